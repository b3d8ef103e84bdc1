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


def test_run_main_ignores_signals_while_exiting_on_an_interrupt_and_restores_sigterm_otherwise():
    import signal
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert cli.run_main(lambda: 7, "demo.py") == 7 and signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]

    def interrupted():
        raise cli.Terminated
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.run_main(interrupted, "demo.py")
        assert exit_info.value.code == 143  # 128 + SIGTERM, as a shell reports it
        # a second Ctrl-C during the exit (atexit, the verifier's worker) must not end the process by the signal
        assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


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


# -----------------------------------------------------------------------------
# A new user's rough edges (issue #48): each expected error one line, nothing written on a failed start, nothing
# deleted outside a run directory


SCRIPTS = {"train_rl.py": T.main, "evaluate.py": E.main, "research/bands/bands.py": B.main, "tiny.py": tiny.main}


def tiny_copy(tmp_path):
    """A copy of the committed tiny model, as a user might point --out at by mistake."""
    import shutil
    shutil.copytree(checkpoint.TINY_MODEL_DIR, tmp_path / "tiny_copy")
    return tmp_path / "tiny_copy"


def snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_out_pointing_at_a_model_is_refused_and_left_intact(tmp_path, capsys):
    model = tiny_copy(tmp_path)
    before = snapshot(model)
    for main, prog, argv in ((T.main, "train_rl.py", ["--model", "tiny", "--steps", "1", "--out", str(model)]),
                             (E.main, "evaluate.py", ["--model", "tiny", "--limit", "2", "--out", str(model)]),
                             (B.main, "bands.py", ["--model", "tiny", "--dataset", "tiny_val", "--limit", "2",
                                                   "--heldout-per-group", "0", "--out", str(model)])):
        code, line = run_cli(main, prog, argv, capsys)
        assert code == 2 and "holds a model checkpoint (config.json + model.safetensors)" in line, line
    assert snapshot(model) == before
    checkpoint.load_model(model, device="cpu")  # still loads as a model


@pytest.mark.parametrize("argv, message", [
    (["--group-size", "1"], "--group-size 1: --objective drgrpo compares each sample with the rest of its group"),
    (["--eval-every", "-1"], "--eval-every must be >= 0, got -1"),
    (["--save-every", "-3"], "--save-every must be >= 0, got -3"),
    (["--lr", "-1"], "--lr must be >= 0, got -1.0"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--temperature", "0"], "--temperature must be > 0, got 0.0"),
    (["--device", "tpu"], "--device 'tpu': use cpu, cuda or cuda:N"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints must be >= 0"),
])
def test_settings_that_cannot_train_are_refused_before_anything_is_written(argv, message, tmp_path, capsys):
    code, line = run_cli(T.main, "train_rl.py", ["--model", "tiny", "--out", str(tmp_path / "run"), *argv], capsys)
    assert code == 2 and line == f"train_rl.py: error: {message}" or message in line, line
    assert not (tmp_path / "run").exists()


def test_a_cuda_device_without_cuda_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli.torch.cuda, "is_available", lambda: False)
    for main, prog in ((T.main, "train_rl.py"), (E.main, "evaluate.py")):
        code, line = run_cli(main, prog, ["--model", "tiny", "--device", "cuda", "--out", str(tmp_path / "x")], capsys)
        assert code == 2 and "--device cuda: this torch" in line and "sees no CUDA GPU" in line
    assert not (tmp_path / "x").exists()


def test_a_validation_carve_out_that_leaves_almost_nothing_is_refused(tmp_path, capsys):
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(dict(problem=f"{i} + 1", answer=str(i + 1))) + "\n" for i in range(8)))
    code, line = run_cli(T.main, "train_rl.py", ["--model", "tiny", "--dataset", str(pool), "--val-dataset", "",
                                                 "--num-problems", "0", "--val-size", "100",
                                                 "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and "--val-size 100 carves 7 of" in line and "leaves 1 to train on" in line
    assert not (tmp_path / "run").exists()


def test_a_bom_is_read_and_undecodable_text_is_named_by_file_and_line(tmp_path, capsys):
    rows = [dict(problem="1 + 1", answer="2"), dict(problem="2 + 2", answer="4")]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    assert [p["answer"] for p in P_load(bom)] == ["2", "4"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(rows[0]).encode() + b"\n" + b'{"problem": "\xd0", "answer": "1"}\n')
    code, line = run_cli(E.main, "evaluate.py", ["--model", "tiny", "--dataset", str(bad), "--out",
                                                 str(tmp_path / "e")], capsys)
    assert code == 2 and f"{bad}:2: not UTF-8 text (byte 0xd0" in line
    assert not (tmp_path / "e").exists()


def P_load(path):
    import problems
    return problems.load_problems(str(path))


def test_a_prompt_too_long_is_named_by_its_problem_before_anything_is_written(tmp_path, capsys):
    pool = tmp_path / "pool.jsonl"
    rows = [dict(id="short", problem="1 + 1", answer="2"), dict(id="huge", problem="1 + " * 300 + "1", answer="301")]
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, line = run_cli(T.main, "train_rl.py", ["--model", "tiny", "--dataset", str(pool), "--out",
                                                 str(tmp_path / "run")], capsys)
    assert code == 2 and "problem 'huge' has a 1" in line and "exceeds the model's 512-token context" in line
    assert not (tmp_path / "run").exists()


def test_a_model_config_that_is_not_an_object_or_has_a_wrong_type_is_one_line(tmp_path, capsys):
    for text, message in (("[1, 2]", "expected a JSON object, got list"), (None, "hidden_size='128' must be int")):
        model = tiny_copy(tmp_path / text.replace("[", "l").replace("]", "") if text else tmp_path / "typed")
        if text is None:
            d = json.loads((model / "config.json").read_text())
            (model / "config.json").write_text(json.dumps(dict(d, hidden_size="128")))
        else:
            (model / "config.json").write_text(text)
        for main, prog, extra in ((T.main, "train_rl.py", []), (E.main, "evaluate.py", ["--limit", "1"])):
            code, line = run_cli(main, prog, ["--model", str(model), "--dataset", "tiny_val", "--out",
                                              str(tmp_path / "out"), *extra], capsys)
            assert code == 2 and message in line and "config.json" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", ["train_rl.py", "evaluate.py", "research/bands/bands.py",
                                    "research/rounds/rounds.py", "research/report.py"])
def test_an_out_that_cannot_be_made_is_one_line(script, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    out = tmp_path / "file" / "run"
    argv = {"train_rl.py": ["--model", "tiny", "--steps", "1"], "evaluate.py": ["--model", "tiny", "--limit", "2"],
            "research/bands/bands.py": ["--model", "tiny", "--dataset", "tiny_val", "--limit", "2",
                                        "--heldout-per-group", "0"],
            "research/rounds/rounds.py": ["--model", "tiny", "--dataset", "tiny_ladder_train", "--rounds", "0",
                                          "--val-limit", "2", "--samples", "2", "--test-dataset", ""],
            "research/report.py": [str(an_evaluation(tmp_path))]}[script]
    r = subprocess.run([sys.executable, str(ROOT / script), *argv, "--out", str(out)], capture_output=True, text=True,
                       cwd=tmp_path, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{Path(script).name}: error: ") and "not a directory" in last, last


def an_evaluation(tmp_path):
    E.main(["--model", "tiny", "--limit", "2", "--out", str(tmp_path / "eval")])
    return tmp_path / "eval"


def test_ctrl_c_saves_then_exits_130_and_resume_continues(tmp_path):
    """SIGINT mid-run: a checkpoint of the finished steps, exit status 130 (so `train && evaluate` stops)."""
    import signal
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "train_rl.py"), "--model", "tiny", "--steps", "40", "--problems-per-step", "2",
           "--save-every", "0", "--test-dataset", "", "--eval-every", "0", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    for line in proc.stdout:
        if line.startswith("step 2/"):
            proc.send_signal(signal.SIGINT)
            break
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted: checkpoint after step" in rest and "Traceback" not in err
    assert newest_checkpoint(out).is_dir()


def newest_checkpoint(out):
    import runs
    return out / "checkpoints" / f"step_{runs.checkpoint_steps(out)[-1]}"


def test_help_shows_the_defaults_in_force_each_once_in_groups(capsys):
    with pytest.raises(SystemExit):
        T.parse_args(["--model", "tiny", "--help"])
    text = capsys.readouterr().out
    assert "--steps N" in text and "(default: 60)" in text and "(default: 0.0001)" in text  # the tiny world's
    assert "\nmodel and data:\n" in text and "\nobjective:\n" in text and "\nrun:\n" in text
    assert "{" + ",".join(T.OBJECTIVES) + "}" in text
    assert all(line.count("(default:") <= 1 for line in text.splitlines())  # never two defaults on one flag
    assert "brings the tiny world's defaults" in text  # the epilog names what each world brings


def test_tiny_py_refuses_to_overwrite_the_committed_build(capsys):
    code, line = run_cli(tiny.main, "tiny.py", [], capsys)
    assert code == 2 and "holds a checkpoint already; pass --force" in line
    code, line = run_cli(tiny.main, "tiny.py", ["--data-only", "--seed", "1"], capsys)
    assert code == 2 and "holds other problems than --seed 1 makes; pass --force" in line


def interrupted_run(tmp_path, signals, slow_save=False):
    """train_rl.py on the tiny world, sent `signals` once step 2 is printed (the second, if any, while the
    interrupt's checkpoint is being saved); returns (exit status, stdout, stderr, run directory)."""
    import signal
    out = tmp_path / "run"
    argv = ["train_rl.py", "--model", "tiny", "--steps", "40", "--problems-per-step", "2", "--save-every", "0",
            "--test-dataset", "", "--eval-every", "0", "--threads", "1", "--out", str(out)]
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import cli, runs, train_rl; real = runs.save_checkpoint\n"
            "def slow(*a, **k):\n    print('saving', flush=True); time.sleep(2); return real(*a, **k)\n"
            f"runs.save_checkpoint = slow if {slow_save} else real; sys.argv = sys.argv[2:]\n"
            "cli.run_main(train_rl.main, 'train_rl.py')")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    sent = []
    for line in proc.stdout:
        if line.startswith("step 2/") or (line.startswith("saving") and sent):
            proc.send_signal(getattr(signal, signals[len(sent)]))
            sent.append(line)
            if len(sent) == len(signals):
                break
    rest, err = proc.communicate(timeout=120)
    return proc.returncode, "".join(sent) + rest, err, out


def test_sigterm_saves_like_ctrl_c_and_exits_143(tmp_path):
    import runs
    code, out, err, run = interrupted_run(tmp_path, ["SIGTERM"])
    assert code == 143, err
    assert "interrupted: checkpoint after step" in out and "Traceback" not in err and "(SIGTERM)" in err
    runs.check_checkpoint(newest_checkpoint(run))


def test_a_second_ctrl_c_while_saving_keeps_the_checkpoint_whole_and_exits_130(tmp_path):
    import runs
    code, out, err, run = interrupted_run(tmp_path, ["SIGINT", "SIGINT"], slow_save=True)
    assert code == 130, err
    assert "Traceback" not in err and "takes effect once the update or checkpoint in progress is complete" in err
    runs.check_checkpoint(newest_checkpoint(run))  # whole: every file reads


def test_a_seed_beyond_64_bits_or_the_seed_range_names_the_flag(capsys):
    for seed in ("1" * 20, str(2**40), "-1"):
        with pytest.raises(ValueError, match="--seed must"):
            T.parse_args(["--model", "tiny", "--seed", seed])

    @dataclass
    class Wide:
        n: int = arg(0, "any int")
    with pytest.raises(ValueError, match="--n must fit in 64 bits"):
        cli.check_fields(Wide(n=2**64))
