"""
Bands: where a model's frontier sits on a problem pool, and the training pool built from it.

    python research/bands/bands.py --model M --dataset aime24 --dataset amc23 -k 8 --temperature 1.0 --out runs/bands/M
    python research/bands/bands.py compare runs/bands/A runs/bands/B  # 3x3 table of bands, problems matched by id,
                                                                      # and the changes sampling noise alone gives
    python research/bands/bands.py table -k 8                         # P(mixed) for a group of 8

Group-relative RL (GRPO, Dr. GRPO) learns only from groups whose rewards differ: when all G samples of a
problem are wrong, or all right, every advantage in the group is zero. So this tool samples k completions
per problem (evaluate.evaluate with samples=k: the same prompt, sampler, checker and resume), counts the
correct ones, and puts each problem in a band:

    all_zero: 0 of k correct      mixed: 1 to k-1 correct      all_one: k of k correct

A problem solved with probability p is mixed in a group of G with P(mixed) = 1 - p^G - (1 - p)^G:
99% at p = 0.5 but 57% at p = 0.9 and 34% at p = 0.05 (G = 8). Many mixed problems therefore means many
problems near the middle of the model's ability, not more exploration.

Outputs in --out DIR, next to evaluate.py's settings.json, records.jsonl (all k samples) and summary.json:
    bands.jsonl          one row per problem: id, source, group, n_correct of k, band, completion length mean
                         and std, finish reasons, distinct answers, dispersion (diversity.embedding_dispersion:
                         mean pairwise cosine distance of the k completions in the model's own embeddings)
    bands_summary.json   band counts and mean dispersion overall and per group, the mean dispersion per band,
                         the histogram of correct counts, the mixed count expected if all problems were equally
                         hard, pool sizes, settings
    heldout.jsonl        --heldout-per-group problems of each group, chosen by a seeded hash of their id
    mixed_pool.jsonl     the mixed problems that are not held out: `train_rl.py --dataset DIR/mixed_pool.jsonl`
    full_pool.jsonl      every problem that is not held out (the unfiltered control pool)
Every pool is checked against MATH-500 (problems.check_held_out). Rerunning the same command resumes: the
finished problems are read back from records.jsonl, and the band files are rewritten from all records.

Compare: two runs on one pool (two models, or one model with another --seed or -k) tabulated band against
band. Beside the observed number of problems that change band it gives the number sampling noise alone would
give: each problem at its pooled pass rate p = (c_A + c_B) / (k_A + k_B), each run an independent
Binomial(k, p) count put in a band by band(), so a problem changes band with probability
q = 1 - sum_b P_A(b) P_B(b), and the count of changes is a sum of independent Bernoullis (Poisson binomial:
mean sum q, variance sum q(1 - q), exact distribution by the recursion in Hong 2013). Excess changes over that
are movement of the pass rates. It is a plug-in estimate: a problem at 0 of k in both runs counts as p = 0
and can never change, though its true rate may be small and not zero. Runs of one model with the same --seed
share their draws (sample j of a problem is the same in both), so they are not independent; compare says so.
"""

import argparse
import hashlib
import json
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the core, and research.*
import checkpoint  # noqa: E402
import cli  # noqa: E402
import evaluate as E  # noqa: E402
import model as M  # noqa: E402
import problems as P  # noqa: E402
import runs  # noqa: E402
import verify  # noqa: E402

BANDS = ("all_zero", "mixed", "all_one")
P_TABLE = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)

# -----------------------------------------------------------------------------
# Formulas


def band(n_correct, k):
    """all_zero (0 of k correct), all_one (k of k) or mixed (anything between)."""
    if not 0 <= n_correct <= k:
        raise ValueError(f"n_correct={n_correct} must be in [0, k={k}]")
    return "all_zero" if n_correct == 0 else "all_one" if n_correct == k else "mixed"


def p_mixed(p, group_size):
    """Probability that a group of G independent samples, each right with probability p, holds both a
    right and a wrong one: 1 - p^G - (1 - p)^G."""
    return 1.0 - p**group_size - (1.0 - p) ** group_size


def binomial_histogram(n, p, k):
    """Expected problems with c = 0..k correct of k if all n problems had success probability p."""
    return [n * math.comb(k, c) * p**c * (1 - p) ** (k - c) for c in range(k + 1)]


def band_probabilities(p, k):
    """{band: probability} of a problem solved with probability p, its Binomial(k, p) count put in a band by band()."""
    probs = dict.fromkeys(BANDS, 0.0)
    for c in range(k + 1):
        probs[band(c, k)] += math.comb(k, c) * p**c * (1 - p) ** (k - c)
    return probs


def p_band_change(p, k_a, k_b):
    """Probability that two independent runs of k_a and k_b samples, each right with probability p, put a problem
    in different bands: 1 - sum over bands of P_A(b) P_B(b)."""
    a, b = band_probabilities(p, k_a), band_probabilities(p, k_b)
    return max(0.0, 1.0 - sum(a[x] * b[x] for x in BANDS))  # max: rounding below 0 at p = 0 or 1


def poisson_binomial(qs):
    """P(X = 0..n) for X a sum of independent Bernoulli(q_i): the recursion that adds one problem at a time
    (Hong 2013, Comput. Stat. Data Anal. 59, sec. 2.3), exact up to rounding."""
    dist = np.ones(1)
    for q in qs:
        dist = np.convolve(dist, [1.0 - q, q])
    return dist


# -----------------------------------------------------------------------------
# Per-problem rows and their summary


def group_value(row, group_by):
    """The group a problem belongs to: its `group_by` field as text, "?" when it has none (as evaluate.py)."""
    return "?" if row.get(group_by) is None else str(row[group_by])


def band_rows(records, group_by="source"):
    """One row per problem from evaluate.py records of k samples each. The length std and the distinct
    extracted answers (no answer counts as one) are defined as diversity.group_diversity's per group."""
    rows = []
    for r in records:
        samples = E.samples_of(r)
        n_correct, tokens = sum(bool(s["correct"]) for s in samples), [s["completion_tokens"] for s in samples]
        rows.append(dict(id=r["id"], source=r.get("source"), group=group_value(r, group_by), answer=r["answer"],
                         k=len(samples), n_correct=n_correct, band=band(n_correct, len(samples)),
                         completion_tokens_mean=float(np.mean(tokens)),
                         completion_tokens_std=float(np.std(tokens, ddof=1)) if len(tokens) > 1 else 0.0,
                         finish_reasons=dict(Counter(s["finish_reason"] for s in samples)),
                         distinct_answers=len({s["extracted"] for s in samples}),
                         dispersion=r.get("dispersion")))  # None for records without it (--responses, older runs)
    return rows


def mean_dispersion(rows):
    """Mean dispersion over the rows that have one; None when none has."""
    values = [r["dispersion"] for r in rows if r.get("dispersion") is not None]
    return float(np.mean(values)) if values else None


def band_stats(rows):
    """Band counts and mean accuracy of some rows, next to the mixed count expected if every problem had
    that mean accuracy. P(mixed) is concave in p, so by Jensen's inequality problems of unequal difficulty
    (the real case) give fewer mixed problems at the same mean: observed < expected, up to noise."""
    n, k = len(rows), rows[0]["k"]
    accuracy = sum(r["n_correct"] for r in rows) / (n * k)
    return dict(n=n, **{b: sum(r["band"] == b for r in rows) for b in BANDS}, accuracy=accuracy,
                mixed_if_equally_hard=n * p_mixed(accuracy, k), dispersion_mean=mean_dispersion(rows))


def summarize_bands(rows, group_by="source"):
    """Band counts overall and per group, and the histogram of correct counts next to the binomial one."""
    ks = {r["k"] for r in rows}
    if len(ks) != 1:
        raise ValueError(f"rows have different numbers of samples per problem ({sorted(ks)}); bands need one k")
    k, overall = ks.pop(), band_stats(rows)
    groups = sorted({r["group"] for r in rows})
    return dict(k=k, group_by=group_by, overall=overall,
                per_group={g: band_stats([r for r in rows if r["group"] == g]) for g in groups},
                dispersion_by_band={b: mean_dispersion([r for r in rows if r["band"] == b]) for b in BANDS},
                histogram=[sum(r["n_correct"] == c for r in rows) for c in range(k + 1)],
                histogram_if_equally_hard=binomial_histogram(len(rows), overall["accuracy"], k))


# -----------------------------------------------------------------------------
# Held-out split and training pools


def heldout_split(problems, per_group, group_by="source", seed=0):
    """(held-out, rest), both in pool order. From each group, the `per_group` problems that rank first by a
    seeded hash of their id: a group's held-out set depends on neither the file order nor the other groups."""
    if per_group < 0:
        raise ValueError(f"--heldout-per-group must be >= 0, got {per_group}")
    groups = {}
    for p in problems:
        groups.setdefault(group_value(p, group_by), []).append(p["id"])
    chosen = set()
    for g, ids in sorted(groups.items()):
        if len(ids) < per_group:
            raise ValueError(f"--heldout-per-group {per_group}: group {group_by}={g} has only {len(ids)} "
                             f"problems; lower it (or --group-by another field)")
        chosen.update(sorted(ids, key=lambda i: hashlib.sha256(f"{seed}/{i}".encode()).hexdigest())[:per_group])
    return [p for p in problems if p["id"] in chosen], [p for p in problems if p["id"] not in chosen]


def training_pools(problems, rows, heldout):
    """{pool name: problems} for every training pool, all without the held-out problems."""
    excluded = {p["id"] for p in heldout}
    mixed = {r["id"] for r in rows if r["band"] == "mixed"}
    rest = [p for p in problems if p["id"] not in excluded]
    return dict(mixed_pool=[p for p in rest if p["id"] in mixed], full_pool=rest)


def write_pools(out_dir, heldout, pools):
    """Write heldout.jsonl and each pool; refuses (writing nothing) when any of them holds a MATH-500 problem."""
    P.check_held_out(heldout + [p for pool in pools.values() for p in pool])
    for name, rows in dict(heldout=heldout, **pools).items():
        runs.write_jsonl(Path(out_dir) / f"{name}.jsonl", rows)


# -----------------------------------------------------------------------------
# Comparing the bands of two models on the same pool


def bands_path(path):
    return Path(path) / "bands.jsonl" if Path(path).is_dir() else Path(path)


def read_bands(path):
    """The rows of a bands.jsonl (or of DIR/bands.jsonl for a directory)."""
    path = bands_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such bands file (bands.py writes DIR/bands.jsonl)")
    rows = []
    for lineno, row in P.read_jsonl(path):
        if "id" not in row or row.get("band") not in BANDS:
            raise ValueError(f"{path}:{lineno}: not a bands row (needs 'id' and 'band' in {', '.join(BANDS)})")
        P.check_id(path, lineno, row)
        if has_counts(row) and not (isinstance(row["k"], int) and isinstance(row["n_correct"], int)
                                    and 0 <= row["n_correct"] <= row["k"] and band(row["n_correct"], row["k"])
                                    == row["band"]):
            raise ValueError(f"{path}:{lineno}: band {row['band']!r} does not follow from n_correct="
                             f"{row['n_correct']!r} of k={row['k']!r} (band(): 0 all_zero, k all_one, else mixed)")
        rows.append(row)
    return rows


def run_settings(path):
    """The sampling settings of the run that wrote a bands file, from its directory; {} when it has none."""
    d = bands_path(path).parent
    for name, key in (("bands_summary.json", "settings"), ("settings.json", None)):
        if (d / name).is_file():
            data = json.loads((d / name).read_text())
            return (data.get(key) or {}) if key else data
    return {}


def has_counts(row):
    return row.get("k") is not None and row.get("n_correct") is not None


def noise_expectation(pairs):
    """What sampling noise alone does to the bands of matched (row in A, row in B) pairs: each problem at its
    pooled pass rate, each run an independent binomial draw (module docstring). The expected 3x3 table, the
    expected number of changes, its sd, the exact central 95% range of that count and P(count >= observed)."""
    probs, qs = [], []
    for ra, rb in pairs:
        p = (ra["n_correct"] + rb["n_correct"]) / (ra["k"] + rb["k"])  # pooled: one rate for both runs
        probs.append((band_probabilities(p, ra["k"]), band_probabilities(p, rb["k"])))
        qs.append(p_band_change(p, ra["k"], rb["k"]))
    dist, observed = poisson_binomial(qs), sum(ra["band"] != rb["band"] for ra, rb in pairs)
    cdf = np.cumsum(dist)
    return dict(table={x: {y: float(sum(a[x] * b[y] for a, b in probs)) for y in BANDS} for x in BANDS},
                expected_changes=float(sum(qs)), sd=math.sqrt(sum(q * (1 - q) for q in qs)),
                range95=[int(np.searchsorted(cdf, 0.025 - 1e-12)), int(np.searchsorted(cdf, 0.975 - 1e-12))],
                p_at_least_observed=float(min(1.0, dist[observed:].sum())))


def contingency(rows_a, rows_b):
    """{band in A: {band in B: count}} over the problems in both (matched by id), with the counts of
    problems only in A and only in B."""
    b = {r["id"]: r for r in rows_b}
    both = [(r, b[r["id"]]) for r in rows_a if r["id"] in b]
    if not both:
        raise ValueError(f"the two bands files share no problem id ({len(rows_a)} and {len(rows_b)} rows); "
                         f"compare two runs on the same pool")
    for ra, rb in both:
        if ra.get("answer") != rb.get("answer"):
            raise ValueError(f"problem {ra['id']!r} has answer {ra.get('answer')!r} in A but {rb.get('answer')!r} "
                             f"in B: different versions of the data set")
    pairs = Counter((ra["band"], rb["band"]) for ra, rb in both)
    counted = all(has_counts(ra) and has_counts(rb) for ra, rb in both)
    return dict(table={x: {y: pairs[x, y] for y in BANDS} for x in BANDS}, n=len(both),
                only_a=len(rows_a) - len(both), only_b=len(b) - len(both),
                changes=sum(ra["band"] != rb["band"] for ra, rb in both),
                k_a=sorted({ra.get("k") for ra, _ in both if ra.get("k")}),
                k_b=sorted({rb.get("k") for _, rb in both if rb.get("k")}),
                noise=noise_expectation(both) if counted else None)  # needs n_correct and k in every row


def shared_draws(settings_a, settings_b):
    """Two runs of one model with the same seed and sampling settings: sample j of a problem is one draw in both
    (sample.py seeds by (seed, problem index, j)), so they are not independent."""
    keys = ("model", "seed", "temperature", "top_p", "template", "dataset")
    return bool(settings_a) and all(settings_a.get(k) == settings_b.get(k) for k in keys)


def compare(path_a, path_b):
    """The contingency table of two bands files with the noise expectation, and whether their runs share draws."""
    result = contingency(read_bands(path_a), read_bands(path_b))
    result.update(shared_draws=shared_draws(run_settings(path_a), run_settings(path_b)))
    return result


def format_contingency(c, a="A", b="B"):
    lines = [f"rows: bands in {a}; columns: bands in {b}", f"{'':10}" + "".join(f"{y:>10}" for y in BANDS)
             + f"{'total':>10}"]
    for x in BANDS:
        row = c["table"][x]
        lines.append(f"{x:10}" + "".join(f"{row[y]:>10}" for y in BANDS) + f"{sum(row.values()):>10}")
    totals = [sum(c["table"][x][y] for x in BANDS) for y in BANDS]
    lines.append(f"{'total':10}" + "".join(f"{t:>10}" for t in totals) + f"{c['n']:>10}")
    lines.append(f"{c['n']} problems in both; {c['only_a']} only in {a}, {c['only_b']} only in {b} (left out)")
    return "\n".join(lines)


def format_noise(c, a="A", b="B"):
    """The observed band changes beside the ones sampling noise alone would give (noise_expectation)."""
    ks = lambda k: "/".join(map(str, k)) or "?"  # noqa: E731
    if c["noise"] is None:
        return (f"band changes: {c['changes']} of {c['n']}; no noise expectation: the rows need 'n_correct' and 'k' "
                f"(bands.py writes both)")
    e = c["noise"]
    lo, hi = e["expected_changes"] - 2 * e["sd"], e["expected_changes"] + 2 * e["sd"]
    lines = [f"band changes: {c['changes']} of {c['n']} observed (k={ks(c['k_a'])} in {a}, k={ks(c['k_b'])} in {b}); "
             f"from sampling noise alone {e['expected_changes']:.1f} +- 2 sd [{max(0.0, lo):.1f}, {hi:.1f}], exact "
             f"95% range {e['range95'][0]}-{e['range95'][1]}, P(noise alone >= {c['changes']}) = "
             f"{e['p_at_least_observed']:.3g}",
             "  noise alone: each problem at its pooled pass rate p = (c_A + c_B) / (k_A + k_B), the two runs "
             "independent Binomial(k, p) draws; expected table:",
             f"{'':10}" + "".join(f"{y:>10}" for y in BANDS)]
    lines += [f"{x:10}" + "".join(f"{e['table'][x][y]:>10.1f}" for y in BANDS) for x in BANDS]
    if c.get("shared_draws"):
        lines.append("  warning: both runs have the same model, seed and sampling settings, so each problem's first "
                     "samples are the same draws in both (sample.py); the runs are not independent and the noise "
                     "expectation overstates the changes: rerun one with another --seed")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# Reports


def format_p_mixed_table(group_size, ps=P_TABLE):
    return "\n".join([
        f"P(mixed) = 1 - p^G - (1-p)^G with G = {group_size}: the chance that a problem solved with probability p "
        f"gives a group with a learning signal",
        "p         " + "".join(f"{p:>7.2f}" for p in ps),
        "P(mixed)  " + "".join(f"{p_mixed(p, group_size):>7.1%}" for p in ps),
        "so many mixed problems means many problems near the middle of the model's ability, not more exploration"])


def format_bands(s, out_dir):
    header = (f"{'group':14}{'n':>6}" + "".join(f"{b:>10}" for b in BANDS) + f"{'accuracy':>10}{'dispersion':>11}"
              f"  mixed if equally hard")
    number = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731

    def line(name, st):
        return (f"{name:14}{st['n']:>6}" + "".join(f"{st[b]:>10}" for b in BANDS)
                + f"{st['accuracy']:>10.1%}{number(st.get('dispersion_mean')):>11}  {st['mixed_if_equally_hard']:.1f}")
    k, g = s["k"], s["group_by"]
    lines = [f"bands of {s['settings']['model']} on {s['settings']['dataset']}: k={k} samples at temperature "
             f"{s['settings']['temperature']}, {s['settings']['max_new_tokens']} new tokens", header,
             line("all", s["overall"]), *(line(f"{g}={v}", st) for v, st in s["per_group"].items()),
             f"correct of {k}:       " + "".join(f"{c:>7}" for c in range(k + 1)),
             "  observed          " + "".join(f"{h:>7}" for h in s["histogram"]),
             "  if equally hard   " + "".join(f"{h:>7.1f}" for h in s["histogram_if_equally_hard"]),
             "(equally hard: every problem at the pool's mean accuracy; real difficulty varies, which moves "
             "problems to the ends and makes fewer mixed)",
             "dispersion (mean pairwise cosine distance of a problem's k completions in the model's own embeddings, "
             "diversity.embedding_dispersion) per band: "
             + ", ".join(f"{b} {number(s.get('dispersion_by_band', {}).get(b))}" for b in BANDS)]
    pools = ", ".join(f"{name} {n}" for name, n in s["pools"].items())
    out = Path(out_dir)
    lines += [f"pools: {pools} (heldout: {s['heldout_per_group']} per {g}, excluded from every training pool)",
              format_p_mixed_table(k),
              f"wrote {out / 'bands.jsonl'}, bands_summary.json, heldout.jsonl, mixed_pool.jsonl, full_pool.jsonl "
              f"({s['wall_time_s']:.0f} s)",
              f"train: python train_rl.py --model {s['settings']['model']} --dataset {out / 'mixed_pool.jsonl'} "
              f"--val-dataset {out / 'heldout.jsonl'} --eval-every 10 --eval-group-by {g}"]
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# CLI


data_arg, bands_arg, heldout_arg, run_arg = map(cli.arg_group, ('model and data', 'bands', 'held-out split', 'run'))


@dataclass
class BandsConfig:
    HELP_GROUPS = ('model and data', 'bands', 'held-out split', 'run')
    dataset: list[str] = data_arg(None, f"a data set ({', '.join(P.DATASETS)}) or a .jsonl path; repeat for a "
                                   f"pool of several (required)", action="append")
    out: str = run_arg(None, "output directory, resumed when it holds a run of the same settings (required)")
    model: str = data_arg(checkpoint.DEFAULT_MODEL, "checkpoint directory, `tiny`, or a Hugging Face repo id")
    k: int = bands_arg(8, "samples per problem (the group size G the bands are for)", aliases=("-k",))
    temperature: float = bands_arg(1.0, "sampling temperature (> 0)")
    top_p: float = bands_arg(1.0, "nucleus sampling mass", range="(0, 1]")
    max_new_tokens: int = bands_arg(2048, "generation budget per sample", range="[1, inf)")
    limit: int | None = data_arg(None, "only the first N problems of each data set", range="[1, inf)")
    group_by: str = bands_arg("source", "problem field for the per-group counts and the held-out split")
    heldout_per_group: int = heldout_arg(25, "problems held out from each group for evaluation during training",
                                         range="[0, inf)")
    seed: int = bands_arg(0, "sampling seed (each batch is seeded with seed + the index of its first problem)")
    heldout_seed: int = heldout_arg(0, "seed of the held-out choice, apart from --seed so that reruns share it")
    template: str = data_arg("base", "prompt template (problems.format_prompt)", choices=P.TEMPLATES)
    batch_size: int = run_arg(64, "problems whose samples decode together (on CUDA, continuous batching: a finished "
                                  "row's place goes to a waiting problem); records are flushed after each call",
                              range="[1, inf)")
    dtype: str | None = run_arg(None, "weights dtype (default bfloat16 on GPU, float32 on CPU)",
                                choices=("float32", "bfloat16", "float16"))
    device: str = run_arg("", "cuda, cuda:N or cpu ('': cuda when available)")
    threads: int = run_arg(0, "torch CPU threads (0: one per core); on a machine another job keeps busy, 1 is faster "
                              "(benchmarks/bench_threads.py)", range="[0, inf)")
    grader: str = data_arg("answer", "answer: verify.grade; steps: the tiny ladder's rule (verify.check_steps)",
                           choices=verify.GRADERS)
    dispersion: bool = bands_arg(True, "each problem's dispersion: the mean pairwise cosine distance of its k "
                                       "completions embedded by the model (diversity.embedding_dispersion); one more "
                                       "forward each")


# The tiny world (--model tiny, or a model trained from it): a budget that fits its context, bands per level,
# a held-out split that a few dozen problems can give.
TINY_DEFAULTS = dict(max_new_tokens=64, group_by="level", heldout_per_group=10)
# The tiny ladder (--dataset tiny_ladder_*): a budget that fits the top rung, its step-checking grader.
LADDER_DEFAULTS = dict(max_new_tokens=128, group_by="level", grader="steps")


def flag_defaults(first):
    """The tiny world's defaults with its model, the ladder's with its data sets; flags given still win."""
    out = dict(TINY_DEFAULTS) if checkpoint.is_tiny_world(first.model) else {}
    out.update(LADDER_DEFAULTS if any(Path(d).stem.startswith("tiny_ladder") for d in first.dataset or ()) else {})
    return out


def check_config(cfg):
    """Refuse flag values that cannot run, naming the flag."""
    cli.check_fields(cfg)
    missing = [cli.flag(name) for name in ("dataset", "out") if not getattr(cfg, name)]
    if missing:  # checked here, not by argparse, so that --help works without them
        raise ValueError(f"the following arguments are required: {', '.join(missing)}")
    cli.check_device(cfg.device)
    if cfg.k < 2:
        raise ValueError(f"-k must be at least 2 (with one sample no problem can be mixed), got {cfg.k}")
    if cfg.temperature <= 0:
        raise ValueError(f"--temperature must be > 0 (greedy samples are all the same), got {cfg.temperature}")
    repeated = [d for d, n in Counter(cfg.dataset).items() if n > 1]
    if repeated:
        raise ValueError(f"--dataset {repeated[0]} is given twice")


def run(cfg):
    """Sample, grade and band the pool; write the band files and the pools; returns the bands summary."""
    check_config(cfg)
    problems = [p for d in cfg.dataset for p in P.load_problems(d, cfg.limit)]
    try:  # before any sampling: every pool this writes is a training pool
        P.check_held_out(problems)
    except ValueError as e:
        raise ValueError(f"--dataset {' '.join(cfg.dataset)}: {e}") from None
    heldout, _ = heldout_split(problems, cfg.heldout_per_group, cfg.group_by, cfg.heldout_seed)
    runs.check_out(cfg.out, "bands", resume=True)
    device = cfg.device or M.default_device()
    dtype = getattr(torch, cfg.dtype) if cfg.dtype else M.default_dtype(device)
    runs.set_threads(cfg.threads, device)
    net, tokenizer = checkpoint.load_model(cfg.model, dtype=dtype, device=device), checkpoint.load_tokenizer(cfg.model)
    P.check_prompts_fit([("+".join(cfg.dataset), problems)], tokenizer, cfg.template, cfg.max_new_tokens,
                        net.config.max_position_embeddings)  # a long or unencodable problem, named, before --out
    runs.claim(cfg.out, "bands", resume=True)  # held until this process ends
    t0 = time.time()
    records, evaluation = E.evaluate(net, tokenizer, problems, cfg.max_new_tokens, cfg.batch_size, cfg.template,
                                     cfg.k, cfg.temperature, cfg.top_p, cfg.seed, cfg.out, progress=True,
                                     dataset="+".join(cfg.dataset), group_by=cfg.group_by, grader=cfg.grader,
                                     dispersion=cfg.dispersion)
    rows = band_rows(records, cfg.group_by)
    pools = training_pools(problems, rows, heldout)
    write_pools(cfg.out, heldout, pools)
    runs.write_jsonl(Path(cfg.out) / "bands.jsonl", rows)
    summary = summarize_bands(rows, cfg.group_by)
    summary.update(pools=dict(heldout=len(heldout), **{name: len(pool) for name, pool in pools.items()}),
                   heldout_per_group=cfg.heldout_per_group, wall_time_s=time.time() - t0,
                   completion_tokens_total=evaluation["completion_tokens_total"],
                   settings=dict(evaluation["settings"], datasets=cfg.dataset, heldout_seed=cfg.heldout_seed))
    runs.write_json(Path(cfg.out) / "bands_summary.json", summary)
    runs.release(cfg.out)
    return summary


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:
        parser = argparse.ArgumentParser(prog="bands.py compare", description="3x3 table of the bands of two "
                                         "runs on the same pool (problems matched by id; any k or seed each), "
                                         "and the band changes sampling noise alone would give.")
        parser.add_argument("a", help="bands.jsonl of model A, or its bands.py output directory")
        parser.add_argument("b", help="the same for model B")
        args = parser.parse_args(argv[1:])
        result = compare(args.a, args.b)
        print(format_contingency(result, args.a, args.b))
        print(format_noise(result, args.a, args.b))
        return result
    if argv[:1] == ["table"]:
        parser = argparse.ArgumentParser(prog="bands.py table", description="P(mixed) for a group size.")
        parser.add_argument("-k", type=int, default=8, help="group size G")
        args = parser.parse_args(argv[1:])
        if args.k < 1:
            raise ValueError(f"-k must be at least 1, got {args.k}")
        print(format_p_mixed_table(args.k))
        return args.k
    cfg = cli.parse_config(BandsConfig, argv, "Bands of a problem pool (module docstring); `bands.py compare A B` "
                           "tabulates two runs, `bands.py table -k G` prints P(mixed).",
                           defaults=flag_defaults)
    check_config(cfg)  # a missing --dataset or --out, before the settings are printed
    print(f"bands: {cfg}", file=sys.stderr)
    summary = run(cfg)
    print(format_bands(summary, cfg.out))
    return summary


if __name__ == "__main__":
    cli.run_main(main, "bands.py")
