import os
import signal
import sys
from pathlib import Path

# The scripts the tests start inherit this: one OpenMP thread each (see set_num_threads below), unless the caller
# chose a count. Set before torch is imported, which reads it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# tests import the repo's top-level modules (model, sample, ...) as a user running from the root would
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import model as M  # noqa: E402
import checkpoint  # noqa: E402

# Tiny test models gain nothing from a second thread, and on a shared machine an OpenMP thread that waits
# for a descheduled sibling makes every op ~10x slower: one thread keeps the suite fast and predictable.
torch.set_num_threads(1)

# A shell's background job (`pytest &`, `nohup ... &`) starts with SIGINT ignored, and subprocesses would inherit
# that: the Ctrl-C tests need the terminal's Ctrl-C, in this process and in the runs it starts.
signal.signal(signal.SIGINT, signal.default_int_handler)

CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n.,:;!?+-*/=()[]{}\\^_$'\"<>|&%#@~`"


def write_char_tokenizer(path):
    """A character-level tokenizer.json (id 0 = <|endoftext|>), small enough for tiny test models."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")  # "." would skip newlines
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok.save(str(path))
    return checkpoint.Tokenizer(path)


def make_char_model(directory, seed=0, hidden=32, layers=2, std=0.1):
    """A random tiny Qwen3 with a character tokenizer, saved in Hugging Face layout; returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = write_char_tokenizer(directory / "tokenizer_src.json")
    config = M.Qwen3Config(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                           rope_theta=10000.0, bos_token_id=0, eos_token_id=0, torch_dtype="float32")
    torch.manual_seed(seed)
    net = M.Qwen3(config)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, std)
    checkpoint.save_model(net, directory / "model", tokenizer)
    return directory / "model"


def make_qwen_vocab_model(directory, seed=0):
    """A random tiny Qwen3 with the real Qwen3 vocabulary and tokenizer (data/qwen3-tokenizer), saved in Hugging
    Face layout: the real-data paths (MATH prompts, Qwen's special tokens) at test-model cost."""
    config = M.Qwen3Config(vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=4096,
                           rope_theta=1000000.0, bos_token_id=151643, eos_token_id=151643, torch_dtype="float32",
                           tie_word_embeddings=True)
    torch.manual_seed(seed)
    net = M.Qwen3(config)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.02)
    checkpoint.save_model(net, Path(directory), checkpoint.load_tokenizer(checkpoint.QWEN3_TOKENIZER))
    return Path(directory)


@pytest.fixture(scope="session")
def qwen_vocab_model_dir(tmp_path_factory):
    return make_qwen_vocab_model(tmp_path_factory.mktemp("qwen_vocab") / "model")


@pytest.fixture
def char_model_dir(tmp_path):
    return make_char_model(tmp_path / "char")


@pytest.fixture
def gpu():
    """The device of the tests named *_on_gpu_*: TEST_DEVICE when set (TEST_DEVICE=cpu checks their logic on
    the CPU), else cuda where there is one (benchmarks/gpu_check.sh runs them there); skipped otherwise."""
    device = os.environ.get("TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
    if device is None:
        pytest.skip("needs a GPU (TEST_DEVICE=cpu runs it on the CPU)")
    return device
