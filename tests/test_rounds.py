"""rounds.py: selection and masking by hand, one tiny round learning, rows recomputed from the records, resume
after an interrupted round, bad flags and pools."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import evaluate as E
import problems as P
from research.hint import hinted as hint_of
from research.rounds import rounds as R
import train_rl as T
from conftest import make_char_model
import checkpoint
import runs
import verify

# A small run on the tiny world's 2-3 operation problems (the step grader works there too): fast enough for the
# suite, with room to learn (the committed checkpoint answers most 3-operation problems bare).
SMALL = ["--model", "tiny", "--dataset", "tiny_train", "--val-dataset", "tiny_val", "--num-problems", "48",
         "--val-limit", "24", "--grader", "steps", "--samples", "4", "--eval-samples", "2", "--max-new-tokens", "64",
         "--lr", "5e-4", "--epochs", "3", "--batch-size", "8", "--test-dataset", "", "--device", "cpu"]


def sample(text, correct=True, tokens=None, finish="stop"):
    return dict(response=text, correct=correct, completion_tokens=tokens or len(text), finish_reason=finish)


def test_selection_rules_by_hand():
    record = dict(id="a", samples=[sample("long one", tokens=9), sample("x", correct=False), sample("mid", tokens=4),
                                   sample("long one", tokens=9), sample("cut", finish="length"), sample("ab", tokens=2)])
    texts = lambda rule, cap: [s["response"] for s in R.select_traces(record, rule, cap)]
    assert texts("all", 10) == ["long one", "mid", "long one", "ab"]  # wrong and truncated samples never
    assert texts("all", 2) == ["long one", "mid"]
    assert texts("distinct", 10) == ["long one", "mid", "ab"]
    assert texts("distinct", 2) == ["long one", "mid"]
    assert texts("shortest", 2) == ["ab", "mid"]
    assert R.select_traces(dict(id="b", response="z", correct=True, completion_tokens=1, finish_reason="stop"),
                           "all", 4)[0]["response"] == "z"  # a one-sample record is its own sample


def test_prompt_masked_and_loss_is_the_token_mean_nll(tmp_path):
    path = make_char_model(tmp_path / "m")
    tok, net = checkpoint.load_tokenizer(path), checkpoint.load_model(path, dtype=torch.float32, device="cpu")
    problems = {"a": dict(id="a", problem="1 + 2"), "b": dict(id="b", problem="30 - 4 + 5")}
    rows = R.trace_rows([dict(id="a", response="1 + 2 = 3"), dict(id="b", response="ok")], problems, tok, "base")
    prompt_a = tok.encode(P.format_prompt("1 + 2", "base"))
    assert rows[0].prompt == prompt_a and rows[0].tokens == tok.encode("1 + 2 = 3") + [tok.eos_id]
    ids, mask = T.sequence_tensors(rows, tok.pad_id, "cpu")
    # row a: targets ids[1:]; exactly the completion's 10 targets (9 characters + the stop token) are unmasked
    assert mask[0].tolist() == [0.0] * (len(prompt_a) - 1) + [1.0] * 10 + [0.0] * (ids.shape[1] - 1 - len(prompt_a) - 9)
    # the distillation update's loss is -sum(log p(target)) / targets over the completion tokens only, by hand
    with torch.no_grad():
        logits = net(ids)[:, :-1].log_softmax(-1)
        logp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1)
    want = -float((logp * mask).sum() / mask.sum())
    cfg = R.RoundsConfig(lr=0.0, batch_size=2, epochs=1)
    losses, tokens = R.distil(net, rows, cfg, 1, "cpu", tok.pad_id)
    assert tokens == int(mask.sum()) == 10 + 3 and losses[0] == pytest.approx(want, rel=1e-5)


def test_decomposition_pieces_by_hand():
    assert [R.chunk_sizes(n, 3) for n in (2, 3, 4, 5, 6)] == [[2], [3], [2, 2], [3, 2], [3, 3]]
    assert [R.chunk_sizes(n, 3) for n in (7, 8, 9, 10)] == [[3, 2, 2], [3, 3, 2], [3, 3, 3], [3, 3, 2, 2]]  # as before
    # pieces of 2: an odd count merges its 1-operation remainder (the tiny world shows 2-3 operations only)
    assert [R.chunk_sizes(n, 2) for n in (5, 6, 7, 8, 9)] == [[3, 2], [2, 2, 2], [3, 2, 2], [2, 2, 2, 2], [3, 2, 2, 2]]
    assert R.chunk_sizes(3, 1) == [1, 1, 1]  # asked for one at a time: given
    assert R.expression(68, [("-", "52"), ("+", "63"), ("*", "4"), ("-", "16")]) == "(68 - 52 + 63) * 4 - 16"
    for p in P.load_problems("tiny_ladder_val"):  # the generator's own texts, rebuilt from their parsed steps
        assert R.expression(*verify.operations(p["problem"])) == p["problem"]


def test_merge_zero_poses_no_sub_problem_from_0(tmp_path, monkeypatch):
    """A scripted policy that solves every sub-problem but misreads a start of 0 as 1 (what the climb's models do:
    the tiny world starts no problem at 0). Plainly the piece after a 0 fails; with --merge-zero it is posed joined to
    the piece before, every call's tokens still counted; a 0 with nothing left, or no 0, changes nothing."""
    tok, policy = checkpoint.load_tokenizer("tiny"), checkpoint.load_model("tiny", dtype=torch.float32, device="cpu")
    head, tail = P.format_prompt("@", "base").split("@")
    posed = []

    def scripted(model, prompts, max_new_tokens, seed=None, **kw):
        out = []
        for i, ids in enumerate(prompts):
            problem = tok.decode(ids)[len(head):-len(tail)]
            posed.append(problem)
            start, steps = verify.operations(problem)
            lines, value = verify.chain(R.expression(start or 1, steps))
            text = "\n" + "\n".join(lines) + f"\n\\boxed{{{value}}}"
            out.append(R.sample.Completion(i, tok.encode(text), [], "stop"))
        return out

    monkeypatch.setattr(R.sample, "generate", scripted)
    rows = [dict(id="zero", problem="(5 + 3 - 8 + 4) * 2", answer="8", level=4),
            dict(id="end", problem="5 + 3 - 8", answer="0", level=2),
            dict(id="none", problem="(5 + 3 + 8 + 4) * 2", answer="40", level=4)]
    got = {}
    for merge in (False, True):
        posed.clear()
        cfg = R.RoundsConfig(template="base", grader="steps", deliberation="decompose", chunk_ops=2, merge_zero=merge)
        records, _ = R.decompose(policy, tok, rows, cfg, tmp_path / str(merge), 0, 1, "x")
        got[merge] = {r["id"]: E.samples_of(r)[0] for r in records}
        assert got[merge]["end"]["correct"] and got[merge]["none"]["correct"]
        assert posed[:3] == ["5 + 3 - 8", "5 + 3 - 8", "5 + 3 + 8"]  # the first pieces
        assert posed[3:] == (["(0 + 4) * 2", "(16 + 4) * 2"] if not merge else ["(5 + 3 - 8 + 4) * 2", "(16 + 4) * 2"])
    assert not got[False]["zero"]["correct"] and got[False]["zero"]["extracted"] == "10"
    assert got[True]["zero"]["correct"] and got[True]["zero"]["response"] == "\n" + "\n".join(
        verify.chain(rows[0]["problem"])[0]) + "\n\\boxed{8}"  # the discarded call's lines are gone
    assert [len(got[m]["zero"]["calls"]) for m in (False, True)] == [2, 2]
    assert got[True]["zero"]["calls"][1][0] > got[False]["zero"]["calls"][1][0]  # the joined call's longer prompt
    assert got[True]["zero"]["completion_tokens"] == sum(c[1] for c in got[True]["zero"]["calls"])  # both counted
    for k in ("end", "none"):
        assert got[True][k] == got[False][k]


def test_frontier_keeps_the_solved_rungs_and_the_next_by_hand():
    pool = [dict(id=str(i), level=level) for i, level in enumerate([2, 3, 4, 5, 6] * 2)]
    ids = lambda problems: [p["id"] for p in problems]
    kept, top = R.frontier_problems(pool, {"2": 0.78, "3": 0.0, "4": 0.0, "5": 0.0, "6": 0.0}, 0.5, 3)
    assert (ids(kept), top) == (["0", "1", "5"], 3)  # rung 2 solved: rungs 2-3, the first 3 of them
    kept, top = R.frontier_problems(pool, {"2": 0.8, "3": 0.7, "4": 0.1, "5": 0.0, "6": 0.0}, 0.5, 0)
    assert (ids(kept), top) == (["0", "1", "2", "5", "6", "7"], 4)  # n = 0: all of rungs 2-4
    kept, top = R.frontier_problems(pool, {"2": 0.9, "3": 0.1, "4": 0.9, "5": 0.0, "6": 0.0}, 0.5, 0)
    assert top == 3  # from the lowest rung up: rung 4's 0.9 above an unsolved rung 3 does not count
    assert R.frontier_problems(pool, {"2": 0.2, "3": 0.9}, 0.5, 0)[1] == 2  # none solved: the lowest rung only


def test_fresh_takes_the_rounds_own_block_by_hand():
    pool = [dict(id=str(i)) for i in range(10)]
    assert [[p["id"] for p in R.fresh_problems(pool, r, 3)] for r in (1, 2, 3)] == [["0", "1", "2"], ["3", "4", "5"],
                                                                                 ["6", "7", "8"]]


def test_fresh_rounds_deliberate_on_new_problems(tmp_path):
    """--fresh: round 1 deliberates on the pool's first N problems, round 2 on the next N, none seen twice."""
    out = tmp_path / "run"
    R.main(SMALL + ["--num-problems", "5", "--rounds", "2", "--fresh", "--val-limit", "4", "--out", str(out)])
    pool = [p["id"] for p in P.load_problems("tiny_train")]
    ids = lambda path: [json.loads(x)["id"] for x in path.read_text().splitlines() if x.strip()]
    assert ids(out / "round_1" / "deliberate" / "records.jsonl") == pool[:5]
    assert ids(out / "round_2" / "deliberate" / "records.jsonl") == pool[5:10]
    assert set(ids(out / "traces_2.jsonl")) <= set(pool[5:10])
    with pytest.raises(ValueError, match="--fresh: 3 rounds of --num-problems 8000 need 24000"):
        R.main(SMALL + ["--num-problems", "8000", "--rounds", "3", "--fresh", "--out", str(tmp_path / "y")])
    assert not (tmp_path / "y").exists()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rounds") / "run"
    rows = R.main(SMALL + ["--rounds", "1", "--out", str(out)])
    return out, rows


def test_one_round_raises_fast_accuracy(small_run):
    _, rows = small_run
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[1]["selected_traces"] > 0
    assert rows[1]["fast_accuracy"] > rows[0]["fast_accuracy"] + 0.2, [r["fast_accuracy"] for r in rows]


def test_rows_equal_their_recomputation_from_the_records(small_run):
    out, rows = small_run
    saved = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert saved == json.loads(json.dumps(rows))
    cfg = R.RoundsConfig(**{k: v for k, v in json.loads((out / "config.json").read_text()).items()
                            if k != "code_version"})
    val = P.load_problems("tiny_val")[:cfg.val_limit]
    cumulative = 0.0
    for row in saved:
        r, d = row["round"], out / f"round_{row['round']}"
        again = {}
        for mode in ("fast", "deliberate"):
            settings = json.loads((d / "eval" / mode / "settings.json").read_text())
            records = E.read_records(d / "eval" / mode / "records.jsonl")[0]
            again.update(R.mode_fields(mode, E.summarize(records, settings, checkpoint.load_model(d).config)))
        if r:
            records = E.read_records(d / "deliberate" / "records.jsonl")[0]
            settings = json.loads((d / "deliberate" / "settings.json").read_text())
            traces = [json.loads(x) for x in (out / f"traces_{r}.jsonl").read_text().splitlines()]
            tok = checkpoint.load_tokenizer(d)
            assert traces == R.traces_for_round(records, cfg, r, tok)
            passes = [E.summarize(records, settings, checkpoint.load_model(out / f"round_{r - 1}").config)]
            again.update(R.deliberation_fields(records, passes, traces, cfg.eval_group_by))
            again["training_tokens"], again["training_flops"] = R.training_flops(checkpoint.load_model(d).config, traces,
                                                                                 cfg.epochs)
        policy, tok = checkpoint.load_model(d, dtype=torch.float32, device="cpu"), checkpoint.load_tokenizer(d)
        fast = E.read_records(d / "eval" / "fast" / "records.jsonl")[0]
        again["entropy"] = R.greedy_entropy(policy, tok, {p["id"]: p for p in val}, fast, "base", "cpu")
        again["round_flops"] = again.get("deliberation_flops", 0.0) + again.get("training_flops", 0.0)
        cumulative += again["round_flops"]
        again["cumulative_flops"] = cumulative
        for k, v in json.loads(json.dumps(again)).items():
            assert row[k] == (pytest.approx(v, rel=1e-9) if isinstance(v, float) else v), k


def test_a_finished_run_extended_keeps_its_old_test_evaluation_beside_its_round(tmp_path, monkeypatch):
    # --rounds raised on --resume: the held-out test of the old last round moves to round_0/, not mixed or lost
    out, few = tmp_path / "run", ["--num-problems", "8", "--test-dataset", "tiny_test", "--test-limit", "3"]
    R.main(SMALL + few + ["--rounds", "0", "--out", str(out)])
    old, first = (out / "test.json").read_text(), json.loads((out / "config.json").read_text())
    monkeypatch.setattr(runs, "code_version", lambda: "another-commit")  # resumed under a later commit
    R.main(SMALL + few + ["--rounds", "1", "--out", str(out), "--resume"])
    # config.json keeps the first run's settings and commit; the resume's commit and --rounds stand beside them
    assert json.loads((out / "config.json").read_text()) == dict(first, resumes=[dict(code_version="another-commit",
                                                                                      rounds=1)])
    before = (out / "config.json").read_bytes()
    with pytest.raises(ValueError, match="--rounds 0: the run in .* has completed 1 round"):
        R.main(SMALL + few + ["--rounds", "0", "--out", str(out), "--resume"])  # would re-test round 0 as the last
    assert (out / "config.json").read_bytes() == before
    assert (out / "round_0" / "test.json").read_text() == old and json.loads(old)["round"] == 0
    assert json.loads((out / "test.json").read_text())["round"] == 1
    for mode in ("fast", "deliberate"):
        settings = json.loads((out / "test" / mode / "settings.json").read_text())
        assert Path(settings["model"]).name == "round_1"
        assert Path(json.loads((out / "round_0" / "test" / mode / "settings.json").read_text())["model"]).name == "round_0"


def test_resume_after_an_interrupted_round_gives_identical_weights(small_run, tmp_path, monkeypatch):
    full, _ = small_run
    out = tmp_path / "run"
    real = R.distil

    def killed_in_round_1(policy, rows, cfg, r, device, pad_id):
        if r == 1:
            raise KeyboardInterrupt  # as kill -9 would, after round 1's deliberation is on disk
        return real(policy, rows, cfg, r, device, pad_id)

    monkeypatch.setattr(R, "distil", killed_in_round_1)
    with pytest.raises(KeyboardInterrupt):
        R.main(SMALL + ["--rounds", "1", "--out", str(out)])
    monkeypatch.setattr(R, "distil", real)
    records = out / "round_1" / "deliberate" / "records.jsonl"
    data = records.read_bytes()
    records.write_bytes(data[:len(data) - 40])  # a partial last line, as a kill mid-write leaves
    with open(out / "rounds.jsonl", "ab") as f:
        f.write(b'{"round": 1, "fast_acc')  # and half a row
    with pytest.raises(FileExistsError):
        R.main(SMALL + ["--rounds", "1", "--out", str(out)])  # no silent overwrite without --resume
    with pytest.raises(ValueError, match="lr"):
        R.main(SMALL + ["--rounds", "1", "--out", str(out), "--resume", "--lr", "1e-4"])
    rows = R.main(SMALL + ["--rounds", "1", "--out", str(out), "--resume"])
    assert (out / "round_1" / "model.safetensors").read_bytes() == (full / "round_1" / "model.safetensors").read_bytes()
    drop = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]
    saved = [json.loads(x) for x in (full / "rounds.jsonl").read_text().splitlines()]
    assert drop(rows) == drop(saved)


def test_zero_rounds_evaluates_the_model_only(small_run, tmp_path):
    full, _ = small_run
    rows = R.main(SMALL + ["--rounds", "0", "--out", str(tmp_path / "run")])  # e.g. a baseline's checkpoint
    drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}
    assert [drop(r) for r in rows] == [drop(json.loads((full / "rounds.jsonl").read_text().splitlines()[0]))]
    assert not list(tmp_path.glob("run/traces_*")) and not (tmp_path / "run" / "round_1").exists()


@pytest.mark.parametrize("flags, message", [
    (["--selection", "best"], "--selection"), (["--samples", "0"], "--samples"),
    (["--distil-from", "scratch"], "--distil-from"), (["--temperature", "0"], "--temperature"),
    (["--samples", "1", "--eval-samples", "0"], "--eval-samples"), (["--max-traces", "0"], "--max-traces"),
    (["--grader", "judge"], "--grader"), (["--adaptive-samples", "-1"], "--adaptive-samples"),
    (["--frontier", "2"], "--frontier"), (["--rounds", "-1"], "--rounds"),
    (["--fresh", "--num-problems", "0"], "--fresh"),
])
def test_bad_flags_name_the_flag(flags, message, tmp_path, capsys):
    with pytest.raises((ValueError, SystemExit)) as e:  # a value outside a flag's choices is argparse's own error
        R.main(SMALL + ["--out", str(tmp_path / "x")] + flags)
    assert message in (str(e.value) if e.type is ValueError else capsys.readouterr().err)
    assert not (tmp_path / "x").exists()


def test_bad_pools_are_refused(tmp_path):
    leak = json.loads(Path(P.dataset_path("math500")).read_text().splitlines()[0])
    (tmp_path / "leak.jsonl").write_text(json.dumps(dict(leak, id="mine/1")) + "\n")
    with pytest.raises(ValueError, match="held-out"):
        R.main(SMALL + ["--dataset", str(tmp_path / "leak.jsonl"), "--out", str(tmp_path / "a")])
    row = dict(id="dup", source="t", problem="1 + 2", answer="3")
    (tmp_path / "dup.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(dict(row, problem="2 + 2", answer="4")) + "\n")
    with pytest.raises(ValueError, match="not unique"):
        R.main(SMALL + ["--dataset", str(tmp_path / "dup.jsonl"), "--out", str(tmp_path / "b")])
    with pytest.raises(FileNotFoundError, match="holds no run to resume"):
        R.main(SMALL + ["--out", str(tmp_path / "c"), "--resume"])
    assert not any((tmp_path / n).exists() for n in "abc")


def test_decomposed_round_with_adaptive_k_and_an_rl_phase_runs_end_to_end(tmp_path):
    out = tmp_path / "run"
    rows = R.main(["--model", "tiny", "--dataset", "tiny_ladder_train", "--num-problems", "10", "--val-limit", "5",
                   "--samples", "2", "--deliberation", "decompose", "--rounds", "1", "--rl-steps", "1",
                   "--adaptive-samples", "3",
                   "--rl-problems-per-step", "2", "--rl-group-size", "2", "--test-dataset", "", "--device", "cpu",
                   "--out", str(out)])
    records = E.read_records(out / "round_1" / "deliberate" / "records.jsonl")[0]
    extra = E.read_records(out / "round_1" / "deliberate_adaptive" / "records.jsonl")[0]
    unsolved = [r["id"] for r in records if not any(s["correct"] for s in r["samples"])]
    assert unsolved and [r["id"] for r in extra] == unsolved  # adaptive k: 3 more samples exactly where none passed
    assert all(len(r["samples"]) == 3 and all(s["calls"] for s in r["samples"]) for r in extra)  # decomposed too
    assert rows[1]["adaptive_problems"] == len(unsolved)
    assert rows[1]["deliberation_samples"] == 2 * len(records) + 3 * len(unsolved)
    assert rows[1]["deliberation_solved"] == len(records) - len(unsolved) + sum(
        any(s["correct"] for s in r["samples"]) for r in extra)
    level_4 = next(r for r in records if r["level"] == 4)
    assert [len(s["calls"]) for s in level_4["samples"]] == [2, 2]  # 4 operations in two calls of 2
    assert all(s["response"].startswith("\n") for r in records for s in r["samples"])  # the tiny world's opening
    assert rows[1]["rl_steps"] == 1 and rows[1]["rl_flops"] > 0 and (out / "round_1" / "rl" / "final").is_dir()
    assert rows[1]["deliberation_flops"] == pytest.approx(R.decompose_flops(checkpoint.load_model("tiny").config, records + extra))


ROUNDS_TABLE = Path(__file__).resolve().parent.parent / "research" / "rounds" / "rounds_table.py"


def load_rounds_table():
    from research.rounds import rounds_table
    return rounds_table


def test_paired_table_reads_the_runs_records(small_run):
    out, rows = small_run
    line = load_rounds_table().paired_table([out, out]).splitlines()[3]  # one run twice: two equal "seeds"
    for mode, cell in zip(("fast", "deliberate"), line.split("|")[2:4]):
        assert float(cell.split()[0]) == pytest.approx(rows[1][f"{mode}_accuracy"] - rows[0][f"{mode}_accuracy"],
                                                       abs=5e-4)


def test_paired_rise_by_hand():
    table = load_rounds_table()
    before = [dict(a=0, b=1, c=0, d=0), dict(a=0, b=0, c=1, d=0)]  # two seeds x four problems
    after = [dict(a=1, b=1, c=1, d=0), dict(a=1, b=0, c=1, d=1)]
    rise, ci = table.paired_rise(before, after)  # per problem, the mean over seeds: 1, 0, 0.5, 0.5
    assert rise == 0.5
    # All 4^4 resamples: P(mean <= 0) = 1/256, P(mean <= 0.125) = 1/256 + 4 (1/4)^3 (1/2) = 0.035, so the 2.5th
    # percentile is 0.125; by symmetry the 97.5th is 0.875.
    assert ci == (0.125, 0.875)
    assert table.paired_rise([dict(a=0, b=0)], [dict(a=1, b=1)]) == (1.0, (1.0, 1.0))
    with pytest.raises(ValueError, match="different problems"):
        table.paired_rise([dict(a=0, b=0)], [dict(a=1, c=1)])


def fake_rounds_run(path, flops, correct):  # rounds.jsonl and each round's records: correct[r] = {id: 0/1}
    path.mkdir()
    (path / "rounds.jsonl").write_text("".join(json.dumps(dict(round=r, cumulative_flops=f)) + "\n"
                                               for r, f in enumerate(flops)))
    for r, by_id in enumerate(correct):
        for mode in ("fast", "deliberate"):
            d = path / f"round_{r}" / "eval" / mode
            d.mkdir(parents=True)
            (d / "records.jsonl").write_text("".join(json.dumps(dict(id=i, correct=c)) + "\n" for i, c in by_id.items()))
    return path


def test_versus_table_by_hand(tmp_path):
    table = load_rounds_table()
    start = dict(a=0, b=0, c=0, d=0)
    arm = [fake_rounds_run(tmp_path / f"arm-s{s}", [0, 10.0 + s], [start, dict(a=1, b=1, c=s, d=0)]) for s in (0, 1)]
    other = [fake_rounds_run(tmp_path / f"other-s{s}", [0, 30.0], [start, dict(a=1, b=0, c=0, d=0)]) for s in (0, 1)]
    lines = table.versus_table(arm, other).splitlines()
    assert len(lines) == 5 and lines[3].startswith("| 1 | 1.05e+01 / 3.00e+01 |")
    # per problem, the mean over the two seeds of arm - other: 0, 1, 0.5, 0 -> mean 0.375
    fast, deliberate = lines[3].split("|")[3:5]
    assert float(fast.split()[0]) == float(deliberate.split()[0]) == 0.375
    assert table.versus_table(arm, arm).splitlines()[3].split("|")[3].split()[0] == "+0.000"


def test_baseline_paired_table_by_hand(tmp_path, monkeypatch):
    """--baseline --paired: each round minus the baseline checkpoint at its FLOPs, from both records; a round with
    no checkpoint within 10% of its FLOPs gets no row."""
    table = load_rounds_table()
    cfg = dict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", eval_samples=4).__dict__)
    start = dict(a=0, b=0, c=0, d=0)
    run = fake_rounds_run(tmp_path / "rounds", [0, 42, 100], [start, dict(a=1, b=1, c=1, d=0), start])
    (run / "config.json").write_text(json.dumps(cfg))
    base = tmp_path / "base"
    (base / "checkpoints").mkdir(parents=True)
    (base / "metrics.jsonl").write_text("".join(json.dumps(dict(step=s, flops=10.0 * s)) + "\n" for s in range(1, 7)))
    for s in (2, 4, 6):
        (base / "checkpoints" / f"step_{s}").mkdir()

    def fake_evaluate(run_dir, step, config):  # the baseline gets a right, in both modes
        where = table.evaluation_dir(run_dir, step, config)
        where.parent.mkdir(parents=True, exist_ok=True)
        fake_rounds_run(where, [0], [dict(a=1, b=0, c=0, d=0)])
    monkeypatch.setattr(table, "evaluate_checkpoint", fake_evaluate)
    lines = table.baseline_paired_table([run], [base]).splitlines()
    assert len(lines) == 5  # title, head, rule, round 1 (step 4 at 40 of 42), the footnote: 60 is not within 10% of 100
    cells = lines[3].split(" | ")
    assert cells[:3] == ["| 1", "4.20e+01 / 4.00e+01", "4"]
    assert cells[3].startswith("+0.500 [+0.000, +") and cells[4].startswith("+0.500 [")  # b and c: 2 of 4 problems


def test_held_out_table_sets_the_last_round_beside_its_start_and_the_baseline_by_hand(tmp_path, monkeypatch):
    """--test: the rounds run's own test records (its last round), the start and the baseline checkpoint at the last
    round's FLOPs evaluated on the same test problems, means per rung and paired differences."""
    table = load_rounds_table()
    level = dict(a=2, b=2, c=3, d=3)

    def write(root, fast, deliberate):  # root/{fast,deliberate}/records.jsonl
        for mode, by_id in (("fast", fast), ("deliberate", deliberate)):
            (root / mode).mkdir(parents=True)
            (root / mode / "records.jsonl").write_text(
                "".join(json.dumps(dict(id=i, correct=c, level=level[i])) + "\n" for i, c in by_id.items()))
    start, none, every = dict(a=1, b=1, c=0, d=0), dict.fromkeys("abcd", 0), dict.fromkeys("abcd", 1)
    last = [dict(a=1, b=0, c=1, d=1), dict(a=0, b=1, c=1, d=0)]  # seeds 0 and 1 after round 1
    runs, bases = [], []
    for s in (0, 1):
        run = fake_rounds_run(tmp_path / f"rounds-s{s}", [0, 42], [start, start])
        cfg = dict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", test_dataset="tiny_ladder_test",
                                  eval_group_by="level", seed=s).__dict__)
        (run / "config.json").write_text(json.dumps(cfg))
        (run / "test.json").write_text(json.dumps(dict(round=1)))
        write(run / "test", last[s], every)
        base = tmp_path / f"base-s{s}"
        (base / "checkpoints").mkdir(parents=True)
        (base / "metrics.jsonl").write_text("".join(json.dumps(dict(step=n, flops=10.0 * n)) + "\n" for n in range(7)))
        for n in (2, 4, 6):
            (base / "checkpoints" / f"step_{n}").mkdir()
        runs.append(run), bases.append(base)
    evaluated = []

    def fake_test_evaluation(model, out, config):  # the start and the baseline both answer a and b
        assert config["test_dataset"] == "tiny_ladder_test"
        evaluated.append(Path(model).name)
        write(Path(out) / "round_0" / "eval", start, none)
    monkeypatch.setattr(table, "evaluate_on_test", fake_test_evaluation)
    lines = table.held_out_table(runs, bases).splitlines()
    assert evaluated == ["tiny", "tiny", "step_4", "step_4"]  # step 4 (40 FLOPs) is the nearest to round 1's 42
    assert lines[0] == "2 seeds x 4 test problems"
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines if line.startswith("| ")}
    assert rows["start"][1:4] == ["0.00e+00", "-", "0.500 [0.50, 0.50]"] and rows["start"][5:] == ["1.00", "0.00 |"]
    assert rows["round 1"][1] == "4.20e+01" and rows["round 1"][4].startswith("1.000")
    assert rows["round 1"][3].startswith("0.625 [") and rows["round 1"][5:] == ["0.50", "0.75 |"]  # by seed: 3/4, 2/4
    assert rows["Dr. GRPO"][1:3] == ["4.00e+01", "4 / 4"]
    # per problem, the mean over seeds of round 1 - start: a -0.5, b -0.5, c 1, d 0.5
    diff = rows["round 1 - start"]
    assert [float(x.split()[0]) for x in diff[1:5]] == [0.125, -0.5, 0.75, 1.0]
    assert rows["Dr. GRPO - start"][1].startswith("+0.000 [+0.000, +0.000]")
    assert rows["round 1 - Dr. GRPO"][1:] == diff[1:]
    (runs[1] / "test.json").write_text(json.dumps(dict(round=2)))
    with pytest.raises(ValueError, match="same last round"):
        table.held_out_table(runs, bases)


def test_compute_table_averages_the_runs_by_hand(tmp_path):
    table = load_rounds_table()
    runs = []
    for s, (samples, hinted, tokens) in enumerate(((100, 0, 1000), (300, 40, 3000))):
        run = tmp_path / f"s{s}"
        run.mkdir()
        rows = [dict(round=0), dict(round=1, deliberation_samples=samples, hinted_samples=hinted,
                                    deliberation_tokens=tokens, training_tokens=tokens // 10, round_flops=2e12 + s * 1e12,
                                    cumulative_flops=2e12 + s * 1e12)]
        (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(run)
    lines = table.compute_table(runs).splitlines()
    assert len(lines) == 4  # title, head, rule, round 1 (round 0 costs nothing)
    assert lines[3] == "| 1 | 200 | 20 | 2,000 | 200 | 2.50e+12 | 2.50e+12 |"


def test_baseline_checkpoint_at_equal_flops_by_hand(tmp_path):
    table = load_rounds_table()
    rows = [dict(step=s, flops=10.0 * s) for s in range(1, 7)] + [dict(step=6, test_accuracy=0.5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for s in (2, 4, 6):
        (tmp_path / "checkpoints" / f"step_{s}").mkdir(parents=True)
    (tmp_path / "checkpoints" / ".step_5.tmp").mkdir()  # an interrupted save is not a checkpoint
    assert table.checkpoint_at(tmp_path, 35.0) == (4, 40.0)  # saved FLOPs 20 / 40 / 60: the nearest
    assert table.checkpoint_at(tmp_path, 29.0) == (2, 20.0) and table.checkpoint_at(tmp_path, 1e9) == (6, 60.0)


def two_seeds(tmp_path, cfg, row):
    """Two rounds runs s0 and s1 of rounds 0-1, their rows row(r, acc) at accuracies 0.2, 0.5 and 0.4, 0.7."""
    runs = []
    for seed, accs in enumerate(([0.2, 0.5], [0.4, 0.7])):
        run = tmp_path / f"s{seed}"
        run.mkdir()
        (run / "config.json").write_text(json.dumps(cfg))
        (run / "rounds.jsonl").write_text("".join(json.dumps(row(r, a)) + "\n" for r, a in enumerate(accs)))
        runs.append(run)
    return runs


def test_mean_table_averages_the_seeds_by_hand(tmp_path):
    """--mean: each round's mean over the runs with its 95% t interval, no baseline rows and nothing evaluated."""
    table = load_rounds_table()
    cfg = dict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", eval_samples=4).__dict__)

    def row(r, fast):
        return dict(round=r, cumulative_flops=1e12 * r, fast_accuracy=fast, fast_by_group={"2": fast},
                    deliberate_accuracy=fast + 0.1, deliberate_pass_at_k={"pass@4": fast + 0.2})
    runs = two_seeds(tmp_path, cfg, row)
    lines = table.mean_table(runs).splitlines()
    assert len(lines) == 4 and "baseline" not in lines[0]  # head, rule, rounds 0 and 1: no Dr. GRPO rows
    # round 1: fast 0.5 and 0.7, mean 0.6, sd 0.1414; t(1 df) = 12.706, half-width 12.706 * 0.1414 / sqrt(2) = 1.27
    assert lines[3] == ("| 1 | rounds | 1.00e+12 | 0.600 [-0.67, 1.87] | 0.700 [-0.57, 1.97] | 0.800 [-0.47, 2.07] "
                        "| 0.60 |")
    # the command line gives the same table (it once crashed on `--mean` alone while mean_table passed)
    shell = subprocess.run([sys.executable, str(ROUNDS_TABLE), *map(str, runs), "--mean"], capture_output=True,
                           text=True)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.splitlines() == lines


def round_row(r, flops, acc):  # a rounds.jsonl row with one group and every accuracy `acc`
    return dict(round=r, cumulative_flops=flops, fast_accuracy=acc, fast_by_group={"2": acc}, deliberate_accuracy=acc,
                deliberate_pass_at_k={"pass@4": acc})


def test_baseline_rows_only_where_a_checkpoint_matches_the_rounds_flops(tmp_path, monkeypatch):
    """A round past the baseline's last checkpoint gets no Dr. GRPO row (the nearest one would not be equal
    FLOPs), and the table says so."""
    table = load_rounds_table()
    cfg = dict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", eval_samples=4).__dict__)
    run, base = tmp_path / "rounds", tmp_path / "base"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg))
    (run / "rounds.jsonl").write_text("".join(json.dumps(round_row(r, f, 0.5)) + "\n"
                                              for r, f in enumerate((0, 42, 100))))
    (base / "checkpoints").mkdir(parents=True)
    (base / "metrics.jsonl").write_text("".join(json.dumps(dict(step=s, flops=10.0 * s)) + "\n" for s in range(1, 7)))
    for s in (2, 4, 6):
        (base / "checkpoints" / f"step_{s}").mkdir()
    monkeypatch.setattr(table, "evaluate_checkpoint", lambda run_dir, step, config: round_row(0, 0, step / 10))
    lines = table.mean_table([run], [base]).splitlines()
    assert [line.split(" | ")[1] for line in lines[2:6]] == ["start (both)", "rounds", "Dr. GRPO", "rounds"]
    assert lines[4].startswith("| 1 | Dr. GRPO | 4.00e+01 | 0.400 |") and lines[4].endswith("| 4 |")  # 40 of 42
    assert lines[-1].startswith("No baseline row for rounds 2:")  # 60 is not within 10% of 100


def test_after_table_pairs_each_checkpoint_with_the_last_round_by_hand(tmp_path, monkeypatch):
    """--after: an RL run continued from the last round, each checkpoint with the rounds' FLOPs added and its rise
    over that round paired over problems; a run that started from another policy is refused."""
    table = load_rounds_table()
    cfg = dict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", eval_samples=4).__dict__)

    def write_records(run_dir, r, fast, deliberate):  # {problem id: correct} per mode
        for mode, correct in (("fast", fast), ("deliberate", deliberate)):
            d = Path(run_dir) / f"round_{r}" / "eval" / mode
            d.mkdir(parents=True)
            (d / "records.jsonl").write_text("".join(json.dumps(dict(id=i, correct=c)) + "\n"
                                                     for i, c in correct.items()))
    run, after = tmp_path / "rounds", tmp_path / "after"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg))
    (run / "rounds.jsonl").write_text("".join(json.dumps(round_row(r, f, acc)) + "\n"
                                              for r, f, acc in ((0, 0, 0.0), (1, 100, 0.25))))
    write_records(run, 1, dict(a=0, b=1, c=0, d=0), dict(a=0, b=0, c=0, d=0))
    (after / "checkpoints" / "step_2").mkdir(parents=True)
    (after / "config.json").write_text(json.dumps(dict(model=str(run / "round_1"))))
    (after / "metrics.jsonl").write_text("".join(json.dumps(dict(step=s, flops=10.0 * s)) + "\n" for s in (1, 2)))

    def fake_evaluate(run_dir, step, config):  # after the RL steps: fast a, b right; deliberate a, b, c right
        write_records(table.evaluation_dir(run_dir, step, config), 0, dict(a=1, b=1, c=0, d=0),
                      dict(a=1, b=1, c=1, d=0))
        return round_row(0, 0, 0.5)
    monkeypatch.setattr(table, "evaluate_checkpoint", fake_evaluate)
    lines = table.after_table([run], [after]).splitlines()
    assert lines[2].startswith("| round 1 | 1.00e+02 | 0.250 | - | 0.250 | - |")
    # FLOPs 100 + 20; fast rises on a only (+1/4), deliberate on a, b, c (+3/4); the bootstrap resamples the 4
    # problems, and 32% of the resamples (3/4)^4 hold no a, so fast's interval starts at 0
    cells = lines[3].split(" | ")
    assert cells[:3] == ["| + 2 RL steps", "1.20e+02", "0.500"]
    assert cells[3].startswith("+0.250 [+0.000, +") and cells[5].startswith("+0.750 [+")
    (after / "config.json").write_text(json.dumps(dict(model=str(run / "round_0"))))
    with pytest.raises(ValueError, match="starts from"):
        table.after_table([run], [after])
    shell = subprocess.run([sys.executable, str(ROUNDS_TABLE), str(run), "--after", str(after)], capture_output=True,
                           text=True)
    assert shell.returncode == 2 and "Traceback" not in shell.stderr  # one error line from the command line
    assert shell.stderr.splitlines()[-1].startswith(f"rounds_table.py: error: --after: {after} starts from")


def test_rl_phase_trains_on_the_rounds_pool(tmp_path, monkeypatch):
    """With --frontier the RL phase draws from the rungs the round deliberated on, not from the whole ladder."""
    seen = {}

    def fake_train(rcfg):
        seen["pool"] = P.load_pools(rcfg)[0]
        run = Path(rcfg.out)
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps(dict(step=1, generated_tokens=5, training_tokens=4, flops=2.0)))
    monkeypatch.setattr(T, "train", fake_train)
    ladder = P.load_problems("tiny_ladder_train")
    pool = [p for p in ladder[:40] if p["level"] <= 3]
    cfg = R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", val_dataset="tiny_ladder_val", grader="steps",
                         eval_group_by="level", frontier=0.5, num_problems=12, rl_steps=1)
    final, rl = R.rl_phase(cfg, tmp_path / "round_1", 1, pool)
    assert [p["id"] for p in seen["pool"]] == [p["id"] for p in pool]  # all of it: rungs 2-3 only
    assert rl == dict(rl_steps=1, rl_generated_tokens=5, rl_training_tokens=4, rl_flops=2.0)
    R.rl_phase(dataclasses.replace(cfg, frontier=0.0), tmp_path / "round_2", 2, pool)
    assert [p["id"] for p in seen["pool"]] == [p["id"] for p in ladder[:12]]  # no frontier: the first 12


def fake_rounds_main(calls, row_of):
    """Stands in for rounds.main(--rounds 0): writes the config rounds.py would write and row_of(model) as row 0."""
    import cli

    def fake_main(argv):
        calls.append(argv)
        cfg = cli.parse_config(R.RoundsConfig, argv, "", defaults=R.flag_defaults)
        Path(cfg.out).mkdir(parents=True)
        (Path(cfg.out) / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
        (Path(cfg.out) / "rounds.jsonl").write_text(json.dumps(row_of(cfg.model)) + "\n")
    return fake_main


def test_baseline_evaluations_are_cached_per_protocol(tmp_path, monkeypatch):
    # two rounds runs evaluated at different temperatures never share the baseline checkpoint's evaluation
    table, calls = load_rounds_table(), []
    monkeypatch.setattr(R, "main", fake_rounds_main(calls, lambda model: dict(round=0, model=model)))
    hot = dataclasses.asdict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", eval_samples=4))
    cool = dict(hot, temperature=0.5)
    for cfg in (hot, cool, hot):
        assert table.evaluate_checkpoint(tmp_path, 12, cfg)["model"] == str(tmp_path / "checkpoints" / "step_12")
    assert [c[c.index("--temperature") + 1] for c in calls] == ["1.0", "0.5"]  # the third call was cached
    outs = {Path(c[c.index("--out") + 1]) for c in calls}  # evaluated under a temporary name, then renamed
    assert len(outs) == 2 and all(o.name == ".step_12.tmp" and not o.exists() for o in outs)
    assert all((o.parent / "step_12" / "rounds.jsonl").is_file() for o in outs)
    moved = next(iter(outs)).parent / "step_12"  # a cache that says another protocol is refused, not read
    cfg = json.loads((Path(moved) / "config.json").read_text())
    (Path(moved) / "config.json").write_text(json.dumps(dict(cfg, samples=cfg["samples"] + 1)))
    with pytest.raises(ValueError, match="other evaluation settings"):
        for cfg in (hot, cool):
            table.evaluate_checkpoint(tmp_path, 12, cfg)


def test_temperature_table_reevaluates_each_round_with_the_new_temperature(tmp_path, monkeypatch):
    table = load_rounds_table()
    cfg = dict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", eval_samples=4).__dict__)
    (tmp_path / "config.json").write_text(json.dumps(cfg))

    def row(r, acc):
        return dict(round=r, fast_accuracy=0.5, fast_by_group={"2": 0.5}, deliberate_accuracy=acc,
                    deliberate_ci95=[acc - 0.1, acc + 0.1], deliberate_by_group={"2": acc},
                    deliberate_pass_at_k={"pass@1": acc, "pass@4": acc + 0.05})
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(row(r, 0.2 + 0.1 * r)) + "\n" for r in range(2)))
    calls = []

    monkeypatch.setattr(R, "main", fake_rounds_main(calls, lambda model: row(0, 0.7 if model == "tiny" else 0.9)))
    text = table.temperature_table(tmp_path, 0.5)
    assert [c[c.index("--model") + 1] for c in calls] == ["tiny", str(tmp_path / "round_1")]  # pi_0, then pi_1
    assert all(c[c.index("--temperature") + 1] == "0.5" and c[c.index("--rounds") + 1] == "0" for c in calls)
    assert all(c[c.index("--eval-samples") + 1] == "4" for c in calls)  # the run's own evaluation otherwise
    lines = text.splitlines()[-2:]
    assert "| 0.200 [0.10, 0.30] | 0.700 [0.60, 0.80] | 0.250 / 0.750 |" in lines[0]  # recorded, then at T = 0.5
    assert "| 0.300 [0.20, 0.40] | 0.900 [0.80, 1.00] | 0.350 / 0.950 | 0.90 |" in lines[1]
    table.temperature_table(tmp_path, 0.5)
    assert len(calls) == 2  # cached: nothing evaluated twice


def test_temperature_mean_table_averages_both_temperatures_over_seeds_by_hand(tmp_path, monkeypatch):
    """--temperature 0.5 --mean: per round, the seeds' mean of the recorded vote and of the vote at T = 0.5."""
    table = load_rounds_table()
    cfg = dict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", eval_samples=4).__dict__)

    def row(r, acc):
        return dict(round=r, fast_accuracy=acc, fast_by_group={"2": acc}, deliberate_accuracy=acc + 0.1,
                    deliberate_by_group={"2": acc + 0.1}, deliberate_pass_at_k={"pass@4": acc + 0.2})
    runs = two_seeds(tmp_path, cfg, row)
    cooler = {str(run / "round_1"): row(0, acc + 0.1)  # pi_1's vote at T = 0.5: 0.1 above its recorded one
              for run, acc in zip(runs, (0.5, 0.7))}
    monkeypatch.setattr(R, "main", fake_rounds_main([], lambda model: cooler.get(model, row(0, 0.3))))
    lines = table.temperature_mean_table(runs, 0.5).splitlines()
    assert lines[0] == "2 seeds" and len(lines) == 5
    # round 0: the recorded votes 0.3 and 0.5 (mean 0.4, half-width 12.706 * 0.1414 / sqrt(2) = 1.27); both
    # seeds' pi_0 ("tiny") vote 0.4 at T = 0.5: no spread, an interval of width 0
    assert lines[3] == "| 0 | 0.300 [-0.97, 1.57] | 0.400 [-0.87, 1.67] | 0.400 [0.40, 0.40] | 0.500 [0.50, 0.50] | 0.40 |"
    # round 1: recorded 0.6 and 0.8; at T = 0.5 0.7 and 0.9 (mean 0.8), pass@4 0.8 and 1.0, by group 0.80
    assert lines[4] == "| 1 | 0.600 [-0.67, 1.87] | 0.700 [-0.57, 1.97] | 0.800 [-0.47, 2.07] | 0.900 [-0.37, 2.17] | 0.80 |"
    # the command line reads the evaluations cached above (nothing to evaluate) and prints the same table
    shell = subprocess.run([sys.executable, str(ROUNDS_TABLE), *map(str, runs), "--temperature", "0.5", "--mean"],
                           capture_output=True, text=True)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.splitlines() == lines


# -----------------------------------------------------------------------------
# Rationalization (--rationalize) and keeping what was learnt (--replay-share)


def test_a_hint_states_the_training_answer_and_the_tiny_tokenizer_spells_it():
    p = dict(id="x", problem="(37 + 12) * 2 - 45", answer="53", level=3)
    hinted = hint_of(p)
    assert hinted["problem"] == "(37 + 12) * 2 - 45\n\nfinal answer: 53" and p["problem"] == "(37 + 12) * 2 - 45"
    prompt = P.format_prompt(hinted["problem"], "base")
    assert prompt.endswith("Problem:\n(37 + 12) * 2 - 45\n\nfinal answer: 53\n\nSolution:")
    tok = checkpoint.load_tokenizer("tiny")
    assert tok.decode(tok.encode(prompt)) == prompt  # every character is in the tiny world's vocabulary
    qwen = checkpoint.load_tokenizer(checkpoint.QWEN3_TOKENIZER)  # and a MATH problem with the real tokenizer
    math = P.load_problems("math_train", 1)[0]
    for template in P.TEMPLATES:
        text = P.format_prompt(hint_of(math)["problem"], template)
        assert f"final answer: {math['answer']}" in text
        assert qwen.decode(qwen.encode(text), skip_special_tokens=False) == text


def test_rationalize_samples_with_hints_only_where_sampling_found_nothing(tmp_path):
    """A round with --rationalize: the problems without a verified trace after the first k samples get hinted
    samples (their prompts state the answer, the records say hint), the others none; every trace says where it
    came from, the row counts traces per source and rung, and the hinted pass's compute is in the round's."""
    out = tmp_path / "rat"
    rows = R.main(SMALL + ["--rounds", "1", "--rationalize", "--rationalize-samples", "3", "--out", str(out)])
    first = {r["id"]: r for r in E.read_records(out / "round_1" / "deliberate" / "records.jsonl")[0]}
    hinted = {r["id"]: r for r in E.read_records(out / "round_1" / "deliberate_hinted" / "records.jsonl")[0]}
    assert hinted and set(hinted) == {i for i, r in first.items() if r["n_correct"] == 0}
    assert all(len(r["samples"]) == 3 for r in hinted.values())
    settings = json.loads((out / "round_1" / "deliberate_hinted" / "settings.json").read_text())
    assert settings["hint"] is True and settings["samples"] == 3
    traces = [json.loads(x) for x in (out / "traces_1.jsonl").read_text().splitlines()]
    assert {t["source"] for t in traces} <= {"sample", "hint"}
    assert all(t["id"] in hinted for t in traces if t["source"] == "hint")
    counted = {s: sum(v.values()) for s, v in rows[1]["selected_by_source"].items()}
    assert counted == {s: sum(t["source"] == s for t in traces) for s in counted} and sum(counted.values()) == len(traces)
    assert rows[1]["hinted_problems"] == len(hinted) and rows[1]["hinted_samples"] == 3 * len(hinted)
    passes = [json.loads((out / "round_1" / d / "summary.json").read_text()) for d in ("deliberate", "deliberate_hinted")]
    assert rows[1]["deliberation_flops"] == pytest.approx(sum(s["inference_flops"] for s in passes))
    # a hinted trace is distilled with the ordinary prompt: the hint is in no training row
    problems = {p["id"]: p for p in P.load_problems("tiny_train")}
    tok = checkpoint.load_tokenizer("tiny")
    for row, t in zip(R.trace_rows(traces, problems, tok, "base"), traces):
        assert row.prompt == tok.encode(P.format_prompt(problems[t["id"]]["problem"], "base"))


def test_replay_share_draws_earlier_rounds_traces_by_hand(tmp_path):
    for q, n in ((1, 6), (2, 4)):
        (tmp_path / f"traces_{q}.jsonl").write_text("".join(json.dumps(dict(round=q, id=f"{q}-{i}")) + "\n"
                                                            for i in range(n)))
    cfg = R.RoundsConfig(replay_share=0.5, seed=3)
    assert R.replayed_traces(tmp_path, 1, 8, cfg) == []  # round 1 has no earlier round
    picked = R.replayed_traces(tmp_path, 3, 4, cfg)  # share 0.5: one earlier trace per new one
    assert len(picked) == 4 and len({t["id"] for t in picked}) == 4 and all(t["round"] in (1, 2) for t in picked)
    assert picked == R.replayed_traces(tmp_path, 3, 4, cfg)  # seeded: a resumed round draws the same
    assert len(R.replayed_traces(tmp_path, 3, 40, cfg)) == 10  # never more than there are
    assert R.replayed_traces(tmp_path, 3, 4, R.RoundsConfig(replay_share=0.0)) == []
    cfg = R.RoundsConfig(replay_share=0.2)
    assert len(R.replayed_traces(tmp_path, 3, 8, cfg)) == 2  # 0.2 / 0.8 x 8


def test_failed_starts_write_nothing(tmp_path, char_model_dir):
    """The RL phase's settings are checked before round 0 is written, and unreadable weights fail before --out
    is claimed: the same command then runs once fixed, without --resume."""
    import shutil
    with pytest.raises(ValueError, match="--rl-steps 1.*--rl-group-size 1"):
        R.main(SMALL + ["--rl-steps", "1", "--rl-group-size", "1", "--out", str(tmp_path / "a")])
    bad = tmp_path / "bad_model"
    shutil.copytree(checkpoint.TINY_MODEL_DIR, bad)
    (bad / "model.safetensors").write_bytes((bad / "model.safetensors").read_bytes()[:200])
    with pytest.raises(Exception):
        R.main(SMALL + ["--model", str(bad), "--rounds", "0", "--out", str(tmp_path / "b")])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_help_shows_the_tiny_validation_set_and_threads_is_a_flag(capsys, monkeypatch):
    with pytest.raises(SystemExit):
        R.main(["--model", "tiny", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: tiny_val)" in text and "--threads N" in text
    seen = []
    monkeypatch.setattr(R, "run", lambda cfg: seen.append((cfg.threads, torch.get_num_threads())))
    before = torch.get_num_threads()
    try:
        R.main(SMALL + ["--threads", "2"])
    finally:
        torch.set_num_threads(before)
    assert seen == [(2, 2)]


def test_rounds_table_bad_input_is_an_error_naming_it_and_an_interrupt_leaves_no_half_cache(tmp_path, monkeypatch):
    table, calls = load_rounds_table(), []
    cfg = dataclasses.asdict(R.RoundsConfig(model="tiny", dataset="tiny_ladder_train", eval_samples=4))
    fake = fake_rounds_main(calls, lambda model: dict(round=0, model=model))

    def interrupted(argv):  # Ctrl-C once the evaluation's run directory is half made
        fake(argv)
        raise KeyboardInterrupt
    monkeypatch.setattr(R, "main", interrupted)
    with pytest.raises(KeyboardInterrupt):
        table.evaluate_checkpoint(tmp_path, 12, cfg)
    cache = table.evaluation_dir(tmp_path, 12, cfg)
    assert not cache.exists()  # the next run evaluates again, not "pass --resume"
    monkeypatch.setattr(R, "main", fake)
    assert table.evaluate_checkpoint(tmp_path, 12, cfg)["round"] == 0 and (cache / "rounds.jsonl").is_file()
    assert len(calls) == 2 and not list(cache.parent.glob(".*"))
    user = table.evaluation_dir(tmp_path / "mine", 4, cfg)
    user.parent.parent.mkdir(parents=True)
    user.parent.write_text("a user's file\n")  # where the cache's folder goes
    with pytest.raises(ValueError, match="cannot hold the evaluation cache"):
        table.evaluate_checkpoint(tmp_path / "mine", 4, cfg)
    # a file given as a run, an empty rounds.jsonl, a level no run has
    with pytest.raises(ValueError, match="not a directory; give rounds.py run directories"):
        table.rows_of(user.parent)
    (tmp_path / "rounds.jsonl").write_text("")
    with pytest.raises(ValueError, match="rounds.jsonl: no rows yet"):
        table.rows_of(tmp_path)
    (tmp_path / "rounds.jsonl").write_text(json.dumps(dict(round=0, fast_by_group={"2": 0.5, "3": 0.1})) + "\n")
    with pytest.raises(ValueError, match="--sources x: no rung or group x in these runs .they have 2, 3."):
        table.sources_table([tmp_path], "x")


def test_a_baseline_checkpoint_saved_by_an_interrupt_before_its_step_was_logged_has_its_flops(tmp_path):
    """Interrupted during step 2's validation: checkpoints/step_2 holds the step's metrics row (unlogged), which
    metrics.jsonl lacks; rounds_table takes its FLOPs from there (it was KeyError: 2)."""
    table = load_rounds_table()
    (tmp_path / "metrics.jsonl").write_text(json.dumps(dict(step=1, flops=10.0)) + "\n")
    for step in (1, 2):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_2" / "trainer_state.json").write_text(
        json.dumps(dict(step=2, unlogged=dict(metrics=dict(step=2, flops=20.0), samples=[]))))
    assert table.saved_checkpoints(tmp_path) == {1: 10.0, 2: 20.0}
    (tmp_path / "checkpoints" / "step_3").mkdir()
    with pytest.raises(ValueError, match="step_3: its step is neither in metrics.jsonl nor in its trainer state"):
        table.saved_checkpoints(tmp_path)
