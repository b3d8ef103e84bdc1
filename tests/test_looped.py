"""Tests of looped.py (looped depth, --loop START:END:N): the looped model is exactly the plain one at
initialisation (logits, cached decoding, log-probs), computes the formula by hand once its loops open, counts its
FLOPs and parameters, round-trips as a looped checkpoint that transformers refuses, and exports its shared weights;
in train_rl.py and evaluate.py a looped run trains its gates at --loop-lr, logs layer passes, FLOPs and gates, saves
a looped checkpoint that resumes exactly, and bad values end with one clear line. The sampler's side is in
test_sample.py."""

import copy
import dataclasses
import json
import subprocess
import sys

import pytest
import torch
import transformers
from safetensors.torch import load_file

import checkpoint
import evaluate as E
import looped
import train_rl as T
from model import KVCache, Qwen3, count_parameters, flops_per_token, rope_cos_sin, token_logprobs
from test_model import assert_logits_close, grads, hf_logits, ids_for, tiny_config, tiny_ours
from test_train_rl import run_setup  # noqa: F401 (a fixture)


# -----------------------------------------------------------------------------
# Looped depth (--loop START:END:N): layers [START, END) run N times with shared weights


def looped_pair(spec="1:3:2", seed=0, lora_rank=0):
    """A tiny random 4-layer Qwen3 and a deep copy of it looped by `spec`."""
    plain = tiny_ours(seed, num_hidden_layers=4)
    return plain, looped.add_loop(copy.deepcopy(plain), spec, lora_rank)


def open_loops_(model, seed=3, scale=0.3):
    """Non-zero gates, embeddings and adapters (smaller: LoRA scales them by alpha / rank), as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.loop.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (scale / 10 if ".lora_" in name else scale))
    return model


def cached_logits(m, ids, split=5):
    """Logits of a prefill of ids[:, :split] and then one decode step per remaining token."""
    cache = m.new_cache(ids.shape[0], ids.shape[1])
    with torch.no_grad():
        out = [m(ids[:, :split], cache=cache)]
        out += [m(ids[:, t:t + 1], cache=cache) for t in range(split, ids.shape[1])]
    return torch.cat(out, 1)


LOOP_SPECS = [("1:3:2", 0), ("1:3:3", 0), ("0:4:2", 0), ("2:3:4", 0), ("1:3:3", 2)]


@pytest.mark.parametrize("spec,rank", LOOP_SPECS, ids=[f"{s}-lora{r}" for s, r in LOOP_SPECS])
def test_looped_model_at_initialisation_is_exactly_the_plain_model(spec, rank):
    plain, loop = looped_pair(spec, lora_rank=rank)
    ids = ids_for((2, 12))
    with torch.no_grad():
        assert torch.equal(loop(ids), plain(ids))
        for a, b in zip(token_logprobs(loop, ids), token_logprobs(plain, ids)):
            assert torch.equal(a, b)
    assert torch.equal(cached_logits(loop, ids), cached_logits(plain, ids))
    s, e, n = map(int, spec.split(":"))
    assert loop.config.layer_passes == 4 + (n - 1) * (e - s)
    assert KVCache(loop.config, 1, 8).k.shape[0] == loop.config.layer_passes  # a row per (layer, loop) pass


def test_loop_n_1_and_empty_spec_are_the_plain_code_path():
    m = tiny_ours(num_hidden_layers=4)
    config = m.config
    assert looped.add_loop(m, "1:3:1") is m and looped.add_loop(m, "") is m
    assert type(m) is Qwen3 and m.config is config and m.config.layer_passes == 4 and config.extra_parameters == 0
    assert looped.parse_loop("1:3:1", 4) == (1, 3, 1) and looped.loop_spec(config) == ""


def test_looped_forward_is_the_formula_by_hand():
    """h <- h + a_k * D(h + s_k) with D(x) = R(x) - x, R the looped layers, for each loop k > 1."""
    _, m = looped_pair("1:3:3")
    open_loops_(m)
    ids = ids_for((2, 9))
    layers, T = m.model.layers, ids.shape[1]
    cos, sin = rope_cos_sin(torch.arange(T)[None].expand(2, T), 16, m.config.rope_theta, torch.float32)
    R = lambda x: layers[2](layers[1](x, cos, sin), cos, sin)  # noqa: E731
    with torch.no_grad():
        h = R(layers[0](m.model.embed_tokens(ids), cos, sin))
        for k in range(2):
            x = h + m.loop.embed[k]
            h = h + m.loop.gate[k] * (R(x) - x)
        expected = m.lm_head(m.model.norm(layers[3](h, cos, sin)))
        assert_logits_close(m(ids), expected, atol=1e-5)
        assert (m(ids) - tiny_ours(num_hidden_layers=4)(ids)).abs().max() > 1e-2  # the open loops do change it


@pytest.mark.parametrize("rank", [0, 2])
def test_looped_cached_decoding_matches_full_forward_with_open_loops(rank):
    """Every (layer, loop) pass has its own cache row: incremental decoding equals the full forward pass."""
    _, m = looped_pair("1:3:3", lora_rank=rank)
    open_loops_(m)
    ids = ids_for((3, 14))
    with torch.no_grad():
        # fp32 rounding: one-token decode steps and the whole sequence take different matrix products (1.08e-5
        # with model.py's formulas, under 1e-5 with the kernels' CPU products)
        assert_logits_close(cached_logits(m, ids), m(ids), atol=2e-5)


def test_loop_gradients_at_initialisation():
    """At a_k = 0: the gate's gradient is D(h + s_k), non-zero; the embedding's is exactly zero (it enters only
    through a_k * D); the shared weights get exactly the plain model's gradients."""
    plain, loop = looped_pair("1:3:3")
    ids = ids_for((2, 10))
    for m in (plain, loop):
        token_logprobs(m, ids)[0].sum().backward()
    assert loop.loop.gate.grad.abs().min(-1).values.gt(0).all()
    assert torch.equal(loop.loop.embed.grad, torch.zeros_like(loop.loop.embed))
    plain_grads = dict(plain.named_parameters())
    for name, p in loop.named_parameters():
        if not name.startswith("loop."):
            assert torch.equal(p.grad, plain_grads[name].grad), name


def test_looped_gradient_checkpointing_gives_the_same_gradients():
    _, m = looped_pair("1:3:3", lora_rank=2)
    open_loops_(m)
    ids = ids_for((2, 10))
    m.train()
    token_logprobs(m, ids)[0].sum().backward()
    g1 = grads(m)
    m.zero_grad(set_to_none=True)
    m.gradient_checkpointing = True
    token_logprobs(m, ids)[0].sum().backward()
    assert set(g1) == set(grads(m)) and any(".lora_" in n for n in g1)
    for name, g in grads(m).items():
        torch.testing.assert_close(g, g1[name], atol=1e-6, rtol=1e-5, msg=name)


def test_looped_flops_per_token_by_hand():
    c = looped.LoopedQwen3Config(**dataclasses.asdict(tiny_config(num_hidden_layers=4)), loop_start=1, loop_end=3,
                                 loop_count=3)
    # 4 layers + 2 extra loops x 2 layers = 8 layer passes of 30,720 matmul weights each; LM head 16,448;
    # attention 2 matmuls x 2 FLOPs x heads 4 x head_dim 16 = 256 per pass and context token
    assert c.layer_passes == 8
    assert flops_per_token(c, context_len=10) == 2 * (8 * 30_720 + 16_448) + 8 * 256 * 10 == 544_896
    assert flops_per_token(c, context_len=10, training=True) == 3 * 544_896
    # per-loop LoRA of rank 2: rank x (in + out) per projection, q 128 + k 96 + v 96 + o 128 + gate 160 + up 160
    # + down 160 = 928, on 2 layers x 2 extra loops
    lora_c = dataclasses.replace(c, loop_lora_rank=2)
    assert flops_per_token(lora_c, context_len=10) == 544_896 + 2 * (2 * 928 * 4) == 559_744
    # the extra trainable parameters: a gate and an embedding (hidden 64) per extra loop, plus the adapters
    assert c.extra_parameters == 2 * 2 * 64 and lora_c.extra_parameters == 256 + 2 * 928 * 4
    assert count_parameters(c) == count_parameters(tiny_config(num_hidden_layers=4)) + 256


@pytest.mark.parametrize("rank", [0, 2])
def test_looped_flops_per_token_matches_flop_counter(rank):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    _, m = looped_pair("1:3:3", lora_rank=rank)
    T = 16
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        m(ids_for((1, T))).sum().backward()
    assert counter.get_total_flops() == T * flops_per_token(m.config, context_len=T, training=True)
    assert sum(p.numel() for p in m.loop.parameters()) == m.config.extra_parameters


@pytest.mark.parametrize("rank", [0, 2])
def test_looped_checkpoint_round_trip_and_transformers_refuses_it(tmp_path, rank):
    _, m = looped_pair("1:3:3", lora_rank=rank)
    open_loops_(m)
    checkpoint.save_model(m, tmp_path / "looped")
    config = json.loads((tmp_path / "looped" / "config.json").read_text())
    assert config["model_type"] == "looped_qwen3" and config["architectures"] == ["LoopedQwen3ForCausalLM"]
    assert (config["loop_start"], config["loop_end"], config["loop_count"], config["loop_lora_rank"]) == (1, 3, 3, rank)
    assert all(k.startswith("loop.") for k in load_file(tmp_path / "looped" / "loop.safetensors"))
    assert not any(k.startswith("loop.") for k in load_file(tmp_path / "looped" / "model.safetensors"))
    back = checkpoint.load_model(tmp_path / "looped", device="cpu")
    assert back.config == dataclasses.replace(m.config, torch_dtype="float32")
    ids = ids_for((2, 12))
    with torch.no_grad():
        assert torch.equal(back(ids), m(ids))
    with pytest.raises(ValueError, match="looped_qwen3"):  # transformers does not know the architecture
        transformers.AutoConfig.from_pretrained(tmp_path / "looped")
    with pytest.raises(ValueError, match="looped_qwen3"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "looped")


def test_export_plain_writes_the_shared_weights_and_says_what_it_drops(tmp_path, capsys):
    plain, m = looped_pair("1:3:2")
    ids = ids_for((2, 12))
    _, gate = looped.export_plain(m, tmp_path / "at_init")  # zero gates: the export is the same function
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "at_init").eval()
    with torch.no_grad():
        assert gate == 0.0 and torch.equal(checkpoint.load_model(tmp_path / "at_init", device="cpu")(ids), m(ids))
        assert_logits_close(hf_logits(hf, ids), m(ids))
    open_loops_(m)
    checkpoint.save_model(m, tmp_path / "looped")
    _, gate = looped.export_plain(tmp_path / "looped", tmp_path / "trained")
    assert gate > 0 and "extra loops are dropped" in capsys.readouterr().err
    with torch.no_grad():  # the export is the plain model with the shared weights, no longer the looped one
        assert torch.equal(checkpoint.load_model(tmp_path / "trained", device="cpu")(ids), plain(ids))


def test_a_looped_checkpoint_loads_where_looped_py_is_imported(tmp_path):
    """checkpoint.py knows model_type looped_qwen3 only once looped.py has added its row to checkpoint.MODEL_TYPES:
    on its own it refuses the checkpoint in one line naming the file, and `python evaluate.py --model` (which
    imports looped.py through model_options.py) evaluates the looped model."""
    m = looped.add_loop(checkpoint.load_model("tiny", device="cpu"), "1:3:2")
    d = checkpoint.save_model(m, tmp_path / "looped", checkpoint.load_tokenizer("tiny"))
    load = f"import checkpoint; checkpoint.load_model({str(d)!r}, device='cpu')"
    alone = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, cwd=checkpoint.REPO_DIR)
    assert alone.returncode == 1 and (f"ValueError: {d / 'config.json'}: unknown architecture (model_type "
                                      f"'looped_qwen3'); this program loads model_type 'qwen3' (") in alone.stderr
    r = subprocess.run([sys.executable, str(checkpoint.REPO_DIR / "evaluate.py"), "--model", str(d), "--limit", "2",
                        "--max-new-tokens", "4", "--device", "cpu", "--out", str(tmp_path / "eval")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["settings"]["loop"] == "1:3:2" and summary["layer_passes"] == m.config.layer_passes


def test_a_looped_checkpoint_is_never_taken_for_a_plain_one(tmp_path):
    _, m = looped_pair("1:3:2")
    checkpoint.save_model(m, tmp_path / "looped")
    d = tmp_path / "looped"
    config = json.loads((d / "config.json").read_text())
    plain_type = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    (d / "config.json").write_text(json.dumps({**config, **plain_type}))
    with pytest.raises(ValueError, match="loop_start=1, loop_end=3, loop_count=2, .* in a plain Qwen3 config.json"):
        checkpoint.load_model(d, device="cpu")
    plain_config = {k: v for k, v in config.items() if not k.startswith("loop_")}
    (d / "config.json").write_text(json.dumps({**plain_config, **plain_type}))
    with pytest.raises(ValueError, match="loop.safetensors: the own tensors of a model_type 'looped_qwen3' checkpoint "
                                         "beside a model_type 'qwen3' config.json"):
        checkpoint.load_model(d, device="cpu")
    (d / "config.json").write_text(json.dumps(config))
    (d / "loop.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="loop.safetensors: missing; config.json says model_type 'looped_qwen3"):
        checkpoint.load_model(d, device="cpu")


@pytest.mark.parametrize("spec,message", [
    ("3:1:2", "--loop 3:1:2: END must be > START"),
    ("2:2:2", "--loop 2:2:2: END must be > START"),
    ("1:5:2", "--loop 1:5:2: the looped layers .* within the model's 4 layers"),
    ("-1:2:2", "--loop -1:2:2: START must be >= 0"),
    ("1:3:0", "--loop 1:3:0: N must be >= 1"),
    ("1:3", "--loop 1:3: expected START:END:N"),
    ("a:b:c", "--loop a:b:c: expected START:END:N"),
])
def test_bad_loop_values_are_refused_naming_the_flag(spec, message):
    m = tiny_ours(num_hidden_layers=4)
    with pytest.raises(ValueError, match=message):
        looped.add_loop(m, spec)
    assert type(m) is Qwen3


def test_a_looped_model_keeps_its_loop():
    _, m = looped_pair("1:3:2")
    assert looped.add_loop(m, "") is m and looped.add_loop(m, "1:3:2") is m
    assert m.config.extra_parameters == 2 * 64  # one extra loop: a gate and an embedding
    with pytest.raises(ValueError, match="already looped \\(1:3:2"):
        looped.add_loop(m, "0:2:2")


@pytest.mark.parametrize("rank", [0, 2])
def test_a_looped_run_trains_its_gates_at_loop_lr_and_saves_a_looped_checkpoint(run_setup, rank):  # noqa: F811
    run = T.train(run_setup(steps=2, lr=1e-3, loop="1:2:3", loop_lr=0.05, loop_lora_rank=rank, save_every=1))
    m = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    net = checkpoint.load_model(run / "final", device="cpu")
    c = net.config
    assert (c.loop_start, c.loop_end, c.loop_count, c.loop_lora_rank) == (1, 2, 3, rank)
    assert [r["layer_passes"] for r in m] == [4, 4]  # 2 layers + 2 extra passes of layer 1
    assert m[0]["loop_parameters"] == c.extra_parameters == 2 * 2 * 32 + 2 * looped.loop_lora_weights(c)
    assert all(a > 0 for a in m[-1]["loop_gate_abs"])
    assert m[-1]["loop_gate_abs"] == looped.loop_metrics(net)["loop_gate_abs"]
    # Adam moves a parameter by about lr a step: the gates at --loop-lr, not at --lr
    assert 0.01 < max(m[-1]["loop_gate_abs"]) <= 2 * 0.05 + 1e-6
    meta = json.loads((run / "checkpoints" / "step_1" / "trainer_state.json").read_text())
    assert [(g["lr"], g["weight_decay"]) for g in meta["param_groups"]][1] == (0.05, 0.0)
    assert (run / "final" / "loop.safetensors").is_file()
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="looped_qwen3"):
        transformers.AutoModelForCausalLM.from_pretrained(run / "final")


def test_a_looped_run_resumes_exactly(run_setup, tmp_path):  # noqa: F811
    flags = dict(loop="0:2:2", loop_lr=0.05, save_every=1)
    straight = T.train(run_setup(steps=2, out=str(tmp_path / "straight"), **flags))
    T.train(run_setup(steps=1, out=str(tmp_path / "split"), **flags))
    split = T.train(run_setup(steps=2, out=str(tmp_path / "split"), resume=True, **flags))
    a, b = (checkpoint.load_model(run / "final", device="cpu").state_dict() for run in (straight, split))
    assert a.keys() == b.keys() and "loop.gate" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("flags,message", [
    (["--loop", "3:1:2"], "--loop 3:1:2: END must be > START"),
    (["--loop", "0:5:2"], "--loop 0:5:2: the looped layers .* 2 layers"),
    (["--loop", "0:2:0"], "--loop 0:2:0: N must be >= 1"),
    (["--loop", "0-2-2"], "--loop 0-2-2: expected START:END:N"),
    (["--loop-lora-rank", "2"], "--loop-lora-rank 2 needs --loop"),
    (["--loop", "0:2:2", "--lora-rank", "4"], "--loop with --lora-rank"),
])
def test_bad_loop_flags_end_with_one_line_before_anything_is_written(char_model_dir, tmp_path, flags, message):
    out = tmp_path / "run"
    argv = ["--model", str(char_model_dir), "--dataset", "tiny_train", "--subject", "", "--out", str(out),
            "--device", "cpu", *flags]
    with pytest.raises(ValueError, match=message):
        T.train(T.parse_args(argv))
    assert not out.exists()
    if flags[1] in ("3:1:2", "0:5:2"):  # the scripts print it as one line: caught early, or once the model is read
        for script, more in (("train_rl.py", argv[2:]), ("evaluate.py", ["--dataset", "tiny_test", "--out", str(out)])):
            r = subprocess.run([sys.executable, str(checkpoint.REPO_DIR / script), *argv[:2], *more, *flags],
                               capture_output=True, text=True, cwd=tmp_path)
            last = r.stderr.strip().splitlines()[-1]
            assert r.returncode == 2 and last.startswith(f"{script}: error: --loop"), r.stderr
        assert not out.exists()


def test_evaluate_with_loop_gives_the_plain_answers_at_more_flops(char_model_dir, tmp_path):
    argv = ["--model", str(char_model_dir), "--dataset", "tiny_test", "--limit", "6", "--max-new-tokens", "12",
            "--device", "cpu"]
    plain = E.main(argv + ["--out", str(tmp_path / "plain")])
    deep = E.main(argv + ["--out", str(tmp_path / "looped"), "--loop", "0:2:3"])
    read = lambda d: [json.loads(x) for x in (tmp_path / d / "records.jsonl").read_text().splitlines()]  # noqa: E731
    assert [r["response"] for r in read("looped")] == [r["response"] for r in read("plain")]
    assert (plain["layer_passes"], deep["layer_passes"]) == (2, 6)
    assert deep["settings"]["loop"] == "0:2:3" and plain["settings"]["loop"] == ""
    assert 2.5 < deep["inference_flops"] / plain["inference_flops"] < 3
    with pytest.raises(ValueError, match="loop: '' there, '0:2:3' now"):  # one directory, one protocol
        E.main(argv + ["--out", str(tmp_path / "plain"), "--loop", "0:2:3"])


def test_a_looped_checkpoint_goes_through_rounds_and_stays_looped(tmp_path):
    """research/rounds (deliberate, distil, RL phase, evaluate) on a looped pi_0: every round's policy keeps the loop."""
    from research.rounds import rounds
    m = looped.add_loop(checkpoint.load_model("tiny", device="cpu"), "1:3:2")
    with torch.no_grad():
        m.loop.gate.fill_(0.05)
    checkpoint.save_model(m, tmp_path / "looped", checkpoint.load_tokenizer("tiny"))
    rows = rounds.main(["--model", str(tmp_path / "looped"), "--dataset", "tiny_ladder_train", "--rounds", "1",
                        "--num-problems", "8", "--samples", "2", "--val-limit", "6", "--eval-samples", "2",
                        "--test-dataset", "", "--rl-steps", "1", "--rl-problems-per-step", "2", "--rl-group-size", "2",
                        "--device", "cpu", "--out", str(tmp_path / "rounds")])
    assert [r["round"] for r in rows] == [0, 1]
    for r in (0, 1):
        policy = checkpoint.load_model(tmp_path / "rounds" / f"round_{r}", device="cpu")
        assert looped.loop_spec(policy.config) == "1:3:2" and policy.loop.gate.abs().max() > 0
