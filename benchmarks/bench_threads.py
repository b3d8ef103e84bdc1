"""
How many torch CPU threads a training step wants, alone and on a loaded machine, side by side.

    python benchmarks/bench_threads.py              # tiny world and Qwen3-0.6B shape, 1 and 2 threads, idle and loaded
    python benchmarks/bench_threads.py --quick      # the tiny world only, fewer steps

Each measurement is one subprocess that runs train_rl.rl_step a few times with torch.set_num_threads(N) and reports
the median seconds of the steps after the first. "Loaded" runs a busy process (a Python spin loop, one core's
worth) beside it, as a second job on a 2-core machine does. Configurations are run in rotated order each repeat,
and the table gives medians over repeats and the ratio to 1 thread under the same load.
The workloads: the tiny world's main command shape (16 problems x 8 samples, 64 new tokens, committed checkpoint),
and the real shape (Qwen3-0.6B-Base's config with random fp32 weights, the real tokenizer, 1 problem x 4 samples,
16 new tokens, MATH problems: a slice of the real step, its matmuls at full width).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads({threads})
import checkpoint, problems, train_rl as T
from model import Qwen3, Qwen3Config
if {tiny}:
    policy, tok = checkpoint.load_model("tiny", torch.float32, "cpu"), checkpoint.load_tokenizer("tiny")
    cfg = T.parse_args(["--model", "tiny", "--device", "cpu", "--dispersion-every", "0"])
    pool = problems.load_problems("tiny_train", 400)
else:
    torch.manual_seed(0)
    policy, tok = Qwen3(Qwen3Config()).float().eval(), checkpoint.load_tokenizer(checkpoint.DEFAULT_MODEL)
    cfg = T.Config(problems_per_step=1, group_size=4, max_new_tokens=16, skip_zero_advantage=False, device="cpu",
                   dispersion_every=0)
    pool = problems.load_problems("math_train", 20)
opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
run = T.Run(cfg=cfg, policy=policy, sampler=policy, reference=None, optimizer=opt, tokenizer=tok, train_set=pool,
            device="cpu", selection={{}})
totals, times = dict(generated_tokens=0, training_tokens=0, flops=0.0), []
for step in range({steps}):
    t0 = time.time()
    _, m = T.rl_step(run, step, totals)
    times.append(time.time() - t0)
print(json.dumps(dict(step=statistics.median(times[1:]), sampling=m["sampling_seconds"],
                      training=m["training_seconds"])))
"""


def measure(tiny, threads, loaded, steps):
    """Median seconds per step of one configuration, in a fresh process (with a spin loop beside it if loaded)."""
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
    try:
        code = CHILD.format(root=str(ROOT), threads=threads, tiny=tiny, steps=steps)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["step"]
    finally:
        if load is not None:
            load.kill()
            load.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the tiny world only, 4 steps, 2 repeats")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="steps per measurement (the first is not counted)")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps = 2, 4
    workloads = [("tiny world (16 x 8, 64 tokens)", True)] + ([] if args.quick else
                                                              [("Qwen3-0.6B shape (1 x 4, 16 tokens)", False)])
    configs = [(name, tiny, threads, loaded) for name, tiny in workloads for loaded in (False, True)
               for threads in (1, 2)]
    results = {c: [] for c in configs}
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    bf16 = "native bf16 (AMX / AVX-512 BF16)" if ("amx_bf16" in cpu or "avx512_bf16" in cpu) else "no native bf16"
    print(f"CPU: {model}, {os.cpu_count()} cores, {bf16}; torch threads 1 and 2, idle and beside a spin loop",
          flush=True)
    for r in range(args.repeats):
        for c in configs[r % len(configs):] + configs[:r % len(configs)]:  # rotated: no config always runs first
            t0 = time.time()
            results[c].append(measure(c[1], c[2], c[3], args.steps))
            print(f"  repeat {r + 1}: {c[0]}, {c[2]} thread(s), {'loaded' if c[3] else 'idle'}: "
                  f"{results[c][-1]:.2f} s/step ({time.time() - t0:.0f} s)", flush=True)
    print("\n| workload | machine | 1 thread (s/step) | 2 threads (s/step) | 2 threads / 1 thread |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, tiny in workloads:
        for loaded in (False, True):
            one, two = (statistics.median(results[(name, tiny, t, loaded)]) for t in (1, 2))
            print(f"| {name} | {'loaded (a spin loop beside it)' if loaded else 'idle'} | {one:.2f} | {two:.2f} | "
                  f"{two / one:.2f}x |")


if __name__ == "__main__":
    main()
