"""
Where an RL step's time goes: sampling / verifying / training seconds per step, side by side.

Qwen3-0.6B shape with random fp32 weights on the CPU (the real tokenizer and MATH training problems),
few tokens per step so it runs in minutes. Random weights earn no reward, so every group is kept
(--no-skip-uniform-groups) and the update runs at full cost.

    python benchmarks/bench_train.py            # Qwen3-0.6B shape
    python benchmarks/bench_train.py --quick    # a small shape, seconds
    python benchmarks/bench_train.py --kernels --layers 6 --threads 1   # model.py's formulas against --kernels

--kernels times each arm in turn, the formulas (the default) and model_kernels.py (train_rl.py --kernels), on the same
model: RL steps (ABBA order, so a busy machine hits both alike), then generate at batch 32 (P=4 x G=8, 32 new
tokens), then the README's main command (--model tiny, --main-steps steps, 1 thread, each arm a fresh process, ABBA);
it prints each arm's medians and their ratios.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import checkpoint  # noqa: E402
import model as M  # noqa: E402
import problems as P  # noqa: E402
import sample as S  # noqa: E402
import train_rl as T  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--problems-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=0, help="decoder layers of the 0.6B shape (0: its 28)")
    ap.add_argument("--kernels", action="store_true", help="model.py's formulas against model_kernels.py, side by side")
    ap.add_argument("--main-steps", type=int, default=10, help="--kernels: steps of the main command per arm (0: none)")
    ap.add_argument("--main-only", action="store_true", help="--kernels: only the main command")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = M.Qwen3Config(num_hidden_layers=2, hidden_size=128, intermediate_size=384) if args.quick else M.Qwen3Config()
    if args.layers:
        config.num_hidden_layers = args.layers
    torch.manual_seed(0)
    policy = M.Qwen3(config).float().eval()
    tokenizer = checkpoint.load_tokenizer(checkpoint.DEFAULT_MODEL)
    cfg = T.Config(problems_per_step=args.problems_per_step, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                   skip_zero_advantage=False, device="cpu", samples_per_step=0)
    train_set = P.load_problems("math_train", limit=50)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    run = T.Run(cfg=cfg, policy=policy, sampler=policy, reference=None, optimizer=optimizer, tokenizer=tokenizer,
                train_set=train_set, device="cpu", selection={})
    totals = dict(generated_tokens=0, training_tokens=0, flops=0.0)
    if args.kernels:
        return compare_kernels(run, args)
    rows = []
    for step in range(args.steps + 1):  # the first step warms up and is not counted
        _, m = T.rl_step(run, step, totals)
        totals = {k: m[k] for k in totals}
        if step:
            rows.append(m)
            print(f"step {step}: sampling {m['sampling_seconds']:.1f}s, verifying {m['verifying_seconds']:.2f}s, "
                  f"training {m['training_seconds']:.1f}s ({m['generated_tokens'] // (step + 1)} tokens/step)", flush=True)
    med = {k: statistics.median(r[f"{k}_seconds"] for r in rows) for k in ("sampling", "verifying", "training")}
    total = sum(med.values())
    print(f"{M.count_parameters(config) / 1e6:.0f}M params, P={cfg.problems_per_step} x G={cfg.group_size}, "
          f"{cfg.max_new_tokens} new tokens max, {args.threads} threads; median seconds per step:")
    for k, v in med.items():
        print(f"  {k:<10} {v:7.2f} s  {v / total:6.1%}")


def ratio_line(name, on, off):
    """Each arm's median seconds and the ratio formulas / kernels (> 1: the kernels are faster)."""
    a, b = statistics.median(off), statistics.median(on)
    print(f"  {name:<28} formulas {a:8.2f} s   kernels {b:8.2f} s   formulas / kernels {a / b:5.2f}", flush=True)


def compare_kernels(run, args):
    """--kernels: the same RL steps, generate calls and main-command runs, alternating model.use_kernels."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"
    print(f"{cpu}, {args.threads} threads, torch {torch.__version__}; {run.policy.config.num_hidden_layers} layers of "
          f"the 0.6B widths, fp32; medians of {args.steps} per arm", flush=True)
    times = {k: {True: [], False: []} for k in ("sampling", "training", "generate")}
    totals = dict(generated_tokens=0, training_tokens=0, flops=0.0)
    if args.main_only:
        return compare_main_command(args)
    T.rl_step(run, 0, totals)  # warm-up
    for step in range(1, args.steps + 1):
        for kernels in ((True, False) if step % 2 else (False, True)):
            M.use_kernels = kernels
            _, m = T.rl_step(run, step, totals)
            times["sampling"][kernels].append(m["sampling_seconds"])
            times["training"][kernels].append(m["training_seconds"])
    prompts = [run.tokenizer.encode(P.format_prompt(p["problem"])) for p in run.train_set[:4]]
    for r in range(args.steps + 1):
        for kernels in ((True, False) if r % 2 else (False, True)):
            M.use_kernels = kernels
            t0 = time.perf_counter()
            S.generate(run.sampler, prompts, 32, temperature=1.0, n=8, seed=r)
            if r:  # the first round warms up
                times["generate"][kernels].append(time.perf_counter() - t0)
    M.use_kernels = False
    ratio_line(f"RL step: sampling (P={args.problems_per_step} x G={args.group_size})", times["sampling"][True],
               times["sampling"][False])
    ratio_line("RL step: training", times["training"][True], times["training"][False])
    ratio_line("generate, batch 32, 32 tokens", times["generate"][True], times["generate"][False])
    if args.main_steps:
        compare_main_command(args)


def compare_main_command(args):
    """The README's main command cut to --main-steps steps, each arm a fresh process, ABBA; its seconds sampling and
    training summed over the steps."""
    main = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r, kernels in enumerate((True, False, False, True)):
            out = Path(tmp) / f"run{r}"
            subprocess.run([sys.executable, "train_rl.py", "--objective", "drgrpo", "--model", "tiny", "--threads", "1",
                            "--steps", str(args.main_steps), "--test-dataset", "", "--eval-every", "0",
                            "--save-every", "0", "--out", str(out), *(["--kernels"] if kernels else [])],
                           cwd=ROOT, check=True, capture_output=True)
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            main[kernels].append(sum(m["sampling_seconds"] + m["training_seconds"] for m in rows))
            print(f"  main command run {r} ({'kernels' if kernels else 'formulas'}): loss at step {args.main_steps} "
                  f"{rows[-1]['loss']:.6f}", flush=True)
    ratio_line(f"main command, {args.main_steps} steps", main[True], main[False])


if __name__ == "__main__":
    main()
