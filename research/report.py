"""
One report for any set of runs: a markdown table per question, with 95% intervals, seeds and compute, and
PNG plots beside it.

    python research/report.py runs/rep/* --out runs/rep/report   # train_rl.py, evaluate.py, bands.py, rounds.py
    python research/report.py runs/a runs/b --by objective,lr     # describe runs by these settings

Every number comes from the files a run directory holds, read by one small function per kind of directory
(READERS): a train_rl.py run (config.json, metrics.jsonl, final/), an evaluate.py output (settings.json,
records.jsonl, summary.json), a bands.py output (bands.jsonl, bands_summary.json) and a rounds.py run
(rounds.jsonl). Each becomes a Run: its settings, seed, status and the evaluations it holds as counts.

- Runs: what each run is (the settings that differ between the runs given, or --by), seed, steps, final
  validation and test accuracy with 95% Wilson intervals (stats.wilson), compute and code version.
  train_rl.py logs accuracies as fractions only, so n is the size of the validation / test set rebuilt from
  the saved config (problems.load_pools) and the correct count is fraction x n.
- Across seeds: runs that differ only by seed, with mean, min-max and a Student t interval over the seeds.
  An incomplete run (killed mid-run: no final/, fewer steps logged than configured, no summary.json) is
  listed with its status and never averaged.
- Paired comparisons of evaluations of the same problems (evaluate.compare: B - A with a bootstrap interval,
  discordant counts, exact McNemar p).
- Bands (bands.summarize_bands) and, for rounds runs, fast and deliberate accuracy per round.
Plots need matplotlib (optional: `pip install matplotlib`); without it the tables are still written.
"""

import argparse
import json
import math
import struct
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: the core, and research.*
import cli  # noqa: E402
import evaluate as E  # noqa: E402
import problems as P  # noqa: E402
import stats  # noqa: E402
from cli import arg  # noqa: E402
from runs import describe as describe_dir, write_json  # noqa: E402
from research.bands import bands as B  # noqa: E402


@dataclass
class ReportConfig:
    out: str = arg("runs/report", "directory for report.md, report.json and the PNGs", group="output",
                   metavar="DIR")
    by: str = arg("", "comma-separated settings that describe a run (default: those that differ between the runs "
                      "given); runs equal in them but for the seed are aggregated, so list seed to keep seeds apart",
                  group="what a run is", metavar="KEY,...")
    dpi: int = arg(100, "PNG resolution in dots per inch, 1 to 600 (each figure's size in inches is fixed)",
                   group="output", range="[1, 600]")
    plots: bool = arg(True, "draw the PNGs (needs matplotlib; --no-plots writes the tables only)", group="output")


@dataclass
class Evaluation:
    """Greedy accuracy on one split at one step, as counts, so that every interval is recomputable."""
    split: str  # "val", "test" or the data set of an evaluate.py run
    step: int | None
    n: int | None  # None when the data set could not be rebuilt (then no interval)
    correct: int | None
    accuracy: float
    per_group: dict = field(default_factory=dict)  # {group: (n, correct, accuracy)}
    records: Path | None = None  # records.jsonl, for paired comparisons


@dataclass
class Run:
    path: Path
    kind: str  # train, eval, bands, rounds
    settings: dict  # what the run is: the config of the run, names spaced by kind for eval and bands
    seed: int | None
    status: str = "complete"  # anything else keeps the run out of every average
    steps: int | None = None
    metrics: list = field(default_factory=list)  # train: one dict per step
    evals: list = field(default_factory=list)  # Evaluation, in step order
    compute: dict = field(default_factory=dict)  # generated_tokens, training_tokens, flops, wall_s, device, code
    bands: dict | None = None  # bands.summarize_bands
    rounds: list = field(default_factory=list)  # rounds: {round, n, fast_correct, deliberate_correct}
    label: str = ""  # the name in tables and legends when the directory's own name is not unique

    @property
    def name(self):
        return self.label or self.path.name

    @property
    def complete(self):
        return self.status == "complete"


# Settings that say how a run was executed or logged, not what it is (train_rl.RESUMABLE and the like).
NOT_WHAT = {"out", "resume", "resumes", "seed", "device", "compile", "save_every", "samples_per_step", "code_version",
            "batch_size", "stop_token_ids", "dataset_hash", "n_problems", "fsdp", "dtype", "responses", "tokenizer",
            "datasets"}

# -----------------------------------------------------------------------------
# Readers: one function per kind of run directory

KINDS = ("train", "eval", "bands", "rounds")


def read_text(path):
    """A file's text, UTF-8 (a BOM allowed); bytes that are not UTF-8 are an error naming the file and line."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#04x}); "
                         f"a run directory's files are UTF-8, so this one is damaged or not a run's") from None


def read_json(path):
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to read") from None


def read_log(path):
    """The objects of a JSONL log and whether its last line was cut off (a killed run)."""
    text = read_text(path) if Path(path).is_file() else ""
    lines = text.split("\n")
    tail = lines.pop()
    rows = [P.parse_json_line(path, i, line) for i, line in enumerate(lines, 1) if line.strip()]
    return rows, bool(tail.strip())


def split_size(problems, group_by):
    """(n, {group: n}) of a list of problems, the groups named as evaluate.py names them."""
    return len(problems), dict(Counter(B.group_value(p, group_by) for p in problems)) if group_by else {}


def counted(where, split, step, accuracy, n, by_group=None, group_sizes=None):
    """An Evaluation from a logged fraction and the split's size: correct = fraction x n, checked whole."""
    def count(acc, size, what):
        if size is None:
            return None
        c = round(acc * size)
        if abs(c - acc * size) > 1e-6:
            raise ValueError(f"{where}: {what} accuracy {acc} at step {step} is not a whole count of {size} "
                             f"problems; the data set named in config.json is not the one this run evaluated")
        return c
    groups = {g: (group_sizes.get(g), count(a, group_sizes.get(g), f"{split} {g}"), a)
              for g, a in (by_group or {}).items()} if group_sizes is not None else \
        {g: (None, None, a) for g, a in (by_group or {}).items()}
    return Evaluation(split, step, n, count(accuracy, n, split), accuracy, groups)


def train_splits(cfg):
    """(val, test) problem lists of a train_rl.py run, rebuilt from its config, or a reason they could not be."""
    import train_rl as T  # the run's own split logic (imports torch)
    names = {f.name for f in fields(T.Config)}
    try:
        _, val, test = P.load_pools(T.Config(**{k: v for k, v in cfg.items() if k in names}))
        return val, test, None
    except (ValueError, FileNotFoundError, TypeError) as e:
        return None, None, f"n unknown, so no intervals ({e})"


def read_train_run(path):
    cfg = read_json(path / "config.json")
    log, cut = read_log(path / "metrics.jsonl")
    metrics = [m for m in log if "reward_mean" in m]
    steps = cfg.get("steps")
    problems = []
    if not metrics:
        problems.append("no step logged")
    elif len(metrics) < steps or metrics[-1]["step"] != steps:
        problems.append(f"{len(metrics)} of {steps} steps logged")
    if not (path / "final").is_dir():
        problems.append("no final/")
    if cut:
        problems.append("partial last log line")
    test_lines = [m for m in log if "test_accuracy" in m]
    if cfg.get("test_dataset") and not problems and not any(m["step"] == steps for m in test_lines):
        problems.append("no test evaluation after training")
    val, test, unknown = train_splits(cfg)
    group_by = cfg.get("eval_group_by") or None
    evals = []
    for m in metrics:
        if "val_accuracy" in m:
            n, sizes = split_size(val, group_by) if val is not None else (None, None)
            by_group = {f"{group_by}={g}": a for g, a in (m.get("val_accuracy_by_group") or {}).items()}
            sizes = {f"{group_by}={g}": k for g, k in sizes.items()} if sizes is not None else None
            evals.append(counted(path, "val", m["step"], m["val_accuracy"], n, by_group, sizes))
    for m in test_lines:
        n, _ = split_size(test, None) if test is not None else (None, None)
        evals.append(counted(path, "test", m["step"], m["test_accuracy"], n))
    last = metrics[-1] if metrics else {}
    wall = sum(m.get("sampling_seconds", 0) + m.get("verifying_seconds", 0) + m.get("training_seconds", 0)
               for m in metrics)
    compute = dict(generated_tokens=last.get("generated_tokens"), training_tokens=last.get("training_tokens"),
                   flops=last.get("flops"), wall_s=wall, device=cfg.get("device") or "auto",
                   code=cfg.get("code_version"), note=unknown and f"{path.name}: {unknown}")
    status = "complete" if not problems else "incomplete: " + ", ".join(problems)
    return Run(path, "train", {k: v for k, v in cfg.items()}, cfg.get("seed"), status,
               metrics[-1]["step"] if metrics else 0, metrics, evals, compute)


def trained_from(model_path):
    """The train_rl.py run a checkpoint came from (DIR/final or DIR/checkpoints/step_N), or None."""
    p = Path(str(model_path or ""))
    for run in (p.parent, p.parent.parent):
        if p.name and (run / "config.json").is_file() and (run / "metrics.jsonl").is_file():
            return run
    return None


def eval_settings(settings, kind):
    """An evaluation's settings under its kind's name (eval.dataset, ...), joined by the config of the run whose
    checkpoint it evaluated, so that `objective` describes an evaluation of a trained model too."""
    own = {f"{kind}.{k}": v for k, v in settings.items()}
    source = trained_from(settings.get("model"))
    if source is None:
        return own, settings.get("seed"), None
    cfg = read_json(source / "config.json")
    own.pop(f"{kind}.model")
    return {**cfg, **own}, cfg.get("seed"), source


def read_eval_run(path):
    settings = read_json(path / "settings.json")
    records, _ = E.read_records(path / "records.jsonl", partial_tail_ok=True)
    summary = read_json(path / "summary.json") if (path / "summary.json").is_file() else None
    s = E.summarize(records, settings)  # recomputed from the records, never read from summary.json
    problems = []
    if len(records) < settings.get("n_problems", len(records)):
        problems.append(f"{len(records)} of {settings['n_problems']} problems recorded")
    if summary is None:
        problems.append("no summary.json")
    breakdowns = dict(level=s["by_level"], subject=s["by_subject"])
    if settings.get("group_by"):
        breakdowns[settings["group_by"]] = s["per_group"]  # the same groups again when it is level or subject
    groups = {f"{key}={g}": (v["n"], v["correct"], v["accuracy"]) for key, by in breakdowns.items()
              for g, v in by.items()}
    name = Path(str(settings.get("dataset"))).stem
    evals = [Evaluation(name, None, s["n"], s["correct"], s["accuracy"] or 0.0, groups, path / "records.jsonl")]
    what, seed, _ = eval_settings(settings, "eval")
    compute = dict(generated_tokens=s["completion_tokens_total"], training_tokens=None,
                   flops=(summary or {}).get("inference_flops"), wall_s=(summary or {}).get("wall_time_s"),
                   device=settings.get("device"), code=None)  # evaluate.py does not record its code version
    status = "complete" if not problems else "incomplete: " + ", ".join(problems)
    return Run(path, "eval", what, seed, status, evals=evals, compute=compute)


def read_bands_run(path):
    rows = B.read_bands(path)
    saved = read_json(path / "bands_summary.json") if (path / "bands_summary.json").is_file() else None
    settings = (saved or {}).get("settings") or read_json(path / "settings.json")
    group_by = (saved or {}).get("group_by") or settings.get("group_by") or "source"
    what, seed, _ = eval_settings(settings, "bands")
    status = "complete" if saved is not None else "incomplete: no bands_summary.json"
    tokens = sum(s["completion_tokens"] for r in E.read_records(path / "records.jsonl", True)[0]
                 for s in E.samples_of(r)) if (path / "records.jsonl").is_file() else None
    evaluation = read_json(path / "summary.json") if (path / "summary.json").is_file() else {}
    return Run(path, "bands", what, seed, status, bands=B.summarize_bands(rows, group_by),
               compute=dict(generated_tokens=tokens, flops=evaluation.get("inference_flops"),
                            wall_s=(saved or {}).get("wall_time_s"), device=settings.get("device")))


def read_rounds_run(path):
    """A rounds.py run: one entry per row of rounds.jsonl (row 0 is pi_0), accuracies back to counts; complete
    once it holds rounds + 1 rows and round_<rounds>/."""
    cfg = read_json(path / "config.json") if (path / "config.json").is_file() else {}
    rows, cut = read_log(path / "rounds.jsonl")
    rounds = []
    for row in rows:
        counts = {}
        for mode in ("fast", "deliberate"):
            n = row[f"{mode}_n"]
            counts[f"{mode}_correct"] = round(row[f"{mode}_accuracy"] * n)
        rounds.append(dict(round=row["round"], n=row["fast_n"], **counts))
    want = cfg.get("rounds")
    problems = []
    if want is not None and len(rows) < want + 1:
        problems.append(f"{len(rows)} of {want + 1} rows")
    if cut:
        problems.append("partial last line")
    if not cfg:
        problems.append("no config.json")
    status = "complete" if not problems else "incomplete: " + ", ".join(problems)
    last = rows[-1] if rows else {}
    compute = dict(generated_tokens=sum(r.get("deliberation_tokens", 0) or 0 for r in rows) or None,
                   flops=last.get("cumulative_flops"), wall_s=sum(r.get("seconds", 0) or 0 for r in rows) or None,
                   device=cfg.get("device") or "auto", code=cfg.get("code_version"))
    return Run(path, "rounds", cfg, cfg.get("seed"), status, steps=len(rows) - 1 if rows else 0, rounds=rounds,
               compute=compute)


# (what marks the kind, its reader), tried in order: a bands.py output also holds an evaluation's files.
READERS = (
    (lambda d: (d / "config.json").is_file() and (d / "metrics.jsonl").is_file(), read_train_run),
    (lambda d: (d / "bands.jsonl").is_file(), read_bands_run),
    (lambda d: (d / "rounds.jsonl").is_file(), read_rounds_run),
    (lambda d: (d / "settings.json").is_file() and (d / "records.jsonl").is_file(), read_eval_run),
)


def read_run(path):
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run directory")
    for is_kind, reader in READERS:
        if is_kind(path):
            return reader(path)
    raise ValueError(f"{path}: not a run directory (report.py reads train_rl.py runs: config.json + metrics.jsonl; "
                     f"evaluate.py outputs: settings.json + records.jsonl; bands.py outputs: bands.jsonl)")


# -----------------------------------------------------------------------------
# What each run is, and which runs differ only by seed


def value_text(v):
    return v if isinstance(v, str) else json.dumps(v)


def describing_keys(runs, by=None):
    """--by's settings, else those whose values differ between the runs that have them (and the kind, when runs
    of several kinds are given: an evaluation's own settings are not compared with a training run's)."""
    if by:
        known = {k for r in runs for k in r.settings} | {"kind", "seed"}
        for k in by:
            if k not in known:
                raise ValueError(f"--by {k}: no run given has that setting (e.g. {', '.join(sorted(known)[:8])})")
        return list(by)
    keys = sorted({k for r in runs for k in r.settings} - NOT_WHAT - {f"{kind}.{k}" for kind in ("eval", "bands")
                                                                       for k in NOT_WHAT})
    values = lambda k: {value_text(setting(r, k)) for r in runs if k in r.settings}  # noqa: E731
    return (["kind"] if len({r.kind for r in runs}) > 1 else []) + [k for k in keys if len(values(k)) > 1]


def setting(run, key):
    return run.kind if key == "kind" else run.seed if key == "seed" else run.settings.get(key)


def describe(run, keys):
    return ", ".join(f"{k}={value_text(setting(run, k))}" for k in keys if k != "seed") or "-"


def seed_groups(runs, keys):
    """{(kind, description, seed if --by keeps seeds apart): runs}, the runs equal in every describing setting
    but the seed, in the order given."""
    groups = {}
    for r in sorted(runs, key=lambda r: KINDS.index(r.kind)):  # stable: training runs first, then evaluations
        groups.setdefault((r.kind, describe(r, keys), r.seed if "seed" in keys else None), []).append(r)
    return groups


# -----------------------------------------------------------------------------
# Tables


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def with_ci(e):
    if e is None:
        return "-"
    if e.n is None:
        return f"{pct(e.accuracy)} (n unknown)"
    lo, hi = stats.wilson(e.correct, e.n)
    return f"{pct(e.accuracy)} [{100 * lo:.1f}, {100 * hi:.1f}]"


def short_version(code):
    """A git commit to 10 digits, keeping a -dirty mark (the full one is in report.json)."""
    commit, dirty, _ = code.partition("-")
    return commit[:10] + ("-" + _ if dirty else "")


def num(x, fmt="{:,}"):
    return "-" if x is None else fmt.format(x)


def last_of(run, split):
    mine = [e for e in run.evals if e.split == split]
    return mine[-1] if mine else None


def final_accuracy(run):
    """(validation, test) evaluations a run ends with; an evaluate.py run's one evaluation counts as test."""
    if run.kind == "eval":
        return None, run.evals[0]
    return last_of(run, "val"), last_of(run, "test")


NUMERIC = {"n", "seed", "seeds", "steps", "step", "round", "correct", "generated", "training", "FLOPs", "wall", "mixed",
           "only", "both", "neither"}


def md_table(header, rows):
    right = [i for i, h in enumerate(header) if h.split()[0] in NUMERIC or h.startswith(B.BANDS)]
    line = lambda cells: "| " + " | ".join(str(c) for c in cells) + " |"  # noqa: E731
    rule = ["---:" if i in right else "---" for i in range(len(header))]
    return "\n".join([line(header), line(rule), *(line(r) for r in rows)])


def runs_table(runs, keys):
    header = ["run", "what", "seed", "steps", "status", "val accuracy [95% CI]", "test accuracy [95% CI]",
              "generated tokens", "training tokens", "FLOPs", "wall s", "device", "code"]
    rows = []
    for r in runs:
        val, test = final_accuracy(r)
        step = lambda e: "" if e is None or e.step is None or e.step == r.steps else f" @ step {e.step}"  # noqa: E731
        c = r.compute
        rows.append([f"`{r.name}`", describe(r, keys), num(r.seed, "{}"), num(r.steps, "{}"), r.status,
                     with_ci(val) + step(val), with_ci(test) + (f" ({test.split})" if r.kind == "eval" and test else
                                                                step(test)),
                     num(c.get("generated_tokens")), num(c.get("training_tokens")), num(c.get("flops"), "{:.3g}"),
                     num(c.get("wall_s"), "{:.0f}"), num(c.get("device"), "{}"),
                     num(c.get("code") and short_version(c["code"]), "`{}`")])
    return md_table(header, rows)


def accuracy_rows(runs):
    """Every evaluation of every run, overall and per group, with n, correct and the Wilson interval."""
    rows = []
    for r in runs:
        for e in r.evals:
            at = "" if e.step is None else f" @ step {e.step}"
            rows.append([f"`{r.name}`", e.split + at, "all", num(e.n, "{}"), num(e.correct, "{}"), with_ci(e)])
            for g, (n, c, a) in sorted(e.per_group.items()):
                rows.append([f"`{r.name}`", e.split + at, g, num(n, "{}"), num(c, "{}"),
                             with_ci(Evaluation(e.split, e.step, n, c, a))])
    return md_table(["run", "split", "group", "n", "correct", "accuracy [95% Wilson]"], rows)


def seeds_table(runs, keys):
    """Final accuracies of the runs that differ only by seed; incomplete runs are named and left out."""
    rows = []
    for (kind, what, _), group in seed_groups(runs, keys).items():
        done = [r for r in group if r.complete]
        left_out = ", ".join(f"`{r.name}` ({r.status})" for r in group if not r.complete) or "-"
        if not done:
            rows.append([what, "-", 0, "-", "-", "-", "-", "-", left_out])
        for split in ("val", "test"):
            evals = [final_accuracy(r)[split == "test"] for r in done]
            if not evals or any(e is None for e in evals):
                continue
            label = split if kind != "eval" else evals[0].split
            shared = set.intersection(*(set(e.per_group) for e in evals))  # groups every seed was evaluated on
            for group in ["all", *sorted(shared)]:
                accs = [e.accuracy if group == "all" else e.per_group[group][2] for e in evals]
                mean, ci = stats.t_interval(accs)
                rows.append([what, label if group == "all" else f"{label} {group}", len(done),
                             " / ".join(str(r.seed) for r in done), " / ".join(pct(a) for a in accs), pct(mean),
                             f"{pct(min(accs))} - {pct(max(accs))}",
                             "-" if ci is None else f"[{100 * max(ci[0], 0):.1f}, {100 * min(ci[1], 1):.1f}]",
                             left_out])
    return md_table(["what", "split (group)", "n seeds", "seeds", "accuracy per seed", "mean", "min - max",
                     "95% t interval (seeds)", "left out"], rows)


def pairings(runs, keys):
    """(A, B) pairs of evaluations of the same problems: the first run given on those problems is the reference;
    a run is paired with the reference group's run of its own seed when there is one."""
    by_problems = {}
    for r in runs:
        if r.kind == "eval" and r.complete:
            s = {k.split(".", 1)[1]: v for k, v in r.settings.items() if k.startswith("eval.")}
            by_problems.setdefault((s.get("dataset_hash"), s.get("n_problems")), []).append(r)
    pairs = []
    for group in by_problems.values():
        reference = group[0]
        ref_key = describe(reference, keys)
        same = {r.seed: r for r in group if describe(r, keys) == ref_key}
        for b in group[1:]:
            a = same.get(b.seed, reference) if describe(b, keys) != ref_key else reference
            pairs.append((a, b if a is not b else None))
    return [(a, b) for a, b in pairs if b is not None]


def compare_table(runs, keys):
    rows = []
    for a, b in pairings(runs, keys):
        c = E.compare(a.evals[0].records, b.evals[0].records)
        rows.append([f"`{a.name}`", f"`{b.name}`", c["n"], pct(c["accuracy_a"]), pct(c["accuracy_b"]),
                     f"{100 * c['difference']:+.1f} [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}]",
                     c["both_correct"], c["only_a_correct"], c["only_b_correct"], c["neither_correct"],
                     f"{c['mcnemar_p']:.3g}"])
    return md_table(["A", "B", "n paired", "A accuracy", "B accuracy", "B - A points [95% bootstrap]",
                     "both right", "only A right", "only B right", "neither", "McNemar p"], rows) if rows else ""


def bands_table(run):
    s = run.bands
    temperature = run.settings.get("bands.temperature")
    header = [f"bands of `{run.name}` (k = {s['k']}, temperature {temperature})", "n", *B.BANDS, "accuracy",
              "mixed if equally hard"]
    line = lambda name, st: [name, st["n"], *(st[b] for b in B.BANDS), pct(st["accuracy"]),  # noqa: E731
                             f"{st['mixed_if_equally_hard']:.1f}"]
    return md_table(header, [line("all", s["overall"]),
                             *(line(f"{s['group_by']}={g}", st) for g, st in s["per_group"].items())])


def rounds_table(runs):
    rows = []
    for r in runs:
        for x in r.rounds:
            fast, slow = (Evaluation("", x["round"], x["n"], x[k], x[k] / x["n"]) for k in
                          ("fast_correct", "deliberate_correct"))
            rows.append([f"`{r.name}`", x["round"], x["n"], with_ci(fast), with_ci(slow)])
    return md_table(["run", "round", "n", "fast accuracy [95% CI]", "deliberate accuracy [95% CI]"], rows)


def validation_table(runs):
    rows = []
    for r in runs:
        for e in (e for e in r.evals if e.split == "val"):
            groups = ", ".join(f"{g} {pct(a)}" for g, (_, _, a) in sorted(e.per_group.items()))
            rows.append([f"`{r.name}`", e.step, with_ci(e), groups or "-"])
    return md_table(["run", "step", "val accuracy [95% CI]", "per group"], rows)


def report_markdown(runs, keys, plots):
    notes = sorted({r.compute.get("note") for r in runs if r.compute.get("note")})
    parts = [f"# Report on {len(runs)} run(s)", "",
             f"Described by: {', '.join(keys) or '(the runs differ only by seed)'}. Accuracy intervals are 95% Wilson "
             f"intervals (stats.wilson). For train_rl.py runs, n is the size of the validation / test set rebuilt "
             f"from config.json (problems.load_pools) and correct = logged fraction x n; FLOPs are the run's "
             f"sampling + training FLOPs (evaluation not counted) and wall s sums its sampling, verifying and "
             f"training seconds. For evaluate.py runs everything is recomputed from records.jsonl except FLOPs and "
             f"wall time (summary.json); an evaluation of a run's final/ carries that run's settings and seed, and "
             f"its code column is empty (evaluate.py records no code version).", "", "## Runs", "",
             runs_table(runs, keys)]
    if notes:
        parts += ["", "Notes: " + "; ".join(notes)]
    if any(r.evals for r in runs):
        parts += ["", "## Accuracy per group", "", accuracy_rows(runs)]
    if any(e.split == "val" for r in runs for e in r.evals):
        parts += ["", "## Validation accuracy by step", "", validation_table(runs)]
    if any(r.evals for r in runs):
        parts += ["", "## Across seeds", "", "Runs equal in every setting above but the seed; incomplete runs are "
                  "listed under 'left out', never averaged. The t interval is clipped to [0, 100]%.", "",
                  seeds_table(runs, keys)]
    comparisons = compare_table(runs, keys)
    if comparisons:
        parts += ["", "## Paired comparisons (same problems)", "", "evaluate.compare: B - A over the problems "
                  "both evaluated, percentile bootstrap over problems, exact McNemar test on the discordant pairs. "
                  "The reference A is the first run given on those problems, or its group's run of B's seed.", "",
                  comparisons]
    for r in runs:
        if r.bands:
            parts += ["", f"## Bands: `{r.name}`", "", bands_table(r)]
    if any(r.rounds for r in runs):
        parts += ["", "## Rounds: fast and deliberate accuracy", "", rounds_table([r for r in runs if r.rounds])]
    if plots:
        parts += ["", "## Plots", ""] + [f"![{p.stem}]({p.name}) `{p.name}`, {w} x {h} px" for p, (w, h) in plots]
    return "\n".join(parts) + "\n"


# -----------------------------------------------------------------------------
# Plots (matplotlib, optional)

# (metrics key, y label, kind): a "rate" lies in [0, 1], a "count" gets integer ticks
CURVES = (("reward_mean", "reward", "value"), ("accuracy", "rollout accuracy", "rate"),
          ("response_tokens_mean", "response tokens", "count"), ("entropy", "entropy per token", "value"))
SEED_STYLES = ("-", "--", ":", "-.")
TITLE_CHARS = 150  # a title line's length at 10 pt across a 12-inch figure


def png_size(path):
    """(width, height) of a PNG from its IHDR chunk; ValueError if the file is not a PNG."""
    head = Path(path).read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path}: not a PNG image")
    return struct.unpack(">II", head[16:24])


def listing(items, width):
    """Items joined by commas, cut to `width` characters with a count of the rest ("a, b and 5 more")."""
    k = len(items)
    text = ", ".join(items)
    while len(text) > width and k > 1:
        k -= 1
        text = ", ".join(items[:k]) + f" and {len(items) - k} more"
    return text


def draw_family(ax, series, color, styles):
    """One line per run (its seed's line style) and the min-max band over the seeds at each point."""
    for run, x, y in series:
        ax.plot(x, y, styles[run.seed], color=color, lw=1.2 if run.complete else 0.7, ms=3,
                marker="o" if len(x) <= 12 else None)  # a few evaluations: show where they are
    done = [(x, y) for run, x, y in series if run.complete]  # an incomplete run is drawn, never in a band
    if len(done) > 1 and len({len(x) for x, _ in done}) == 1:
        xs, ys = np.array([x for x, _ in done], float), np.array([y for _, y in done], float)
        ax.fill_between(xs.mean(0), np.nanmin(ys, 0), np.nanmax(ys, 0), color=color, alpha=0.18, lw=0)


def settle_ylim(ax, rate):
    """A constant series (all zero, say) gets a y axis that reads, instead of matplotlib's +-5% around it (-0.055
    to 0.055 for zeros): 0 to 1 for a rate in [0, 1] and for zeros, else 10% either side, which stays above 0 for
    positive data. Points on the edge (0 or 1) are drawn whole."""
    ys = np.concatenate([np.asarray(line.get_ydata(), float) for line in ax.lines] or [np.array([])])
    ys = ys[np.isfinite(ys)]
    if not len(ys) or ys.max() - ys.min() > 1e-9 * max(1.0, abs(ys.max())):
        return
    c = float(ys.max())
    lo, hi = (0.0, 1.0) if c == 0 or (rate and 0 <= c <= 1) else (c - 0.1 * abs(c), c + 0.1 * abs(c))
    ax.set_ylim(lo, hi)
    for line in ax.lines:
        line.set_clip_on(False)


def legend_entries(families, colors, styles, results=None):
    """A legend that stays readable with many runs: one entry per family (its colour), one per seed (its line
    style), one per test marker drawn (before and after training), and one per incomplete run, instead of one per
    run."""
    from matplotlib.lines import Line2D
    entries = [(Line2D([], [], color=colors[j % len(colors)], lw=2),  # runs alike but for the seed: their names
                what if what != "-" else listing([r.name for r in group], 40))
               for j, ((_, what, _), group) in enumerate(families.items())]
    if len(styles) > 1:
        entries += [(Line2D([], [], color="black", ls=style, lw=1.2), f"seed {seed}") for seed, style in styles.items()]
    for after, text in ((False, "test accuracy before training (open)"),
                        (True, "test accuracy after training (filled)")):
        if any(a == after for marks in (results or {}).values() for *_, a in marks):
            entries.append((Line2D([], [], color="black", ls="none", marker="s", mfc="black" if after else "none"),
                            text))
    entries += [(Line2D([], [], color="black", lw=0.7), f"{r.name} (incomplete, thin)")
                for group in families.values() for r in group if not r.complete]
    return entries


def curve_figure(plt, runs, keys, panels, dpi, title=(), results=None):
    """Rows of panels (y label, {run: (steps, flops, values)}, kind), each against step and cumulative FLOPs, under
    `title` (its lines) and the legend. results ({run: test marks}, result_marks) are drawn as squares in the run's
    colour on the first rate panel, at step 0 (open) and the last step (filled)."""
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 3.2 * len(panels)), dpi=dpi, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    families = seed_groups(runs, keys)
    seeds = sorted({r.seed for r in runs}, key=str)
    styles = {seed: SEED_STYLES[i % len(SEED_STYLES)] for i, seed in enumerate(seeds)}
    marked = next((i for i, (_, _, kind) in enumerate(panels) if kind == "rate"), None) if results else None
    for i, (row, (ylabel, data, kind)) in enumerate(zip(axes, panels)):
        for j, group in enumerate(families.values()):
            color = colors[j % len(colors)]
            for ax, xi in zip(row, (0, 1)):
                draw_family(ax, [(r, data[r.name][xi], data[r.name][2]) for r in group if r.name in data], color,
                            styles)
                marks = [m for r in group for m in results.get(r.name, ())] if i == marked else []
                for step, flops, accuracy, after in marks:
                    ax.plot([(step, flops)[xi]], [accuracy], ls="none", marker="s", ms=6, color=color,
                            mfc=color if after else "none", zorder=3)
        for ax, xlabel in zip(row, ("step", "cumulative FLOPs (sampling + training)")):
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if xlabel == "step":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if kind == "count":
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            settle_ylim(ax, kind == "rate")
    handles, labels = zip(*legend_entries(families, colors, styles, results))
    # columns as wide as the longest label allows at 9 pt (~0.07 inch a character, 0.8 for the line sample)
    ncol = max(1, min(3, int(fig.get_figwidth() // (0.07 * max(map(len, labels)) + 0.8))))
    height = fig.get_figheight()  # fixed margins in inches (tight_layout costs seconds per figure)
    title = [line for line in title if line]
    above = 0.22 * len(title) + 0.1 if title else 0.0
    if title:
        fig.suptitle("\n".join(title), y=1 - 0.08 / height, va="top", fontsize=10)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - above / height), ncol=ncol,
               fontsize=9, frameon=False)
    legend = 0.25 * math.ceil(len(labels) / ncol) + 0.15
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.55 / height, top=1 - (above + legend) / height,
                        wspace=0.22, hspace=0.75 / 3.2)
    return fig


def training_panels(runs):
    """training.png's rows. The reward row only where some run's reward differs from its rollout accuracy (a
    format penalty, --reward random or format); by default they are equal and the accuracy row says so."""
    train = [r for r in runs if r.metrics]
    same = all(m.get("reward_mean") is not None and m.get("accuracy") is not None and
               math.isclose(m["reward_mean"], m["accuracy"], rel_tol=0, abs_tol=1e-12)
               for r in train for m in r.metrics)
    panels = []
    for key, label, kind in CURVES:
        if key == "reward_mean" and same:
            continue
        panels.append((label + (" (= reward)" if key == "accuracy" and same else ""),
                       {r.name: ([m["step"] for m in r.metrics], [m["flops"] for m in r.metrics],
                                 [m.get(key, float("nan")) for m in r.metrics]) for r in train}, kind))
    return panels if train else []


def validation_panels(runs):
    flops = {r.name: {m["step"]: m["flops"] for m in r.metrics} for r in runs}
    vals = {r.name: [e for e in r.evals if e.split == "val"] for r in runs}
    vals = {k: v for k, v in vals.items() if v}
    if not vals:
        return []
    panels = [("val accuracy", {k: ([e.step for e in v], [flops[k][e.step] for e in v], [e.accuracy for e in v])
                                for k, v in vals.items()}, "rate")]
    for g in sorted({g for v in vals.values() for e in v for g in e.per_group}):
        panels.append((f"val accuracy, {g}", {k: ([e.step for e in v], [flops[k][e.step] for e in v],
                                                  [e.per_group.get(g, (0, 0, float("nan")))[2] for e in v])
                                              for k, v in vals.items()}, "rate"))
    return panels


def result_marks(runs):
    """{run: [(step, FLOPs, accuracy, after)]}: the test accuracy train_rl.py logs before training (step 0) and
    after its last step, the run's result, for the markers on the accuracy panels."""
    results = {}
    for r in runs:
        flops = {0: 0, **{m["step"]: m["flops"] for m in r.metrics}}
        last = r.metrics[-1]["step"] if r.metrics else None
        marks = [(e.step, flops[e.step], e.accuracy, e.step != 0) for e in r.evals
                 if e.split == "test" and e.step in (0, last)]
        if marks:
            results[r.name] = marks
    return results


def results_line(runs, keys, results):
    """ "test accuracy before -> after training: a 42.4% -> 51.6%, ...": per run for up to 4 runs, else per
    family, the mean over its complete runs that have both."""
    def accuracy(marks, after):
        return next((a for _, _, a, is_after in marks if is_after == after), None)
    if not results:
        return ""
    if len(runs) <= 4:
        items = [f"{r.name} {pct(accuracy(results[r.name], False))} → {pct(accuracy(results[r.name], True))}"
                 for r in runs if r.name in results]
    else:
        items = []
        for (_, what, _), group in seed_groups(runs, keys).items():
            both = [results[r.name] for r in group if r.complete and len(results.get(r.name, ())) == 2]
            if both:
                mean = lambda after: float(np.mean([accuracy(m, after) for m in both]))  # noqa: E731
                items.append(f"{what if what != '-' else 'all'} {pct(mean(False))} → {pct(mean(True))} "
                             f"(mean of {len(both)})")
    return "test accuracy before → after training: " + listing(items, TITLE_CHARS - 40) if items else ""


def bands_figure(plt, runs, dpi):
    """Stacked band counts, one bar per run and group (all, then each group)."""
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(10, 5), dpi=dpi)
    colors = dict(all_zero="#c44e52", mixed="#55a868", all_one="#4c72b0")
    bars = [(f"{r.name}\n{g}", st) for r in runs for g, st in [
        ("all", r.bands["overall"]), *((f"{r.bands['group_by']}={v}", st) for v, st in r.bands["per_group"].items())]]
    bottoms = np.zeros(len(bars))
    for b in B.BANDS:
        counts = np.array([st[b] for _, st in bars])
        ax.bar(range(len(bars)), counts, bottom=bottoms, color=colors[b], label=b)
        bottoms += counts
    ax.set_xticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    ax.set_ylabel("problems")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"bands of {listing([r.name for r in runs], 60)}: problems with 0 of k, some, or k of k samples "
                 f"right", fontsize=10)
    ax.legend()
    fig.tight_layout()
    return fig


def rounds_figure(plt, runs, dpi):
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(8, 5), dpi=dpi)
    for r in runs:
        rounds = [x["round"] for x in r.rounds]
        for key, style in (("fast_correct", "-o"), ("deliberate_correct", "--s")):
            ax.plot(rounds, [x[key] / x["n"] for x in r.rounds], style, label=f"{r.name}, {key.split('_')[0]}")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("accuracy")
    settle_ylim(ax, rate=True)
    ax.set_title(f"rounds: {listing([r.name for r in runs], 70)}", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def figures(plt, runs, keys, dpi):
    """{file name: figure} for the runs: training.png and validation.png for train_rl.py runs, bands.png, rounds.png;
    each titled with the runs it draws."""
    figs, trained = {}, [r for r in runs if r.metrics]
    # legends name the settings that differ between the runs drawn (kind=train would say nothing)
    drawn = [k for k in keys if len({value_text(setting(r, k)) for r in trained}) > 1]
    results = result_marks(trained)
    names, result = listing([r.name for r in trained], TITLE_CHARS - 25), results_line(trained, drawn, results)
    if trained:
        figs["training.png"] = curve_figure(plt, trained, drawn, training_panels(trained), dpi,
                                            [f"training: {names}", result], results)
    if validation_panels(trained):
        figs["validation.png"] = curve_figure(plt, trained, drawn, validation_panels(trained), dpi,
                                              [f"validation accuracy: {names}", result], results)
    if any(r.bands for r in runs):
        figs["bands.png"] = bands_figure(plt, [r for r in runs if r.bands], dpi)
    if any(r.rounds for r in runs):
        figs["rounds.png"] = rounds_figure(plt, [r for r in runs if r.rounds], dpi)
    return figs


def write_plots(runs, keys, out, dpi):
    """The PNGs and their sizes; [] with a message when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib is not installed, so no plots were drawn (pip install matplotlib, or "
              "pip install -r requirements-dev.txt); the tables are written", file=sys.stderr)
        return []
    written = []
    for name, fig in figures(plt, runs, keys, dpi).items():
        fig.savefig(out / name)
        plt.close(fig)
        written.append((out / name, png_size(out / name)))
    return written


# -----------------------------------------------------------------------------
# CLI


REPORT_FILES = ("report.md", "report.json")  # with the PNGs: what a report directory holds


def check_out(out):
    """Refuse an --out holding anything but a previous report (its report.md / report.json and PNGs), as
    runs.check_out does for runs: a report is rewritten in place, other files are never written over."""
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    ours = [n for n in names if n in REPORT_FILES or n.endswith(".png")]
    if names and (ours != names or not any(n in REPORT_FILES for n in names)):
        what = describe_dir(out) or f"{len(names)} other file(s)"
        other = [n for n in names if n not in ours] or names
        raise FileExistsError(f"--out {out}: holds {what} ({', '.join(other[:3])}{' ...' * (len(other) > 3)}), not a "
                              f"report; refusing to write into it. Choose another --out (an empty or new directory, or "
                              f"a previous report)")


def report(run_dirs, out, by=(), dpi=100, plots=True):
    """Read the runs, write report.md, report.json and the PNGs into out; returns the markdown. Every flag and
    run directory is checked before anything is written."""
    cli.check_fields(ReportConfig(str(out), ",".join(by), dpi, plots))
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: a file, not a directory")
    check_out(out)
    mine = [d for d in run_dirs if Path(d).resolve() == out.resolve()]  # `report.py runs/x/* --out runs/x/report`
    if mine:
        print(f"report.py: leaving out {mine[0]}, the report's own --out", file=sys.stderr)
    runs = [read_run(d) for d in run_dirs if d not in mine]
    if not runs:
        raise ValueError("no run directory given")
    if len(runs) != len({r.path.resolve() for r in runs}):
        raise ValueError("a run directory is given twice")
    names = Counter(r.name for r in runs)
    for r in runs:  # two runs named alike (a/eval, b/eval) are told apart by their parent
        if names[r.name] > 1:
            r.label = f"{r.path.parent.name}/{r.path.name}"
    keys = describing_keys(runs, list(by))
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(runs, keys, out, dpi) if plots else []
    text = report_markdown(runs, keys, plots)
    (out / "report.md").write_text(text)
    write_json(out / "report.json", [dict(path=str(r.path), kind=r.kind, seed=r.seed, status=r.status,
                                            steps=r.steps, what=describe(r, keys), compute=r.compute,
                                            evals=[dict(split=e.split, step=e.step, n=e.n, correct=e.correct,
                                                        accuracy=e.accuracy, per_group=e.per_group)
                                                   for e in r.evals]) for r in runs])
    return text


def help_description():
    """--help's text: the module docstring's first paragraph and its two example commands, a line each."""
    first, examples = __doc__.strip().split("\n\n")[:2]
    return textwrap.fill(" ".join(first.split()), 108) + "\n\nexamples:\n" + "\n".join(
        "  " + line.strip() for line in examples.splitlines())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="report.py", description=help_description(),
                                     usage="%(prog)s RUN_DIR... [--out DIR] [--by KEY,...] [--dpi N] [--no-plots]",
                                     epilog="research/REPORT.md describes the tables and plots.",
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="train_rl.py, evaluate.py, bands.py or rounds.py output directories")
    cli.add_flags(parser, ReportConfig)
    args = vars(parser.parse_args(sys.argv[1:] if argv is None else argv))
    run_dirs = args.pop("runs")
    cfg = ReportConfig(**args)
    cli.check_fields(cfg)
    text = report(run_dirs, cfg.out, [k for k in cfg.by.split(",") if k], cfg.dpi, cfg.plots)
    print(text)
    print(f"wrote {Path(cfg.out) / 'report.md'}", file=sys.stderr)
    return text


if __name__ == "__main__":
    cli.run_main(main, "report.py")
