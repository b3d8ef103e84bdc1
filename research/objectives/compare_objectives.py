"""
Every objective on the embedded tiny world, side by side: a short run per objective and seed from the
committed checkpoint, then greedy accuracy and direct-answer share on tiny_test before and after.

    python research/objectives/compare_objectives.py             # every objective x seeds 0-2, 12 steps x 8 problems (~9 min)
    python research/objectives/compare_objectives.py --quick     # drgrpo and grpo, seed 0, 4 steps (a smoke test)
    python research/objectives/compare_objectives.py --epochs-per-batch 4   # any other flag goes to every train_rl run
    python research/report.py runs/objectives/*/final_eval --by objective --out runs/report/objectives  # the same, with intervals

Every run uses the tiny world's defaults from train_rl.py (G = 8, lr 1e-4, 64 new tokens) and each
objective's own flag defaults (e.g. DAPO's clip-higher and dynamic sampling); only the objective and the
seed change. All seeds are printed, none dropped. Each run stays in --keep DIR (runs/objectives) with its
evaluation of final/ in final_eval/ (evaluate.py's records and summary), which report.py reads.
"""

import argparse
import contextlib
import functools
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the core, and research.*
import checkpoint  # noqa: E402
import evaluate as E  # noqa: E402
from objectives import OBJECTIVES  # noqa: E402
import problems as P  # noqa: E402
import train_rl as T  # noqa: E402

def greedy_test(model_path, n_test, out_dir=None):
    """(greedy accuracy, direct-answer share, mean response tokens) on the first n_test tiny_test problems;
    with out_dir the evaluation's records and summary are written there (report.py reads them)."""
    test = P.load_problems("tiny_test", limit=n_test)
    tokenizer = checkpoint.load_tokenizer(model_path)
    records, summary = E.evaluate(checkpoint.load_model(model_path, device="cpu"), tokenizer, test,
                                  max_new_tokens=64, batch_size=n_test, out_dir=out_dir, dataset="tiny_test")
    direct = sum(T.is_direct_answer(r["response"]) for r in records) / len(records)
    length = statistics.mean(len(tokenizer.encode(r["response"])) for r in records)
    return summary["accuracy"], direct, length


@functools.cache
def start_test(model_path, n_test):
    """greedy_test of the starting checkpoint, once per process: every run starts from the same weights."""
    return greedy_test(model_path, n_test)


def rl_effect(objective, seed, out, steps=12, problems_per_step=8, n_test=200, model="tiny", flags=()):
    """Greedy tiny_test (accuracy, direct share, length) before and after a short run of `objective`;
    `flags` are more train_rl.py flags for every run (e.g. --epochs-per-batch 4)."""
    cfg = T.parse_args(["--model", "tiny", "--objective", objective, "--steps", str(steps), "--problems-per-step",
                        str(problems_per_step), "--eval-every", "0", "--test-dataset", "", "--save-every", "0",
                        "--seed", str(seed), "--device", "cpu", "--out", str(out), *flags])
    cfg.model = str(model)
    with contextlib.redirect_stdout(io.StringIO()):  # the per-step lines of every run would drown the table
        run = T.train(cfg)
    return start_test(model, n_test), greedy_test(run / "final", n_test, out_dir=run / "final_eval")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--problems-per-step", type=int, default=8)
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="tiny", help="start from this checkpoint (the tiny world's settings apply)")
    ap.add_argument("--out", default="", help="also write the rows as JSON here")
    ap.add_argument("--keep", default="runs/objectives", help="run directories (each with final_eval/); '' keeps none")
    args, flags = ap.parse_known_args()  # the rest go to train_rl.py, e.g. --epochs-per-batch 4
    if args.quick:
        args.objectives, args.seeds, args.steps, args.n_test = "drgrpo,grpo", "0", 4, 100
    torch.set_num_threads(args.threads)
    objectives, seeds = args.objectives.split(","), [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for objective in objectives:
            for seed in seeds:
                t0 = time.time()
                run = Path(args.keep or tmp) / f"{objective}{''.join(flags).replace('--', '-')}-s{seed}"
                if run.exists():
                    raise SystemExit(f"compare_objectives.py: error: {run} exists; remove it or pass another --keep")
                before, after = rl_effect(objective, seed, run, args.steps,
                                          args.problems_per_step, args.n_test, args.model, flags)
                rows.append(dict(objective=objective, seed=seed, before=before, after=after, seconds=time.time() - t0))
                print(f"{objective} seed {seed}: accuracy {before[0]:.3f} -> {after[0]:.3f}, direct share "
                      f"{before[1]:.2f} -> {after[1]:.2f}, length {before[2]:.0f} -> {after[2]:.0f} "
                      f"({rows[-1]['seconds']:.0f}s)", flush=True)
    print(f"\n{args.steps} steps x {args.problems_per_step} problems x G=8 {' '.join(flags)}, greedy on {args.n_test} tiny_test "
          f"problems; before: accuracy {rows[0]['before'][0]:.3f}, direct share {rows[0]['before'][1]:.2f}\n")
    print(f"| objective | accuracy after, seeds {' / '.join(map(str, seeds))} | mean gain (points) | direct share after "
          f"| length after |")
    print("|---|---|---:|---:|---:|")
    for objective in objectives:  # the README's table rows
        mine = [r for r in rows if r["objective"] == objective]
        accs = " / ".join(f"{100 * r['after'][0]:.1f}%" for r in mine)
        gain = statistics.mean(100 * (r["after"][0] - r["before"][0]) for r in mine)
        direct = statistics.mean(r["after"][1] for r in mine)
        length = statistics.mean(r["after"][2] for r in mine)
        print(f"| `{objective}` | {accs} | {gain:+.1f} | {direct:.2f} | {length:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
