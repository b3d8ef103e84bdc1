"""
Training-step throughput and peak memory of our Qwen3 against transformers' Qwen3ForCausalLM.

What RL training computes: forward + backward of a loss on the per-token log-probs of the chosen tokens,
loss = -mean_t(A_b * log p(x[t+1] | x[:t+1])) with a random advantage A_b per sequence.
- ours:         model.token_logprobs (chunked LM head; the (B, T, vocab) logits never exist at once)
- transformers: Qwen3ForCausalLM(ids).logits -> .float().log_softmax(-1) -> gather (what a user writes)

Both get the same random bf16 weights on CPU. Each implementation lives in its own worker process, so
one's allocations cannot inflate the other's peak, and the parent alternates their steps (ABBA order),
so background load on a shared machine hits both alike. Memory = peak RSS during the measured steps
minus RSS after building the model (Linux: the kernel's peak mark VmHWM is reset through
/proc/self/clear_refs once the model is built; elsewhere ru_maxrss, which then includes setup).

On a CPU shared with other jobs, absolute tokens/s swing a lot between runs: with 2 threads every
parallel op waits for the slower thread. Compare the ratio, from interleaved steps; it moves too, in
our favour when the machine is busy, since we run fewer, larger ops.

    python benchmarks/bench_model.py               # Qwen3-0.6B shape, batch 4 x 256 (several minutes)
    python benchmarks/bench_model.py --quick       # a small shape, seconds
    python benchmarks/bench_model.py --threads 1   # the compute-bound view, free of thread contention
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere: import model.py

import torch

import model as qwen3

IMPLS = ("ours", "transformers")


def config_for(quick):
    if quick:
        return qwen3.Qwen3Config(vocab_size=32768, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    return qwen3.Qwen3Config()  # Qwen3-0.6B


def _status_bytes(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_peak_rss():
    """Reset the kernel's peak-RSS mark to the current RSS; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def build(impl, config, seed=0):
    """The model built directly in bf16 (no fp32 copy), with the same random weights for both impls."""
    torch.manual_seed(seed)
    with torch.device("meta"):
        ours = qwen3.Qwen3(config)
    ours = ours.to_empty(device="cpu").to(torch.bfloat16)
    if config.tie_word_embeddings:
        ours.lm_head.weight = ours.model.embed_tokens.weight  # to_empty unties shared parameters
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else torch.randn_like(p) * 0.02)
    if impl == "ours":
        return ours
    from transformers import Qwen3Config as HFConfig, Qwen3ForCausalLM
    hf_config = HFConfig(**{k: v for k, v in config.to_hf_dict().items() if k not in ("torch_dtype", "rope_theta")},
                         rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta})
    with torch.device("meta"):
        hf = Qwen3ForCausalLM(hf_config)
    hf = hf.to_empty(device="cpu").to(torch.bfloat16)
    if config.tie_word_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    hf.load_state_dict(ours.state_dict())
    # the rotary frequencies: a non-persistent fp32 buffer that from_pretrained would have computed
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2).float() / config.head_dim)
    hf.model.rotary_emb.register_buffer("inv_freq", inv_freq, persistent=False)
    hf.model.rotary_emb.original_inv_freq = inv_freq
    return hf


def token_logprobs(impl, model, ids):
    if impl == "ours":
        return qwen3.token_logprobs(model, ids)[0]  # (B, T-1)
    logits = model(input_ids=ids[:, :-1], use_cache=False).logits  # (B, T-1, vocab), bf16
    return logits.float().log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def train_step(impl, model, ids, adv):
    """One RL step's compute; returns the loss as a float, so nothing of this step outlives it (a live
    loss tensor keeps its spent graph's small allocations scattered through the heap, which raises the
    next step's peak RSS by ~0.5 GiB for either implementation)."""
    loss = -(token_logprobs(impl, model, ids) * adv).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)  # what an optimizer step + zero_grad leave behind
    return loss.item()


def worker(impl, quick, batch, seq, threads):
    """Build the model, then run one training step per 'step' line on stdin; 'done' reports the peak."""
    torch.set_num_threads(threads)
    config = config_for(quick)
    model = build(impl, config).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(config.vocab_size, (batch, seq + 1), generator=g)
    adv = torch.randn(batch, 1, generator=g)
    base = _status_bytes("VmRSS")
    reset_ok = reset_peak_rss()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "done":
            break
        t0 = time.perf_counter()
        loss = train_step(impl, model, ids, adv)
        print(json.dumps({"step_s": time.perf_counter() - t0, "loss": loss}), flush=True)
    peak = _status_bytes("VmHWM") if reset_ok else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"base": base, "peak": peak - base,
                      "method": "VmHWM reset after setup" if reset_ok else "ru_maxrss, includes setup"}), flush=True)


class Worker:
    def __init__(self, impl, args, batch, seq):
        cmd = [sys.executable, __file__, "--worker", impl, "--batch", str(batch), "--seq", str(seq),
               "--threads", str(args.threads)] + (["--quick"] if args.quick else [])
        self.impl, self.steps, self.losses = impl, [], []
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.read()  # ready

    def read(self):
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"{self.impl} worker died (exit code {self.proc.wait()})")
        return json.loads(line)

    def step(self, measured=True):
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        r = self.read()
        if measured:
            self.steps.append(r["step_s"])
        self.losses.append(r["loss"])

    def finish(self):
        self.proc.stdin.write("done\n")
        self.proc.stdin.flush()
        r = self.read()
        self.proc.wait()
        return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small shape that runs in seconds")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 4; 2 with --quick)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 256; 128 with --quick)")
    p.add_argument("--iters", type=int, default=5, help="measured steps per implementation, after 1 warm-up")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in each worker")
    p.add_argument("--worker", choices=IMPLS, default=None, help=argparse.SUPPRESS)  # internal
    args = p.parse_args()
    batch = args.batch or (2 if args.quick else 4)
    seq = args.seq or (128 if args.quick else 256)
    if args.worker:
        return worker(args.worker, args.quick, batch, seq, args.threads)

    c = config_for(args.quick)
    print(f"shape: {'quick' if args.quick else 'Qwen3-0.6B'} (hidden {c.hidden_size}, {c.num_hidden_layers} layers, "
          f"vocab {c.vocab_size}, {qwen3.count_parameters(c) / 1e6:.1f}M params), random bf16 weights, CPU, "
          f"torch.set_num_threads({args.threads}), batch {batch} x {seq} tokens")
    print(f"step: forward + backward of -mean(A * log p(chosen token)); tokens/s = batch x seq / median step "
          f"time of {args.iters} steps after 1 warm-up, the two implementations' steps alternating ABBA")
    workers = [Worker(impl, args, batch, seq) for impl in IMPLS]  # built one after the other
    for w in workers:
        w.step(measured=False)
    for i in range(args.iters):
        for w in (workers if i % 2 == 0 else workers[::-1]):
            w.step()
    results = {}
    for w in workers:
        r = results[w.impl] = {**w.finish(), "tokens_per_s": batch * seq / statistics.median(w.steps)}
        print(f"{w.impl:>12}: {r['tokens_per_s']:7.1f} tokens/s (steps {', '.join(f'{t:.2f}' for t in w.steps)} s), "
              f"peak memory {r['peak'] / 2**30:.2f} GiB above the {r['base'] / 2**30:.2f} GiB after setup, "
              f"loss {w.losses[0]:.5f}")
    print(f"memory: each implementation in its own process; {results['ours']['method']}; peak RSS during the "
          f"steps minus RSS after building the model (weights, inputs, libraries); no tensor outlives its step")
    ours, hf = results["ours"], results["transformers"]
    # each measured step of one implementation ran right next to one of the other (ABBA), under about
    # the same background load: the median of those paired ratios is robust to load changing mid-run
    paired = statistics.median(h / o for o, h in zip(workers[0].steps, workers[1].steps))
    target = "" if args.quick else " (target: speed >= 1.2x, memory <= 0.8x)"
    print(f"ours / transformers: speed {paired:.2f}x (median of paired step-time ratios; ratio of the medians "
          f"{ours['tokens_per_s'] / hf['tokens_per_s']:.2f}x), peak memory {ours['peak'] / hf['peak']:.2f}x{target}")


if __name__ == "__main__":
    main()
