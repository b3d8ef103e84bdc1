"""
Where an RL step's time goes: sampling / verifying / training seconds per step, side by side.

Qwen3-0.6B shape with random fp32 weights on the CPU (the real tokenizer and MATH training problems),
few tokens per step so it runs in minutes. Random weights earn no reward, so every group is kept
(--no-skip-uniform-groups) and the update runs at full cost.

    python benchmarks/bench_train.py            # Qwen3-0.6B shape
    python benchmarks/bench_train.py --quick    # a small shape, seconds
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import checkpoint  # noqa: E402
import model as M  # noqa: E402
import problems as P  # noqa: E402
import train_rl as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--problems-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = M.Qwen3Config(num_hidden_layers=2, hidden_size=128, intermediate_size=384) if args.quick else M.Qwen3Config()
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


if __name__ == "__main__":
    main()
