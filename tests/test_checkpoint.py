"""
Tests of checkpoint.py: the tokenizer, loading and saving Hugging Face checkpoints (transformers loads what we
write and we load what it writes; test_model.py checks the logits), clear errors naming the file for every bad
input, and a real download into the Hugging Face cache over loopback HTTP.
"""

import http.server
import json
import socket
import threading
from functools import partial

import pytest
import torch
from safetensors.torch import load_file, save_file

import checkpoint
from test_model import assert_logits_close, hf_logits, ids_for, save_hf


# -----------------------------------------------------------------------------
# Tokenizer


def test_tokenizer_falls_back_to_bundled_qwen3_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    tok = checkpoint.load_tokenizer("Qwen/Qwen3-0.6B-Base")
    assert tok.path == checkpoint.QWEN3_TOKENIZER
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert (tok.eos_id, tok.im_start_id, tok.im_end_id) == (151643, 151644, 151645)
    assert tok.stop_token_ids(chat=False) == [151643]
    assert tok.stop_token_ids(chat=True) == [151643, 151645]
    text = "Find $x$ such that $x^2 - 5x + 6 = 0$. Answer: \\boxed{2}, ∑ é 中文"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([151644, 872, 151645]) == "user"
    assert tok.decode([151644, 872, 151645], skip_special_tokens=False) == "<|im_start|>user<|im_end|>"
    assert tok.vocab_size >= 151669


# -----------------------------------------------------------------------------
# Bad inputs: each a clear error that names the file (and tensor)


def test_missing_config_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json not found") as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(tmp_path / "config.json") in str(e.value)


def test_an_unknown_model_type_is_one_error_naming_the_file(tmp_path):
    """A model_type without a row in checkpoint.MODEL_TYPES (and not Qwen3's architecture) is refused before a weight
    is read, naming config.json and the model types this program loads."""
    save_hf(tmp_path)
    path = tmp_path / "config.json"
    d = json.loads(path.read_text())
    path.write_text(json.dumps(dict(d, model_type="mamba", architectures=["MambaForCausalLM"])))
    for read in (checkpoint.read_config, checkpoint.load_model):
        with pytest.raises(ValueError) as e:
            read(tmp_path)
        assert str(e.value).startswith(f"{path}: unknown architecture (model_type 'mamba'); this program loads "
                                       f"model_type 'qwen3'")
    path.write_text(json.dumps(dict(d, model_type="mamba")))  # Qwen3's architecture still says the plain model
    assert type(checkpoint.read_config(tmp_path)) is checkpoint.Qwen3Config


def rewrite_checkpoint(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor(tmp_path):
    save_hf(tmp_path)
    rewrite_checkpoint(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor.*model\.layers\.1\.mlp\.up_proj\.weight") as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(tmp_path) in str(e.value)


def test_tensor_of_the_wrong_shape(tmp_path):
    save_hf(tmp_path)
    rewrite_checkpoint(tmp_path, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(16, 64)}))
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \(16, 64\), "
                                         r"expected \(32, 64\)") as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(tmp_path / "model.safetensors") in str(e.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, bad):
    save_hf(tmp_path)
    key = "model.layers.1.mlp.down_proj.weight"

    def poison(t):
        t[key] = t[key].clone()
        t[key][3, 5] = bad
    rewrite_checkpoint(tmp_path, poison)
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.down_proj\.weight' holds non-finite") as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(tmp_path / "model.safetensors") in str(e.value)


def test_unexpected_tensor(tmp_path):
    save_hf(tmp_path)
    rewrite_checkpoint(tmp_path, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}))
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'") as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(tmp_path / "model.safetensors") in str(e.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_truncated_or_corrupt_safetensors(tmp_path, damage):
    save_hf(tmp_path)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:len(data) // 2] if damage == "truncated" else bytes(range(256)) * 64)
    with pytest.raises(ValueError, match="corrupt or truncated safetensors") as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(f) in str(e.value)


def test_a_saved_checkpoint_gets_the_umask_permissions_and_replaces_the_old_one_whole(tmp_path):
    import os
    net = checkpoint.load_model("tiny", device="cpu")
    old = os.umask(0o022)
    try:
        checkpoint.save_model(net, tmp_path / "m")
        (tmp_path / "m" / "stale.txt").write_text("from the previous checkpoint\n")
        checkpoint.save_model(net, tmp_path / "m")  # replaced whole: nothing of the old one is left
    finally:
        os.umask(old)
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o755  # mkdtemp's 0o700 would hide it from other users
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary or set-aside directory left beside it


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_every_file_of_a_saved_checkpoint_is_readable_as_the_umask_says(tmp_path, umask):
    """safetensors' writer makes its file 0600 whatever the umask; save_model gives it the umask's mode, as the
    JSON files beside it have (0644 under 022, 0640 under 027, 0600 under 077)."""
    import os
    old = os.umask(umask)
    try:
        checkpoint.save_model(checkpoint.load_model("tiny", device="cpu"), tmp_path / "m",
                              checkpoint.load_tokenizer("tiny"))
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "m").iterdir()}
    assert modes == {name: 0o666 & ~umask for name in ("config.json", "model.safetensors", "tokenizer.json")}


def test_a_run_directory_or_a_missing_round_is_named_for_what_it_is(tmp_path, empty_hf_home, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "final").mkdir(parents=True)
    (tmp_path / "run" / "config.json").write_text(json.dumps(dict(objective="drgrpo")))  # a run's, not a model's
    with pytest.raises(FileNotFoundError, match="run: a run directory, not a model checkpoint; use its final/ or "
                                                "checkpoints/step_N"):
        checkpoint.load_model("run", device="cpu")
    (tmp_path / "climb" / "round_0").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"climb/round_9: no such model directory .*climb/ is a local "
                                                r"directory, so this is no Hugging Face repo id"):
        checkpoint.load_model("climb/round_9", device="cpu")  # one slash, like a repo id: never sent to the hub


def test_pickled_checkpoint_is_refused_never_unpickled(tmp_path, monkeypatch):
    save_hf(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")

    def forbidden(*args, **kwargs):
        raise AssertionError("a pickled checkpoint was unpickled")
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr("pickle.load", forbidden)
    monkeypatch.setattr("pickle.loads", forbidden)
    refused = r"no model\.safetensors.*pickled \.bin checkpoints are not loaded"
    with pytest.raises(FileNotFoundError, match=refused) as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(tmp_path) in str(e.value)


def test_shard_listed_in_index_but_missing(tmp_path):
    save_hf(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*-of-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match="shard listed in model.safetensors.index.json is missing") as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(shard) in str(e.value)


@pytest.fixture
def empty_hf_home(tmp_path, monkeypatch):
    """An empty Hugging Face cache, no offline flag, and no proxy between us and loopback."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN", "HF_ENDPOINT", "http_proxy", "HTTP_PROXY",
                "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    return home


def test_offline_and_uncached_repo_id_says_how_to_provide_weights(empty_hf_home, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as e:
        checkpoint.load_model("Qwen/Qwen3-0.6B-Base", device="cpu")  # a dot in the repo name is still a repo id
    msg = str(e.value)
    assert "Qwen/Qwen3-0.6B-Base" in msg and "HF_HUB_OFFLINE=1" in msg and str(empty_hf_home / "hub") in msg
    assert "download_model('Qwen/Qwen3-0.6B-Base')" in msg and "local directory" in msg


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_uncached_repo_id_whose_download_fails(empty_hf_home, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(FileNotFoundError) as e:
        checkpoint.load_model("org/name", device="cpu")
    msg = str(e.value)
    assert "org/name" in msg and "downloading it failed" in msg and "local directory" in msg


# -----------------------------------------------------------------------------
# Download over loopback HTTP, into the Hugging Face cache layout

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub(http.server.BaseHTTPRequestHandler):
    """Serves files[name] at /{org}/{name}/resolve/main/<file>, like huggingface.co; 404 otherwise. Files named
    in `cut` are sent half-way with the full Content-Length, as a dropped connection leaves them."""

    def __init__(self, *args, files, requests, cut=(), **kwargs):
        self.files, self.requests, self.cut = files, requests, cut
        super().__init__(*args, **kwargs)

    def do_GET(self):
        self.requests.append(self.path)
        prefix = "/org/name/resolve/main/"
        body = self.files.get(self.path[len(prefix):]) if self.path.startswith(prefix) else None
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        self.wfile.write(body[:len(body) // 2] if self.path.endswith(tuple(self.cut)) else body)

    def log_message(self, *args):
        pass


def test_download_into_hf_cache_then_load_from_cache(tmp_path, empty_hf_home, monkeypatch):
    hf = save_hf(tmp_path / "repo")
    files = {name: (tmp_path / "repo" / name).read_bytes() for name in ("config.json", "model.safetensors")}
    requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(FakeHub, files=files, requests=requests))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        m = checkpoint.load_model("org/name", device="cpu")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert "/org/name/resolve/main/model.safetensors.index.json" in requests  # tried, 404 -> single file
    ids = ids_for((2, 16))
    with torch.no_grad():
        assert_logits_close(m(ids), hf_logits(hf, ids))
    repo = empty_hf_home / "hub" / "models--org--name"
    assert (repo / "refs" / "main").read_text() == COMMIT
    snap = repo / "snapshots" / COMMIT
    for name, body in files.items():
        assert (snap / name).read_bytes() == body
    leftovers = [p for p in empty_hf_home.rglob("*") if p.name.endswith((".incomplete", ".partial"))]
    assert leftovers == []
    assert checkpoint.resolve_model_dir("org/name") == snap
    again = checkpoint.load_model("org/name", device="cpu")  # the server is gone: this must come from the cache
    with torch.no_grad():
        assert torch.equal(again(ids), m(ids))


def serve(files, cut=()):
    """A FakeHub on a loopback port: (server, thread, requests); stop it with stop(server, thread)."""
    requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(FakeHub, files=files, requests=requests, cut=cut))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread, requests


def stop(server, thread):
    server.shutdown()
    server.server_close()
    thread.join()


def test_sharded_download_follows_the_index(tmp_path, empty_hf_home, monkeypatch):
    hf = save_hf(tmp_path / "repo", max_shard_size="20KB")
    files = {p.name: p.read_bytes() for p in (tmp_path / "repo").iterdir() if p.suffix in (".json", ".safetensors")}
    shards = sorted(n for n in files if n.startswith("model-"))
    assert len(shards) >= 3
    server, thread, requests = serve(files)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        m = checkpoint.load_model("org/name", device="cpu")
    finally:
        stop(server, thread)
    assert [r for r in requests if "/model-" in r] == [f"/org/name/resolve/main/{n}" for n in shards]
    assert not any(r.endswith("/model.safetensors") for r in requests)  # the index says where the weights are
    snap = empty_hf_home / "hub" / "models--org--name" / "snapshots" / COMMIT
    assert all((snap / n).read_bytes() == files[n] for n in shards)
    ids = ids_for((2, 16))
    with torch.no_grad():
        assert_logits_close(m(ids), hf_logits(hf, ids))


def test_truncated_download_is_never_taken_for_a_checkpoint(tmp_path, empty_hf_home, monkeypatch):
    save_hf(tmp_path / "repo")
    files = {name: (tmp_path / "repo" / name).read_bytes() for name in ("config.json", "model.safetensors")}
    server, thread, _ = serve(files, cut=("model.safetensors",))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        with pytest.raises(FileNotFoundError, match="org/name: .*downloading it failed .*truncated"):
            checkpoint.load_model("org/name", device="cpu")
    finally:
        stop(server, thread)
    assert checkpoint.cached_snapshot("org/name", "main") is None  # nothing that looks complete was left
    assert not list(empty_hf_home.rglob("model.safetensors"))


@pytest.mark.parametrize("name", ["a/b/c", "./org/name", "/abs/path", "org/name.json", "org/weights.bin", "tiny2"])
def test_names_that_are_neither_a_directory_nor_a_repo_id_are_refused(name, empty_hf_home):
    with pytest.raises(FileNotFoundError, match="no such model directory.*not a Hugging Face repo id"):
        checkpoint.resolve_model_dir(name)


def test_invalid_json_and_tokenizer_files_name_the_file(tmp_path):
    save_hf(tmp_path / "m", max_shard_size="20KB")
    (tmp_path / "m" / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(ValueError, match="model.safetensors.index.json: not a valid safetensors index"):
        checkpoint.load_model(tmp_path / "m", device="cpu")
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        checkpoint.load_model(tmp_path / "m", device="cpu")
    (tmp_path / "tokenizer.json").write_text('{"model": "half a file"')
    with pytest.raises(ValueError, match="tokenizer.json: not a valid tokenizer.json"):
        checkpoint.load_tokenizer(tmp_path / "tokenizer.json")
