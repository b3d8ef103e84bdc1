"""The decomposed vote of climb checkpoints on validation, plain and with --merge-zero, paired by problem (issue #67).

A sub-problem that starts from 0 is one the tiny world never shows (tiny.make_problem starts at 1-99); rounds.py's
--merge-zero poses such a piece joined to the one before. This re-runs the vote of each run's round --round on the
validation rows of --rungs (all of them, not the run's --val-limit) with the run's own settings, both ways, and prints
the two beside each other, on every problem and on those whose generator chain passes through 0 at a piece boundary
(chosen with the generator's chain: a diagnostic subset, never a label). Writes under --save, never into the runs.

    python research/rounds/revote.py runs/climb67/final/couple-all-s1 --round 5 --rungs 8 10
"""

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import checkpoint  # noqa: E402
import cli  # noqa: E402
import model as M  # noqa: E402
import problems as P  # noqa: E402
import runs  # noqa: E402
import stats  # noqa: E402
import verify  # noqa: E402
from research.rounds import climb as C  # noqa: E402
from research.rounds import rounds as R  # noqa: E402


def zero_boundary(problem, chunk_ops):
    """Whether the generator's chain of `problem` reaches 0 where a decomposed piece ends and another starts."""
    _, steps = verify.operations(problem)
    values, end = [line.rsplit("= ", 1)[1] for line in verify.chain(problem)[0]], 0
    for size in R.chunk_sizes(len(steps), chunk_ops)[:-1]:
        end += size
        if values[end - 1] == "0":
            return True
    return False


def main(argv=None):
    parser = argparse.ArgumentParser(prog="revote.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="climb run directories (with their round_N checkpoints)")
    parser.add_argument("--round", type=int, default=5, help="which round's checkpoint of each run")
    parser.add_argument("--rungs", type=int, nargs="+", default=[8, 10], help="validation rungs voted on")
    parser.add_argument("--save", default="runs/revote", help="where the votes' records go")
    parser.add_argument("--device", default="", help="cpu, cuda, mps (default: the best available)")
    cfg = parser.parse_args(argv)
    print("| run | round | rungs | problems | plain | --merge-zero | difference [95% paired] | zero-boundary problems "
          "| plain | --merge-zero |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for run in map(Path, cfg.runs):
        saved = runs.read_json_object(run / "config.json")
        ccfg = C.ClimbConfig(**{k: v for k, v in saved.items() if k in C.ClimbConfig.__dataclass_fields__})
        rows = [p for s in C.splits_for(ccfg) for p in P.load_problems(s[2]) if p["level"] in cfg.rungs]
        policy_dir = run / f"round_{cfg.round}"
        tokenizer, (_, sampler) = checkpoint.load_tokenizer(policy_dir), R.load_policy(policy_dir, cfg.device or M.default_device())
        correct = {}
        for merge in (False, True):
            view = dataclasses.replace(C.rounds_view(ccfg), merge_zero=merge)
            out = Path(cfg.save) / run.name / f"round_{cfg.round}" / ("merge" if merge else "plain")
            records, _ = R.decompose(sampler, tokenizer, rows, view, out, ccfg.seed, ccfg.samples, "validation")
            correct[merge] = [float(r["correct"]) for r in records]
        zero = [zero_boundary(p["problem"], ccfg.chunk_ops) for p in rows]
        mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
        diff, (lo, hi) = stats.bootstrap_paired(correct[False], correct[True])
        z = {m: [c for c, is_zero in zip(correct[m], zero) if is_zero] for m in (False, True)}
        print(f"| {run.name} | {cfg.round} | {', '.join(map(str, cfg.rungs))} | {len(rows)} | {mean(correct[False]):.3f} "
              f"| {mean(correct[True]):.3f} | {diff:+.3f} [{lo:+.3f}, {hi:+.3f}] | {sum(zero)} | {mean(z[False]):.2f} "
              f"| {mean(z[True]):.2f} |", flush=True)


if __name__ == "__main__":
    cli.run_main(main, "revote.py")
