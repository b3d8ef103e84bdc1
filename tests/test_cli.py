"""cli.py and every command-line entry point (train_rl.py, evaluate.py, bands.py, tiny.py): flags from the config
dataclass, defaults that follow --model (the tiny world's), and one `prog: error: ...` line, no traceback, for
bad input: a malformed data row, a model that is neither cached nor downloadable, an invalid flag value, a
resume mismatch."""

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from research.bands import bands as B
import cli
import evaluate as E
import model as M
import tiny
import train_rl as T
from cli import arg
import checkpoint

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Demo:
    steps: int = arg(3, "an int")
    rate: float = arg(0.5, "a float")
    name: str = arg("a", "a str", choices=("a", "b"))
    limit: int | None = arg(None, "an optional int")
    fast: bool = arg(True, "a bool")
    k: int = arg(8, "with an alias", aliases=("-k",))


def test_flags_come_from_the_dataclass():
    assert cli.parse_config(Demo, [], "demo") == Demo()
    cfg = cli.parse_config(Demo, ["--steps", "5", "--rate", "1e-3", "--name", "b", "--limit", "7", "--no-fast",
                                  "-k", "2"], "demo")
    assert cfg == Demo(steps=5, rate=1e-3, name="b", limit=7, fast=False, k=2)
    for bad in (["--steps", "x"], ["--name", "c"], ["--no-such-flag"]):
        with pytest.raises(SystemExit):
            cli.parse_config(Demo, bad, "demo")


def test_dependent_defaults_see_the_first_parse_and_flags_still_win():
    follow = lambda first: dict(steps=100) if first.name == "b" else {}  # noqa: E731
    assert cli.parse_config(Demo, ["--name", "b"], "demo", defaults=follow).steps == 100
    assert cli.parse_config(Demo, ["--name", "b", "--steps", "4"], "demo", defaults=follow).steps == 4
    assert cli.parse_config(Demo, [], "demo", defaults=follow).steps == 3


def test_run_main_prints_one_line_for_expected_errors_and_keeps_bugs_loud(capsys):
    for error in (ValueError("data.jsonl:3: missing 'answer'"), FileNotFoundError("nope: no such model"),
                  FileExistsError("runs/x already holds a run")):
        def main(error=error):
            raise error
        with pytest.raises(SystemExit) as exit_info:
            cli.run_main(main, "demo.py")
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == f"demo.py: error: {error}\n"

    def bug():
        raise KeyError("a bug keeps its traceback")
    with pytest.raises(KeyError):
        cli.run_main(bug, "demo.py")
    assert cli.run_main(lambda: 7, "demo.py") == 7


# -----------------------------------------------------------------------------
# The tiny world's defaults follow --model: `tiny`, or any checkpoint trained from it


def test_tiny_world_models_are_recognised(tmp_path, char_model_dir):
    net, tok = checkpoint.load_model("tiny", device="cpu"), checkpoint.load_tokenizer("tiny")
    checkpoint.save_model(net, tmp_path / "final", tok)  # what a run's final/ holds
    assert checkpoint.is_tiny_world("tiny") and checkpoint.is_tiny_world(tmp_path / "final") and checkpoint.is_tiny_world(checkpoint.TINY_MODEL_DIR)
    assert not checkpoint.is_tiny_world(char_model_dir)  # another character tokenizer
    assert not checkpoint.is_tiny_world(checkpoint.DEFAULT_MODEL) and not checkpoint.is_tiny_world(tmp_path / "missing")
    final = str(tmp_path / "final")
    for model in ("tiny", final):
        cfg = T.parse_args(["--model", model])
        assert (cfg.dataset, cfg.subject, cfg.max_new_tokens) == ("tiny_train", "", tiny.MAX_NEW_TOKENS)
        assert E.TINY_DEFAULTS["dataset"] == "tiny_test" and B.TINY_DEFAULTS["max_new_tokens"] == tiny.MAX_NEW_TOKENS
    real = T.parse_args(["--model", str(char_model_dir)])
    assert (real.dataset, real.subject, real.max_new_tokens) == ("math_train", "Algebra", 512)


def test_evaluate_and_bands_run_on_the_tiny_world_with_no_other_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out is relative: runs/eval/tiny-tiny_test
    summary = E.main(["--model", "tiny", "--limit", "4"])
    settings = json.loads((tmp_path / "runs/eval/tiny-tiny_test/settings.json").read_text())
    assert (settings["dataset"], settings["max_new_tokens"]) == ("tiny_test", tiny.MAX_NEW_TOKENS)
    assert summary["n"] == 4 and set(summary["per_group"]) == {"2", "3"}  # grouped by level
    bands = B.main(["--model", "tiny", "--dataset", "tiny_test", "-k", "2", "--limit", "40", "--out", "runs/b"])
    assert bands["overall"]["n"] == 40 and set(bands["per_group"]) == {"2", "3"}
    assert bands["pools"]["heldout"] == 2 * B.TINY_DEFAULTS["heldout_per_group"]


# -----------------------------------------------------------------------------
# Bad input: one line naming the file and line, the flag or the model; nothing written


def run_cli(main, prog, argv, capsys):
    """stderr's last line and the exit code of a command-line main run as the script runs it."""
    with pytest.raises(SystemExit) as exit_info:
        cli.run_main(lambda: main(argv), prog)
    err = capsys.readouterr().err.strip().splitlines()
    return exit_info.value.code, err[-1] if err else ""


@pytest.fixture
def bad_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(dict(problem="1 + 1", answer="2")) + "\n" + json.dumps(dict(problem="2 + 2")) + "\n")
    return path


def test_malformed_rows_name_the_file_and_line(bad_rows, tmp_path, capsys):
    wanted = f"{bad_rows}:2: missing or empty 'answer' field"
    cases = ((T.main, "train_rl.py", ["--model", "tiny", "--dataset", str(bad_rows), "--out", str(tmp_path / "r")]),
             (E.main, "evaluate.py", ["--model", "tiny", "--dataset", str(bad_rows), "--out", str(tmp_path / "e")]),
             (B.main, "bands.py", ["--model", "tiny", "--dataset", str(bad_rows), "--out", str(tmp_path / "b")]))
    for main, prog, argv in cases:
        assert run_cli(main, prog, argv, capsys) == (2, f"{prog}: error: {wanted}")
    assert not any((tmp_path / d).exists() for d in "reb")  # refused before anything was written


@pytest.mark.parametrize("main, prog, argv, message", [
    (T.main, "train_rl.py", ["--model", "tiny", "--group-size", "0"], "--group-size must be at least 1, got 0"),
    (T.main, "train_rl.py", ["--model", "tiny", "--schedule", "cosin"], "argument --schedule: invalid choice: 'cosin'"),
    (T.main, "train_rl.py", ["--model", "tiny", "--template", "chatml"], "argument --template: invalid choice"),
    (E.main, "evaluate.py", ["--model", "tiny", "--samples", "0"], "--samples must be at least 1, got 0"),
    (E.main, "evaluate.py", ["--model", "tiny", "--samples", "4"], "--samples 4 needs --temperature > 0"),
    (E.main, "evaluate.py", ["--model", "tiny", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (B.main, "bands.py", ["--model", "tiny", "--dataset", "tiny_val", "-k", "1", "--out", "x"], "-k must be at least 2"),
    (tiny.main, "tiny.py", ["--threads", "0"], "--threads must be at least 1, got 0"),
    (tiny.main, "tiny.py", ["--bare-3", "1.5"], "--bare-3 must be in [0, 1], got 1.5"),
    (tiny.main, "tiny.py", ["--rope-theta", "0"], "--rope-theta must be > 0, got 0.0"),
    (tiny.main, "tiny.py", ["--long-5", "-0.1"], "--long-5 must be in [0, 1], got -0.1"),
    (tiny.main, "tiny.py", ["--long-4", "0.6", "--long-6", "0.5"], "--long-4 + --long-5 + --long-6 must be at most 1"),
])
def test_invalid_flag_values_name_the_flag(main, prog, argv, message, capsys):
    code, line = run_cli(main, prog, argv, capsys)
    assert code == 2 and line.startswith(f"{prog}: error: ") and message in line


def test_a_missing_model_offline_is_named_with_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cases = ((T.main, "train_rl.py", ["--out", str(tmp_path / "r"), "--steps", "1"]),
             (E.main, "evaluate.py", ["--limit", "1", "--out", str(tmp_path / "e")]),
             (B.main, "bands.py", ["--dataset", "aime24", "--out", str(tmp_path / "b")]))
    for main, prog, argv in cases:
        code, line = run_cli(main, prog, argv, capsys)
        assert code == 2 and line.startswith(f"{prog}: error: {checkpoint.DEFAULT_MODEL}: not in the Hugging Face cache")
        assert "HF_HUB_OFFLINE=1" in line and "local directory" in line
    assert not (tmp_path / "r").exists()  # no half-made run directory to trip a rerun


def test_resume_mismatches_are_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    saved = dataclasses.asdict(T.parse_args(["--model", "tiny", "--out", str(run)]))
    (run / "config.json").write_text(json.dumps(dict(saved, lr=0.5)))
    code, line = run_cli(T.main, "train_rl.py", ["--model", "tiny", "--out", str(run), "--resume"], capsys)
    assert code == 2 and "--resume: settings differ" in line and "'lr': (0.5, 0.0001)" in line
    ev = tmp_path / "eval"
    E.main(["--model", "tiny", "--limit", "1", "--out", str(ev)])
    code, line = run_cli(E.main, "evaluate.py", ["--model", "tiny", "--limit", "2", "--max-new-tokens", "32",
                                                  "--out", str(ev)], capsys)
    assert code == 2 and "holds an evaluation with another protocol" in line and "max_new_tokens" in line
    code, line = run_cli(B.main, "bands.py", ["--model", "tiny", "--dataset", "tiny_test", "--limit", "1",
                                               "--heldout-per-group", "0", "--out", str(ev)], capsys)
    assert code == 2 and line.startswith("bands.py: error: ") and "another protocol" in line


@pytest.mark.parametrize("script, argv", [
    ("train_rl.py", ["--model", "tiny", "--steps", "0"]),
    ("evaluate.py", ["--model", "tiny", "--dataset", "no_such_set"]),
    ("research/bands/bands.py", ["--model", "tiny", "--dataset", "tiny_val", "--temperature", "0", "--out", "x"]),
    ("tiny.py", ["--steps", "0"]),
])
def test_scripts_exit_with_one_error_line_from_the_shell(script, argv, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / script), *argv], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert lines[-1].startswith(f"{Path(script).name}: error: "), r.stderr


def readme_commands(script):
    """Every `python SCRIPT ...` command in the README and the research pages' code blocks, continuation lines joined
    and comments dropped, as argv lists (without the script)."""
    import shlex
    root = Path(__file__).resolve().parent.parent
    out = []
    for doc in [root / "README.md", *sorted((root / "research").glob("*/*.md"))]:
        for block in doc.read_text().split("```")[1::2]:
            for command in block.replace("\\\n", " ").splitlines():
                words = shlex.split(command, comments=True) if script in command else []
                if words[:2] == ["python", script]:  # the loops' shell variables: $o an objective, $s a seed
                    out.append((doc.name, [w.replace("$o", "drgrpo").replace("$s", "1") for w in words[2:]]))
    return out


def test_every_train_rl_command_the_docs_show_parses_and_combines():
    """The real-model recipes cannot run here; their flags must at least exist and pass check_config together."""
    import train_rl as T
    commands = readme_commands("train_rl.py")
    assert len(commands) >= 5 and any("--lora-rank" in argv for _, argv in commands)
    for doc, argv in commands:
        try:
            T.check_config(T.parse_args(argv))
        except (SystemExit, ValueError) as e:
            raise AssertionError(f"{doc}: python train_rl.py {' '.join(argv)}: {e}") from None
