"""research/rounds/revote.py: the zero-boundary subset by hand, and one run's vote both ways, written beside the run."""

import dataclasses
import json
import shutil

import pytest

import checkpoint
import evaluate as E
from research.rounds import climb as C
from research.rounds import revote


def test_zero_boundary_by_hand():
    assert revote.zero_boundary("(5 + 3 - 8 + 4) * 2", 2)  # 8, 0 | 4, 8: a piece ends at 0
    assert not revote.zero_boundary("5 + 3 - 8", 2)  # ends at 0, but no piece follows
    assert not revote.zero_boundary("(5 + 3 + 8 + 4) * 2", 2)
    assert not revote.zero_boundary("5 + 3 - 8 + 4 + 1 + 2 + 6 + 7", 2)  # 0 after 2 of pieces 3, 2, 2
    assert revote.zero_boundary("5 + 3 - 8 + 4 + 1 + 2 + 6 + 7", 1)  # pieces of 1: a boundary after every line


def test_revote_prints_both_votes_and_writes_outside_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(checkpoint.resolve_model_dir("tiny"), run / "round_1")
    cfg = dataclasses.replace(C.ClimbConfig(), samples=2, out=str(run))
    (run / "config.json").write_text(json.dumps(dict(dataclasses.asdict(cfg), program=C.PROGRAM)))
    before = sorted(p.name for p in run.rglob("*"))
    revote.main([str(run), "--round", "1", "--rungs", "4", "--save", str(tmp_path / "save"), "--device", "cpu"])
    row = capsys.readouterr().out.strip().splitlines()[-1].split(" | ")
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written into the run
    saved = tmp_path / "save" / "run" / "round_1" / "rungs_4"
    votes = {m: E.read_records(saved / m / "records.jsonl")[0] for m in ("plain", "merge")}
    assert [len(v) for v in votes.values()] == [100, 100] and all(len(E.samples_of(r)) == 2 for r in votes["plain"])
    plain, merged = (sum(r["correct"] for r in votes[m]) / 100 for m in ("plain", "merge"))
    assert row[3:6] == ["100", f"{plain:.3f}", f"{merged:.3f}"]
    assert row[7] == "1"  # rung 4's validation rows: one passes through 0 where its two pieces meet
    other = tmp_path / "elsewhere" / "run"  # another run of the same name: refused, its votes never taken for these
    shutil.copytree(run, other)
    with pytest.raises(ValueError, match="holds the votes of"):
        revote.main([str(other), "--round", "1", "--rungs", "4", "--save", str(tmp_path / "save"), "--device", "cpu"])
