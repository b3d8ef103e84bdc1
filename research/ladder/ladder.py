"""
The tiny world's ladder (tiny.py, data/tiny_ladder_*.jsonl): rungs of 2-6 operations graded by the step
check, and the three questions a method climbing it needs answered, one command each.

    python research/ladder/ladder.py reach                # guess rate and step-valid pass@16 / pass@64 per rung
    python research/ladder/ladder.py capacity             # SFT on the ladder's own worked solutions: an upper bound
    python research/ladder/ladder.py baseline             # Dr. GRPO from the ladder's checkpoint, 3 seeds, 2 controls
                                                     # (96 steps; 192; 96 on twice the questions)
    python research/ladder/ladder.py baseline --seeds 1   # one seed (run seeds side by side; finished runs are kept)
    python research/ladder/ladder.py baseline --no-controls --replay-fraction 0.25 --out runs/ladder/replay
                                                     # a method at the base arm's budget (train_rl.py flags)
    python research/ladder/ladder.py baseline --quick     # any part with --quick: small shapes, a smoke test

Every part starts from --model, by default `tiny-ladder` (tiny_ladder_model/: the committed checkpoint
continued with a share of complete 4-6-operation solutions, tiny.py's docstring); `--model tiny` measures the
committed checkpoint itself.

`reach` samples k completions per problem of tiny_ladder_val at temperature 1 and grades each twice: by the
answer alone (verify.grade, what a guess can earn) and by the ladder's step check (verify.check_steps, the
reward). `baseline` runs train_rl.py in-process with the ladder's defaults (`--dataset tiny_ladder_train`);
its controls train twice as long, or on twice as many distinct questions. A run whose final/ exists is read,
not run again, so seeds may run in separate processes and a last call with all of them writes the tables.
"""

import argparse
import collections
import contextlib
import dataclasses
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
import stats  # noqa: E402
import tiny  # noqa: E402
import train_rl as T  # noqa: E402
import verify  # noqa: E402
from research.hint import hinted  # noqa: E402

# -----------------------------------------------------------------------------
# Guess rate and reachability: k samples per problem, graded by the answer and by the steps


def rung_table(records, rows, k):
    """Per level: per-sample rates (step-valid, answer-right, bare, answer-right without the steps), the share
    of problems with a step-valid sample in 16 and in k (pass@16 by the unbiased estimator), first errors."""
    table = {}
    for level in sorted({r["level"] for r in records}):
        mine = [(r, p) for r, p in zip(records, rows) if r["level"] == level]
        pairs = [(s, p) for r, p in mine for s in r["samples"]]
        steps = [s["correct"] for s, _ in pairs]
        answer = [verify.grade(s["response"], p["answer"]) for s, p in pairs]
        bare = [bool(tiny.BARE.fullmatch(s["response"])) for s, _ in pairs]
        errors = collections.Counter(verify.first_error(s["response"], r["problem"]) for s, r in pairs if not s["correct"])
        n = len(pairs)
        table[level] = dict(
            problems=len(mine), samples=n, step_valid=sum(steps) / n, answer_right=sum(answer) / n,
            bare=sum(bare) / n, bare_right=sum(a and b for a, b in zip(answer, bare)) / n,
            lucky=sum(a and not s for a, s in zip(answer, steps)) / n,
            pass16=sum(stats.pass_at_k(len(r["samples"]), r["n_correct"], 16) for r, _ in mine) / len(mine),
            pass_k=sum(r["n_correct"] > 0 for r, _ in mine) / len(mine), k=k,
            first_errors=[f"line {i + 1} {kind}: {c / max(1, n - sum(steps)):.2f}" for (i, kind), c in
                          errors.most_common(4)])
    return table


def reach(model_path, rows, k, budget, out_dir, batch_size=16, hint=False):
    """rung_table of model_path on rows, and the seconds it took; the samples are kept in out_dir (evaluate's
    records, resumed on a rerun). With hint, each prompt states the answer (research/hint.py: rationalization)."""
    net, tokenizer = checkpoint.load_model(model_path, device="cpu"), checkpoint.load_tokenizer(model_path)
    t0 = time.time()
    records, _ = E.evaluate(net, tokenizer, rows, budget, batch_size, samples=k, temperature=1.0, out_dir=out_dir,
                            grader="steps", hint=hinted if hint else None)
    return rung_table(records, rows, k), time.time() - t0


def print_reach(table, title):
    print(f"\n{title}\n")
    print("| rung (operations) | bare answers | answer right (any) | answer right, steps wrong | of which bare "
          f"| step-valid per sample | step-valid pass@16 | step-valid pass@{next(iter(table.values()))['k']} |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for level, t in table.items():
        print(f"| {level} | {t['bare']:.3f} | {t['answer_right']:.3f} | {t['lucky']:.3f} | {t['bare_right']:.3f} | "
              f"{t['step_valid']:.4f} | {t['pass16']:.2f} | {t['pass_k']:.2f} |")
    print("\nfirst errors of the step-invalid samples (share of them):")
    for level, t in table.items():
        print(f"  rung {level}: {'; '.join(t['first_errors'])}")


# -----------------------------------------------------------------------------
# Capacity: supervised fine-tuning on the ladder's own worked solutions (never a model's output)


def capacity(model_path, steps, lr, batch_size, n_test, log=print):
    """Greedy step-valid accuracy per rung on tiny_ladder_test after SFT of model_path on tiny_ladder_train's
    `solution` field (tiny.pretrain with no bare answers); (per-rung table, seconds)."""
    net, tokenizer = checkpoint.load_model(model_path, device="cpu"), checkpoint.load_tokenizer(model_path)
    cfg = tiny.TinyConfig(steps=steps, batch_size=batch_size, lr=lr, warmup=min(20, steps), bare_2=0.0, bare_3=0.0)
    t0 = time.time()
    tiny.pretrain(net, tokenizer, P.load_problems("tiny_ladder_train"), cfg, log=log)
    seconds = time.time() - t0
    _, summary = E.evaluate(net, tokenizer, P.load_problems("tiny_ladder_test", n_test), tiny.LADDER_MAX_NEW_TOKENS,
                            group_by="level", grader="steps")
    return {k: v["accuracy"] for k, v in summary["per_group"].items()}, seconds


# -----------------------------------------------------------------------------
# The RLVR baseline and its controls


def run_baseline(model_path, seed, steps, questions, out, eval_every, flags=()):
    """One Dr. GRPO run with the ladder's defaults on its first `questions` training problems (uniform over the
    rungs); its per-step metric rows (metrics.jsonl). A finished run (final/ written) is read, not rerun."""
    cfg = T.parse_args(["--model", str(model_path), "--dataset", "tiny_ladder_train", "--objective", "drgrpo",
                        "--steps", str(steps), "--num-problems", str(questions), "--eval-every", str(eval_every),
                        "--save-every", "0", "--test-dataset", "", "--seed", str(seed), "--device", "cpu",
                        "--out", str(out), *flags])
    if not (Path(out) / "final" / "config.json").is_file():
        with contextlib.redirect_stdout(io.StringIO()):  # the per-step lines of every run would drown the table
            T.train(cfg)
    else:
        saved, want = json.loads((Path(out) / "config.json").read_text()), json.loads(json.dumps(dataclasses.asdict(cfg)))
        if any(saved.get(k) != v for k, v in want.items()):
            raise ValueError(f"{out}: a finished run with other settings; move it away to run this one")
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def curve(rows, last_step=None):
    """[(step, generated tokens, FLOPs, seconds, {rung: val accuracy})] at each validation up to last_step;
    seconds are the steps' own (sampling, grading, training), validations left out."""
    out, seconds = [], 0.0
    for r in rows:
        if last_step is not None and r["step"] > last_step:
            break
        seconds += r.get("sampling_seconds", 0) + r.get("verifying_seconds", 0) + r.get("training_seconds", 0)
        if "val_accuracy_by_group" in r:
            out.append((r["step"], r["generated_tokens"], r["flops"], seconds, r["val_accuracy_by_group"]))
    return out


def start_accuracy(model_path, dataset):
    """{rung: greedy step-valid accuracy} of the starting checkpoint on the validation set: the curves' step 0."""
    _, summary = E.evaluate(checkpoint.load_model(model_path, device="cpu"), checkpoint.load_tokenizer(model_path), P.load_problems(dataset),
                            tiny.LADDER_MAX_NEW_TOKENS, group_by="level", grader="steps")
    return {k: v["accuracy"] for k, v in summary["per_group"].items()}


def print_baseline(results, levels):
    print("\n| run | seed | step | distinct questions | generated tokens | FLOPs | seconds | "
          + " | ".join(f"rung {lv}" for lv in levels) + " |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in levels) + " |")
    for r in results:
        for step, tokens, flops, seconds, acc in r["curve"]:
            print(f"| {r['name']} | {r['seed']} | {step} | {r['questions']} | {tokens:,} | {flops:.2e} | "
                  f"{seconds:.0f} | "
                  + " | ".join(f"{acc.get(str(lv), float('nan')):.2f}" for lv in levels) + " |")
    print("\nat each run's last validation, mean over seeds (min-max):\n")
    print("| run | step | generated tokens | FLOPs | seconds | " + " | ".join(f"rung {lv}" for lv in levels) + " |")
    print("| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in levels) + " |")
    for name in dict.fromkeys(r["name"] for r in results):
        last = [r["curve"][-1] for r in results if r["name"] == name]
        cells = [[x[4].get(str(lv), float("nan")) for x in last] for lv in levels]
        print(f"| {name} | {last[0][0]} | {statistics.mean(x[1] for x in last):,.0f} | "
              f"{statistics.mean(x[2] for x in last):.2e} | {statistics.mean(x[3] for x in last):.0f} | "
              + " | ".join(f"{statistics.mean(c):.2f} ({min(c):.2f}-{max(c):.2f})" for c in cells) + " |")


# -----------------------------------------------------------------------------
# CLI


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("reach", "capacity", "baseline"))
    ap.add_argument("--quick", action="store_true", help="small shapes: a smoke test, not a measurement")
    ap.add_argument("--model", default="tiny-ladder", help="the starting checkpoint (reach: the one to sample)")
    ap.add_argument("--per-rung", type=int, default=50, help="reach: problems per rung")
    ap.add_argument("--dataset", default="tiny_ladder_val", help="reach: the rungs' problems (tiny_ladder_far_val: the "
                                                                   "far rungs 7-8, which no checkpoint was shown)")
    ap.add_argument("--hint", action="store_true", help="reach: each prompt states the answer (rationalization)")
    ap.add_argument("-k", type=int, default=64, help="reach: samples per problem")
    ap.add_argument("--sft-steps", type=int, default=400, help="capacity: SFT steps")
    ap.add_argument("--sft-lr", type=float, default=1e-3, help="capacity: peak learning rate")
    ap.add_argument("--seeds", default="0,1,2", help="baseline: seeds")
    ap.add_argument("--steps", type=int, default=96, help="baseline: steps of the base run (the long control: 2x)")
    ap.add_argument("--questions", type=int, default=384, help="baseline: distinct questions (that control: 2x)")
    ap.add_argument("--eval-every", type=int, default=24, help="baseline: steps between validations")
    ap.add_argument("--controls", action=argparse.BooleanOptionalAction, default=True,
                    help="baseline: also the two controls (2x steps, 2x questions); --no-controls runs the base arm "
                         "alone, e.g. a method given by train_rl.py flags after the benchmark's")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/ladder", help="run directories and the JSON of the results")
    args, flags = ap.parse_known_args()  # the rest go to every train_rl.py run
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "reach":
        per_rung, k = (4, 16) if args.quick else (args.per_rung, args.k)
        levels = {p["level"] for p in P.load_problems(args.dataset)}
        rows = P.load_problems(args.dataset, per_rung * len(levels))  # the rungs take turns
        name = "-".join(Path(args.model).parts[-2:]) + ("" if args.dataset == "tiny_ladder_val" else f"-{args.dataset}")
        where = out / f"reach-{name}-k{k}{'-hint' if args.hint else ''}"
        table, seconds = reach(args.model, rows, k, tiny.LADDER_MAX_NEW_TOKENS, where, hint=args.hint)
        print_reach(table, f"{args.model}: {per_rung} {args.dataset} problems per rung x {k} samples, temperature "
                           f"1, {tiny.LADDER_MAX_NEW_TOKENS} new tokens{', hinted' if args.hint else ''} "
                           f"({seconds:.0f} s)")
        (where / "rungs.json").write_text(json.dumps(table, indent=1) + "\n")
    elif args.part == "capacity":
        steps, n_test = (10, 50) if args.quick else (args.sft_steps, None)
        table, seconds = capacity(args.model, steps, args.sft_lr, 64, n_test,
                                  log=lambda s: None if args.quick else print(s))
        print(f"\nSFT of {args.model} on tiny_ladder_train's worked solutions, {steps} steps x 64, lr "
              f"{args.sft_lr} ({seconds:.0f} s); greedy step-valid accuracy on tiny_ladder_test (an upper bound):\n")
        print("| rung | " + " | ".join(table) + " |\n| --- | " + " | ".join("---:" for _ in table) + " |")
        print("| accuracy | " + " | ".join(f"{v:.2f}" for v in table.values()) + " |")
        (out / "capacity.json").write_text(json.dumps(dict(steps=steps, lr=args.sft_lr, accuracy=table)) + "\n")
    else:
        seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
        steps, questions, every = (2, 32, 2) if args.quick else (args.steps, args.questions, args.eval_every)
        if args.quick:  # 10 validation problems, 4 x 4 rollouts a step
            runs.write_jsonl(out / "quick_val.jsonl", P.load_problems("tiny_ladder_val", 10))
            flags += ["--problems-per-step", "4", "--group-size", "4", "--val-dataset", str(out / "quick_val.jsonl")]
        val = flags[flags.index("--val-dataset") + 1] if "--val-dataset" in flags else "tiny_ladder_val"
        results = [dict(name="start", seed="-", questions=0, curve=[(0, 0, 0.0, 0.0, start_accuracy(args.model, val))])]
        for seed in seeds:  # the base run is the 2x-steps run's first half: data order, sampling seeds and the
            # constant learning rate are functions of the step, so its first `steps` steps are the shorter run
            if args.controls:
                long = run_baseline(args.model, seed, 2 * steps, questions, out / f"baseline-2xsteps-s{seed}", every,
                                    flags)
                wide = run_baseline(args.model, seed, steps, 2 * questions, out / f"baseline-2xquestions-s{seed}",
                                    every, flags)
                arms = (("base", long, steps, questions), ("2x steps", long, None, questions),
                        ("2x questions", wide, None, 2 * questions))
            else:  # a method's arm (its flags after the benchmark's): the base run alone
                arms = (("base", run_baseline(args.model, seed, steps, questions, out / f"base-s{seed}", every, flags),
                         None, questions),)
            for name, rows, last, n_questions in arms:
                results.append(dict(name=name, seed=seed, questions=n_questions, curve=curve(rows, last),
                                    reward=[r["reward_mean"] for r in rows if "reward_mean" in r][:last]))
                print(f"{name} seed {seed}: {results[-1]['curve'][-1] if results[-1]['curve'] else '-'}", flush=True)
        print_baseline(results, tiny.LADDER_LEVELS)
        (out / f"baseline-s{'-'.join(map(str, seeds))}.json").write_text(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
