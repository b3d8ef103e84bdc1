"""memory.py: the plan's parts by hand for the published Qwen3 shapes at the README's recipes; against what PyTorch
measures on the CPU for small shapes; a run that cannot fit stops with one line before loading anything.

How the CPU measures are taken: the activations are the bytes of every distinct storage autograd saves for backward
during the micro-batch's forward (torch.autograd.graph.saved_tensors_hooks; parameters left out: they are the
weights' part), i.e. what lives from forward to backward; with --grad-checkpointing the same hooks see only the
layers' inputs, so there the peak is taken from torch.profiler's allocation timeline (profile_memory=True: every op's
allocations and frees, summed in time order) over forward and backward. The KV cache is the peak of that timeline
over a whole generate() call (the weights exist before it, so they are not in it)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import memory
import model as M
from model import Qwen3Config

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30

# The published config.json values (huggingface.co/Qwen/Qwen3-{0.6B,1.7B,8B}-Base): hidden, layers, heads, kv heads,
# head_dim, intermediate, vocab, tie_word_embeddings.
QWEN3_0_6B = Qwen3Config(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True)
QWEN3_1_7B = Qwen3Config(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True)
QWEN3_8B = Qwen3Config(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False)
# parameters by hand: layers x (q,k,v,o + q/k norms + MLP + two norms) + final norm + embedding (+ untied head)
N_0_6B = 28 * (1024 * 128 * 48 + 256 + 3 * 1024 * 3072 + 2048) + 1024 + 151936 * 1024  # 596,049,920
N_1_7B = 28 * (2048 * 128 * 48 + 256 + 3 * 2048 * 6144 + 4096) + 2048 + 151936 * 2048  # 1,720,574,976
N_8B = 36 * (4096 * 128 * 80 + 256 + 3 * 4096 * 12288 + 8192) + 4096 + 2 * 151936 * 4096  # 8,190,735,360


def recipe(**kw):
    """train_rl.py's defaults that the plan reads (the README's `python train_rl.py --objective drgrpo`)."""
    return SimpleNamespace(**dict(dict(fsdp=False, lora_rank=0, max_new_tokens=512, kl_coef=0.0, problems_per_step=1,
                                       group_size=8, micro_batch_tokens=4096, grad_checkpointing=False), **kw))


def parts(cfg, config, prompt, device, world=1):
    return {p.name: p.bytes for p in memory.training_plan(cfg, config, prompt, device, world)}


def test_parameter_counts_are_the_published_ones():
    assert (N_0_6B, N_1_7B, N_8B) == (596_049_920, 1_720_574_976, 8_190_735_360)
    assert [M.count_parameters(c) for c in (QWEN3_0_6B, QWEN3_1_7B, QWEN3_8B)] == [N_0_6B, N_1_7B, N_8B]


def test_qwen3_0_6b_default_recipe_on_one_gpu_by_hand(monkeypatch):
    monkeypatch.setattr(M, "use_kernels", True)
    got = parts(recipe(), QWEN3_0_6B, 200, "cuda")
    assert got["weights (fp32)"] == 4 * N_0_6B and got["gradients (fp32)"] == 4 * N_0_6B
    assert got["AdamW moments (fp32)"] == 8 * N_0_6B and got["sampling copy (bf16)"] == 2 * N_0_6B
    # the cache: 8 rows of 200 + 512 slots, k and v of 28 layers x 8 heads x 128 in bf16, the prefilled row beside
    assert got["KV cache"] == (8 + 1) * 712 * (2 * 28 * 8 * 128 * 2)
    # 8 rows of 712 tokens: 4096 // 712 = 5 rows a micro-batch, 711 positions each (ids[:, :-1])
    tokens = 5 * 711
    per_layer = (2 * 1024 * 4 + 2 * 4      # the two norms' x_hat (fp32 residual) and rstd
                 + 3072 * 2 + 24 * 2       # the joint q/k norm's x_hat (bf16) and rstd, 16 + 8 heads
                 + 5 * 1024 * 2            # q, k, v, gate, up: each a bf16 cast of its norm's output
                 + 3072 * 2 + 1024 * 2     # q, k after RoPE (cast to bf16 by SDPA) and v
                 + 2048 * 2 + 16 * 4       # attention's output and logsumexp
                 + 4 * 3072 * 2)           # gate, silu(gate), up, their product
    layer_weights = 28 * (1024 * 128 * 48 + 3 * 1024 * 3072)  # cast to bf16 by autocast, kept for backward
    per_token_rest = 2 * 128 * 2 + 2 * 1024 * 4 + 4  # cos, sin; the final norm's x_hat and h, rstd
    assert got["activations"] == 28 * per_layer * tokens + 2 * layer_weights + per_token_rest * tokens
    # backward's chunk of logits and probabilities with the LM head's fp32 gradient outweighs forward's three buffers
    assert got["log-prob pass"] == 256 * 151936 * (4 + 4) + 151936 * 1024 * 4 > 256 * 151936 * 12
    assert round(sum(got.values()) / GiB, 2) == 18.10  # fits an 80 GB H100


def test_qwen3_1_7b_default_recipe_with_grad_checkpointing_by_hand(monkeypatch):
    monkeypatch.setattr(M, "use_kernels", True)
    got = parts(recipe(grad_checkpointing=True), QWEN3_1_7B, 200, "cuda")
    assert got["weights (fp32)"] + got["gradients (fp32)"] + got["AdamW moments (fp32)"] == 16 * N_1_7B
    assert got["KV cache"] == 9 * 712 * (2 * 28 * 8 * 128 * 2)  # the same cache shape as 0.6B's
    tokens = 5 * 711
    per_layer = (2 * 2048 * 4 + 8 + 3072 * 2 + 48 + 5 * 2048 * 2 + 3072 * 2 + 1024 * 2 + 2048 * 2 + 64
                 + 4 * 6144 * 2)
    one_layer_weights = 2048 * 128 * 48 + 3 * 2048 * 6144
    # checkpointed: every layer's fp32 input, one layer recomputed in backward with its weight casts
    assert got["activations"] == (28 * 2048 * 4 * tokens + per_layer * tokens + 2 * one_layer_weights
                                  + (2 * 128 * 2 + 2 * 2048 * 4 + 4) * tokens)


def test_qwen3_8b_recipe_under_fsdp_on_8_gpus_by_hand(monkeypatch):
    monkeypatch.setattr(M, "use_kernels", True)
    got = parts(recipe(fsdp=True, grad_checkpointing=True, problems_per_step=64), QWEN3_8B, 200, "cuda", world=8)
    assert got["weights (fp32)"] == 4 * N_8B / 8 and got["AdamW moments (fp32)"] == 8 * N_8B / 8
    assert got["sampling copy (bf16)"] == 2 * N_8B  # whole on every rank
    slot = 2 * 36 * 8 * 128 * 2
    # each rank samples 64 / 8 = 8 problems x 8 rows; 4 GiB holds 4 GiB // slot // (8 x 712) = 5 problems a chunk
    assert 4 * GiB // slot // (8 * 712) == 5 and got["KV cache"] == 5 * (8 + 1) * 712 * slot
    assert round(sum(got.values()) / GiB, 1) == 40.6  # fits 80 GB per rank
    alone = parts(recipe(problems_per_step=64), QWEN3_8B, 200, "cuda")  # no --fsdp, no checkpointing, one GPU
    assert sum(alone.values()) / GiB > 150 and max(alone, key=alone.get) == "AdamW moments (fp32)"


def test_the_plain_formulas_keep_the_log_softmax_whole(monkeypatch):
    monkeypatch.setattr(M, "use_kernels", False)
    got = parts(recipe(), QWEN3_0_6B, 200, "cuda")
    # fp32 log-softmax, its exp and their product over 3,555 positions x the vocabulary, and autocast's bf16 head
    assert got["log-prob pass"] == 3555 * 151936 * 12 + 2 * 151936 * 1024


def test_lora_trains_only_its_adapters():
    got = parts(recipe(lora_rank=16), QWEN3_0_6B, 200, "cpu")
    adapters = 16 * 28 * (2 * (1024 + 2048) + 2 * (1024 + 1024) + 3 * (1024 + 3072))
    assert got["gradients (fp32)"] == 4 * adapters and got["weights (fp32)"] == 4 * (N_0_6B + adapters)
    assert "sampling copy (bf16)" not in got  # on a CPU the policy samples itself


# -----------------------------------------------------------------------------
# Against what PyTorch measures on the CPU

SMALL = Qwen3Config(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)


def profiled_peak(fn):
    """The peak of the CPU allocations made while fn runs, from torch.profiler's per-op allocations and frees."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    current = peak = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += e.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def saved_for_backward(net, ids):
    """Bytes of the distinct storages autograd saves during token_logprobs' forward, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    saved = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            saved[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        M.token_logprobs(net, ids)
    return sum(saved.values())


@pytest.mark.parametrize("kernels", [True, False])
def test_activations_within_15_percent_of_what_autograd_saves(kernels, monkeypatch):
    monkeypatch.setattr(M, "use_kernels", kernels)
    torch.manual_seed(0)
    net = M.Qwen3(SMALL).train()
    ids = torch.randint(SMALL.vocab_size, (4, 257))
    tokens = 4 * 256
    measured = saved_for_backward(net, ids)
    plan = memory.activation_bytes(SMALL, tokens, kernels, False, False)
    if not kernels:  # the plain formula also keeps the fp32 log-softmax and its exp: the log-prob pass's
        plan += 8 * tokens * SMALL.vocab_size
    print(f"activations: measured {measured / 2**20:.2f} MiB, plan {plan / 2**20:.2f} MiB")
    assert abs(plan - measured) <= 0.15 * measured


def test_checkpointed_activations_within_15_percent_of_the_profiled_peak(monkeypatch):
    monkeypatch.setattr(M, "use_kernels", True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = M.Qwen3(SMALL).train()
    net.gradient_checkpointing = True
    ids = torch.randint(SMALL.vocab_size, (4, 257))
    net(ids[:, :2]).sum().backward()  # the gradients exist before the measured pass (the plan's gradients part)

    def step():
        logp, _ = M.token_logprobs(net, ids)
        logp.sum().backward()
    peak = profiled_peak(step)
    # the log-prob pass's buffers are freed before backward recomputes the first layer, so the peak is the
    # activations' (the plan adds both: an upper bound)
    plan = memory.activation_bytes(SMALL, 4 * 256, True, False, True)
    print(f"checkpointed forward + backward: measured peak {peak / 2**20:.2f} MiB, plan {plan / 2**20:.2f} MiB")
    assert abs(plan - peak) <= 0.15 * peak


@pytest.mark.parametrize("group", [4, 8])
def test_kv_cache_within_15_percent_of_the_profiled_peak_of_generate(group):
    import sample
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    net = M.Qwen3(config).eval()
    prompts = [list(range(1, 1 + n)) for n in (40, 33, 25, 12)]
    peak = profiled_peak(lambda: sample.generate(net, prompts, 64, n=group, seed=0))
    plan, rows = memory.sampling_cache_bytes(config, 4, group, 40 + 64, 4)
    print(f"KV cache, G={group}: measured peak {peak / 2**20:.3f} MiB, plan {plan / 2**20:.3f} MiB")
    assert rows == 4 and abs(plan - peak) <= 0.15 * peak


# -----------------------------------------------------------------------------
# A run that cannot fit stops before loading


def shape_only_checkpoint(path, config):
    """A model directory with config.json and the tokenizer, and no weights: loading it would fail."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    shutil.copy(ROOT / "data" / "qwen3-tokenizer" / "tokenizer.json", path / "tokenizer.json")
    for name in ("tokenizer_config.json",):
        if (ROOT / "data" / "qwen3-tokenizer" / name).is_file():
            shutil.copy(ROOT / "data" / "qwen3-tokenizer" / name, path / name)
    return path


def test_the_8b_shape_on_a_24gb_device_stops_with_one_line_before_loading(tmp_path):
    model_dir = shape_only_checkpoint(tmp_path / "qwen3-8b-shape", QWEN3_8B)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "train_rl.py", "--model", str(model_dir), "--device", "cpu",
                        "--device-memory-gb", "24", "--num-problems", "8", "--val-size", "0", "--threads", "1",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train_rl.py: error: memory plan: "), r.stderr
    assert "exceeds the device's 24.0 GiB" in lines[0] and "AdamW moments" in lines[0] and "--fsdp" in lines[0]
    assert "memory plan (cpu, GiB)" in r.stdout and "total" in r.stdout
    assert not out.exists()  # nothing written, no weights opened (there are none)


def test_evaluation_plan_by_hand_continuous_on_a_gpu_and_chunks_on_a_cpu():
    gpu = {p.name: p.bytes for p in memory.evaluation_plan(QWEN3_0_6B, 64, 1, 300, 2048, 2, continuous=True)}
    # 64 rows of 300 + 2 x 2048 slots (generate_slots' room), and a join copying up to 3/4 of them
    assert gpu == {"weights (bf16)": 2 * N_0_6B, "KV cache": 1.75 * 64 * (300 + 4096) * (2 * 28 * 8 * 128 * 2),
                   "decode logits": 64 * 151936 * (2 + 8)}
    cpu = {p.name: p.bytes for p in memory.evaluation_plan(QWEN3_0_6B, 64, 1, 300, 2048, 4, continuous=False)}
    slot = 2 * 28 * 8 * 128 * 4
    assert 4 * GiB // slot // 2348 == 7 and cpu["KV cache"] == 7 * 2348 * slot  # 7 prompts a 4 GiB chunk


def test_evaluate_stops_with_one_line_before_loading(tmp_path):
    model_dir = shape_only_checkpoint(tmp_path / "qwen3-8b-shape", QWEN3_8B)
    out = tmp_path / "eval"
    r = subprocess.run([sys.executable, "evaluate.py", "--model", str(model_dir), "--device", "cpu", "--limit", "4",
                        "--device-memory-gb", "24", "--threads", "1", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("evaluate.py: error: memory plan: ")
    assert "largest part is the weights (fp32)" in r.stderr and "memory plan (cpu, GiB)" in r.stderr
    assert not (out / "records.jsonl").exists()


# -----------------------------------------------------------------------------
# The README's table: the plan of its recipes (the longest of the first 50 Algebra prompts is 176 tokens)

README_RECIPES = [("0.6B, 1 GPU", QWEN3_0_6B, recipe(), 1), ("1.7B, 1 GPU", QWEN3_1_7B, recipe(), 1),
                  ("8B, 1 GPU", QWEN3_8B, recipe(problems_per_step=64), 1),
                  ("8B, 8 GPUs --fsdp --grad-checkpointing, per GPU", QWEN3_8B,
                   recipe(fsdp=True, grad_checkpointing=True, problems_per_step=64), 8)]


def readme_table():
    plans = [parts(cfg, c, 176, "cuda", world) for _, c, cfg, world in README_RECIPES]
    names = list(dict.fromkeys(name for p in plans for name in p))
    lines = ["| GiB | " + " | ".join(r[0] for r in README_RECIPES) + " |", "|---" * (len(plans) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(f"{p[name] / GiB:.1f}" if name in p else "-" for p in plans) + " |"
              for name in names]
    return "\n".join(lines + ["| total | " + " | ".join(f"{sum(p.values()) / GiB:.1f}" for p in plans) + " |"])


def test_the_readme_shows_the_plan_of_its_recipes():
    table = readme_table()
    assert table in (ROOT / "README.md").read_text(), f"README.md's memory plan table is now:\n{table}"


def test_ignore_memory_plan_goes_on_to_loading(tmp_path):
    model_dir = shape_only_checkpoint(tmp_path / "qwen3-8b-shape", QWEN3_8B)
    r = subprocess.run([sys.executable, "train_rl.py", "--model", str(model_dir), "--device", "cpu",
                        "--device-memory-gb", "24", "--ignore-memory-plan", "--num-problems", "8", "--val-size", "0",
                        "--threads", "1", "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 2 and "memory plan (cpu, GiB)" in r.stdout
    assert "memory plan:" not in r.stderr and str(model_dir) in r.stderr  # it went on, to the missing weights
