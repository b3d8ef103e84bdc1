"""The per-round table of one or more rounds.py runs (research/rounds/README.md), from their rounds.jsonl alone; and the
ordinary RLVR baseline beside them at equal FLOPs.

    python research/rounds/rounds_table.py runs/rounds/ladder-decompose-s0 runs/rounds/ladder-s0
    python research/rounds/rounds_table.py runs/rounds/ladder-frontier-s? --baseline runs/rounds/baseline-eqflops-s?
    python research/rounds/rounds_table.py runs/rounds/ladder-frontier-s? --mean   # each round's mean over the seeds
    python research/rounds/rounds_table.py runs/rounds/ladder-frontier-s0 --temperature 0.5
    python research/rounds/rounds_table.py runs/rounds/ladder-frontier-s? --temperature 0.5 --mean   # over the seeds
    python research/rounds/rounds_table.py runs/rounds/fresh-s? --paired      # round-to-round rises, paired over problems
    python research/rounds/rounds_table.py runs/rounds/fresh-s? --baseline runs/rounds/gr-s? --paired  # rounds - baseline
    python research/rounds/rounds_table.py runs/rounds/ladder-frontier-s? --after runs/rounds/frontier-r8-rl-s?
    python research/rounds/rounds_table.py runs/rounds/rat-s? --sources 6   # rung 6: traces per source, fast accuracy
    python research/rounds/rounds_table.py runs/rounds/hold-s? --versus runs/rounds/best-s?   # one arm minus another
    python research/rounds/rounds_table.py runs/rounds/hold-s? --compute     # samples, tokens and FLOPs per round
    python research/rounds/rounds_table.py runs/r49/best-s? --baseline runs/r49/gr-s? --test   # the test split, once

With --baseline (train_rl.py run directories, one per seed, checkpoints saved every few steps) each rounds row
r >= 1 is matched, seed by seed, with the baseline checkpoint whose cumulative FLOPs (rollouts + training, as
the rounds count deliberation + distillation; evaluation excluded in both) are nearest the round's; a round
with no checkpoint within 10% of its FLOPs on every seed gets no baseline row. That checkpoint is evaluated
once by `rounds.py --rounds 0` with the rounds run's own evaluation flags (the same validation problems,
fast greedy and the same deliberate mode, k and temperature), cached in
<baseline>/rounds_eval/<hash of those flags>/step_N.

With --paired, each round's rise over the round before, in both modes, from the saved evaluation records
(round_N/eval/{fast,deliberate}/records.jsonl): the mean over seeds and validation problems of the change in
correctness, and its 95% percentile bootstrap interval over problems, a problem's seeds resampled together.
With --baseline too, each round minus the baseline checkpoint at its FLOPs, paired in the same way.

With --versus (another arm's rounds runs, one per seed), each round's difference between the two arms in both modes,
paired in the same way, beside each arm's mean FLOPs.

With --test, the test split rounds.py evaluated after the last round (test/), beside the start and the baseline
checkpoint at the last round's FLOPs, both evaluated once by the same protocol on the same test problems (cached
in <run>/rounds_eval/test-start-<seed> and <baseline>/rounds_eval/test-<hash>/step_N): means over seeds per mode
and per group, and the paired differences (last round - start: what was kept; last round - baseline).

With --after (train_rl.py runs started from each rounds run's last round, `--model <run>/round_N`), each
checkpoint they all saved is evaluated as --baseline's are and set beside round N, with its paired rise over it.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the core, and research.*

# the rounds run's settings that define its evaluation; the baseline's checkpoints are evaluated with the same
EVAL_FLAGS = ("dataset", "val_dataset", "val_limit", "template", "grader", "eval_group_by", "samples", "temperature",
              "top_p", "max_new_tokens", "slow_max_new_tokens", "deliberation", "chunk_ops", "eval_samples",
              "eval_batch_size", "seed")


def mean(xs):
    return sum(xs) / len(xs)


def rows_of(run_dir):
    """A rounds run's rows (rounds.jsonl); a path that is no rounds run, or one without a row, is an error naming it."""
    import runs
    path = Path(run_dir) / "rounds.jsonl"
    if not path.is_file():
        what = "no rounds.jsonl" if Path(run_dir).is_dir() else "not a directory"
        raise ValueError(f"{run_dir}: {what}; give rounds.py run directories")
    rows = runs.read_log(path)
    if not rows:
        raise ValueError(f"{path}: no rows yet (round 0's is written once its evaluation ends)")
    return rows


def config_of(run_dir):
    """A run's config.json, or an error naming it."""
    import runs
    cfg = runs.read_json_object(Path(run_dir) / "config.json")
    if not cfg:
        raise ValueError(f"{Path(run_dir) / 'config.json'}: missing or not a JSON object; give run directories")
    return cfg


def accuracy_ci(row, mode):  # "0.512 [0.45, 0.57]": a mode's accuracy and its 95% interval
    return f"{row[mode + '_accuracy']:.3f} [{row[mode + '_ci95'][0]:.2f}, {row[mode + '_ci95'][1]:.2f}]"


def table(run_dir):
    rows = rows_of(run_dir)
    groups = list(rows[0]["fast_by_group"])
    k = max(rows[0]["deliberate_pass_at_k"], key=lambda s: int(s.split("@")[1]))
    head = ["round", "fast (95% CI)", "deliberate (95% CI)", *[f"fast / delib. {g}" for g in groups], k,
            "fast len", "entropy", "selected per group", "round FLOPs", "cumulative FLOPs"]
    lines = [f"{run_dir}\n", "| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for r in rows:
        cells = [str(r["round"]), accuracy_ci(r, "fast"), accuracy_ci(r, "deliberate"),
                 *[f"{r['fast_by_group'][g]:.2f} / {r['deliberate_by_group'][g]:.2f}" for g in groups],
                 f"{r['deliberate_pass_at_k'][k]:.3f}", f"{r['fast_length_mean']:.0f}", f"{r['entropy']:.3f}",
                 " ".join(f"{g}:{n}" for g, n in r.get("selected_by_group", {}).items()) or "-",
                 f"{r['round_flops']:.2e}", f"{r['cumulative_flops']:.2e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# The RLVR baseline at equal FLOPs


def saved_checkpoints(run_dir):
    """{step: cumulative FLOPs} of the checkpoints a train_rl run saved: from metrics.jsonl, or for a checkpoint an
    interrupt saved before its step was logged, from its trainer state (runs.unlogged)."""
    import runs
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise ValueError(f"{run_dir}: no metrics.jsonl; give train_rl.py run directories")
    at = {r["step"]: r["flops"] for r in runs.read_log(run_dir / "metrics.jsonl") if "flops" in r}
    for step in runs.checkpoint_steps(run_dir):
        if step not in at:
            ckpt = run_dir / "checkpoints" / f"step_{step}"
            try:
                pending = runs.unlogged(ckpt) or {}
            except (OSError, ValueError):
                pending = {}
            if "flops" not in pending.get("metrics", {}):
                raise ValueError(f"{ckpt}: its step is neither in metrics.jsonl nor in its trainer state; resume the "
                                 f"run (train_rl.py --resume) or move the checkpoint away")
            at[step] = pending["metrics"]["flops"]
    return {step: at[step] for step in runs.checkpoint_steps(run_dir)}


def checkpoint_at(run_dir, flops):
    """(step, its cumulative FLOPs) of the saved checkpoint of a train_rl run nearest to `flops`."""
    return min(saved_checkpoints(run_dir).items(), key=lambda s: abs(s[1] - flops))


def evaluate_with(model, out, rounds_config, **override):
    """Row 0 of `rounds.py --rounds 0` on `model`: the rounds run's own evaluation of both modes (flags in
    `override` replaced), cached in `out`."""
    import os
    import shutil
    from research.rounds import rounds as R
    settings, out = {**{k: rounds_config[k] for k in EVAL_FLAGS}, **override}, Path(out)
    if out.exists() and not (out / "rounds.jsonl").is_file():
        raise ValueError(f"{out}: where this evaluation is cached holds something else (a file, or a half-made "
                         f"evaluation of an older rounds_table.py); move it away to evaluate again")
    if not out.exists():  # made under a temporary name, then renamed: an interrupt never leaves half a cache
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"{out.parent}: cannot hold the evaluation cache ({e.strerror}: a file is in the way); "
                             f"move it away") from None
        shutil.rmtree(tmp, ignore_errors=True)  # an interrupted evaluation's
        flags = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        R.main(["--model", str(model), *flags, "--rounds", "0", "--test-dataset", "", "--out", str(tmp)])
        os.replace(tmp, out)
    saved = config_of(out)
    if any(saved[k] != v for k, v in settings.items()):
        raise ValueError(f"{out}: cached with other evaluation settings; move it away to evaluate again")
    return rows_of(out)[0]


def evaluation_dir(run_dir, step, rounds_config, split=""):
    """Where a train_rl checkpoint's evaluation by a rounds run's protocol is cached: per protocol (its settings'
    hash), so rounds runs that evaluate differently (e.g. another temperature) never share an evaluation; the test
    split's (split="test") apart from validation's."""
    import hashlib
    key = hashlib.sha1(json.dumps({k: rounds_config[k] for k in EVAL_FLAGS}, sort_keys=True).encode()).hexdigest()[:8]
    return Path(run_dir) / "rounds_eval" / (f"{split}-{key}" if split else key) / f"step_{step}"


def evaluate_checkpoint(run_dir, step, rounds_config):
    """The baseline's checkpoint evaluated by the rounds run's protocol (row 0 of its evaluation)."""
    return evaluate_with(Path(run_dir) / "checkpoints" / f"step_{step}",
                         evaluation_dir(run_dir, step, rounds_config), rounds_config)


def mean_ci(values):
    import stats
    mean, ci = stats.t_interval(values)
    return f"{mean:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def mean_cells(xs, k, groups):
    """A policy's cells over seeds (one row per seed in xs): mean FLOPs; fast, deliberate@k and pass@k with 95% t
    intervals; fast accuracy per group."""
    return dict(flops=f"{mean([x['cumulative_flops'] for x in xs]):.2e}",
                fast=mean_ci([x["fast_accuracy"] for x in xs]),
                deliberate=mean_ci([x["deliberate_accuracy"] for x in xs]),
                pass_at_k=mean_ci([x["deliberate_pass_at_k"][f"pass@{k}"] for x in xs]),
                groups=[f"{mean([x['fast_by_group'][g] for x in xs]):.2f}" for g in groups])


FLOPS_MATCH = 0.1  # a baseline checkpoint stands for a round when its FLOPs are within 10% of the round's


def baseline_at(runs, baseline_dirs, r):
    """[(step, FLOPs)] of each seed's baseline checkpoint nearest round r's FLOPs (runs: each seed's rows), or None
    when one of them is not within FLOPS_MATCH of its round."""
    at = [checkpoint_at(base, rows[r]["cumulative_flops"]) for rows, base in zip(runs, baseline_dirs)]
    if any(abs(flops - rows[r]["cumulative_flops"]) > FLOPS_MATCH * rows[r]["cumulative_flops"]
           for rows, (_, flops) in zip(runs, at)):
        return None
    return at


def mean_table(rounds_dirs, baseline_dirs=()):
    """Rounds (mean over seeds), beside the baseline at the FLOPs of each round (seed i against seed i) when
    baseline_dirs are given."""
    runs = [rows_of(d) for d in rounds_dirs]
    configs = [config_of(d) for d in rounds_dirs]
    k = configs[0]["eval_samples"] or configs[0]["samples"]
    groups = list(runs[0][0]["fast_by_group"])
    head = ["round", "method", "FLOPs (mean)", "fast, mean [95% t]", f"deliberate@{k}", f"pass@{k}",
            *[f"fast rung {g}" for g in groups], *(["baseline steps"] if baseline_dirs else [])]
    lines = ["| " + " | ".join(head) + " |", "| ---: | --- |" + " ---: |" * (len(head) - 2)]
    unmatched = []  # rounds no baseline checkpoint comes within FLOPS_MATCH of, on some seed
    for r in range(min(len(rows) for rows in runs)):
        # round 0 is the starting checkpoint for both
        methods = [("start (both)" if baseline_dirs and not r else "rounds", [rows[r] for rows in runs], "-")]
        at = baseline_at(runs, baseline_dirs, r) if r and baseline_dirs else []
        if at is None:
            unmatched.append(r)
        elif at:
            methods.append(("Dr. GRPO", [dict(evaluate_checkpoint(base, step, cfg), cumulative_flops=flops)
                                         for base, cfg, (step, flops) in zip(baseline_dirs, configs, at)],
                            " / ".join(str(step) for step, _ in at)))
        for name, xs, steps in methods:
            c = mean_cells(xs, k, groups)
            cells = [str(r), name, c["flops"], c["fast"], c["deliberate"], c["pass_at_k"], *c["groups"],
                     *([steps] if baseline_dirs else [])]
            lines.append("| " + " | ".join(cells) + " |")
    if unmatched:
        lines.append(f"\nNo baseline row for rounds {', '.join(map(str, unmatched))}: no saved checkpoint within "
                     f"{FLOPS_MATCH:.0%} of their FLOPs on every seed (train the baseline longer).")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# Round-to-round rises, paired over the same problems


def correct_in(records_path, group_by=None):
    """{problem id: correct} of one records file; with group_by, {problem id: its group} too."""
    import evaluate as E
    records = E.read_records(records_path)[0]
    correct = {x["id"]: bool(x["correct"]) for x in records}
    return (correct, {x["id"]: str(x.get(group_by)) for x in records}) if group_by else correct


def correct_by_id(run_dir, r, mode):
    return correct_in(Path(run_dir) / f"round_{r}" / "eval" / mode / "records.jsonl")


def paired_rise(before, after, n_boot=10_000, seed=0):
    """(mean of after - before, 95% interval): `before` and `after` are one {problem id: correct} per seed; the
    bootstrap resamples problems (Efron & Tibshirani 1993), each with all its seeds, as the seeds share them."""
    import numpy as np
    ids = sorted(before[0])
    if any(sorted(x) != ids for x in before + after):
        raise ValueError("--paired: the rounds were evaluated on different problems; pair runs of one --val-limit")
    d = np.array([[int(a[i]) - int(b[i]) for i in ids] for b, a in zip(before, after)]).mean(0)  # per problem
    means = d[np.random.default_rng(seed).integers(0, len(d), (n_boot, len(d)))].mean(1)
    return float(d.mean()), (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def rise_cell(before, after):  # "+0.063 [+0.039, +0.088] *": paired_rise, starred when its interval is above 0
    rise, (lo, hi) = paired_rise(before, after)
    return f"{rise:+.3f} [{lo:+.3f}, {hi:+.3f}]" + (" *" if lo > 0 else "")


def paired_table(run_dirs):
    n_rounds = min(len(rows_of(d)) for d in run_dirs)
    correct = {(mode, r): [correct_by_id(d, r, mode) for d in run_dirs]  # each round's records read once
               for mode in ("fast", "deliberate") for r in range(n_rounds)}
    head = ["step", "fast: rise [95% bootstrap]", "deliberate: rise [95% bootstrap]"]
    lines = [f"{len(run_dirs)} seeds x {len(correct['fast', 0][0])} problems",
             "| " + " | ".join(head) + " |", "| --- | --- | --- |"]
    for r in range(1, n_rounds):
        cells = [f"round {r - 1} -> {r}", *[rise_cell(correct[mode, r - 1], correct[mode, r])
                                            for mode in ("fast", "deliberate")]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ["* the interval is above 0"])


def versus_table(run_dirs, other_dirs):
    """Each round of one arm against the same round of another (seed i against seed i, the same validation
    problems): the difference in both modes, paired over problems and seeds, beside each arm's mean FLOPs."""
    runs, others = [rows_of(d) for d in run_dirs], [rows_of(d) for d in other_dirs]
    n_rounds = min(len(rows) for rows in runs + others)
    head = ["round", "FLOPs: this arm / the other", "fast: difference [95% bootstrap]",
            "deliberate: difference [95% bootstrap]"]
    lines = [f"{run_dirs[0]}... minus {other_dirs[0]}..., {len(run_dirs)} seeds",
             "| " + " | ".join(head) + " |", "| ---: | ---: | --- | --- |"]
    for r in range(1, n_rounds):
        flops = [mean([rows[r]["cumulative_flops"] for rows in arm]) for arm in (runs, others)]
        cells = [str(r), f"{flops[0]:.2e} / {flops[1]:.2e}",
                 *[rise_cell([correct_by_id(d, r, mode) for d in other_dirs],
                             [correct_by_id(d, r, mode) for d in run_dirs]) for mode in ("fast", "deliberate")]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ["* the interval is above 0"])


def baseline_paired_table(rounds_dirs, baseline_dirs):
    """--baseline with --paired: each round minus the baseline checkpoint nearest its FLOPs (mean_table's match,
    seed i against seed i), in both modes, paired over problems and seeds."""
    runs = [rows_of(d) for d in rounds_dirs]
    configs = [config_of(d) for d in rounds_dirs]
    head = ["round", "FLOPs: rounds / baseline", "baseline steps", "fast: rounds - baseline [95% bootstrap]",
            "deliberate: rounds - baseline [95% bootstrap]"]
    lines = [f"{len(rounds_dirs)} seeds", "| " + " | ".join(head) + " |", "| ---: | ---: | ---: | --- | --- |"]
    for r in range(1, min(len(rows) for rows in runs)):
        at = baseline_at(runs, baseline_dirs, r)
        if at is None:
            continue  # no checkpoint at this round's FLOPs on some seed (mean_table says so)
        for base, cfg, (step, _) in zip(baseline_dirs, configs, at):
            evaluate_checkpoint(base, step, cfg)  # cached; writes the records read below
        dirs = [evaluation_dir(base, step, cfg) for base, cfg, (step, _) in zip(baseline_dirs, configs, at)]
        cells = [str(r), f"{mean([rows[r]['cumulative_flops'] for rows in runs]):.2e} / "
                         f"{mean([flops for _, flops in at]):.2e}", " / ".join(str(step) for step, _ in at),
                 *[rise_cell([correct_by_id(d, 0, mode) for d in dirs], [correct_by_id(d, r, mode) for d in rounds_dirs])
                   for mode in ("fast", "deliberate")]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ["* the interval is above 0"])


# -----------------------------------------------------------------------------
# The held-out test split: the start, the last round and the baseline at its FLOPs, each evaluated once


def evaluate_on_test(model, out, rounds_config):
    """Row 0 of `model` evaluated by the rounds run's protocol on its test split (rounds.py's --test-dataset and
    --test-limit in place of the validation set), cached in `out`: the same problems and settings rounds.py's own
    test evaluation of the last round used."""
    return evaluate_with(model, out, rounds_config, val_dataset=rounds_config["test_dataset"],
                         val_limit=rounds_config["test_limit"])


def held_out_table(rounds_dirs, baseline_dirs=()):
    """The test split, read once at the end of each rounds run (its test/, the last round) beside its start and,
    with baseline_dirs, the baseline checkpoint nearest the last round's FLOPs (seed i against seed i), both
    evaluated by the same protocol: each policy's mean over seeds per mode and per group, then the paired
    differences over problems and seeds, overall and per group (is a rung kept? is the lead real?)."""
    configs = [config_of(d) for d in rounds_dirs]
    tested = [json.loads((Path(d) / "test.json").read_text())["round"] for d in rounds_dirs]
    if len(set(tested)) > 1 or any(not c["test_dataset"] for c in configs):
        raise ValueError(f"--test: each run needs its test.json from the same last round (rounds {tested})")
    last, group_by = tested[0], configs[0]["eval_group_by"] or None
    runs = [rows_of(d) for d in rounds_dirs]
    starts = [Path(d) / "rounds_eval" / f"test-start-{c['seed']}" for d, c in zip(rounds_dirs, configs)]
    for c, out in zip(configs, starts):
        evaluate_on_test(c["model"], out, c)
    # each policy: its FLOPs per seed, the baseline's steps, and per seed the directory holding {fast,deliberate}/
    policies = [("start", [0.0] * len(runs), "-", [out / "round_0" / "eval" for out in starts]),
                (f"round {last}", [rows[last]["cumulative_flops"] for rows in runs], "-",
                 [Path(d) / "test" for d in rounds_dirs])]
    if baseline_dirs:
        at = baseline_at(runs, baseline_dirs, last)
        if at is None:
            raise ValueError(f"--test: no baseline checkpoint within {FLOPS_MATCH:.0%} of round {last}'s FLOPs")
        outs = []
        for base, c, (step, _) in zip(baseline_dirs, configs, at):
            outs.append(evaluation_dir(base, step, c, "test"))
            evaluate_on_test(Path(base) / "checkpoints" / f"step_{step}", outs[-1], c)
        policies.append(("Dr. GRPO", [flops for _, flops in at], " / ".join(str(step) for step, _ in at),
                         [out / "round_0" / "eval" for out in outs]))
    correct = {(name, mode): [correct_in(root / mode / "records.jsonl", group_by) for root in roots]
               for name, _, _, roots in policies for mode in ("fast", "deliberate")}
    by_group = correct["start", "fast"][0][1]
    groups = list(dict.fromkeys(by_group.values()))

    def only(seeds, g=None):  # [{id: correct}] per seed, the problems of group g (all when None)
        return [{i: c for i, c in x.items() if g is None or by_group[i] == g} for x, _ in seeds]

    k = configs[0]["eval_samples"] or configs[0]["samples"]
    head = ["policy", "FLOPs (mean)", "baseline steps", "fast, mean [95% t]", f"deliberate@{k}",
            *[f"fast rung {g}" for g in groups]]
    lines = [f"{len(rounds_dirs)} seeds x {len(by_group)} test problems", "| " + " | ".join(head) + " |",
             "| --- |" + " ---: |" * (len(head) - 1)]
    for name, flops, steps, _ in policies:
        acc = {g: [mean(list(x.values())) for x in only(correct[name, "fast"], g)] for g in [None, *groups]}
        cells = [name, f"{mean(flops):.2e}", steps, mean_ci(acc[None]),
                 mean_ci([mean(list(x.values())) for x in only(correct[name, "deliberate"])]),
                 *[f"{mean(acc[g]):.2f}" for g in groups]]
        lines.append("| " + " | ".join(cells) + " |")
    pairs = [(f"round {last}", "start")]
    pairs += [("Dr. GRPO", "start"), (f"round {last}", "Dr. GRPO")] if baseline_dirs else []
    head = ["difference, paired [95% bootstrap]", "fast, all", *[f"fast rung {g}" for g in groups], "deliberate, all"]
    lines += ["", "| " + " | ".join(head) + " |", "| --- |" + " --- |" * (len(head) - 1)]
    for a, b in pairs:
        cells = [f"{a} - {b}", *[rise_cell(only(correct[b, "fast"], g), only(correct[a, "fast"], g))
                                 for g in [None, *groups]],
                 rise_cell(only(correct[b, "deliberate"]), only(correct[a, "deliberate"]))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ["* the interval is above 0"])


# -----------------------------------------------------------------------------
# An RL phase after the last round, against the last round, paired


def after_table(rounds_dirs, after_dirs):
    """Each train_rl run in after_dirs continued from the last round's policy of the rounds run beside it (seed i
    on seed i): every checkpoint all of them saved, evaluated by the rounds' own protocol, its FLOPs added to the
    rounds', and its rise over the last round in both modes, paired over problems and seeds."""
    runs = [rows_of(d) for d in rounds_dirs]
    configs = [config_of(d) for d in rounds_dirs]
    last = min(len(rows) for rows in runs) - 1
    for rounds_dir, after_dir in zip(rounds_dirs, after_dirs):  # a mispaired run would compare other policies
        start = config_of(after_dir)["model"]
        if Path(start).resolve() != (Path(rounds_dir) / f"round_{last}").resolve():
            raise ValueError(f"--after: {after_dir} starts from {start}, not {rounds_dir}/round_{last}")
    k = configs[0]["eval_samples"] or configs[0]["samples"]
    groups = list(runs[0][0]["fast_by_group"])
    head = ["policy", "FLOPs (mean)", "fast, mean [95% t]", "fast rise [95% bootstrap]", f"deliberate@{k}",
            "deliberate rise [95% bootstrap]", f"pass@{k}", *[f"fast rung {g}" for g in groups]]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    before = {mode: [correct_by_id(d, last, mode) for d in rounds_dirs] for mode in ("fast", "deliberate")}
    saved = [saved_checkpoints(d) for d in after_dirs]
    policies = [(f"round {last}", [rows[last] for rows in runs], None)]
    for step in sorted(set.intersection(*[set(x) for x in saved])):
        dirs = [evaluation_dir(d, step, cfg) for d, cfg in zip(after_dirs, configs)]
        xs = [dict(evaluate_checkpoint(d, step, cfg), cumulative_flops=rows[last]["cumulative_flops"] + at[step])
              for d, cfg, rows, at in zip(after_dirs, configs, runs, saved)]
        policies.append((f"+ {step} RL steps", xs, dirs))
    for name, xs, dirs in policies:
        fast, deliberate = [rise_cell(before[mode], [correct_by_id(d, 0, mode) for d in dirs]) if dirs else "-"
                            for mode in ("fast", "deliberate")]
        c = mean_cells(xs, k, groups)
        cells = [name, c["flops"], c["fast"], fast, c["deliberate"], deliberate, c["pass_at_k"], *c["groups"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ["* the interval is above 0"])


# -----------------------------------------------------------------------------
# The deliberate mode at another temperature, every round's policy re-evaluated


def again_at(run_dir, temperature):
    """Each round's pi_N (round 0: the run's starting model) evaluated again with the deliberate mode at
    `temperature` (fast greedy is unchanged): (its config, its rows, the new rows), cached in <run>/rounds_eval/T<t>."""
    rows = rows_of(run_dir)
    cfg = config_of(run_dir)
    return cfg, rows, [evaluate_with(Path(run_dir) / f"round_{r['round']}" if r["round"] else cfg["model"],
                                Path(run_dir) / "rounds_eval" / f"T{temperature:g}" / f"round_{r['round']}", cfg,
                                temperature=temperature) for r in rows]


def temperature_table(run_dir, temperature):
    """One run's rounds beside their deliberate mode at `temperature` (again_at)."""
    cfg, rows, again = again_at(run_dir, temperature)
    k = cfg["eval_samples"] or cfg["samples"]
    groups = list(rows[0]["fast_by_group"])
    t0, t1 = cfg["temperature"], temperature
    head = ["round", "fast", f"deliberate@{k}, T = {t0:g}", f"deliberate@{k}, T = {t1:g}", f"pass@{k}, T = {t0:g} / {t1:g}",
            *[f"delib. {g}, T = {t1:g}" for g in groups]]
    lines = [f"{run_dir}\n", "| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for r, a in zip(rows, again):
        cells = [str(r["round"]), f"{r['fast_accuracy']:.3f}", accuracy_ci(r, "deliberate"), accuracy_ci(a, "deliberate"),
                 f"{r['deliberate_pass_at_k'][f'pass@{k}']:.3f} / {a['deliberate_pass_at_k'][f'pass@{k}']:.3f}",
                 *[f"{a['deliberate_by_group'][g]:.2f}" for g in groups]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def temperature_mean_table(run_dirs, temperature):
    """--temperature with --mean: each round's mean over the runs (seeds), both temperatures, 95% t intervals."""
    evaluated = [again_at(d, temperature) for d in run_dirs]
    cfg = evaluated[0][0]
    runs = [(rows, again) for _, rows, again in evaluated]
    k = cfg["eval_samples"] or cfg["samples"]
    groups = list(runs[0][0][0]["fast_by_group"])
    t0, t1 = cfg["temperature"], temperature
    head = ["round", "fast, mean [95% t]", f"deliberate@{k}, T = {t0:g}", f"deliberate@{k}, T = {t1:g}",
            f"pass@{k}, T = {t1:g}", *[f"delib. {g}, T = {t1:g}" for g in groups]]
    lines = [f"{len(run_dirs)} seeds", "| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for r in range(min(len(rows) for rows, _ in runs)):
        xs, ys = [rows[r] for rows, _ in runs], [again[r] for _, again in runs]
        cells = [str(r), mean_ci([x["fast_accuracy"] for x in xs]), mean_ci([x["deliberate_accuracy"] for x in xs]),
                 mean_ci([y["deliberate_accuracy"] for y in ys]),
                 mean_ci([y["deliberate_pass_at_k"][f"pass@{k}"] for y in ys]),
                 *[f"{mean([y['deliberate_by_group'][g] for y in ys]):.2f}" for g in groups]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sources_table(run_dirs, level):
    """Per round, the mean over the runs (seeds) of the traces selected at one rung (or group) from each source
    (sample: the first k; adaptive: adaptive k; hint: rationalization), the problems hinted, and the fast accuracy
    there."""
    runs = [rows_of(d) for d in run_dirs]
    groups = {g for rows in runs for x in rows for g in x["fast_by_group"]}
    if str(level) not in groups:
        raise ValueError(f"--sources {level}: no rung or group {level} in these runs (they have "
                         f"{', '.join(sorted(groups, key=lambda g: (len(g), g)))})")
    sources = ("sample", "adaptive", "hint")
    head = ["round", *[f"traces from {s}" for s in sources], "problems hinted", f"fast accuracy, rung {level}"]
    lines = [f"rung {level}, mean of {len(runs)} runs", "| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for r in range(min(len(rows) for rows in runs)):
        xs = [rows[r] for rows in runs]
        found = [mean([x.get("selected_by_source", {}).get(s, {}).get(str(level), 0) for x in xs]) for s in sources]
        cells = [str(r), *(f"{v:.1f}" if r else "" for v in found),
                 f"{mean([x.get('hinted_problems', 0) for x in xs]):.1f}" if r else "",
                 f"{mean([x['fast_by_group'].get(str(level), float('nan')) for x in xs]):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compute_table(run_dirs):
    """Per round, the mean over the runs (seeds) of what it cost: deliberation samples (of which hinted), generated
    tokens, distillation target tokens, and the round's and cumulative FLOPs (evaluation excluded)."""
    runs = [rows_of(d) for d in run_dirs]
    head = ["round", "deliberation samples", "of which hinted", "generated tokens", "training tokens",
            "round FLOPs", "cumulative FLOPs"]
    lines = [f"mean of {len(runs)} runs", "| " + " | ".join(head) + " |", "|" + " ---: |" * len(head)]
    for r in range(1, min(len(rows) for rows in runs)):
        xs = [rows[r] for rows in runs]
        counts = [mean([x.get(key, 0) for x in xs]) for key in
                  ("deliberation_samples", "hinted_samples", "deliberation_tokens", "training_tokens")]
        flops = [mean([x.get(key, 0) for x in xs]) for key in ("round_flops", "cumulative_flops")]
        cells = [str(r), *(f"{v:,.0f}" for v in counts), *(f"{v:.2e}" for v in flops)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="rounds.py run directories (with --baseline: one per seed, in seed order)")
    ap.add_argument("--baseline", nargs="+", default=None, help="train_rl.py run directories, one per rounds run")
    ap.add_argument("--temperature", type=float, default=None,
                    help="re-evaluate every round's policy with the deliberate mode at this temperature")
    ap.add_argument("--mean", action="store_true", help="each round's mean over the runs (seeds), 95%% t intervals")
    ap.add_argument("--paired", action="store_true",
                    help="round-to-round rises in both modes, paired over the same problems and seeds (with "
                         "--baseline: each round minus the baseline at its FLOPs)")
    ap.add_argument("--sources", default=None, metavar="LEVEL",
                    help="per round, the traces selected at this rung from each source and its fast accuracy")
    ap.add_argument("--versus", nargs="+", default=None,
                    help="rounds.py run directories of another arm, one per run (seed i against seed i): each "
                         "round's difference in both modes, paired over problems and seeds")
    ap.add_argument("--compute", action="store_true",
                    help="per round, the mean over the runs of samples, generated and training tokens and FLOPs")
    ap.add_argument("--after", nargs="+", default=None,
                    help="train_rl.py run directories continued from each rounds run's last round, one per run")
    ap.add_argument("--test", action="store_true",
                    help="the test split (test.json, the last round) beside the start and, with --baseline, the "
                         "baseline at the last round's FLOPs, each evaluated once; paired differences per group")
    args = ap.parse_args(argv)
    for flag, dirs in (("--baseline", args.baseline), ("--after", args.after), ("--versus", args.versus)):
        if dirs and len(dirs) != len(args.runs):
            ap.error(f"{flag}: {len(dirs)} runs for {len(args.runs)} rounds runs (one per seed)")
    try:  # a mispaired run, a stale cache, a missing file: one error line
        if args.test:
            print(held_out_table(args.runs, args.baseline or ()))
        elif args.compute:
            print(compute_table(args.runs))
        elif args.sources is not None:
            print(sources_table(args.runs, args.sources))
        elif args.after:
            print(after_table(args.runs, args.after))
        elif args.versus:
            print(versus_table(args.runs, args.versus))
        elif args.paired:
            print(baseline_paired_table(args.runs, args.baseline) if args.baseline else paired_table(args.runs))
        elif args.temperature is not None:
            print(temperature_mean_table(args.runs, args.temperature) if args.mean
                  else "\n\n".join(temperature_table(d, args.temperature) for d in args.runs))
        else:
            print(mean_table(args.runs, args.baseline or ()) if args.baseline or args.mean
                  else "\n\n".join(table(d) for d in args.runs))
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        ap.error(str(e))


if __name__ == "__main__":
    import cli
    cli.run_main(main, "rounds_table.py")  # Ctrl-C: one line, exit 130
