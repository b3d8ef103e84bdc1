"""benchmarks/probe_cli.py: its --quick subset passes (so CI runs a new user's bad inputs, the notes-folder case and
two interrupt trials on every change), and the full probe keeps covering every entry point and every case of
issue #55."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("probe_cli", ROOT / "benchmarks" / "probe_cli.py")
PC = importlib.util.module_from_spec(spec)
spec.loader.exec_module(PC)


def entry_points():
    """Every script a user runs: a top-level `if __name__ == "__main__":` in the root or research/ (symbolic.py's
    sympy worker is started by symbolic.py itself, not by a user)."""
    found = set()
    for path in [*ROOT.glob("*.py"), *(ROOT / "research").rglob("*.py")]:
        if re.search(r"^if __name__ == ['\"]__main__['\"]:", path.read_text(), re.M):
            found.add(str(path.relative_to(ROOT)))
    return found


def test_quick_probe_passes():
    """Every probe of --quick as expected: no traceback, no file written by a failed start, nothing lost, and both
    interrupt trials resume bit-identical to the straight run."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_cli.py"), "--quick"], capture_output=True,
                       text=True, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=900)
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert r.returncode == 0 and not failed, "\n".join(failed) or r.stdout[-3000:] + r.stderr[-3000:]
    assert "data lost 0" in r.stdout and "tracebacks 0" in r.stdout


def test_every_entry_point_has_a_help_probe():
    helped = {p.script for p in PC.probes() if p.expect == "help"}
    assert entry_points() - helped == set()
    assert entry_points() >= {"train_rl.py", "evaluate.py", "tiny.py", "objectives.py", "research/report.py",
                              "research/bands/bands.py", "research/rounds/rounds.py"}
    subcommands = {(p.script, p.argv[0]) for p in PC.probes() if p.expect == "help"}
    assert {("evaluate.py", "compare"), ("research/bands/bands.py", "compare")} <= subcommands


def test_every_out_is_probed_with_a_users_folder_and_quick_has_tiny_and_train_rl():
    """Each script's --out into a folder holding notes.txt is refused, tiny.py included."""
    notes = {p.script for p in PC.probes() if p.expect == "error" and any(a.endswith("notes") for a in p.argv)}
    assert notes == {"train_rl.py", "evaluate.py", "research/bands/bands.py", "research/rounds/rounds.py",
                     "research/report.py", "tiny.py"}
    quick = {p.script for p in PC.probes() if p.quick and any(a.endswith("notes") for a in p.argv)}
    assert quick == {"train_rl.py", "tiny.py"}


@pytest.mark.parametrize("case", [
    "deep.jsonl", "listid.jsonl", "char.jsonl", "bignum.jsonl", "long.jsonl", "my+data.jsonl", "cfg_kv0",
    "cfg_neg_hidden", "cfg_neg_head", "cfg_bos", "cfg_rope0", "cfg_eps", "nan_model", "trunc_model", PC.SEED20,
    "--n-boot 0", "--rl-group-size 1", "--resume --steps 1", "bad_run", "{S}/a_file", "{S}/ro"])
def test_each_case_of_issue_55_is_a_probe(case):
    assert any(case in " ".join(p.argv) for p in PC.probes() if p.expect in ("error", "resume"))


@pytest.mark.parametrize("case", [
    "traces_1.jsonl missing", "traces_1.jsonl torn", "cut to 3 of 4 rows", "a damaged climb.jsonl line",
    "--resume --rounds 0", "config.json kept", "config.json without a newer setting", "another value given", "another process holds",
    "every round tested", "--start a run directory", "--start a round never made", "--test, no config.json",
    "--rl-group-size 1", "readable as the umask", "a setting --model tiny gives", "named twice", "a stray file",
    "only empty directories", "a file as a run directory", "empty rounds.jsonl", "--sources x", "no config.json",
    "a user's file where the cache goes", "a finished rounds run: config.json kept",
    "rounds.py --resume --rounds 0", "Ctrl-C left an evaluation half made", "interrupted in step 2's validation"])
def test_each_case_of_issue_65_is_a_probe(case):
    """The research tools' cases (climb.py, climb_table.py, rounds_table.py), each a probe of the full run."""
    assert any(case in p.note + " " + " ".join(p.argv) for p in PC.probes())


def test_the_scratch_fixtures(tmp_path):
    """NaN weights keep their header (they load, then give non-finite logits); the bad data lines are what they say."""
    import torch
    from safetensors.torch import load_file
    PC.setup(tmp_path)
    weights = load_file(str(tmp_path / "nan_model" / "model.safetensors"))
    good = load_file(str(ROOT / "tiny_model" / "model.safetensors"))
    assert weights.keys() == good.keys() and all(torch.isnan(w).all() for w in weights.values())
    assert (tmp_path / "trunc_model" / "model.safetensors").stat().st_size == 100_000
    last = (tmp_path / "deep.jsonl").read_text().splitlines()[-1]
    assert last.count("[") == 100_000
    with pytest.raises(RecursionError):
        __import__("json").loads(last)
    assert "?" not in (ROOT / "tiny_model" / "tokenizer.json").read_text().split('"vocab"')[1].split("}")[0]


def test_clean_line_and_timing_fields():
    assert PC.clean_line("evaluate.py", [], ["x", "evaluate.py compare: error: --n-boot must be >= 1"], 2)
    assert PC.clean_line("research/bands/bands.py", [], ["bands.py: error: bad"], 2)
    assert not PC.clean_line("train_rl.py", [], ["ZeroDivisionError: integer modulo by zero"], 1)
    assert not PC.clean_line("train_rl.py", [], ["train_rl.py: error: bad"], 1)
    row = dict(step=1, accuracy=0.5, sampling_seconds=0.1, tokens_per_second=9.0, flops=1.0)
    kept = {k for k in row if not PC.TIMING.search(k)}
    assert kept == {"step", "accuracy", "flops"}
