"""Every fork the docstrings show, applied to a copy of the repo: the reward term (reward.py), the objective
(objectives.py) and a model formula (model.py: RMSNorm without its learned scale). Each fork runs 2 steps of the
README's main command with evaluation on, then evaluate.py --limit 5 on what it trained (issue #66)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import model
import objectives
import reward

ROOT = Path(__file__).resolve().parents[1]

# the forks as the docstrings print them (each test checks its text is still there, word for word)
LENGTH_TERM = '''def length_penalty(r, cfg):
    return -cfg.length_coef * len(r.tokens) / cfg.max_new_tokens'''
LENGTH_ROW = '''"length": Term(length_penalty, "Team Kimi 2025, Kimi k1.5, sec. 2.3.3", "-coef x the share of the budget used",
               knob="length_coef"),'''
LENGTH_FIELD = '''length_coef: float = arg(0.0, "length penalty: the reward falls by X at the full budget", range="[0, inf)")'''
REINFORCE_ROW = '''"reinforce": Objective(lambda r, passed, cfg: r.clone(), drgrpo_loss, "Williams 1992, REINFORCE",
                       "the reward itself as the advantage: no baseline"),'''
RMSNORM_LINE = "return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)"


def shown_in(doc, text):
    """text, as indented in a docstring's code block, is in doc (its lines in order, each stripped)."""
    lines = [line.strip() for line in doc.splitlines()]
    want = [line.strip() for line in text.splitlines()]
    return any(lines[i:i + len(want)] == want for i in range(len(lines)))


def indent(text, spaces):
    return "\n".join(" " * spaces + line for line in text.splitlines())


def fork(tmp_path, edits):
    """A copy of the repo's core (its .py files; the data and the tiny model linked) with edits applied:
    {file: [(old, new), ...]}, each old text present once."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for path in ROOT.glob("*.py"):
        shutil.copy(path, repo / path.name)
    for name in ("data", "tiny_model"):
        (repo / name).symlink_to(ROOT / name)
    for name, pairs in edits.items():
        text = (repo / name).read_text()
        for old, new in pairs:
            assert text.count(old) == 1, (name, old)
            text = text.replace(old, new)
        (repo / name).write_text(text)
    return repo


def run(repo, script, *argv):
    r = subprocess.run([sys.executable, script, *argv], cwd=repo, capture_output=True, text=True, timeout=600,
                       env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def main_command(repo, *flags):
    """2 steps of the README's main command, validation at step 2 on 5 problems, then evaluate.py --limit 5 on the
    trained model; returns the steps' metrics."""
    val = repo / "val5.jsonl"
    val.write_text("".join((ROOT / "data" / "tiny_val.jsonl").read_text().splitlines(keepends=True)[:5]))
    run(repo, "train_rl.py", "--objective", "drgrpo", "--model", "tiny", "--steps", "2", "--eval-every", "2",
        "--val-dataset", str(val), "--test-dataset", "", "--threads", "1", "--out", "run", *flags)
    run(repo, "evaluate.py", "--model", "run/final", "--limit", "5", "--out", "eval")
    assert len((repo / "eval" / "records.jsonl").read_text().splitlines()) == 5
    metrics = [json.loads(line) for line in (repo / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "val_accuracy" in m] == [2]
    return [m for m in metrics if "loss" in m]


@pytest.fixture(scope="module")
def unforked(tmp_path_factory):
    return main_command(fork(tmp_path_factory.mktemp("plain"), {}))


def test_the_reward_docstrings_length_penalty(tmp_path):
    for text in (LENGTH_TERM, LENGTH_ROW, LENGTH_FIELD):
        assert shown_in(reward.__doc__, text), text
    repo = fork(tmp_path, {"reward.py": [
        ("\n\n@dataclass\nclass Term:", "\n\n" + LENGTH_TERM + "\n\n\n@dataclass\nclass Term:"),
        ("\nTERMS = {\n", "\nTERMS = {\n" + indent(LENGTH_ROW, 4) + "\n"),
        ("\n\n\ndef check(cfg):", "\n" + indent(LENGTH_FIELD, 4) + "\n\n\ndef check(cfg):")]})
    for m in main_command(repo, "--length-coef", "0.5"):
        # every term but the new one is off: the reward is accuracy - 0.5 x the mean share of the 64-token budget
        assert m["reward_mean"] == pytest.approx(m["accuracy"] - 0.5 * m["response_tokens_mean"] / 64, abs=1e-9)
    assert "| `length` | Team Kimi 2025" in run(repo, "reward.py").stdout


def test_the_objectives_docstrings_reinforce(tmp_path, unforked):
    assert shown_in(objectives.__doc__, REINFORCE_ROW)
    repo = fork(tmp_path, {"objectives.py": [("\nOBJECTIVES = {\n", "\nOBJECTIVES = {\n" + indent(REINFORCE_ROW, 4) + "\n")]})
    forked = main_command(repo, "--objective", "reinforce")
    assert forked[0]["reward_mean"] == unforked[0]["reward_mean"]  # the same samples at step 1 ...
    assert forked[0]["loss"] != unforked[0]["loss"]  # ... paid without a baseline: another loss
    assert "reinforce" in run(repo, "objectives.py").stdout


def test_a_model_formula_fork_changes_what_runs(tmp_path, unforked):
    """model.py's formulas run by default: RMSNorm without its learned scale moves the logged loss of step 1
    (the tiny model's trained gains are not 1), and the samples drawn with it."""
    assert RMSNORM_LINE in Path(model.__file__).read_text() and "without `self.weight * `" in model.__doc__
    repo = fork(tmp_path, {"model.py": [(RMSNORM_LINE, RMSNORM_LINE.replace("self.weight * ", ""))]})
    forked = main_command(repo)
    assert forked[0]["loss"] != unforked[0]["loss"]
