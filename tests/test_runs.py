"""runs.py: a run directory is claimed safely (a directory holding anything else is refused, naming what is there;
a second process is refused with the first one's PID), JSONL logs survive a torn last line, and training checkpoints
are kept as asked. The scripts' use of it end to end is in test_cli.py."""

import json
import os
import subprocess
import sys
import time

import pytest

import checkpoint
import runs


def test_describe_names_what_a_directory_holds(tmp_path):
    assert runs.describe(tmp_path / "absent") is None and runs.describe(tmp_path) is None
    (tmp_path / "m").mkdir()
    checkpoint.save_model(checkpoint.load_model("tiny", device="cpu"), tmp_path / "m")
    assert runs.describe(tmp_path / "m") == "a model checkpoint (config.json + model.safetensors)"
    kinds = {"t": ("config.json", '{"objective": "drgrpo"}'), "r": ("rounds.jsonl", ""), "e": ("settings.json", "{}"),
             "b": ("bands.jsonl", ""), "c": ("config.json", '{"rounds": 2, "program": "climb"}'),
             "x": ("notes.txt", "mine")}
    for d, (name, text) in kinds.items():
        (tmp_path / d).mkdir()
        (tmp_path / d / name).write_text(text)
    assert [runs.describe(tmp_path / d) for d in kinds] == [
        "a train_rl.py run", "a rounds run (research/rounds/rounds.py)", "an evaluate.py output",
        "a bands run (research/bands/bands.py)", "a climb run (research/rounds/climb.py)",
        "1 other file(s), e.g. notes.txt"]


def test_a_directory_holding_something_else_is_refused_and_left_as_it_was(tmp_path):
    model = tmp_path / "model"
    checkpoint.save_model(checkpoint.load_model("tiny", device="cpu"), model)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    for kind in ("train", "rounds", "eval", "bands"):
        with pytest.raises(FileExistsError, match=r"--out .*model: holds a model checkpoint \(config.json \+ "
                                                  r"model.safetensors\), not a"):
            runs.claim(model, kind)
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before  # nothing written, nothing deleted
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="already holds a train_rl.py run; pass --resume"):
        runs.claim(tmp_path / "run", "train")
    with pytest.raises(FileNotFoundError, match="holds no run to resume"):
        runs.claim(tmp_path / "new", "train", resume=True)
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="is a file, not a directory"):
        runs.claim(tmp_path / "file", "eval")


def test_a_second_process_is_refused_with_the_first_ones_pid(tmp_path):
    """Two runs into one --out, or a --resume beside a live run: the second is refused while the first lives, and
    the directory is free again once the first ends (however it ends: the lock is the process's)."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); import runs; "
                               "runs.claim(sys.argv[2], 'train'); print('held', flush=True); time.sleep(60)",
                               str(checkpoint.REPO_DIR), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        (out / "metrics.jsonl").write_text("")  # the first run has started logging
        for resume in (False, True):
            with pytest.raises(FileExistsError, match=rf"in use by PID {holder.pid} \(started 20"):
                runs.claim(out, "train", resume=True) if resume else runs.claim(out, "train", resume=True)
    finally:
        holder.kill()
        holder.wait()
    runs.claim(out, "train", resume=True)  # the dead process's lock is gone with it
    assert f"PID {os.getpid()}" in (out / runs.LOCK).read_text()
    runs.release(out)


def test_a_claim_is_reentrant_in_one_process_and_released(tmp_path):
    runs.claim(tmp_path / "e", "eval", resume=True)
    runs.claim(tmp_path / "e", "eval", resume=True)  # the same process again: a resume in-process
    runs.release(tmp_path / "e")
    assert (tmp_path / "e").resolve() not in runs.HELD


def test_a_rank_after_the_first_leaves_the_claim_to_rank_0(tmp_path, monkeypatch):
    """Under torchrun every rank checks --out before a barrier, then rank 0 claims it and writes config.json. A slow
    rank 1 reaching claim after that write must not take rank 0's new run for an old one (it did: a flaky
    FileExistsError in test_distributed under load)."""
    out = tmp_path / "run"
    runs.claim(out, "train")  # rank 0: claims the fresh directory ...
    runs.write_json(out / "config.json", {"objective": "drgrpo"})  # ... and writes the run's config
    with pytest.raises(FileExistsError, match="already holds a train_rl.py run"):
        runs.check_out(out, "train", False)  # what any rank's check sees now: a run is there
    monkeypatch.setattr(runs.D, "this_rank", lambda: 1)
    runs.claim(out, "train")  # rank 1, late: nothing to check or hold
    assert json.loads((out / "config.json").read_text()) == {"objective": "drgrpo"}  # rank 0's run, untouched
    runs.release(out)


def test_a_torn_last_line_is_dropped_and_cut_on_resume(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    good = [dict(step=1, generated_tokens=10, training_tokens=8, flops=1.0), dict(step=2, generated_tokens=20,
                                                                                 training_tokens=16, flops=2.0)]
    log.write_bytes(("".join(json.dumps(r) + "\n" for r in good) + '{"step": 3, "generated_tok').encode())
    assert runs.read_log(log) == good and "dropping a torn last line" in capsys.readouterr().err
    assert log.read_bytes().endswith(b'"generated_tok')  # reading alone changes nothing
    assert runs.logged_totals(log, 2) == dict(generated_tokens=20, training_tokens=16, flops=2.0)
    runs.truncate_log(log, 2)  # what --resume does
    assert log.read_text() == "".join(json.dumps(r) + "\n" for r in good)
    log.write_text('{"step": 1}\nnot json\n{"step": 2}\n')  # damage before the last line is not a torn write
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON object"):
        runs.read_log(log)
    log.write_bytes(b'\xef\xbb\xbf{"step": 1}\n')  # a BOM (an editor's) is read
    assert runs.read_log(log) == [dict(step=1)]


def test_check_resume_names_each_changed_setting(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(lr=1e-4, steps=10, seed=0)))
    runs.check_resume(path, dict(lr=1e-4, steps=20, seed=0), resumable={"steps"})
    with pytest.raises(ValueError, match=r"settings differ from .*config.json \(saved, now\): \{'lr': \(0.0001, 0.5\)\}"):
        runs.check_resume(path, dict(lr=0.5, steps=10, seed=0), resumable={"steps"})
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json is missing or not a JSON object; nothing to resume"):
        runs.check_resume(path, {}, set())


def test_keep_last_checkpoints(tmp_path):
    for step in (2, 4, 6, 8, 10):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
    runs.keep_last_checkpoints(tmp_path, 0)
    assert runs.checkpoint_steps(tmp_path) == [2, 4, 6, 8, 10]  # 0 keeps all
    runs.keep_last_checkpoints(tmp_path, 2)
    assert runs.checkpoint_steps(tmp_path) == [8, 10]  # the newest two


def test_a_full_disk_while_saving_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    from safetensors import SafetensorError
    import safetensors.torch

    def full(*args, **kw):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(OSError) as e:
        checkpoint.save_model(checkpoint.load_model("tiny", device="cpu"), tmp_path / "ckpt")
    assert e.value.errno == 28 and "model.safetensors" in e.value.filename
    assert list(tmp_path.iterdir()) == []  # no temporary directory left behind either
    time.sleep(0)


def test_truncate_log_is_atomic(tmp_path, monkeypatch):
    """A kill while --resume rewrites a log leaves the old log whole, never an empty or half one."""
    log = tmp_path / "metrics.jsonl"
    text = "".join(json.dumps(dict(step=s)) + "\n" for s in (1, 2, 3))
    log.write_text(text)
    real = type(log).write_text

    def killed(self, data, *args, **kw):
        real(self, data[:5], *args, **kw)
        raise KeyboardInterrupt
    monkeypatch.setattr(type(log), "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        runs.truncate_log(log, 2)
    assert log.read_text() == text


def test_a_full_disk_while_writing_final_is_one_line_naming_the_file(tmp_path, monkeypatch):
    import shutil
    import cli
    ckpt = tmp_path / "checkpoints" / "step_1"
    checkpoint.save_model(checkpoint.load_model("tiny", device="cpu"), ckpt)

    def full(src, dst, *args, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(shutil, "copyfile", full)
    monkeypatch.setattr(shutil, "copy2", full)
    with pytest.raises(OSError) as e:
        runs.write_final(tmp_path, 1)
    line = cli.error_line(e.value)
    assert line is not None and "final" in line and "no space left on device" in line and "\n" not in line
    assert not (tmp_path / "final").exists() and not (tmp_path / ".final.tmp").exists()
    assert cli.error_line(shutil.Error([("a", "b/c", "[Errno 28] No space left on device")])).startswith("b/c: [Errno 28]")


def test_every_file_of_a_training_checkpoint_is_readable_as_the_umask_says(tmp_path):
    """The trainer state's safetensors too (the writer makes it 0600): 0644 under umask 022, as its JSON."""
    import torch
    import train_rl as T
    policy = checkpoint.load_model("tiny", device="cpu", dtype=torch.float32)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    policy(torch.tensor([[1, 2, 3]])).sum().backward()
    optimizer.step()  # moments to save
    old = os.umask(0o022)
    try:
        runs.save_checkpoint(tmp_path / "step_1", policy, optimizer, checkpoint.load_tokenizer("tiny"), 1, T.Config())
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "step_1").iterdir()}
    assert modes == {name: 0o644 for name in ("config.json", "model.safetensors", "tokenizer.json",
                                              "trainer_state.json", "trainer_state.safetensors")}


def test_a_resume_keeps_the_first_config_and_records_another_commit_beside_it(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    monkeypatch.setattr(runs, "code_version", lambda: "aaa")
    runs.write_config(path, dict(rounds=2, seed=0, device=""))
    first = path.read_bytes()
    runs.write_config(path, dict(rounds=2, seed=0, device=""), resume=True, resumable={"rounds", "device"})
    assert path.read_bytes() == first  # the same commit and settings: nothing rewritten
    monkeypatch.setattr(runs, "code_version", lambda: "bbb")
    for _ in range(2):  # the second resume under bbb adds nothing new
        runs.write_config(path, dict(rounds=4, seed=0, device=""), resume=True, resumable={"rounds", "device"})
    assert json.loads(path.read_text()) == dict(rounds=2, seed=0, device="", code_version="aaa",
                                                resumes=[dict(code_version="bbb", rounds=4)])


def test_a_setting_newer_than_the_run_goes_on_at_its_default_as_the_run_ran_and_says_so(tmp_path, capsys):
    from dataclasses import dataclass

    @dataclass
    class Config:
        lr: float = 1e-3
        steps: int = 10
        loop: str = ""  # newer than the run below
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(lr=1e-4, steps=10)))  # written before `loop` existed
    runs.check_resume(path, dict(lr=1e-4, steps=20, loop=""), {"steps"}, Config)
    assert capsys.readouterr().err.strip() == (f"note: --resume: {path} has no loop (settings newer than the run); it "
                                               f"goes on with their defaults, as it ran: --loop ''")
    with pytest.raises(ValueError) as e:  # another value (given, or a default --model tiny brings) is refused
        runs.check_resume(path, dict(lr=1e-4, steps=10, loop="2:3:2"), {"steps"}, Config)
    assert str(e.value) == (f"--resume: {path} has no loop (settings newer than the run, which ran as their "
                            f"defaults: --loop ''); this command gives --loop '2:3:2'. Pass --loop '' to resume it as "
                            f"it ran")  # never "saved ''": nothing was saved
    with pytest.raises(ValueError, match=r"\{'lr': \(0.0001, 0.5\)\}$"):
        runs.check_resume(path, dict(lr=0.5, steps=10, loop=""), {"steps"}, Config)


def test_strict_read_refuses_a_torn_or_cut_file(tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_text('{"a": 1}\n{"a": 2')
    assert runs.read_log(path) == [{"a": 1}]  # a log: the torn line is an interrupted append
    with pytest.raises(ValueError, match="traces.jsonl:2: not a JSON object"):
        runs.read_log(path, strict=True)  # a file written whole is never torn: it is damaged
    path.write_text('{"a": 1}\n{"a": 2}')
    with pytest.raises(ValueError, match="traces.jsonl:2: the last line has no newline"):
        runs.read_log(path, strict=True)
