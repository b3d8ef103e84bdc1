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
import stats  # noqa: E402
import torch  # noqa: E402
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


def climb_config(run, round_, rungs):
    """The run's ClimbConfig, once its config.json is a climb's, round_'s checkpoint exists and it holds the rungs."""
    ccfg = C.run_config(run, "", "each run")
    if not (run / f"round_{round_}" / "model.safetensors").is_file():
        raise FileNotFoundError(f"{run / f'round_{round_}'}: no checkpoint (--round {round_} of this run not done)")
    missing = sorted(set(rungs) - set(C.rungs_for(ccfg)))
    if missing:
        raise ValueError(f"--rungs {' '.join(map(str, missing))}: not rungs of {run} (its rungs: "
                         f"{C.rungs_for(ccfg)[0]}-{C.rungs_for(ccfg)[-1]})")
    return ccfg


def votes_dir(save, run, round_, rungs):
    """Where a run's votes go: --save/<run's name>/round_N/rungs_a-b/, which names the run's own path (a vote's records
    are reused when they exist, so another run of the same name is refused, never read as this one's)."""
    out = save / run.name / f"round_{round_}" / f"rungs_{'-'.join(map(str, rungs))}"
    source, mine = save / run.name / "run.txt", str(run.resolve())
    if source.is_file() and source.read_text().strip() != mine:
        raise ValueError(f"--save {save}: {run.name}/ holds the votes of {source.read_text().strip()}, not of {mine}; "
                         f"give another --save")
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(mine + "\n")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="revote.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="climb run directories (with their round_N checkpoints)")
    parser.add_argument("--round", type=int, default=5, help="which round's checkpoint of each run")
    parser.add_argument("--rungs", type=int, nargs="+", default=[8, 10], help="validation rungs voted on")
    parser.add_argument("--save", default="runs/revote", help="where the votes' records go")
    parser.add_argument("--device", default="", help="cpu, cuda, mps (default: the best available)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    cfg = parser.parse_args(argv)
    torch.set_num_threads(cfg.threads)
    configs = [climb_config(Path(run), cfg.round, cfg.rungs) for run in cfg.runs]  # every run checked before any vote
    print("| run | round | rungs | problems | plain | --merge-zero | difference [95% paired] | zero-boundary problems "
          "| plain | --merge-zero |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for run, ccfg in zip(map(Path, cfg.runs), configs):
        rows = [p for p in C.validation_rows(ccfg) if p["level"] in cfg.rungs]
        policy_dir, save = run / f"round_{cfg.round}", votes_dir(Path(cfg.save), run, cfg.round, cfg.rungs)
        tokenizer = checkpoint.load_tokenizer(policy_dir)
        _, sampler = R.load_policy(policy_dir, cfg.device or M.default_device())
        correct = {}
        for merge in (False, True):
            view = dataclasses.replace(C.rounds_view(ccfg), merge_zero=merge)
            out = save / ("merge" if merge else "plain")
            records, _ = R.decompose(sampler, tokenizer, rows, view, out, ccfg.seed, ccfg.samples, "validation")
            correct[merge] = [float(r["correct"]) for r in records]
        zero = [zero_boundary(p["problem"], ccfg.chunk_ops) for p in rows]
        mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
        diff, (lo, hi) = stats.bootstrap_paired(correct[False], correct[True])
        z = {m: [c for c, is_zero in zip(correct[m], zero) if is_zero] for m in (False, True)}
        print(f"| {run.name} | {cfg.round} | {', '.join(map(str, cfg.rungs))} | {len(rows)} "
              f"| {mean(correct[False]):.3f} | {mean(correct[True]):.3f} | {diff:+.3f} [{lo:+.3f}, {hi:+.3f}] "
              f"| {sum(zero)} | {mean(z[False]):.2f} | {mean(z[True]):.2f} |", flush=True)


if __name__ == "__main__":
    cli.run_main(main, "revote.py")
