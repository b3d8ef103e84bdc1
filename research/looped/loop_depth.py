"""
Looped depth on the tiny ladder: the committed checkpoint trained with the same RL budget as itself (plain) and
with its middle layers [1, 3) looped 2 and 3 times (`--loop 1:3:N`, model.py), at equal parameters (the same
steps) and at equal FLOPs (the plain model given the looped runs' FLOPs as extra steps).

    python research/looped/loop_depth.py            # seeds 0-2, 16 steps x 8 problems x G = 8 (15-19 min on one core)
    python research/looped/loop_depth.py --quick    # seed 0, 2 steps, 10 validation problems (a smoke test)
    python research/looped/loop_depth.py --loop-lr 3e-2 --steps 24   # any other flag goes to every train_rl run

Every run is train_rl.py in-process with the ladder's defaults (`--model tiny --dataset tiny_ladder_train`:
Dr. GRPO, lr 1e-4, 128 new tokens, the step-checking grader), validated greedily on the first --per-rung x 5
problems of tiny_ladder_val. The plain run goes 2 x --steps: data order, sampling seeds and the constant
learning rate are functions of the step, so its first S steps are the equal-steps run and its steps 1.5 S and
2 S the FLOPs of looping 2 and 3 times (a looped layer pass costs what a plain one does; the table shows the
FLOPs each row really spent, which also follow the response lengths). All seeds are printed, none dropped.
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
import runs  # noqa: E402
import tiny  # noqa: E402
import train_rl as T  # noqa: E402


def run(seed, steps, loop, out, args, flags=()):
    """One train_rl run on the ladder; its metrics.jsonl rows and its wall time (validations included)."""
    cfg = T.parse_args(["--model", "tiny", "--dataset", "tiny_ladder_train", "--steps", str(steps),
                        "--problems-per-step", str(args.problems_per_step), "--group-size", str(args.group_size),
                        "--eval-every", str(args.eval_every), "--val-dataset", str(args.val), "--save-every", "0",
                        "--test-dataset", "", "--seed", str(seed), "--device", "cpu", "--out", str(out),
                        "--loop", loop, "--loop-lr", str(args.loop_lr), *flags])
    t0 = time.time()
    with contextlib.redirect_stdout(io.StringIO()):  # the per-step lines of every run would drown the table
        T.train(cfg)
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, time.time() - t0


def at_step(rows, step):
    """What a run had reached after `step` steps: validation per rung, FLOPs, tokens, the steps' own seconds
    (sampling, grading, training; validations left out) and the mean |gate| of each extra loop."""
    upto = [r for r in rows if r["step"] <= step]
    last = upto[-1]
    assert last["step"] == step and "val_accuracy" in last, f"no validation at step {step}: use --eval-every"
    return dict(step=step, val=last["val_accuracy"], by_rung=last["val_accuracy_by_group"], flops=last["flops"],
                generated_tokens=last["generated_tokens"], length=last["response_tokens_mean"],
                seconds=sum(r["sampling_seconds"] + r["verifying_seconds"] + r["training_seconds"] for r in upto),
                gates=last.get("loop_gate_abs"), gates_half=upto[len(upto) // 2 - 1].get("loop_gate_abs"))


def start_accuracy(val):
    """{rung: greedy step-valid accuracy} and the mean of the committed checkpoint on the validation problems."""
    _, summary = E.evaluate(checkpoint.load_model("tiny", device="cpu"), checkpoint.load_tokenizer("tiny"), P.load_problems(val),
                            tiny.LADDER_MAX_NEW_TOKENS, group_by="level", grader="steps")
    return summary["accuracy"], {k: v["accuracy"] for k, v in summary["per_group"].items()}


def mean(xs):
    return statistics.mean(xs) if xs else float("nan")


def print_table(results, start, args, command):
    rungs = sorted(start[1])
    print(f"\n`{command}`: greedy step-valid accuracy on {args.per_rung} tiny_ladder_val problems per rung, mean of "
          f"seeds {args.seeds} (each seed in brackets); start: {start[0]:.3f}\n")
    print("| run | layer passes | steps | FLOPs | val accuracy (seeds) | " + " | ".join(f"rung {r}" for r in rungs)
          + " | mean \\|gate\\| at S/2 -> S | length | seconds |")
    print("|---|---:|---:|---:|---|" + "---:|" * len(rungs) + "---|---:|---:|")
    for name, passes, rows in results:
        accs = " / ".join(f"{r['val']:.3f}" for r in rows)
        per_rung = " | ".join(f"{mean([r['by_rung'][k] for r in rows]):.3f}" for k in rungs)
        gates = "-"
        if rows[0]["gates"]:
            half = [mean(r["gates_half"]) for r in rows]
            gates = f"{mean(half):.4f} -> {mean([mean(r['gates']) for r in rows]):.4f}"
        print(f"| {name} | {passes} | {rows[0]['step']} | {mean([r['flops'] for r in rows]):.3g} | "
              f"{mean([r['val'] for r in rows]):.3f} ({accs}) | {per_rung} | {gates} | "
              f"{mean([r['length'] for r in rows]):.0f} | {mean([r['seconds'] for r in rows]):.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=16, help="S: steps of the looped runs (the plain run goes 2 S)")
    ap.add_argument("--eval-every", type=int, default=8, help="steps between validations (must divide S / 2)")
    ap.add_argument("--problems-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--per-rung", type=int, default=20, help="tiny_ladder_val problems per rung to validate on")
    ap.add_argument("--loops", default="2,3", help="N of --loop 1:3:N, the middle two of the tiny model's 4 layers")
    ap.add_argument("--loop-lr", type=float, default=1e-2, help="the gates' and loop embeddings' learning rate")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/loop_depth", help="run directories and the JSON of the results")
    args, flags = ap.parse_known_args()  # the rest go to every train_rl.py run
    if args.quick:
        args.seeds, args.steps, args.eval_every, args.per_rung = "0", 2, 1, 2
        args.problems_per_step, args.group_size = 4, 4
    if args.steps % (2 * args.eval_every):
        raise SystemExit(f"loop_depth.py: error: --eval-every {args.eval_every} must divide --steps / 2 "
                         f"(validations at S, 1.5 S and 2 S)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.val = out / "val.jsonl"  # the rungs take turns in tiny_ladder_val, so its first 5 k rows are k per rung
    runs.write_jsonl(args.val, P.load_problems("tiny_ladder_val", args.per_rung * len(tiny.LADDER_LEVELS)))
    seeds, loops, S = [int(s) for s in args.seeds.split(",")], [int(n) for n in args.loops.split(",")], args.steps
    start = start_accuracy(args.val)
    plain, looped, raw = [], {n: [] for n in loops}, []
    t0 = time.time()
    for seed in seeds:
        rows, wall = run(seed, 2 * S, "", out / f"plain-s{seed}-{int(time.time())}", args, flags)
        plain.append(rows)
        raw.append(dict(loop="", seed=seed, wall=wall, rows=rows))
        print(f"plain seed {seed}: val {at_step(rows, S)['val']:.3f} at step {S}, "
              f"{at_step(rows, 2 * S)['val']:.3f} at {2 * S} ({wall:.0f} s)", flush=True)
        for n in loops:
            rows, wall = run(seed, S, f"1:3:{n}", out / f"loop{n}-s{seed}-{int(time.time())}", args, flags)
            looped[n].append(rows)
            raw.append(dict(loop=f"1:3:{n}", seed=seed, wall=wall, rows=rows))
            print(f"--loop 1:3:{n} seed {seed}: val {at_step(rows, S)['val']:.3f} at step {S}, gates "
                  f"{at_step(rows, S)['gates']} ({wall:.0f} s)", flush=True)
    results = [("plain", 4, [at_step(r, S) for r in plain])]
    results += [(f"`--loop 1:3:{n}`", 4 + 2 * (n - 1), [at_step(r, S) for r in looped[n]]) for n in loops]
    for n in loops:  # the plain run at (about) the looped run's FLOPs: 1 + (n - 1) / 2 times the steps
        step = round(S * (1 + (n - 1) / 2))
        if step <= 2 * S and step % args.eval_every == 0:
            results.append((f"plain, FLOPs of `1:3:{n}`", 4, [at_step(r, step) for r in plain]))
    command = "python research/looped/loop_depth.py " + " ".join(sys.argv[1:])
    print_table(results, start, args, command.strip())
    print(f"\n{time.time() - t0:.0f} s in all")
    (out / "loop_depth.json").write_text(json.dumps(dict(command=command, start=start, args={
        k: str(v) for k, v in vars(args).items()}, flags=flags, results=results, runs=raw), indent=1) + "\n")


if __name__ == "__main__":
    main()
