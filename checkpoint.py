"""
Checkpoint I/O: Hugging Face checkpoints (config.json + safetensors, never pickle), the hub download, and the
tokenizer. A `--model` is a local directory, a tiny-world name (`tiny`, `tiny-ladder`) or a Hugging Face repo id
(the local cache first, then a download over HTTPS with the standard library).

    model = load_model("Qwen/Qwen3-0.6B-Base", dtype=torch.bfloat16, device="cuda")
    tokenizer = load_tokenizer("Qwen/Qwen3-0.6B-Base")
    save_model(model, "runs/x/final", tokenizer)   # loadable by transformers and vLLM

config.json's model_type picks the config and model classes (MODEL_TYPES: the plain Qwen3 here; a model option
adds its own row when its module is imported, with the name of its own tensors, kept in NAME.safetensors beside
model.safetensors).
"""

import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import fields
from pathlib import Path

import torch

from model import Qwen3, Qwen3Config, default_device, default_dtype

REPO_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = "Qwen/Qwen3-0.6B-Base"
TINY_MODEL_DIR = REPO_DIR / "tiny_model"  # the embedded tiny world's checkpoint (`--model tiny`)
# The tiny world's named checkpoints: `tiny`, and `tiny-ladder`, the ladder's start (tiny.py's docstring builds both)
TINY_MODELS = {"tiny": TINY_MODEL_DIR, "tiny-ladder": REPO_DIR / "tiny_ladder_model"}
QWEN3_TOKENIZER = REPO_DIR / "data" / "qwen3-tokenizer" / "tokenizer.json"

# config.json's model_type -> (config class, model class, the name of the model's own submodule or None): its
# tensors NAME.* are kept in NAME.safetensors, so that transformers, which refuses the model_type, never sees them
# as a plain model's. A model option adds its row when imported; the plain Qwen3 is the default.
MODEL_TYPES = {Qwen3Config.MODEL_TYPE: (Qwen3Config, Qwen3, None)}

# -----------------------------------------------------------------------------
# Tokenizer


class Tokenizer:
    """A thin wrapper on `tokenizers.Tokenizer` with the special ids the rest of the repo needs."""

    def __init__(self, path):
        from tokenizers import Tokenizer as HFTokenizer
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: tokenizer.json not found")
        try:
            self.tok = HFTokenizer.from_file(str(path))
        except Exception as e:
            raise ValueError(f"{path}: not a valid tokenizer.json ({e})") from None
        self.path = path
        self.eos_id = self.tok.token_to_id("<|endoftext|>")
        self.im_start_id = self.tok.token_to_id("<|im_start|>")
        self.im_end_id = self.tok.token_to_id("<|im_end|>")
        self.pad_id = self.eos_id if self.eos_id is not None else 0

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self):
        return self.tok.get_vocab_size(with_added_tokens=True)

    def stop_token_ids(self, chat=False):
        """Ids that end a completion: `<|endoftext|>` for a base model, plus `<|im_end|>` for a chat model."""
        ids = [self.eos_id] + ([self.im_end_id] if chat else [])
        return [i for i in ids if i is not None]


# -----------------------------------------------------------------------------
# Finding a checkpoint: a local directory, `tiny`, or a Hugging Face repo id (cache, then download)


def hf_cache_dir():
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def cached_snapshot(repo_id, revision):
    repo_dir = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    ref = repo_dir / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snap = repo_dir / "snapshots" / commit
    return snap if (snap / "config.json").is_file() else None


def download(url, dest):
    """Stream url to dest through a temporary name, so an interrupted download never looks complete."""
    headers = {"User-Agent": "rlvr-math/1.0"}
    if os.environ.get("HF_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['HF_TOKEN']}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".incomplete")
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as r:
        total, done, last = int(r.headers.get("Content-Length") or 0), 0, 0
        with open(tmp, "wb") as f:
            while chunk := r.read(1 << 20):
                f.write(chunk)
                done += len(chunk)
                if total > 50 << 20 and done - last > total // 20:
                    print(f"\r  {dest.name}: {done / 2**20:.0f}/{total / 2**20:.0f} MB", end="", file=sys.stderr)
                    last = done
        commit = r.headers.get("X-Repo-Commit")
    if total and done != total:
        tmp.unlink()
        raise OSError(f"{url}: download truncated ({done} of {total} bytes)")
    os.replace(tmp, dest)
    if total > 50 << 20:
        print(file=sys.stderr)
    return commit


def download_model(repo_id, revision="main"):
    """Fetch config, tokenizer and safetensors of a Hugging Face repo into the standard cache layout."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{repo_id}/resolve/{revision}/"
    repo_dir = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    staging = repo_dir / "snapshots" / f".{revision}.partial"
    commit = download(url + "config.json", staging / "config.json") or revision
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        try:
            download(url + name, staging / name)
        except urllib.error.HTTPError:
            pass  # optional files
    try:
        download(url + "model.safetensors.index.json", staging / "model.safetensors.index.json")
        index = json.loads((staging / "model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
        shards = ["model.safetensors"]
    for name in shards:
        if not (staging / name).is_file():
            download(url + name, staging / name)
    snap = repo_dir / "snapshots" / commit
    if snap.exists():
        shutil.rmtree(snap)
    os.replace(staging, snap)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / revision).write_text(commit)
    return snap


def is_tiny_world(name_or_path):
    """`tiny`, `tiny-ladder`, or a local checkpoint with the tiny world's tokenizer (one trained from it, e.g. a
    run's final/): such a model gets the tiny world's flag defaults (budget, data sets) in every script."""
    if str(name_or_path) in TINY_MODELS:
        return True
    mine = Path(name_or_path) / "tokenizer.json"
    if not mine.is_file() or mine.stat().st_size > 1 << 20:  # the tiny world's is ~1 KB; Qwen3's is 11 MB
        return False
    try:
        return json.loads(mine.read_text())["model"] == json.loads((TINY_MODEL_DIR / "tokenizer.json").read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def resolve_model_dir(name_or_path, revision="main"):
    """A local directory, a tiny-world name (TINY_MODELS), or a Hugging Face repo id (the local cache first, then
    a download)."""
    if str(name_or_path) in TINY_MODELS:
        local = TINY_MODELS[str(name_or_path)]
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{local}: the {name_or_path} model is missing; rebuild it with the command "
                                    f"in tiny.py's docstring")
        return local
    path = Path(name_or_path)
    if path.is_dir():
        return check_model_dir(path)
    name = str(name_or_path)
    missing = f"{name}: no such model directory (a run's final/ appears when train_rl.py finishes)"
    if name.count("/") != 1 or name.startswith((".", "/")) or path.suffix in (".json", ".safetensors", ".bin"):
        raise FileNotFoundError(f"{missing}, and not a Hugging Face repo id like {DEFAULT_MODEL!r}")
    snap = cached_snapshot(name, revision)
    if snap is not None:
        return snap
    if path.parent.is_dir():  # e.g. a rounds run's round_9 that was never made, not a hub id
        raise FileNotFoundError(f"{missing}; {path.parent}/ is a local directory, so this is no Hugging Face repo id")
    how = (f"Download it on a machine with internet (e.g. `python -c \"import checkpoint; "
           f"checkpoint.download_model('{name}')\"`, or `huggingface-cli download {name}`) and copy "
           f"{hf_cache_dir() / ('models--' + name.replace('/', '--'))} here, set HF_HOME to where it is, "
           f"or pass a local directory holding config.json and model.safetensors.")
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(f"{name}: not in the Hugging Face cache {hf_cache_dir()} and HF_HUB_OFFLINE=1. {how}")
    print(f"downloading {name} into {hf_cache_dir()} ...", file=sys.stderr)
    try:
        return download_model(name, revision)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise FileNotFoundError(f"{name}: not in the Hugging Face cache {hf_cache_dir()}, and downloading "
                                f"it failed ({e}). {how}") from None


# a run directory holds these; its checkpoints are final/, checkpoints/step_N, round_N/ (research/rounds)
RUN_MARKS = ("final", "checkpoints", "round_0", "metrics.jsonl", "rounds.jsonl", "climb.jsonl")


def check_model_dir(path):
    """A local model directory, or a FileNotFoundError naming what it is instead: a run directory (whose
    checkpoints are inside it) or a directory without config.json."""
    weights = any((path / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json"))
    if not weights and any((path / m).exists() for m in RUN_MARKS):
        raise FileNotFoundError(f"{path}: a run directory, not a model checkpoint; use its final/ or "
                                f"checkpoints/step_N (a rounds or climb run's: round_N/)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path / 'config.json'}: config.json not found; a model directory holds it beside "
                                f"model.safetensors")
    return path


# -----------------------------------------------------------------------------
# Loading and saving checkpoints (safetensors only; never pickle)


def read_safetensors(model_dir, files=None):
    """All tensors of a single-file or sharded checkpoint (or of `files` in it): {name: (tensor, its file)}."""
    from safetensors import safe_open
    index = model_dir / "model.safetensors.index.json"
    if files is None and index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index}: not a valid safetensors index ({e})") from None
    elif files is None and (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    elif files is None:
        raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json "
                                f"(pickled .bin checkpoints are not loaded, by design)")
    tensors = {}
    for name in files:
        path = model_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: shard listed in {index.name} is missing")
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    tensors[key] = (f.get_tensor(key), path)
        except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
            raise ValueError(f"{path}: corrupt or truncated safetensors file ({e})") from None
    return tensors



def read_config(model_dir):
    """The config of a checkpoint directory, of the class MODEL_TYPES gives its config.json's model_type (a plain
    Qwen3Config when it says none: from_json then checks the architecture)."""
    path = Path(model_dir) / "config.json"
    try:
        d = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        d = None  # Qwen3Config.from_json names what is wrong with it
    kind = d.get("model_type") if isinstance(d, dict) and isinstance(d.get("model_type"), str) else None
    if kind not in (None, *MODEL_TYPES) and Qwen3Config.ARCHITECTURE not in (d.get("architectures") or []):
        raise ValueError(f"{path}: unknown architecture (model_type {kind!r}); this program loads model_type "
                         f"{', '.join(map(repr, MODEL_TYPES))} (a model option's once its module is imported, as "
                         f"train_rl.py and evaluate.py import theirs)")
    if kind in MODEL_TYPES and kind != Qwen3Config.MODEL_TYPE:
        return MODEL_TYPES[kind][0].from_json(path)
    plain = {f.name for f in fields(Qwen3Config)}
    for other, (config_class, _, _) in MODEL_TYPES.items():  # a mislabelled checkpoint of another architecture
        theirs = [f"{f.name}={d[f.name]}" for f in fields(config_class)
                  if isinstance(d, dict) and f.name not in plain and d.get(f.name) is not None]
        if theirs:
            raise ValueError(f"{path}: {', '.join(theirs)} in a plain Qwen3 config.json (a checkpoint with them says "
                             f"model_type {other!r})")
    return Qwen3Config.from_json(path)


def empty_model(config):
    """The model of this config (its MODEL_TYPES row's class) on the meta device (no memory)."""
    with torch.device("meta"):
        return MODEL_TYPES[config.MODEL_TYPE][1](config)


def load_model(name_or_path=DEFAULT_MODEL, dtype=None, device=None):
    """A Qwen3 (or the model of another MODEL_TYPES row) from a local directory, a tiny-world name (`tiny`,
    `tiny-ladder`), or a Hugging Face repo id."""
    model_dir = resolve_model_dir(name_or_path)
    config = read_config(model_dir)
    device = device or default_device()
    dtype = dtype or default_dtype(device)
    model = empty_model(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    tensors = read_safetensors(model_dir)
    own = MODEL_TYPES[config.MODEL_TYPE][2]  # None for the plain Qwen3
    if own and not (model_dir / f"{own}.safetensors").is_file():
        raise FileNotFoundError(f"{model_dir / own}.safetensors: missing; config.json says model_type "
                                f"{config.MODEL_TYPE!r}, whose own tensors ({own}.*) live there")
    for kind, (_, _, name) in MODEL_TYPES.items():  # another architecture's own tensors: a mislabelled checkpoint
        if name and name != own and (model_dir / f"{name}.safetensors").is_file():
            raise ValueError(f"{model_dir / name}.safetensors: the own tensors of a model_type {kind!r} checkpoint "
                             f"beside a model_type {config.MODEL_TYPE!r} config.json; refusing to guess which model "
                             f"this is")
    if own:
        tensors.update(read_safetensors(model_dir, [f"{own}.safetensors"]))
    state = {}
    for key, (t, path) in tensors.items():
        if key.endswith("rotary_emb.inv_freq") or (key == "lm_head.weight" and config.tie_word_embeddings):
            continue  # recomputed / tied to the embedding
        if key not in expected:
            raise ValueError(f"{path}: unexpected tensor {key!r} for a Qwen3 model")
        if t.shape != expected[key]:
            raise ValueError(f"{path}: tensor {key!r} has shape {tuple(t.shape)}, expected "
                             f"{tuple(expected[key])} from config.json")
        state[key] = t.to(device=device, dtype=dtype)
        if not bool(torch.isfinite(state[key]).all()):  # refused here, before a script claims its --out
            raise ValueError(f"{path}: tensor {key!r} holds non-finite values (NaN or inf); this checkpoint cannot "
                             f"be used")
    missing = [k for k in expected if k not in state and not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing:
        raise ValueError(f"{model_dir}: checkpoint is missing tensor(s) {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.name_or_path = str(name_or_path)
    return model.eval()


def save_tensors(tensors, path, metadata=None):
    """safetensors' save_file, with a full disk raised as the OSError it is (cli prints it as one line)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file
    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        if "No space" in str(e) or "StorageFull" in str(e) or "Quota" in str(e):
            raise OSError(28, "No space left on device", str(path)) from None
        raise
    os.chmod(path, file_mode())  # the writer makes its files 0600; every other file of a run follows the umask


def file_mode():
    """The permissions a new file gets under this process's umask."""
    return dir_mode() & 0o666


def save_model(model, path, tokenizer=None):
    """Write config.json + model.safetensors in Hugging Face layout, atomically (temp dir, then rename). A model of
    another MODEL_TYPES row adds NAME.safetensors (its own submodule's tensors) and says its model_type in
    config.json, so transformers refuses it rather than loading the shared weights as a plain model."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # Hugging Face stores a tied head once, as the embedding
        own = MODEL_TYPES[model.config.MODEL_TYPE][2]
        extra = {k: state.pop(k) for k in list(state) if own and k.startswith(own + ".")}  # the option's own tensors
        save_tensors(state, tmp / "model.safetensors", {"format": "pt"})
        if extra:
            save_tensors(extra, tmp / f"{own}.safetensors", {"format": "pt"})
        config = model.config.to_hf_dict()
        config["torch_dtype"] = str(next(iter(state.values())).dtype).replace("torch.", "")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if tokenizer is not None:
            shutil.copyfile(tokenizer.path, tmp / "tokenizer.json")
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"{path}: is a file, not a checkpoint directory; save the model elsewhere")
        os.chmod(tmp, dir_mode())  # as any directory the user makes (mkdtemp's starts owner-only)
        replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def dir_mode():
    """The permissions a new directory gets under this process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def replace_dir(new, path):
    """Move directory `new` to `path`. A directory already there is moved aside under a name of its own (never a
    user's PATH.old) and deleted only once `new` is in place, or put back if that fails: an interrupt at any moment
    leaves path whole, or absent with the old one under a hidden name beside it."""
    path = Path(path)
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
        os.replace(path, old)
    try:
        os.replace(new, path)
    except BaseException:
        if old is not None:
            os.replace(old, path)  # put the previous one back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)



def random_checkpoint(path, config=None, dtype=torch.bfloat16, seed=0):
    """A checkpoint of a published shape with random weights, written offline: config (default Qwen3Config(), which
    is Qwen3-0.6B-Base's config.json), N(0, 0.02) matrices, unit norms, the shipped Qwen3 tokenizer. What a machine
    without the hub benchmarks and smoke-tests the real shape on (benchmarks/gpu_rl_check.py). Returns path."""
    config = config or Qwen3Config()
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = Qwen3(config).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return save_model(model, path, load_tokenizer(QWEN3_TOKENIZER))


def load_tokenizer(name_or_path=DEFAULT_MODEL):
    """The checkpoint's own tokenizer.json when it has one, else the bundled Qwen3 tokenizer for Qwen ids."""
    path = Path(name_or_path)
    if path.suffix == ".json":
        return Tokenizer(path)
    local = TINY_MODELS.get(str(name_or_path), path)
    if (local / "tokenizer.json").is_file():
        return Tokenizer(local / "tokenizer.json")
    if str(name_or_path).startswith("Qwen/"):
        snap = cached_snapshot(str(name_or_path), "main")
        if snap is not None and (snap / "tokenizer.json").is_file():
            return Tokenizer(snap / "tokenizer.json")
        return Tokenizer(QWEN3_TOKENIZER)  # all dense Qwen3 models share this vocabulary
    raise FileNotFoundError(f"{name_or_path}: no tokenizer.json found")
