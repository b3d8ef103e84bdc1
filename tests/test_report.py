"""report.py on run directories made here: hand-written ones whose every number is known, and tiny real runs of
train_rl.py and evaluate.py on a random character model. Each number in report.md is checked against its
recomputation from the files; seeds aggregate and runs pair as computed by hand; an incomplete run is named and
never averaged; a directory that is not a run is refused by name; the PNGs are images of the stated size."""

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

import evaluate as E
import model as M
import problems as P
from research import report as R
import train_rl as T
from test_train_rl import fake_grade  # the loop tests' stand-in reward: mixed groups from a random model
import checkpoint
import stats


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(path)


@pytest.fixture
def data(tmp_path):
    """A training pool, a validation set (2 problems of level 2, 2 of level 3) and a test set of 5."""
    d = tmp_path / "data"
    d.mkdir()
    make = lambda name, n, **kw: write_jsonl(d / f"{name}.jsonl", [  # noqa: E731
        dict(id=f"{name}{i}", problem=f"{name} {i} + 1", answer=str(i + 1), **{k: v(i) for k, v in kw.items()})
        for i in range(n)])
    return dict(pool=make("pool", 6), val=make("val", 4, level=lambda i: 2 + i % 2), test=make("test", 5))


def hand_train_run(root, name, data, seed=0, objective="drgrpo", steps=3, logged=None, final=True, val=(0.5, 0.75, 1.0),
                   test=(0.2, 0.6)):
    """A train_rl.py run directory written by hand: config.json from train_rl.Config, one metrics line per step
    (val accuracy every step, per level), test accuracy before and after."""
    run = Path(root) / name
    run.mkdir(parents=True)
    cfg = T.Config(model="tiny", dataset=str(data["pool"]), val_dataset=str(data["val"]),
                   test_dataset=str(data["test"]), subject="", num_problems=0, steps=steps, eval_every=1,
                   eval_group_by="level", seed=seed, objective=objective, out=str(run))
    (run / "config.json").write_text(json.dumps(dict(dataclasses.asdict(cfg), code_version="abc123")))
    lines = [dict(step=0, test_accuracy=test[0])]
    for s in range(1, (steps if logged is None else logged) + 1):
        acc = val[s - 1]  # levels: 2 of level 2 right, the rest of level 3
        lines.append(dict(step=s, reward_mean=0.1 * s + seed / 100, accuracy=0.1 * s, response_tokens_mean=10 + s,
                          entropy=1.0 / s, loss=0.0, lr=1e-4, generated_tokens=100 * s, training_tokens=90 * s,
                          flops=1e9 * s * (1 + seed / 10), sampling_seconds=1.0, verifying_seconds=0.5,
                          training_seconds=2.0, val_accuracy=acc,
                          val_accuracy_by_group={"2": 1.0, "3": (4 * acc - 2) / 2}))
    if logged is None:
        lines.append(dict(step=steps, test_accuracy=test[1]))
    write_jsonl(run / "metrics.jsonl", lines)
    if final:
        (run / "final").mkdir()
    return run


def hand_eval_run(root, name, correct, model="m", complete=True, group_by=None):
    """An evaluate.py output written by hand: one record per 0/1 in `correct` (levels 1 and 2 alternate)."""
    run = Path(root) / name
    run.mkdir(parents=True)
    records = [dict(id=f"q{i}", answer=str(i), level=1 + i % 2, correct=bool(c), completion_tokens=10 + i,
                    finish_reason="stop", prompt_tokens=5, response="x", extracted=None, reward=float(c))
               for i, c in enumerate(correct)]
    settings = dict(model=str(model), dataset="hand", dataset_hash="h", n_problems=len(correct), temperature=0.0,
                    max_new_tokens=16, device="cpu", group_by=group_by)
    (run / "settings.json").write_text(json.dumps(settings))
    write_jsonl(run / "records.jsonl", records if complete else records[:-2])
    if complete:
        (run / "summary.json").write_text(json.dumps(dict(inference_flops=1.5e6, wall_time_s=3.0)))
    return run


def tables(md):
    """{section heading: [row dicts]} of the markdown tables in a report."""
    out, heading, header = {}, None, None
    for line in md.splitlines():
        if line.startswith("## "):
            heading, header = line[3:], None
        elif line.startswith("| ") and heading:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(cells[0]) <= set("-:"):
                out.setdefault(heading, []).append(dict(zip(header, cells)))
    return out


def acc_ci(correct, n):
    lo, hi = stats.wilson(correct, n)
    return f"{100 * correct / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def test_every_number_in_the_runs_and_accuracy_tables_is_recomputed_from_the_files(tmp_path, data):
    runs = [hand_train_run(tmp_path, f"drgrpo-s{s}", data, seed=s, val=(0.5, 0.75, 0.5 + 0.25 * s)) for s in (0, 1)]
    ev = hand_eval_run(tmp_path, "eval-a", [1, 0, 1, 1, 0, 1, 0, 0], group_by="level")
    md = R.report([*runs, ev], tmp_path / "out", plots=False)
    t = tables(md)
    rows = {r["run"].strip("`"): r for r in t["Runs"]}
    for run in runs:
        metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "reward_mean" in m]
        row = rows[run.name]
        assert row["steps"] == "3" and row["status"] == "complete" and row["seed"] == str(json.loads(
            (run / "config.json").read_text())["seed"])
        assert row["val accuracy [95% CI]"] == acc_ci(round(steps[-1]["val_accuracy"] * 4), 4)  # tiny val: 4 problems
        assert row["test accuracy [95% CI]"] == acc_ci(round(metrics[-1]["test_accuracy"] * 5), 5)  # test: 5
        assert row["generated tokens"] == f"{steps[-1]['generated_tokens']:,}"
        assert row["training tokens"] == f"{steps[-1]['training_tokens']:,}"
        assert row["FLOPs"] == f"{steps[-1]['flops']:.3g}" and row["code"] == "`abc123`"
        wall = sum(m["sampling_seconds"] + m["verifying_seconds"] + m["training_seconds"] for m in steps)
        assert row["wall s"] == f"{wall:.0f}"
        per = [r for r in t["Accuracy per group"] if r["run"] == f"`{run.name}`" and r["split"] == "val @ step 3"]
        last = steps[-1]
        assert {r["group"]: r["accuracy [95% Wilson]"] for r in per} == {
            "all": acc_ci(round(4 * last["val_accuracy"]), 4),
            **{f"level={g}": acc_ci(round(2 * a), 2) for g, a in last["val_accuracy_by_group"].items()}}
        curve = [r for r in t["Validation accuracy by step"] if r["run"] == f"`{run.name}`"]
        assert [r["val accuracy [95% CI]"] for r in curve] == [acc_ci(round(4 * m["val_accuracy"]), 4) for m in steps]
    records, _ = E.read_records(ev / "records.jsonl")
    c, n = sum(r["correct"] for r in records), len(records)
    row = rows["eval-a"]
    assert row["test accuracy [95% CI]"] == acc_ci(c, n) + " (hand)" and row["steps"] == "-"
    assert row["generated tokens"] == f"{sum(r['completion_tokens'] for r in records):,}" and row["FLOPs"] == "1.5e+06"
    per = {r["group"]: (r["n"], r["correct"], r["accuracy [95% Wilson]"]) for r in t["Accuracy per group"]
           if r["run"] == "`eval-a`"}
    for level in (1, 2):
        mine = [r["correct"] for r in records if r["level"] == level]
        assert per[f"level={level}"] == (str(len(mine)), str(sum(mine)), acc_ci(sum(mine), len(mine)))
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["status"] for r in saved] == ["complete"] * 3


def test_seeds_aggregate_and_evaluations_pair_as_computed_by_hand(tmp_path, data):
    """Two methods x three seeds, each trained run evaluated on the same 10 problems: the seed table's mean,
    min-max and t interval, and the pairs (same seed across methods) with their discordant counts and p."""
    scores = dict(x=[[1] * 5 + [0] * 5, [1] * 6 + [0] * 4, [1] * 7 + [0] * 3],
                  y=[[0] * 2 + [1] * 7 + [0], [1] * 9 + [0], [1] * 10])
    dirs = []
    for method, per_seed in scores.items():
        for seed, correct in enumerate(per_seed):
            train = hand_train_run(tmp_path, f"{method}-s{seed}", data, seed=seed,
                                   objective=dict(x="drgrpo", y="grpo")[method])
            dirs.append(hand_eval_run(tmp_path / "evals", f"{method}-s{seed}", correct, model=train / "final"))
    t = tables(R.report(dirs, tmp_path / "out", plots=False))
    seeds = {(r["what"], r["split (group)"]): r for r in t["Across seeds"]}
    x, y = seeds["objective=drgrpo", "hand"], seeds["objective=grpo", "hand"]
    assert x["accuracy per seed"] == "50.0% / 60.0% / 70.0%" and x["mean"] == "60.0%"
    assert x["min - max"] == "50.0% - 70.0%"
    half = 4.303 * 0.1 / math.sqrt(3)  # t(0.975, 2 df) x sd / sqrt(3 seeds)
    assert x["95% t interval (seeds)"] == f"[{100 * (0.6 - half):.1f}, {100 * (0.6 + half):.1f}]"
    assert x["seeds"] == "0 / 1 / 2" and x["n seeds"] == "3" and x["left out"] == "-"
    assert y["mean"] == f"{100 * 26 / 30:.1f}%"
    # per group across seeds: level 1 holds the even problems, level 2 the odd ones (hand_eval_run)
    for level, first in ((1, 0), (2, 1)):
        accs = [sum(c[first::2]) / 5 for c in scores["y"]]
        mean = sum(accs) / 3
        half = 4.303 * math.sqrt(sum((a - mean) ** 2 for a in accs) / 2) / math.sqrt(3)
        lo, hi = max(mean - half, 0), min(mean + half, 1)  # clipped to what an accuracy can be
        row = seeds["objective=grpo", f"hand level={level}"]
        assert row["accuracy per seed"] == " / ".join(f"{100 * a:.1f}%" for a in accs)
        assert (row["mean"], row["95% t interval (seeds)"]) == (f"{100 * mean:.1f}%",
                                                                 f"[{100 * lo:.1f}, {100 * hi:.1f}]")
    pairs = {(r["A"], r["B"]): r for r in t["Paired comparisons (same problems)"]}
    # the reference is the first run given (x-s0); another x seed pairs with it, each y seed with x of its seed
    assert set(pairs) == {("`x-s0`", "`x-s1`"), ("`x-s0`", "`x-s2`"), *((f"`x-s{s}`", f"`y-s{s}`") for s in range(3))}
    row = pairs["`x-s0`", "`y-s0`"]
    a, b = scores["x"][0], scores["y"][0]
    only_a = sum(1 for i, j in zip(a, b) if i and not j)
    only_b = sum(1 for i, j in zip(a, b) if j and not i)
    assert (row["only A right"], row["only B right"]) == (str(only_a), str(only_b)) == ("2", "4")
    p = min(1.0, 2 * sum(math.comb(6, i) for i in range(3)) / 2**6)  # exact two-sided binomial test
    assert row["McNemar p"] == f"{p:.3g}"
    diff, ci = stats.bootstrap_paired(a, b)
    assert row["B - A points [95% bootstrap]"] == f"{100 * diff:+.1f} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def test_names_repeated_across_folders_are_told_apart(tmp_path, data):
    a = hand_eval_run(tmp_path / "a", "eval", [1, 0])
    b = hand_eval_run(tmp_path / "b", "eval", [1, 1])
    t = tables(R.report([a, b, tmp_path / "out"], tmp_path / "out", plots=False))  # the report's own dir: left out
    assert [r["run"] for r in t["Runs"]] == ["`a/eval`", "`b/eval`"]


def test_an_incomplete_run_is_reported_as_such_and_never_averaged(tmp_path, data):
    done = [hand_train_run(tmp_path, f"r-s{s}", data, seed=s) for s in (0, 1)]
    killed = hand_train_run(tmp_path, "r-s2", data, seed=2, logged=2, final=False)
    with open(killed / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward_me')  # the line being written when it was killed
    cut = hand_eval_run(tmp_path, "eval-cut", [1, 0, 1, 1, 0], complete=False)
    t = tables(R.report([*done, killed, cut], tmp_path / "out", plots=False))
    status = {r["run"]: r["status"] for r in t["Runs"]}
    assert status["`r-s2`"] == "incomplete: 2 of 3 steps logged, no final/, partial last log line"
    assert status["`eval-cut`"] == "incomplete: 3 of 5 problems recorded, no summary.json"
    group = [r for r in t["Across seeds"] if r["what"] == "kind=train"]
    assert {r["seeds"] for r in group} == {"0 / 1"} and all("`r-s2`" in r["left out"] for r in group)
    val = next(r for r in group if r["split (group)"] == "val")
    assert val["mean"] == "100.0%"  # the killed run's last val (75%) is not in it
    assert [r for r in t["Across seeds"] if r["what"] == "kind=eval"][0]["n seeds"] == "0"


def test_a_directory_that_is_not_a_run_gets_an_error_naming_it(tmp_path, capsys, data):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    good = hand_eval_run(tmp_path, "e", [1])
    for bad, message in ((tmp_path / "notes", "not a run directory"), (tmp_path / "nothing", "no such run directory")):
        with pytest.raises(SystemExit):
            R.cli.run_main(lambda: R.main([str(good), str(bad), "--out", str(tmp_path / "o")]), "report.py")
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"report.py: error: {bad}: {message}") and "\n" not in err
    with pytest.raises(ValueError, match="--by nosuch"):
        R.report([good], tmp_path / "o", by=["nosuch"])


def test_a_rounds_run_is_read_back_to_counts_and_a_short_one_is_incomplete(tmp_path):
    """rounds.jsonl rows (rounds.py's mode_fields) become counts: accuracy x n, rounded; compute adds up."""
    run = tmp_path / "rounds"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(dict(rounds=2, seed=3, dataset="tiny_ladder_train")))
    rows = [dict(round=i, fast_accuracy=(2 + i) / 8, fast_n=8, deliberate_accuracy=(4 + i) / 8, deliberate_n=8,
                 deliberation_tokens=100 * i, cumulative_flops=1e9 * i, seconds=10.0) for i in range(3)]
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    short = R.read_run(run)
    assert short.kind == "rounds" and short.status == "incomplete: 2 of 3 rows" and not short.complete
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = R.read_run(run)
    assert done.complete and done.seed == 3 and done.steps == 2
    assert done.rounds == [dict(round=i, n=8, fast_correct=2 + i, deliberate_correct=4 + i) for i in range(3)]
    assert done.compute["generated_tokens"] == 300 and done.compute["flops"] == 2e9 and done.compute["wall_s"] == 30
    table = tables(R.report_markdown([done], [], []))["Rounds: fast and deliberate accuracy"]
    assert [r["deliberate accuracy [95% CI]"] for r in table] == [acc_ci(4 + i, 8) for i in range(3)]


def test_by_settings_describe_runs_and_seed_keeps_seeds_apart(tmp_path, data):
    runs = [hand_train_run(tmp_path, f"r-s{s}", data, seed=s) for s in (0, 1)]
    t = tables(R.report(runs, tmp_path / "out", by=["objective", "seed"], plots=False))
    assert [r["what"] for r in t["Runs"]] == ["objective=drgrpo"] * 2
    overall = [r for r in t["Across seeds"] if r["split (group)"] in ("val", "test")]
    assert [r["n seeds"] for r in overall] == ["1"] * 4  # val and test for each seed on its own
    t = tables(R.report(runs, tmp_path / "out", by=["objective"], plots=False))
    assert {r["n seeds"] for r in t["Across seeds"]} == {"2"}


def hand_bands_run(root, name="bands"):
    """A bands.py output written by hand: 8 problems of k = 4 in levels 2 and 3; returns (directory, rows)."""
    run = Path(root) / name
    run.mkdir(parents=True)
    rows = [dict(id=f"b{i}", group=str(2 + i % 2), answer="1", k=4, n_correct=c, band=R.B.band(c, 4))
            for i, c in enumerate([0, 1, 4, 2, 0, 3, 4, 1])]
    write_jsonl(run / "bands.jsonl", rows)
    settings = dict(model="m", dataset="d", temperature=1.0, group_by="level")
    (run / "bands_summary.json").write_text(json.dumps(dict(group_by="level", settings=settings, wall_time_s=2.0)))
    return run, rows


def test_bands_table_counts_the_bands_file(tmp_path):
    run, rows = hand_bands_run(tmp_path)
    t = tables(R.report([run], tmp_path / "out"))
    table = t["Bands: `bands`"]
    for row in table:
        name = row["bands of `bands` (k = 4, temperature 1.0)"]
        mine = rows if name == "all" else [r for r in rows if f"level={r['group']}" == name]
        assert [row[b] for b in R.B.BANDS] == [str(sum(r["band"] == b for r in mine)) for b in R.B.BANDS]
        assert row["accuracy"] == f"{100 * sum(r['n_correct'] for r in mine) / (4 * len(mine)):.1f}%"
        assert row["n"] == str(len(mine))
    assert len(table) == 3
    assert R.png_size(tmp_path / "out" / "bands.png") == (1000, 500)


def test_pngs_are_images_of_the_stated_size_with_one_line_per_run(tmp_path, data):
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.image
    import matplotlib.pyplot as plt
    methods = ("drgrpo", "grpo")
    dirs = [hand_train_run(tmp_path, f"{o}-s{s}", data, seed=s, objective=o) for o in methods for s in (0, 1)]
    md = R.report(dirs, tmp_path / "out", dpi=50)
    for name, panels in (("training.png", 4), ("validation.png", 3)):  # validation: overall, level 2, level 3
        size = (600, int(50 * 3.2 * panels))
        assert R.png_size(tmp_path / "out" / name) == size and f"`{name}`, {size[0]} x {size[1]} px" in md
        assert matplotlib.image.imread(tmp_path / "out" / name).shape[:2] == size[::-1]
    runs = [R.read_run(d) for d in dirs]
    keys = R.describing_keys(runs)
    fig = R.curve_figure(plt, runs, keys, R.training_panels(runs), 50)
    for ax in fig.axes:
        assert len(ax.lines) == 4 and ax.get_xlabel() and ax.get_ylabel()
        assert len(ax.collections) == 2  # a min-max band over the seeds of each method
    labels = fig.legends[0].get_texts()
    assert [x.get_text() for x in labels] == [f"objective={o}" for o in methods] + ["seed 0", "seed 1"]
    assert {ax.lines[0].get_linestyle() for ax in fig.axes} == {"-"} and fig.axes[0].lines[1].get_linestyle() == "--"
    plt.close(fig)
    rounds = R.Run(Path("r"), "rounds", {}, 0, rounds=[dict(round=i, n=10, fast_correct=3 + i, deliberate_correct=6 + i)
                                                       for i in range(3)])
    fig = R.rounds_figure(plt, [rounds], 50)
    assert len(fig.axes[0].lines) == 2
    plt.close(fig)
    rows = tables(R.report_markdown([rounds], [], []))["Rounds: fast and deliberate accuracy"]
    assert [r["fast accuracy [95% CI]"] for r in rows] == [acc_ci(3 + i, 10) for i in range(3)]


def test_without_matplotlib_the_tables_are_still_written(tmp_path, data, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    R.report([hand_train_run(tmp_path, "r", data)], tmp_path / "out")
    assert "pip install matplotlib" in capsys.readouterr().err
    assert (tmp_path / "out" / "report.md").is_file() and not list((tmp_path / "out").glob("*.png"))


def test_a_bad_flag_value_ends_in_one_line_naming_the_flag_and_nothing_is_written(tmp_path, capsys):
    good = hand_eval_run(tmp_path, "e", [1, 0])
    out = tmp_path / "out"
    for flags, message in ((["--dpi", "0"], "--dpi must be in [1, 600], got 0"),
                           (["--dpi", "601"], "--dpi must be in [1, 600], got 601"),
                           (["--by", "nosuch"], "--by nosuch: no run given has that setting"),
                           (["--out", str(good / "records.jsonl")], f"--out {good / 'records.jsonl'}: a file, not")):
        with pytest.raises(SystemExit) as e:
            R.cli.run_main(lambda: R.main([str(good), "--out", str(out), *flags]), "report.py")
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.startswith(f"report.py: error: {message}") and "\n" not in err
        assert not out.exists()
    with pytest.raises(ValueError, match=r"--dpi must be in \[1, 600\], got 0"):  # also when called from Python
        R.report([good], out, dpi=0)
    assert not out.exists() and sorted(p.name for p in good.iterdir()) == ["records.jsonl", "settings.json",
                                                                            "summary.json"]


def test_help_is_a_description_then_one_example_command_a_line_then_the_flags_by_group(capsys):
    with pytest.raises(SystemExit) as e:
        R.main(["--help"])
    text = capsys.readouterr().out
    assert e.value.code == 0 and text.startswith("usage: report.py RUN_DIR...")
    commands = [line.strip() for line in text.splitlines() if "research/report.py" in line]
    assert len(commands) == 2 and all(c.startswith("python research/report.py runs/") for c in commands)
    assert text.count("options:") == 1 and "\noutput:\n" in text and "\nwhat a run is:\n" in text
    assert "1 to 600" in text and "(default: )" not in text and max(map(len, text.splitlines())) <= 110


@pytest.fixture
def plt():
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot
    yield matplotlib.pyplot
    matplotlib.pyplot.close("all")


def hand_rounds_run(name="rounds-a"):
    return R.Run(Path(name), "rounds", {}, 0, rounds=[dict(round=i, n=10, fast_correct=3 + i, deliberate_correct=6 + i)
                                                     for i in range(3)])


def test_training_png_has_a_reward_row_only_where_reward_differs_from_accuracy(tmp_path, data, plt):
    same = hand_train_run(tmp_path, "same", data, seed=0)  # hand_train_run: reward = accuracy + seed / 100
    differs = hand_train_run(tmp_path, "differs", data, seed=1)
    for runs, panels in (([same], 3), ([differs], 4), ([same, differs], 4)):
        out = tmp_path / f"out-{len(runs)}-{panels}"
        R.report(runs, out, dpi=50)
        assert R.png_size(out / "training.png") == (600, int(50 * 3.2 * panels))
    fig = R.figures(plt, [R.read_run(same)], [], 50)["training.png"]
    assert [ax.get_ylabel() for ax in fig.axes[::2]] == ["rollout accuracy (= reward)", "response tokens",
                                                         "entropy per token"]


def test_each_figure_is_titled_with_its_runs_and_the_accuracy_panels_mark_the_test_result(tmp_path, data, plt):
    runs = [R.read_run(hand_train_run(tmp_path, f"drgrpo-s{s}", data, seed=s, test=(0.2, 0.6 + 0.2 * s)))
            for s in (0, 1)]
    every = [*runs, R.read_run(hand_bands_run(tmp_path)[0]), hand_rounds_run()]
    figs = R.figures(plt, every, R.describing_keys(every), 50)
    assert set(figs) == {"training.png", "validation.png", "bands.png", "rounds.png"}
    for name, fig in figs.items():
        title = fig.get_suptitle() or fig.axes[0].get_title()
        drawn = {"bands.png": ["bands"], "rounds.png": ["rounds-a"]}.get(name, ["drgrpo-s0", "drgrpo-s1"])
        assert all(n in title for n in drawn), (name, title)
    for name in ("training.png", "validation.png"):
        fig = figs[name]
        assert "test accuracy before → after training: drgrpo-s0 20.0% → 60.0%, drgrpo-s1 20.0% → 80.0%" in \
            fig.get_suptitle()
        squares = lambda ax: sorted((float(x.get_xdata()[0]), float(x.get_ydata()[0]),  # noqa: E731
                                     x.get_markerfacecolor() != "none") for x in ax.lines if x.get_marker() == "s")
        marked = [ax for ax in fig.axes if ax.get_ylabel() in ("rollout accuracy", "val accuracy")]
        step_ax, flops_ax = marked  # the accuracy row (the reward row is above it in training.png: they differ)
        rest = [ax for ax in fig.axes if ax not in marked]
        assert squares(step_ax) == [(0, 0.2, False), (0, 0.2, False), (3, 0.6, True), (3, 0.8, True)]
        assert squares(flops_ax) == [(0, 0.2, False), (0, 0.2, False), (3e9, 0.6, True), (3e9 * 1.1, 0.8, True)]
        assert not any(squares(ax) for ax in rest)
        legend = [x.get_text() for x in fig.legends[0].get_texts()]
        assert "test accuracy before training (open)" in legend and "test accuracy after training (filled)" in legend
    # more than four runs: the title gives each setting's mean over its seeds
    six = [R.read_run(hand_train_run(tmp_path / "six", f"{o}-s{s}", data, seed=s, objective=o,
                                     test=(0.2, 0.4 + 0.2 * s))) for o in ("drgrpo", "grpo") for s in range(3)]
    assert R.results_line(six, ["objective"], R.result_marks(six)) == (
        "test accuracy before → after training: objective=drgrpo 20.0% → 60.0% (mean of 3), "
        "objective=grpo 20.0% → 60.0% (mean of 3)")


def test_an_all_zero_or_constant_series_gets_an_axis_that_reads_and_is_not_negative(tmp_path, data, plt):
    run = hand_train_run(tmp_path, "flat", data)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    write_jsonl(run / "metrics.jsonl", [dict(m, reward_mean=0.0, accuracy=0.0, entropy=0.0, response_tokens_mean=12.0)
                                        if "reward_mean" in m else m for m in lines])
    flat = R.read_run(run)
    fig = R.curve_figure(plt, [flat], [], R.training_panels([flat]), 50)
    limits = {ax.get_ylabel(): tuple(map(float, ax.get_ylim())) for ax in fig.axes}
    lo, hi = limits.pop("response tokens")
    assert 0 < lo < 12 < hi and hi - lo < 5  # a constant: a margin around it, above 0
    assert set(limits.values()) == {(0.0, 1.0)}  # all zero: rollout accuracy (a rate) and entropy
    val = R.figures(plt, [flat], [], 50)["validation.png"]
    assert {ax.get_ylabel(): ax.get_ylim() for ax in val.axes}["val accuracy, level=2"] == (0, 1)  # always 100%


def test_axes_that_count_have_integer_ticks(tmp_path, data, plt):
    every = [R.read_run(hand_train_run(tmp_path, "r", data)), R.read_run(hand_bands_run(tmp_path)[0]),
             hand_rounds_run()]
    figs = R.figures(plt, every, [], 50)
    step_column = figs["training.png"].axes[::2]
    tokens = next(ax for ax in step_column if ax.get_ylabel() == "response tokens")  # 11, 12, 13: a mean of counts
    counting = dict(steps=[ax.xaxis for ax in step_column + figs["validation.png"].axes[::2]],
                    tokens=[tokens.yaxis], rounds=[figs["rounds.png"].axes[0].xaxis],
                    problems=[figs["bands.png"].axes[0].yaxis])
    for what, axes in counting.items():
        for axis in axes:
            lo, hi = sorted(axis.get_view_interval())
            ticks = [float(t) for t in axis.get_ticklocs() if lo - 1e-9 <= t <= hi + 1e-9]
            assert len(ticks) >= 2 and all(t.is_integer() for t in ticks), (what, ticks)


def test_tiny_real_runs_report_what_their_files_say(tmp_path, char_model_dir, monkeypatch, data):
    """Two seeds of a 2-step train_rl.py run on a random model, each evaluated with evaluate.py: the report's
    numbers are the logged ones with n from the data sets, and the pair is evaluate.compare's."""
    monkeypatch.setattr(T.verify, "grade_batch", fake_grade)
    dirs = []
    for seed in (0, 1):
        cfg = T.Config(model=str(char_model_dir), dataset=str(data["pool"]), val_dataset=str(data["val"]),
                       test_dataset=str(data["test"]), subject="", num_problems=0, steps=2, problems_per_step=2,
                       group_size=4, max_new_tokens=8, lr=1e-2, seed=seed, device="cpu", eval_every=1,
                       eval_group_by="level", out=str(tmp_path / f"run-s{seed}"), save_every=0,
                       micro_batch_tokens=200)
        run = T.train(cfg)
        problems = P.load_problems(str(data["test"]))
        E.evaluate(checkpoint.load_model(run / "final", device="cpu"), checkpoint.load_tokenizer(run / "final"), problems, 8,
                   out_dir=tmp_path / "evals" / f"run-s{seed}", dataset=str(data["test"]))
        dirs += [run, tmp_path / "evals" / f"run-s{seed}"]
    t = tables(R.report(dirs, tmp_path / "out", plots=False))
    rows = {r["run"]: r for r in t["Runs"]}
    for seed in (0, 1):
        log = [json.loads(x) for x in (tmp_path / f"run-s{seed}" / "metrics.jsonl").read_text().splitlines()]
        row = rows[f"`{tmp_path.name}/run-s{seed}`"]  # told apart from the evaluation evals/run-s{seed}
        assert row["status"] == "complete"
        assert row["test accuracy [95% CI]"] == acc_ci(round(5 * log[-1]["test_accuracy"]), 5)
        assert rows[f"`evals/run-s{seed}`"]["seed"] == str(seed)  # the evaluation of final/ has the run's seed
        assert row["val accuracy [95% CI]"] == acc_ci(round(4 * log[-2]["val_accuracy"]), 4)
        assert row["FLOPs"] == f"{log[-2]['flops']:.3g}"
    c = E.compare(tmp_path / "evals" / "run-s0" / "records.jsonl", tmp_path / "evals" / "run-s1" / "records.jsonl")
    pair = t["Paired comparisons (same problems)"][0]
    assert (pair["n paired"], pair["only A right"], pair["only B right"], pair["McNemar p"]) == (
        str(c["n"]), str(c["only_a_correct"]), str(c["only_b_correct"]), f"{c['mcnemar_p']:.3g}")


def test_a_non_utf8_metrics_file_is_named(tmp_path, data, capsys):
    run = hand_train_run(tmp_path, "r", data)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 4, "note": "\xff"}\n')
    with pytest.raises(SystemExit):
        R.cli.run_main(lambda: R.main([str(run), "--out", str(tmp_path / "o")]), "report.py")
    err = capsys.readouterr().err
    assert err.startswith(f"report.py: error: {run / 'metrics.jsonl'}:6: not UTF-8 text") and err.count("\n") == 1
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "config.json").write_bytes(b'{"model": "\xfe"}')
    with pytest.raises(ValueError, match=f"^{run / 'config.json'}:1: not UTF-8 text"):
        R.report([run], tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_out_holding_other_files_is_refused_and_a_previous_report_is_rewritten(tmp_path, data):
    good = hand_eval_run(tmp_path, "e", [1, 0])
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("keep\n")
    with pytest.raises(FileExistsError, match=f"^--out {notes}: holds 1 other file.* \\(notes.txt\\), not a report"):
        R.report([good], notes, plots=False)
    with pytest.raises(FileExistsError, match="holds an evaluate.py output"):
        R.report([hand_eval_run(tmp_path, "f", [1])], good, plots=False)
    assert sorted(p.name for p in notes.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in good.iterdir()) == ["records.jsonl", "settings.json", "summary.json"]
    first = R.report([good], tmp_path / "rep", plots=False)
    (tmp_path / "rep" / "training.png").write_bytes(b"")  # a previous report's plot
    assert R.report([good], tmp_path / "rep", plots=False) == first  # rewritten in place
    (tmp_path / "rep" / "mine.txt").write_text("x")
    with pytest.raises(FileExistsError, match="mine.txt"):
        R.report([good], tmp_path / "rep", plots=False)
