"""
The climb's tables (issue #57) from its runs' climb.jsonl and test.jsonl (climb.py --test), mean of the seeds and
the 95% Student t interval over them:

    python research/rounds/climb_table.py climb=runs/climb/main-s1? u45=runs/climb/u45-s1? generator=runs/climb/gen-s1?

Each argument is ARM=GLOB (one run directory per seed); --baseline ARM adds each other arm's paired difference from
it. Printed: greedy step-valid accuracy per rung on test after every round; the decomposed vote per rung; the
pre-registered endpoint (rung 7 after round 2) and goal rows; goals 3 and 2 by their pre-registered rules; the
moonshot (rung 10 after round 5, every earlier rung kept, and the vote at the next rung round by round); rungs 2-6
against round 0, paired by seed; erosion (each rung against its own round, paired by seed; after the last round also
paired by problem and seed, with a bootstrap interval); the trend test (per seed, the slope of mean accuracy over
rungs 2-10 against the round); reach (step-valid pass@k at T = 1) and first errors at the round's rung and one
above; each round's labels, mix, loss shares and FLOPs; the runs' own validation rows (every round a run reached,
tested or not); and the next rung before its round, with where System 1's failed answers there go wrong
(verify.first_error).
A column for every rung some run evaluates (2-10, up to 20 where a run labels past rung 10); every "mean" column and
the trend average the rungs all runs evaluate.
"""

import collections
import glob
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root
import cli  # noqa: E402
import evaluate as E  # noqa: E402
import problems as P  # noqa: E402
import runs  # noqa: E402
import stats  # noqa: E402
from research.rounds import climb as C  # noqa: E402


def cell(values, digits=2):
    mean, ci = stats.t_interval(values)
    return f"{mean:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def run_dirs(arms):
    """{arm: its run directories in glob order} of ARM=GLOB arguments. Each path the glob matches must be a climb
    run with rows (a stray file or an empty directory would drop runs from the tables), and each arm is named once."""
    out = {}
    for arg in arms:
        name, _, pattern = arg.partition("=")
        dirs = sorted(glob.glob(pattern))
        if not name or not dirs:
            raise ValueError(f"{arg!r}: want ARM=GLOB matching climb run directories")
        if name in out:
            raise ValueError(f"{arg!r}: arm {name!r} is named twice; give each arm one glob (e.g. {name}=a/s?)")
        for d in dirs:
            if not (Path(d) / "climb.jsonl").is_file():
                what = "not a directory" if not Path(d).is_dir() else "no climb.jsonl"
                raise ValueError(f"{d}: {what}; arm {name}'s glob {pattern!r} must match climb run directories only")
        out[name] = dirs
    return out


def load(arms):
    """{arm: [(climb rows by round, test rows by round) per seed run]}, the runs in glob order (run_dirs); a run not
    yet tested (climb.py --test) is named, as the test tables leave it out."""
    out = {}
    for name, dirs in run_dirs(arms).items():
        out[name] = [({r["round"]: r for r in runs.read_log(Path(d) / "climb.jsonl")},
                      {r["round"]: r for r in runs.read_log(Path(d) / "test.jsonl")}) for d in dirs]
        for d, (climb, test) in zip(dirs, out[name]):
            if set(climb) - set(test):
                print(f"note: {d}: rounds {', '.join(map(str, sorted(set(climb) - set(test))))} not in test.jsonl "
                      f"(climb.py --test); the test tables show only the rounds every seed of arm {name} has "
                      f"tested", file=sys.stderr)
    return out


def rung_columns(arms):
    """(columns, common): every rung some row evaluates, one column each (2-10, up to 20 where a run labels past
    rung 10), and the rungs every row evaluates, which the "mean" columns average (the same set when runs agree)."""
    sets = [set(row["fast_by_rung"]) for seeds in arms.values() for climb, test in seeds
            for row in [*climb.values(), *test.values()]]
    return sorted(set.union(*sets), key=int), sorted(set.intersection(*sets), key=int)


def span(rungs):
    return f"{rungs[0]}-{rungs[-1]}"


def rounds_of(seeds):
    """The rounds every seed has tested."""
    return sorted(set.intersection(*(set(test) for _, test in seeds)))


def per_rung_table(arms, field, title, rungs):
    columns, common = rungs
    print(f"\n{title}\n")
    print(f"| arm | round | rung | FLOPs (mean) | mean {span(common)} | "
          + " | ".join(f"rung {k}" for k in columns) + " |")
    print("| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in columns) + " |")
    for arm, seeds in arms.items():
        for r in rounds_of(seeds):
            tests = [test[r] for _, test in seeds]
            flops = np.mean([climb[r]["cumulative_flops"] for climb, _ in seeds])
            rung = tests[0]["rung"]
            cells = [cell([t[field][k] for t in tests]) if str(rung) == k else
                     "-" if any(k not in t[field] for t in tests) else f"{np.mean([t[field][k] for t in tests]):.2f}"
                     for k in columns]
            print(f"| {arm} | {r} | {rung or '-'} | {flops:.2e} | "
                  f"{cell([np.mean([t[field][k] for k in common]) for t in tests], 3)} | " + " | ".join(cells) + " |")


def per_rung_items(test_row):
    """Test problems a rung of a test row (every rung of the greedy evaluation has as many)."""
    return test_row["fast_n"] // len(test_row["fast_by_rung"])


def with_test_error(values, test_row):
    """The seeds' mean with the interval that adds the test set's sampling error (the seeds share one test set:
    stats.t_interval_with_items), and issue #67's rule on it: met when the mean is >= 0.30 and its lower end > 0.05."""
    mean, ci = stats.t_interval_with_items(values, per_rung_items(test_row))
    both = f"{mean:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{mean:.3f}"
    return both, bool(ci) and mean >= 0.30 and ci[0] > 0.05


def endpoint_table(arms, rung=7, at_round=2, goal_rung=6, goal_round=1):
    """Issue #57's endpoint; issue #67's rule reads the interval that adds the test set's sampling error (the seeds
    share one test set: stats.t_interval_with_items)."""
    print(f"\nThe pre-registered endpoint: greedy rung {rung} on test after round {at_round} (met: mean >= 0.30, "
          f"lower end > 0.05 of the interval with the test set's error); the goal's rung {goal_rung} after round "
          f"{goal_round}; seeds listed\n")
    print("| arm | seeds | endpoint [95% t over seeds] | with the test set's error | met | rung 6 after round 1 | "
          "per seed |")
    print("| --- | ---: | ---: | ---: | --- | ---: | --- |")
    for arm, seeds in arms.items():
        if not all(at_round in test and goal_round in test for _, test in seeds):
            continue
        end = [test[at_round]["fast_by_rung"][str(rung)] for _, test in seeds]
        goal = [test[goal_round]["fast_by_rung"][str(goal_rung)] for _, test in seeds]
        both, met = with_test_error(end, seeds[0][1][at_round])
        print(f"| {arm} | {len(seeds)} | {cell(end, 3)} | {both} | {'yes' if met else 'no'} | {cell(goal, 3)} | "
              f"{' / '.join(f'{x:.3f}' for x in end)} |")


def goals_table(arms):
    """Issue #67's goals 3 and 2 on test by their pre-registered rules (research/rounds/README.md, the NoPE start's
    finals): System 1 at rung r + 1 after round r >= 1, met at a round when the mean is >= 0.30 and the lower end of
    the interval with the test set's error > 0.05; and after the last round every rung's mean minus its own round's
    (own_rounds) >= -0.02."""
    print("\nGoal 3: System 1 (greedy) on test at the next rung after round r, mean of the seeds (met: mean >= 0.30, "
          "lower end > 0.05 of the interval with the test set's error)\n")
    print("| arm | round | next rung | System 1 [95% t over seeds] | with the test set's error | met |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    met = {arm: [] for arm in arms}
    for arm, seeds in arms.items():
        for r in rounds_of(seeds)[1:]:
            k = str(seeds[0][1][r]["rung"] + 1)
            if any(k not in test[r]["fast_by_rung"] for _, test in seeds):
                continue
            values = [test[r]["fast_by_rung"][k] for _, test in seeds]
            both, met_here = with_test_error(values, seeds[0][1][r])
            if met_here:
                met[arm].append(r)
            print(f"| {arm} | {r} | {k} | {cell(values, 3)} | {both} | {'yes' if met_here else 'no'} |")
    for arm, rs in met.items():  # the goal needs every round 1-4 (a round not tested is not met)
        rs = [r for r in rs if r <= 4]
        print(f"\n{arm}: goal 3 met at rounds {', '.join(map(str, rs)) or 'none'} of 1-4; the goal "
              f"{'is met' if rs == [1, 2, 3, 4] else 'is not met'}")
    print("\nGoal 2 on test after each arm's last tested round: each rung minus its own round (rungs 2-5 against round "
          "1), mean of the seeds; met when none is below -0.02\n")
    print("| arm | after round | rungs | lowest (rung) | rungs below -0.02 | met |")
    print("| --- | ---: | --- | ---: | --- | --- |")
    for arm, seeds in arms.items():
        rs = rounds_of(seeds)
        if len(rs) < 3:  # round 2 is the first that can lower a rung learnt before it
            continue
        last, own = rs[-1], own_rounds(seeds, 1, rs)
        diffs = {k: round(float(np.mean([test[last]["fast_by_rung"][str(k)] - test[q]["fast_by_rung"][str(k)]
                                          for _, test in seeds])), 6) for k, q in own.items() if q < last}
        low = min(diffs, key=diffs.get)
        below = ", ".join(f"{k}: {d:.3f}" for k, d in sorted(diffs.items()) if d < -0.02) or "none"
        print(f"| {arm} | {last} | {min(diffs)}-{max(diffs)} | {diffs[low]:.3f} ({low}) | {below} | "
              f"{'yes' if below == 'none' else 'no'} |")


def paired_table(arms, baseline, rungs):
    """Each arm minus the baseline arm on test, paired by seed (each glob's runs in order: name the seeds alike),
    at the round's rung and over the rungs every row evaluates (2-10), beside both arms' cumulative FLOPs (issue
    #67: against Dr. GRPO with the scaffold)."""
    base = arms[baseline]
    print(f"\nPaired by seed against {baseline} (each glob's runs in order): greedy on test, arm minus {baseline}, "
          f"mean of the seeds' differences [95% t]; cumulative FLOPs of each, mean of the seeds\n")
    common = rungs[1]
    print(f"| arm | round | rung | difference at the rung | difference, mean {span(common)} | "
          f"FLOPs: arm / {baseline} |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for arm, seeds in arms.items():
        if arm == baseline:
            continue
        if len(seeds) != len(base):
            print(f"note: arm {arm} has {len(seeds)} runs and {baseline} {len(base)}: not paired", file=sys.stderr)
            continue
        for r in sorted(set(rounds_of(seeds)) & set(rounds_of(base)) - {0}):
            k = str(seeds[0][1][r]["rung"])
            pairs = [(test[r]["fast_by_rung"], other[r]["fast_by_rung"]) for (_, test), (_, other) in zip(seeds, base)]
            at = [a[k] - b[k] for a, b in pairs]
            over = [np.mean([a[j] for j in common]) - np.mean([b[j] for j in common]) for a, b in pairs]
            flops = [np.mean([climb[r]["cumulative_flops"] for climb, _ in s]) for s in (seeds, base)]
            print(f"| {arm} | {r} | {k} | {cell(at, 3)} | {cell(over, 3)} | {flops[0]:.2e} / {flops[1]:.2e} |")


def moonshot_table(arms, rung=10, at_round=5):
    """Issue #57's moonshot: rung 10 >= 0.30 after round 5 and every earlier rung still >= 0.50, on the mean of the
    seeds and seed by seed; and the vote at the next rung after each round (a better System 1, a better System 2?)."""
    print(f"\nThe moonshot: greedy rung {rung} on test after round {at_round} >= 0.30, every rung 2-{rung - 1} "
          f">= 0.50 (met on the mean of the seeds; and seed by seed); the vote at the next rung after each round\n")
    print(f"| arm | seeds | rung {rung} | lowest rung 2-{rung - 1} (mean) | met | per seed: rung {rung} / lowest "
          f"(rung) | vote at the next rung, rounds 0-{at_round - 1} |")
    print("| --- | ---: | ---: | ---: | --- | --- | --- |")
    earlier = [str(k) for k in range(2, rung)]
    for arm, seeds in arms.items():
        if not all(r in test for _, test in seeds for r in range(at_round + 1)):
            continue
        last = [test[at_round]["fast_by_rung"] for _, test in seeds]
        top = [x[str(rung)] for x in last]
        means = {k: np.mean([x[k] for x in last]) for k in earlier}
        low = min(earlier, key=means.get)
        met = np.mean(top) >= 0.30 and means[low] >= 0.50
        lows = [min(earlier, key=x.get) for x in last]
        by_seed = " ; ".join(f"{x[str(rung)]:.2f} / {x[k]:.2f} ({k})" for x, k in zip(last, lows))
        n_met = sum(x[str(rung)] >= 0.30 and x[k] >= 0.50 for x, k in zip(last, lows))
        votes = " / ".join(f"{np.mean([test[r]['vote_by_rung'][str(rung - at_round + 1 + r)] for _, test in seeds]):.2f}"
                           for r in range(at_round))
        print(f"| {arm} | {len(seeds)} | {cell(top)} | {cell([x[low] for x in last])} (rung {low}) | "
              f"{'yes' if met else 'no'}, {n_met} of {len(seeds)} seeds | {by_seed} | {votes} |")


def kept_table(arms, rungs=("2", "3", "4", "5", "6")):
    print("\nRungs 2-6 after each round minus round 0, greedy on test, paired by seed (a rung is kept while the "
          "difference stays above -0.05)\n")
    print("| arm | round | " + " | ".join(f"rung {k}" for k in rungs) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in rungs) + " |")
    for arm, seeds in arms.items():
        for r in rounds_of(seeds)[1:]:
            diffs = [[test[r]["fast_by_rung"][k] - test[0]["fast_by_rung"][k] for _, test in seeds] for k in rungs]
            print(f"| {arm} | {r} | " + " | ".join(f"{cell(d, 3)}" for d in diffs) + " |")


def common_rounds(seeds, which):
    """The rounds every seed has: tested (which 1, test.jsonl) or run (which 0, climb.jsonl: validation)."""
    return sorted(set.intersection(*(set(seed[which]) for seed in seeds)))


def own_rounds(seeds, which, rs):
    """{rung: its own round} over the rounds rs: the round that labelled it; the rungs below round 1's (2-5, the base
    replay's, first distilled beside it) round 1."""
    own = {seeds[0][which][r]["rung"]: r for r in rs if r}
    if 1 in rs:
        own.update({int(k): 1 for k in seeds[0][which][1]["fast_by_rung"] if int(k) < seeds[0][which][1]["rung"]})
    return own


def erosion_table(arms, which, split):
    """Each rung a round labelled, in every later round, minus its value after its own round (the round that
    labelled it), paired by seed: what learning the later rungs cost it (issue #67; against round 0 a rung
    learnt in the climb always looks kept). The rungs below round 1's (2-5, the base replay's, first distilled
    beside it) are measured against round 1."""
    print(f"\nErosion on {split}: each rung's greedy accuracy after a later round minus its value after its own round "
          f"(the round that labelled it; rungs 2-5, first distilled in round 1, against round 1), paired by seed\n")
    tables = {arm: (seeds, common_rounds(seeds, which)) for arm, seeds in arms.items()}
    own = {arm: own_rounds(seeds, which, rs) for arm, (seeds, rs) in tables.items()}
    rungs = sorted({k for v in own.values() for k in v})
    print("| arm | round | " + " | ".join(f"rung {k}" for k in rungs) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in rungs) + " |")
    for arm, (seeds, rs) in tables.items():
        for r in rs:
            cells = [cell([seed[which][r]["fast_by_rung"][str(k)] - seed[which][own[arm][k]]["fast_by_rung"][str(k)]
                           for seed in seeds], 3) if own[arm].get(k, r) < r else "-" for k in rungs]
            if any(c != "-" for c in cells):
                print(f"| {arm} | {r} | " + " | ".join(cells) + " |")


def greedy_scores(d, sub, r):
    """{(rung, problem id): greedy step-valid 0/1} of run d's round r from its evaluation records (sub: "eval",
    validation; "test"); None where the round has none."""
    path = Path(d) / f"round_{r}" / sub / "fast" / "records.jsonl"
    return {(x["level"], x["id"]): x["correct"] for x in E.read_records(path)[0]} if path.is_file() else None


def paired_erosion_table(arms, dirs, which, split):
    """After each arm's last round, each rung minus its own round's value (own_rounds) with its 95% interval over
    the (seed, problem) pairs (stats.bootstrap_paired on the rounds' evaluation records): the noise goal 2's 0.02
    rule (issue #67) reads through. The difference is the erosion table's mean when the seeds have as many
    problems; lost / gained count the problems solved in one of the two rounds only."""
    sub = "test" if which else "eval"
    print(f"\nErosion on {split} after the last round, paired by problem and seed: each rung minus its own round, "
          f"95% bootstrap interval over the (seed, problem) pairs; problems lost / gained\n")
    print("| arm | last round | rung | own round | difference [95% paired] | pairs | lost / gained |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for arm, seeds in arms.items():
        rs = common_rounds(seeds, which)
        if not rs:
            continue
        last, own = rs[-1], own_rounds(seeds, which, rs)
        scores = {r: [greedy_scores(d, sub, r) for d in dirs[arm]] for r in {last, *own.values()}}
        for k, q in sorted(own.items()):
            if q >= last:
                continue
            if any(x is None for x in scores[q] + scores[last]):
                print(f"| {arm} | {last} | {k} | {q} | - | - | - |")
                continue
            before, after = [], []
            for a, b in zip(scores[q], scores[last]):
                ids = sorted(key for key in a if key[0] == k)
                if ids != sorted(key for key in b if key[0] == k):
                    raise ValueError(f"arm {arm}: rounds {q} and {last} evaluated different problems at rung {k}")
                before += [a[i] for i in ids]
                after += [b[i] for i in ids]
            diff, (lo, hi) = stats.bootstrap_paired(before, after)
            lost = sum(x and not y for x, y in zip(before, after))
            gained = sum(y and not x for x, y in zip(before, after))
            print(f"| {arm} | {last} | {k} | {q} | {diff:.3f} [{lo:.3f}, {hi:.3f}] | {len(before)} | "
                  f"{lost} / {gained} |")


def greedy_first_errors(dirs, r, rung, top=3):
    """(the top first errors (climb.first_errors) of the greedy answers that fail the rung on validation after round
    r, the line count most answers write before the box and its share), pooled over the seeds' runs, from each
    round's evaluation records; "-" where a run has none or none at the rung."""
    paths = [Path(d) / f"round_{r}" / "eval" / "fast" / "records.jsonl" for d in dirs]
    if not all(p.is_file() for p in paths):
        return "-", "-"
    problems = {row["id"]: row["problem"] for row in P.load_problems(C.split_of(rung, 2))}
    answers = [x for path in paths for x in E.read_records(path)[0] if x["level"] == rung]
    if not answers:
        return "-", "-"
    failed = [(x["response"], problems[x["id"]]) for x in answers if not x["correct"]]
    errors = "; ".join(f"{n} {s:.2f}" for n, s in C.first_errors(failed, top).items()) if failed else "none failed"
    lines = collections.Counter(sum(bool(line.strip()) and "\\boxed" not in line for line in x["response"].splitlines())
                                for x in answers)
    (n, count), = lines.most_common(1)
    return errors, f"{n} ({count / len(answers):.2f})"


def next_rung_table(arms, dirs=None):
    """Length generalisation: System 1 (greedy) at the rung above the newest, after round r, i.e. at rung r + 1's
    start before its own round labels it; and System 2 (the decomposed vote) there, on validation (each run's own
    rows) and, where tested, test; with dirs ({arm: run directories}), where System 1's failed answers go wrong."""
    print("\nThe next rung before its round: after round r, greedy (System 1) and the decomposed vote (System 2) at "
          "the rung round r + 1 labels, mean of the seeds; the first errors (verify.first_error) of System 1's failed "
          "answers on validation, pooled over the seeds (share of the failed), and the number of lines most of its "
          "answers there write before the box (share of the answers)\n")
    print("| arm | round | next rung | System 1 (validation) | vote (validation) | System 1 (test) | vote (test) | "
          "System 1's first errors (validation) | lines written (share) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for arm, seeds in arms.items():
        for r in common_rounds(seeds, 0):
            k = seeds[0][0][r].get("vote_rung")
            if k is None:
                continue
            tested = [test[r] for _, test in seeds if r in test]
            on_test = [f"{np.mean([t[f][str(k)] for t in tested]):.2f}" if len(tested) == len(seeds) else "-"
                       for f in ("fast_by_rung", "vote_by_rung")]
            errors, lines = greedy_first_errors(dirs[arm], r, k) if dirs else ("-", "-")
            print(f"| {arm} | {r} | {k} | {cell([c[r]['fast_by_rung'][str(k)] for c, _ in seeds])} | "
                  f"{cell([c[r]['vote_accuracy'] for c, _ in seeds])} | {on_test[0]} | {on_test[1]} | {errors} | "
                  f"{lines} |")


def labels_table(arms):
    """Each round's labels: the source that filtered (climb.py --label-source), what it kept and its precision by
    the step key (verify.check_steps) and by the final answer, and what the other sources would have kept from the
    same samples, measured offline (rounds with labels_by_source only; round 0 where pi_0 labelled the base replay,
    climb.py --base-labels own)."""
    sources = ("key", "answer", "vote")
    print("\nLabels each round (mean of the seeds): the source used, traces kept and their precision by the step key "
          "and by the final answer; every source on the same samples, offline: kept (steps / answer precision)\n")
    print("| arm | round | rung | source | labelled | kept | precision (steps) | precision (answer) | "
          + " | ".join(f"offline: {x}" for x in sources) + " |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | " + " | ".join("---" for _ in sources) + " |")
    for arm, seeds in arms.items():
        for r in common_rounds(seeds, 0):
            rows = [climb[r] for climb, _ in seeds]
            base = "base_" if r == 0 else ""  # round 0: pi_0's labels of the rungs below the first round's
            if not all(x.get(f"{base}labels_by_source") for x in rows):
                continue
            labels = [x[f"{base}labels_by_source"] for x in rows]
            def mean(src, f, digits=3):  # "-" where a seed kept nothing (no precision to measure)
                values = [x[src][f] for x in labels]
                return "-" if None in values else f"{np.mean(values):.{digits}f}"
            src = rows[0]["label_source"]
            offline = [f"{mean(x, 'kept', 0)} ({mean(x, 'precision_steps')} / {mean(x, 'precision_answer')})"
                       for x in sources]
            used = [[x[src][f] for x in labels] for f in ("precision_steps", "precision_answer")]
            used = ["-" if None in values else cell(values, 3) for values in used]
            rung = f"{rows[0]['base_rungs'][0]}-{rows[0]['base_rungs'][-1]}" if base else rows[0]["rung"]
            labelled = np.mean([x[f"{base}problems_labelled"] for x in rows])
            print(f"| {arm} | {r} | {rung} | {src} | {labelled:.0f} | {mean(src, 'kept', 0)} | {used[0]} | {used[1]} | "
                  + " | ".join(offline) + " |")


def trend_table(arms, rungs):
    common = rungs[1]
    print(f"\nThe trend test: per seed, the least-squares slope of mean greedy accuracy over rungs {span(common)} "
          "(test) "
          "against the round; mean of the seeds [95% t]\n")
    print("| arm | rounds | slope per round | per seed |")
    print("| --- | ---: | ---: | --- |")
    for arm, seeds in arms.items():
        rs = rounds_of(seeds)
        if len(rs) < 2:
            continue
        slopes = [float(np.polyfit(rs, [np.mean([test[r]["fast_by_rung"][k] for k in common]) for r in rs], 1)[0])
                  for _, test in seeds]
        print(f"| {arm} | {rs[0]}-{rs[-1]} | {cell(slopes, 3)} | {' / '.join(f'{x:+.3f}' for x in slopes)} |")


def reach_table(arms):
    print("\nReach at T = 1 (step-valid pass@k over the first test problems of the rung) and the first errors of "
          "the failed samples (share, pooled over seeds)\n")
    print("| arm | round | rung | pass@1 | pass@k | first errors |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for arm, seeds in arms.items():
        for r in rounds_of(seeds):
            tests = [test[r] for _, test in seeds]
            for k in sorted(tests[0]["reach"], key=int):
                errors = {}
                for t in tests:
                    for name, share in t["reach"][k]["first_errors"].items():
                        errors[name] = errors.get(name, 0.0) + share / len(tests)
                top = "; ".join(f"{n} {s:.2f}" for n, s in sorted(errors.items(), key=lambda x: -x[1])[:3])
                print(f"| {arm} | {r} | {k} | {cell([t['reach'][k]['pass_at_1'] for t in tests], 3)} | "
                      f"{cell([t['reach'][k]['pass_at_k'] for t in tests])} (k={tests[0]['reach_samples']}) | {top} |")


def val_table(arms, rungs):
    print("\nValidation, as each run evaluated itself after every round (greedy per rung on its --val-limit first "
          "problems of each rung; the vote at the next rung), mean of the seeds that reached the round\n")
    columns = rungs[0]
    print("| arm | round | seeds | FLOPs (mean) | " + " | ".join(f"rung {k}" for k in columns)
          + " | vote at the next rung |")
    print("| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in columns) + " | --- |")
    for arm, seeds in arms.items():
        for r in sorted(set.union(*(set(c) for c, _ in seeds))):
            rows = [climb[r] for climb, _ in seeds if r in climb]
            cells = ["-" if any(k not in x["fast_by_rung"] for x in rows) else
                     f"{np.mean([x['fast_by_rung'][k] for x in rows]):.2f}" for k in columns]
            vote = f"rung {rows[0]['vote_rung']}: {np.mean([x['vote_accuracy'] for x in rows]):.2f}" \
                if rows[0].get("vote_rung") else "-"
            print(f"| {arm} | {r} | {len(rows)} | {np.mean([x['cumulative_flops'] for x in rows]):.2e} | "
                  + " | ".join(cells) + f" | {vote} |")


def rounds_table(arms):
    print("\nEach round: problems labelled and solved (mean), traces per rung in the mix (seed 1 of the arm), the new "
          "rung's share of the mix's tokens and of its loss before the first / after the last update, updates, "
          "FLOPs (mean)\n")
    print("| arm | round | rung | labelled | solved | mix by rung | new rung: tokens / loss first / loss last | "
          "updates | deliberation FLOPs | distillation FLOPs |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |")
    for arm, seeds in arms.items():
        for r in sorted(set.intersection(*(set(c) for c, _ in seeds)) - {0}):
            rows = [climb[r] for climb, _ in seeds]
            k = str(rows[0]["rung"])
            share = lambda f: f"{np.mean([x[f][k] for x in rows]):.2f}" if rows[0].get(f) else "-"  # noqa: E731
            mix = ", ".join(f"{rung}: {n}" for rung, n in rows[0]["mix_by_rung"].items())
            print(f"| {arm} | {r} | {k} | {np.mean([x['problems_labelled'] for x in rows]):.0f} | "
                  f"{np.mean([x['solved'] for x in rows]):.0f} | {mix} | {share('token_share_by_rung')} / "
                  f"{share('loss_share_first_by_rung')} / {share('loss_share_last_by_rung')} | "
                  f"{rows[0]['updates']} | {np.mean([x['deliberation_flops'] for x in rows]):.2e} | "
                  f"{np.mean([x['distillation_flops'] for x in rows]):.2e} |")


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: climb_table.py ARM=GLOB [ARM=GLOB ...] [--baseline ARM]\n\n" + __doc__.strip())
        return
    baseline = None
    if "--baseline" in args:
        i = args.index("--baseline")
        if i + 1 == len(args):
            raise ValueError("--baseline: want an arm's name (--baseline ARM)")
        baseline, args = args[i + 1], args[:i] + args[i + 2:]
    arms = load(args)
    dirs = run_dirs(args)
    if baseline is not None and baseline not in arms:
        raise ValueError(f"--baseline {baseline}: not an arm; the arms are {', '.join(arms)}")
    rungs = rung_columns(arms)
    endpoint_table(arms)
    goals_table(arms)
    if baseline is not None:
        paired_table(arms, baseline, rungs)
    moonshot_table(arms)
    per_rung_table(arms, "fast_by_rung", "Fast (greedy, step-valid) per rung on test, mean of the seeds; the round's "
                                         "rung and the mean with their 95% t interval", rungs)
    per_rung_table(arms, "vote_by_rung", "Deliberate (decomposed majority vote) per rung on the first test problems "
                                         "of each rung, mean of the seeds", rungs)
    kept_table(arms)
    erosion_table(arms, 1, "test")
    paired_erosion_table(arms, dirs, 1, "test")
    trend_table(arms, rungs)
    reach_table(arms)
    rounds_table(arms)
    labels_table(arms)
    val_table(arms, rungs)
    erosion_table(arms, 0, "validation")
    paired_erosion_table(arms, dirs, 0, "validation")
    next_rung_table(arms, dirs)


if __name__ == "__main__":
    cli.run_main(main, "climb_table.py")
