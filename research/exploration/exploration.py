"""
Better objectives and exploration on the tiny ladder, against plain Dr. GRPO at the same rollouts, with the two
reward controls: the pass-rate curriculum, replay of rare successes, W-REINFORCE, the pass@k advantage
(train_rl.py flags, curriculum.py), and the random and format rewards.

    python research/exploration/exploration.py run              # every method x seeds 0-2 (one JSON per run, resumable)
    python research/exploration/exploration.py run --methods baseline,replay --seeds 0   # a subset (e.g. a second process)
    python research/exploration/exploration.py table            # the README table from the JSONs written so far
    python research/exploration/exploration.py run --quick      # small shapes: a smoke test, not a measurement
    python research/exploration/exploration.py validate         # write final_eval/ into runs kept from before, checked
    python research/report.py runs/exploration/*/final_eval --by objective,select,replay_fraction,reward  # with intervals

Every run: `--model M --dataset tiny_ladder_train` with the ladder's defaults (16 problems x 8 samples a step,
lr 1e-4, 128 new tokens, the step check as the reward), the same first --questions training problems (uniform
over the rungs), the same steps and so the same number of generated rollouts; only the method's flags differ.
Validation: greedy, step-checked, on the first --val problems of tiny_ladder_val (the rungs take turns), at
the end, and pass@8 (8 samples at temperature 1) on its first --passk-val, both kept in the run directory
(final_eval/, final_eval_pass8/) for report.py. Compute is train_rl's running totals (rollouts and training;
validation left out).
"""

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the core, and research.*
import checkpoint  # noqa: E402
import evaluate as E  # noqa: E402
import problems as P  # noqa: E402
import tiny  # noqa: E402
import train_rl as T  # noqa: E402

METHODS = {  # name -> the train_rl.py flags that make it; everything else is the baseline's
    "baseline": ["--objective", "drgrpo"],
    "pass_rate": ["--objective", "drgrpo", "--select", "pass_rate"],
    "replay": ["--objective", "drgrpo", "--replay-fraction", "0.25"],
    "w_reinforce": ["--objective", "w_reinforce"],
    "passk": ["--objective", "passk", "--passk-k", "4"],
    "random_reward": ["--objective", "drgrpo", "--reward", "random"],
    "format_reward": ["--objective", "drgrpo", "--reward", "format"],
}
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}  # two-sided 95% Student t quantiles by degrees of freedom


def run_one(method, seed, args, out):
    """Train, then greedy per-rung accuracy and per-rung pass@8; the result as a dict (also written to JSON)."""
    run_dir = out / f"{method}-s{seed}"
    cfg = T.parse_args(["--model", args.model, "--dataset", "tiny_ladder_train", "--steps", str(args.steps),
                        "--num-problems", str(args.questions), "--eval-every", "0", "--save-every", "0",
                        "--test-dataset", "", "--seed", str(seed), "--device", "cpu", "--out", str(run_dir),
                        *METHODS[method], *args.flags])
    t0 = time.time()
    with contextlib.redirect_stdout(io.StringIO()):  # the per-step lines of every run would drown the table
        T.train(cfg)
    seconds = time.time() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "reward_mean" in r]
    result = dict(method=method, seed=seed, flags=METHODS[method] + args.flags, steps=args.steps, model=args.model,
                  problems_per_step=cfg.problems_per_step, group_size=cfg.group_size,
                  questions=args.questions, seconds=seconds, generated_tokens=steps[-1]["generated_tokens"],
                  training_tokens=steps[-1]["training_tokens"], flops=steps[-1]["flops"],
                  accuracy_true=statistics.mean(r["accuracy"] for r in steps),
                  reward=statistics.mean(r["reward_mean"] for r in steps),
                  dispersion=[r["group_dispersion"] for r in steps if "group_dispersion" in r],
                  **validate(run_dir, args))
    (out / f"{method}-s{seed}.json").write_text(json.dumps(result) + "\n")
    return result


def validate(run_dir, args):
    """Greedy per-rung accuracy and per-rung pass@8 of run_dir/final; the evaluations' records and summaries go
    to run_dir/final_eval and run_dir/final_eval_pass8 (evaluate.py's layout), which report.py reads."""
    net, tok = checkpoint.load_model(run_dir / "final", device="cpu"), checkpoint.load_tokenizer(run_dir / "final")
    val = P.load_problems("tiny_ladder_val", args.val)
    kw = dict(group_by="level", grader="steps", dataset="tiny_ladder_val")
    _, greedy = E.evaluate(net, tok, val, tiny.LADDER_MAX_NEW_TOKENS, out_dir=run_dir / "final_eval", **kw)
    records, sampled = E.evaluate(net, tok, val[:args.passk_val], tiny.LADDER_MAX_NEW_TOKENS, samples=8,
                                  temperature=1.0, seed=1234, out_dir=run_dir / "final_eval_pass8", **kw)
    return dict(greedy={str(k): v["accuracy"] for k, v in greedy["per_group"].items()},
                greedy_all=greedy["accuracy"], pass8_all=sampled["pass_at_k"]["pass@8"],
                pass8={str(lv): statistics.mean(r["n_correct"] > 0 for r in records if r["level"] == lv)
                       for lv in sorted({r["level"] for r in records})})


def backfill(out, args):
    """Write final_eval/ and final_eval_pass8/ for runs made before validate() kept them, and check that they
    reproduce the numbers in each run's JSON (greedy and the seeded samples are deterministic)."""
    for path in sorted(out.glob("*-s*.json")):
        saved, run_dir = json.loads(path.read_text()), out / path.stem
        if not (run_dir / "final").is_dir():
            print(f"{run_dir}: no final/ kept; skipped")
            continue
        again = validate(run_dir, args)
        same = all(again[k] == saved[k] for k in again)
        print(f"{run_dir}: {'reproduces' if same else 'DIFFERS FROM'} {path.name}", flush=True)


def interval(xs):
    """Mean and the 95% t interval half-width over seeds (nan with one seed)."""
    m = statistics.mean(xs)
    return m, (T_95.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))


def print_table(out, levels=tiny.LADDER_LEVELS):
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*-s*.json"))]
    by = {m: sorted((r for r in results if r["method"] == m), key=lambda r: r["seed"]) for m in METHODS}
    by = {m: rs for m, rs in by.items() if rs}
    if not by:
        print(f"no results in {out}")
        return
    fmt = lambda xs: "{:.2f} ± {:.2f}".format(*interval(xs)) if len(xs) > 1 else f"{xs[0]:.2f}"  # noqa: E731
    first = next(iter(by.values()))[0]
    print(f"\n{first['model']}: {first['steps']} steps x {first['problems_per_step']} problems x {first['group_size']} "
          f"samples on the first {first['questions']} tiny_ladder_train problems; mean over seeds ± 95% t half-width; "
          f"greedy step-valid accuracy per rung, pass@8 over all\n")
    print("| method | seeds | generated tokens | FLOPs | train seconds (shared CPU) | train accuracy | "
          + " | ".join(f"rung {lv}" for lv in levels) + " | all rungs | pass@8 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in levels) + " | ---: | ---: |")
    for m, rs in by.items():
        print(f"| {m} | {len(rs)} | {statistics.mean(r['generated_tokens'] for r in rs):,.0f} | "
              f"{statistics.mean(r['flops'] for r in rs):.2e} | {statistics.mean(r['seconds'] for r in rs):.0f} | "
              f"{fmt([r['accuracy_true'] for r in rs])} | "
              + " | ".join(fmt([r["greedy"].get(str(lv), 0.0) for r in rs]) for lv in levels)
              + f" | {fmt([r['greedy_all'] for r in rs])} | {fmt([r['pass8_all'] for r in rs])} |")
    if "baseline" not in by:
        return
    base = {r["seed"]: r for r in by["baseline"]}
    print("\npaired by seed against the baseline (same data order and sampling seeds): mean difference of greedy "
          "accuracy over all rungs ± 95% t half-width, and per rung where it exceeds the seed spread\n")
    print("| method | difference, all rungs | pass@8 difference | rungs where the interval excludes 0 |")
    print("| --- | ---: | ---: | --- |")
    for m, rs in by.items():
        if m == "baseline":
            continue
        pairs = [(r, base[r["seed"]]) for r in rs if r["seed"] in base]
        if not pairs:
            continue
        diff = lambda f: [f(a) - f(b) for a, b in pairs]  # noqa: E731
        sig = []
        for lv in levels:
            d = diff(lambda r: r["greedy"].get(str(lv), 0.0))
            mean, half = interval(d)
            if len(d) > 1 and abs(mean) > half:
                sig.append(f"{lv} ({mean:+.2f})")
        print(f"| {m} | {fmt(diff(lambda r: r['greedy_all']))} | {fmt(diff(lambda r: r['pass8_all']))} | "
              f"{', '.join(sig) or 'none'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("run", "table", "validate"))
    ap.add_argument("--quick", action="store_true", help="small shapes: a smoke test, not a measurement")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--model", default="tiny", help="the starting checkpoint")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--questions", type=int, default=192)
    ap.add_argument("--val", type=int, default=250, help="greedy validation problems (the rungs take turns)")
    ap.add_argument("--passk-val", type=int, default=100, help="pass@8 validation problems")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/exploration")
    args, args.flags = ap.parse_known_args()  # the rest go to every train_rl.py run
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "validate":
        return backfill(out, args)
    if args.part == "run":
        if args.quick:
            args.steps, args.questions, args.val, args.passk_val = 2, 16, 10, 5
            args.flags += ["--problems-per-step", "4", "--group-size", "4"]
        for method in args.methods.split(","):
            if method not in METHODS:
                raise SystemExit(f"exploration.py: error: --methods: {method!r} is not one of {', '.join(METHODS)}")
            for seed in [int(s) for s in args.seeds.split(",")]:
                if (out / f"{method}-s{seed}.json").exists():
                    continue
                r = run_one(method, seed, args, out)
                print(f"{method} seed {seed}: greedy {r['greedy']} pass@8 {r['pass8_all']:.2f} "
                      f"({r['seconds']:.0f}s)", flush=True)
    print_table(out)


if __name__ == "__main__":
    main()
