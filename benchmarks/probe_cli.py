"""
A new user's bad inputs and interrupts, every entry point: each probe runs a script as a user would, in a scratch
directory, and checks that an expected error ends in one `prog: error:` line (exit 2, no traceback), that a failed
start wrote nothing, and that nothing it should not touch was changed or deleted (data loss).

    python benchmarks/probe_cli.py                 # every probe, 25 + 12 interrupt trials (about 25 minutes, 1 thread)
    python benchmarks/probe_cli.py --quick         # a representative subset, about 90 s (tests/test_probe_cli.py)
    python benchmarks/probe_cli.py --only train_rl.py          # one script's probes (or: help, interrupt, a word of
    python benchmarks/probe_cli.py --only interrupt --trials 5  # a probe's name or arguments)

Sections:
- help: every entry point's `--help` (and each subcommand's) exits 0 with a usage; the CPU-heavy scripts list
  --threads.
- bad inputs, one per case of issue #55 and the earlier probes: malformed data lines (100,000 nested brackets, a list
  as "id", a character the tiny tokenizer lacks, a 5,000-digit number, a prompt too long), broken config.json
  values (num_key_value_heads 0, negative sizes, rope_theta 0, rms_norm_eps -1, bos_token_id "zero"), NaN and
  truncated weights, broken or truncated trainer state on --resume (a clean error or a fall back to the previous
  checkpoint that ends bit-identical), `--resume --steps N` below the steps done, and --out into a folder holding
  a user's notes.txt, a file, or a read-only folder, for train_rl, evaluate, bands, rounds, report and tiny.py.
  A message that should name the file or flag is checked for it.
- interrupt: a straight `train_rl.py --model tiny --steps 4 ... --save-every 1 --eval-every 2` run, then trials that
  each send SIGINT (or SIGTERM, or SIGINT twice) at a seeded random moment spread over the run (validation, log
  writes and periodic saves included), check that every checkpoint left matches the straight run's of that step
  and that no logged step was lost, then `--resume` and `cmp` final/model.safetensors, metrics.jsonl (timing
  fields dropped) and samples.jsonl against the straight run. A mismatch is data lost or a silently wrong result.
- the research tools (issue #65): climb.py, climb_table.py and rounds_table.py, one probe per case (a resume with
  round 1's traces missing, torn or cut short; --test while another process holds the run; an arm named twice; a
  cache half made by Ctrl-C; ...), and the research interrupt trials (`--only "research interrupt"`): climb.py
  stopped by SIGINT, SIGKILL or SIGTERM at seeded random moments, a third of them in round 2 with round 1's traces
  then removed or torn (the resume must refuse, naming the file), resumed and compared file by file with a
  straight run; rounds_table.py --temperature 0.5 stopped while it evaluates, rerun, its table and caches compared.

Prints one line per probe, then a table per script and the totals: probes, clean one-line errors, tracebacks,
files written by failed starts, data lost (the goal for the last three: 0, 0, 0). Exit status 1 if any probe failed.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny"]
# train_rl's short run (issue #55's TR) and the interrupt trials' run (T4)
TR = TINY + ["--steps", "2", "--problems-per-step", "2", "--group-size", "4", "--test-dataset", "", "--save-every", "1"]
T4 = TINY + ["--steps", "4", "--problems-per-step", "2", "--group-size", "4", "--test-dataset", "", "--threads", "1",
             "--save-every", "1", "--eval-every", "2"]
EV = TINY + ["--limit", "2", "--max-new-tokens", "16"]
BANDS = TINY + ["--dataset", "tiny_val", "--limit", "2", "-k", "2"]
ROUNDS = TINY + ["--dataset", "tiny_ladder_train"]
SEED20 = "12345678901234567890"
# the research tools (issue #65): a two-round climb whose generator labels give every round traces (round 2 replays
# round 1's), its --test, and a one-round rounds run whose policies rounds_table.py --temperature re-evaluates
CLIMB = ["--rounds", "2", "--label-problems", "4", "--updates", "2", "--val-limit", "2", "--batch-size", "4",
         "--min-traces", "1", "--samples", "2", "--loss-probe", "4", "--labels", "generator", "--device", "cpu"]
CLIMB_TEST = ["--test", "--test-limit", "2", "--test-vote-limit", "1", "--reach-samples", "2", "--reach-limit", "1",
              "--device", "cpu"]
RR = TINY + ["--dataset", "tiny_ladder_train", "--rounds", "1", "--num-problems", "8", "--val-limit", "8", "--samples",
             "2", "--epochs", "1", "--test-dataset", ""]
TIMING = re.compile(r"(_seconds|per_second|_time)$|^(seconds|time|eta)$")
# scripts whose --help must list --threads (issue #55: every CPU-heavy script has the same --threads)
CPU_HEAVY = {"train_rl.py", "evaluate.py", "tiny.py", "research/bands/bands.py", "research/rounds/rounds.py",
             "research/rounds/revote.py"}
# places a script could write by mistake when it resolves a relative --out against the repository, not the cwd
REPO_WATCH = ("runs", "run", "notes", "data_out", "tinydata", "rep")


# -----------------------------------------------------------------------------
# Fixtures: files the probes point at, made once per scratch directory (the run fixtures only when a probe needs them)


def edit_config(scratch, name, **changes):
    shutil.copytree(ROOT / "tiny_model", scratch / name)
    d = json.loads((scratch / name / "config.json").read_text())
    (scratch / name / "config.json").write_text(json.dumps(dict(d, **changes), indent=2))


def nan_weights(src, dst):
    """A copy of a float32 safetensors file with every value NaN (the header kept, so it loads)."""
    data = Path(src).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"F32"}
    body = len(data) - 8 - n
    Path(dst).write_bytes(data[:8 + n] + struct.pack("<f", float("nan")) * (body // 4))


def setup(scratch):
    """The static fixtures: model copies with broken configs or weights, bad data files, a file."""
    shutil.copytree(ROOT / "tiny_model", scratch / "model_copy")
    rows = [dict(id=f"p{i}", problem=f"{i} + 1", answer=str(i + 1)) for i in range(8)]
    good = "".join(json.dumps(r) + "\n" for r in rows)
    write = lambda name, data: (scratch / name).write_bytes(data)  # noqa: E731
    write("pool8.jsonl", good.encode())
    write("mine+data.jsonl", good.encode())
    write("bom.jsonl", b"\xef\xbb\xbf" + good.encode())
    write("undecodable.jsonl", b'{"problem": "\xd0\xd0", "answer": "1"}\n')
    write("noanswer.jsonl", b'{"problem": "1 + 1"}\n')
    write("huge.jsonl", (json.dumps(dict(id="huge", problem="1 + " * 300_000 + "1", answer="1")) + "\n").encode())
    write("leak.jsonl", open(ROOT / "data" / "math500.jsonl", "rb").readline())
    write("deep.jsonl", (good + "[" * 100_000 + "]" * 100_000 + "\n").encode())  # json.loads: RecursionError
    write("listid.jsonl", (good + json.dumps(dict(id=[1, 2], problem="3 + 4", answer="7")) + "\n").encode())
    write("char.jsonl", (good + json.dumps(dict(id="q", problem="What is 7 + 5?", answer="12")) + "\n").encode())
    write("bignum.jsonl", (good + '{"id": "big", "problem": "1 + 1", "answer": ' + "7" * 5000 + "}\n").encode())
    write("long.jsonl", (good + json.dumps(dict(id="long", problem="1 + " * 200 + "1", answer="201")) + "\n").encode())
    write("a_file", b"not a directory")
    for name, edit in (("config_list", "[1, 2]"), ("config_typed", None)):
        shutil.copytree(ROOT / "tiny_model", scratch / name)
        d = json.loads((scratch / name / "config.json").read_text())
        (scratch / name / "config.json").write_text(edit or json.dumps(dict(d, hidden_size="128")))
    for name, changes in CONFIGS.items():
        edit_config(scratch, name, **changes)
    shutil.copytree(ROOT / "tiny_model", scratch / "nan_model")
    nan_weights(ROOT / "tiny_model" / "model.safetensors", scratch / "nan_model" / "model.safetensors")
    shutil.copytree(ROOT / "tiny_model", scratch / "trunc_model")
    weights = scratch / "trunc_model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])
    (scratch / "samples_only").mkdir()
    write("samples_only/samples.jsonl", b"not json\n")


CONFIGS = dict(cfg_kv0=dict(num_key_value_heads=0), cfg_neg_hidden=dict(hidden_size=-128),
               cfg_neg_head=dict(head_dim=-32), cfg_bos=dict(bos_token_id="zero"), cfg_rope0=dict(rope_theta=0),
               cfg_eps=dict(rms_norm_eps=-1))


def env_for(scratch):
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(scratch / "hf_home"), PYTHONWARNINGS="ignore",
                OMP_NUM_THREADS="1", ROUNDS_THREADS="1", PYTHONUNBUFFERED="1")


def run_fixture(scratch, name, script, argv):
    """A run the probes read or copy (made on first use, then kept): its directory, or raise with its stderr."""
    if not (scratch / name).exists():
        r = subprocess.run([sys.executable, str(ROOT / script), *argv, *threads_flag(script, argv), "--out", name],
                           capture_output=True, text=True, cwd=scratch, env=env_for(scratch), timeout=600)
        if r.returncode != 0:
            shutil.rmtree(scratch / name, ignore_errors=True)
            raise RuntimeError(f"fixture {name} failed (exit {r.returncode}): {r.stderr.strip()[-300:]}")
    return scratch / name


FIXTURES = {  # name -> (script, argv): train_rl's TR run, the same with a test split, an evaluation
    "base_run": ("train_rl.py", TR),
    "base_test": ("train_rl.py", TINY + ["--steps", "2", "--problems-per-step", "2", "--group-size", "4",
                                         "--save-every", "1"]),
    "ev_run": ("evaluate.py", EV),
    "climb_run": ("research/rounds/climb.py", CLIMB),
    "rounds_run": ("research/rounds/rounds.py", RR),
}
HELP_CACHE = {}


def threads_flag(script, argv):
    """--threads 1 for a script whose --help lists it (not for subcommands, nor where the probe sets it)."""
    if "--threads" in argv or (argv and argv[0] in ("compare", "table")) or "--help" in argv:
        return []
    if script not in HELP_CACHE:
        r = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
        HELP_CACHE[script] = r.stdout
    return ["--threads", "1"] if "--threads" in HELP_CACHE[script] else []


# -----------------------------------------------------------------------------
# The probes


@dataclass
class Probe:
    script: str
    argv: list
    expect: str  # 'error': one clean line, nothing written | 'ok': exit 0 | 'help' | 'resume': error or exact fallback
    mentions: tuple = ()  # the error line names these (the file, the flag)
    prep: Optional[Callable] = None  # (scratch) -> None, before the snapshot: what the probe's --out holds
    check: Optional[Callable] = None  # (scratch, completed process) -> list of problems, after the run
    needs: tuple = ()  # run fixtures made before the snapshot
    quick: bool = False  # part of --quick
    note: str = ""


def notes(name="notes", mode=None):
    """A user's folder holding notes.txt (read-only with mode 0o555)."""
    def prep(scratch):
        (scratch / name).mkdir()
        (scratch / name / "notes.txt").write_text("keep\n")
        if mode is not None:
            os.chmod(scratch / name, mode)
    return prep


def copy_run(src, dst="run", damage=None):
    """--out holds a copy of a run fixture, then damage(run_dir) breaks something in it."""
    def prep(scratch):
        shutil.copytree(scratch / src, scratch / dst)
        (scratch / dst / ".lock").unlink(missing_ok=True)
        if damage:
            damage(scratch / dst)
    return prep


def latest(run_dir):
    steps = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))
    return run_dir / "checkpoints" / f"step_{steps[-1]}"


def truncate(name):
    def damage(run_dir):
        path = latest(run_dir) / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return damage


def garble(name):
    def damage(run_dir):
        (latest(run_dir) / name).write_text('{"step": 2, "rng')
    return damage


def undecodable_metrics(run_dir):
    (run_dir / "metrics.jsonl").write_bytes(b'{"step": 1, "accuracy": 0.5}\n\xff\xfe\xd0 not utf-8\n')


def same_final(ref):
    """After a fall back: the resumed run ends bit-identical to the straight run `ref`."""
    def check(scratch, r):
        if r.returncode != 0:
            return []
        a, b = scratch / "run" / "final" / "model.safetensors", scratch / ref / "final" / "model.safetensors"
        return [] if a.is_file() and a.read_bytes() == b.read_bytes() else ["final/ differs from the straight run"]
    return check


def one_test_row(scratch, r):
    rows = [json.loads(x) for x in (scratch / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [row["step"] for row in rows if "test_accuracy" in row]
    return [] if len(steps) == len(set(steps)) else [f"duplicate test-accuracy rows at steps {steps}"]


def final_readable(scratch, r):
    """final/ is created as any other file of the run: readable by whom the umask allows, not by its owner only."""
    umask = os.umask(0)
    os.umask(umask)
    final = scratch / "run" / "final"
    if not final.is_dir():
        return ["no final/"]
    bad = [p.name for p in [final, *final.iterdir()]
           if (p.stat().st_mode & 0o777) != ((0o777 if p.is_dir() else 0o666) & ~umask)]
    return [f"final/ modes not as the umask gives: {bad}"] if bad else []


def help_shows(*patterns):
    def check(scratch, r):
        return [f"--help does not show {p!r}" for p in patterns if not re.search(p, r.stdout, re.S)]
    return check


def val_default_tiny(scratch, r):
    block = re.search(r"--val-dataset.*?(?=\n  -)", r.stdout, re.S)
    if block and "tiny_val" in block.group(0):
        return []
    return ["--val-dataset's default under --model tiny is not tiny_val"]


# -----------------------------------------------------------------------------
# The research tools' fixtures and checks (issue #65)

HOLDERS = []  # processes a probe's prep started (a second writer holding a run), stopped by its check


def child(scratch, argv, script="research/rounds/climb.py"):
    return subprocess.run([sys.executable, str(ROOT / script), *argv], cwd=scratch, env=env_for(scratch),
                          capture_output=True, text=True, timeout=600)


def traces_damage(how):
    """climb_run's round 1 traces (4 rows, which round 2 replayed): removed, torn mid-line, or cut to 3 rows."""
    def damage(run_dir):
        path = run_dir / "traces_1.jsonl"
        data = path.read_bytes()
        if how == "missing":
            path.unlink()
        else:
            path.write_bytes(data[:len(data) * 3 // 5] if how == "torn" else b"".join(data.splitlines(True)[:3]))
    return damage


def damage_line(name, line=2):
    def damage(run_dir):
        lines = (run_dir / name).read_bytes().splitlines(True)
        lines[line - 1] = b'{"round": 1, "fast_acc\n'
        (run_dir / name).write_bytes(b"".join(lines))
    return damage


def drop_setting(key):
    """A config.json written before `key` existed."""
    def damage(run_dir):
        d = json.loads((run_dir / "config.json").read_text())
        del d[key]
        (run_dir / "config.json").write_text(json.dumps(d, indent=2) + "\n")
    return damage


def holding(src):
    """--out is a copy of src held by another process (a climb run or --test in progress there)."""
    def prep(scratch):
        copy_run(src)(scratch)
        code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import runs; runs.claim('run', 'climb', "
                "resume=True); print('held', flush=True); time.sleep(600)")
        proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT)], cwd=scratch, stdout=subprocess.PIPE, text=True)
        HOLDERS.append(proc)
        proc.stdout.readline()
    return prep


def release_holders(scratch, r):
    while HOLDERS:
        proc = HOLDERS.pop()
        proc.kill()
        proc.wait()
    return []


def tested(scratch):
    """--out is a copy of climb_run whose every round is in test.jsonl."""
    copy_run("climb_run")(scratch)
    r = child(scratch, CLIMB_TEST + ["--threads", "1", "--out", "run"])
    if r.returncode != 0:
        raise RuntimeError(f"climb.py --test failed: {r.stderr.strip()[-300:]}")


def says(*texts, absent=()):
    """The run's stdout or stderr says each of texts, and none of absent."""
    def check(scratch, r):
        both = r.stdout + r.stderr
        return [f"does not say {t!r}" for t in texts if t not in both] + [f"says {t!r}" for t in absent if t in both]
    return check


def config_kept(src, drop=None):
    """run/config.json is still the first run's (src's, less `drop`): a resume rewrites none of it."""
    def check(scratch, r):
        first = json.loads((scratch / src / "config.json").read_text())
        first.pop(drop, None)
        now = json.loads((scratch / "run" / "config.json").read_text())
        return [] if now == first else [f"config.json rewritten: {sorted(k for k in now if now.get(k) != first.get(k))}"]
    return check


def umask_modes(scratch, r):
    """Every file and folder of the run (round_N/'s weights included) has the mode the umask gives."""
    umask = os.umask(0)
    os.umask(umask)
    bad = [str(p.relative_to(scratch)) for p in (scratch / "run").rglob("*") if p.name != ".lock" and
           (p.stat().st_mode & 0o777) != ((0o777 if p.is_dir() else 0o666) & ~umask)]
    return [f"modes not as the umask gives: {bad[:4]}"] if bad else []


def half_cache(scratch):
    """--out's rounds_table.py --temperature 0.5 cut by Ctrl-C while it evaluates round 0 (its cache half made)."""
    copy_run("rounds_run")(scratch)
    cache = scratch / "run" / "rounds_eval" / "T0.5"
    proc = subprocess.Popen([sys.executable, str(ROOT / "research/rounds/rounds_table.py"), "run", "--temperature",
                             "0.5"], cwd=scratch, env=env_for(scratch), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=default_sigint)
    while proc.poll() is None and not any(cache.glob("*round_0*/config.json")):  # its run directory is claimed
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    if (cache / "round_0" / "rounds.jsonl").exists():
        raise RuntimeError("the Ctrl-C came after round 0's evaluation was whole")


def unlogged_step(run_dir):
    """A baseline interrupted in step 2's validation: its checkpoint holds the step's metrics row, not the log."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = [row for row in rows if row["step"] == 2]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows if row["step"] < 2))
    state = run_dir / "checkpoints" / "step_2" / "trainer_state.json"
    meta = json.loads(state.read_text())
    state.write_text(json.dumps(dict(meta, unlogged=dict(metrics=last[0], samples=[]))))


def arms(scratch):
    """arms/ holds a climb run and a user's notes that the arm's glob also matches."""
    (scratch / "arms").mkdir()
    shutil.copytree(scratch / "climb_run", scratch / "arms" / "s0")
    (scratch / "arms" / "s_notes.txt").write_text("keep\n")


def empty_dirs(scratch):
    for name in ("e1", "e2"):
        (scratch / name).mkdir()


def research_probes():
    """climb.py, climb_table.py and rounds_table.py: issue #65's cases, each a probe."""
    P = Probe
    C, CT, RT = "research/rounds/climb.py", "research/rounds/climb_table.py", "research/rounds/rounds_table.py"
    run, resume = ["--out", "run"], ["--out", "run", "--resume"]
    c = [P(C, CLIMB + ["--rounds", "3"] + resume, "error", mentions=("traces_1.jsonl",), needs=("climb_run",),
           prep=copy_run("climb_run", damage=traces_damage(how)), note=f"traces_1.jsonl {how}")
         for how in ("missing", "torn", "cut to 3 of 4 rows")]
    c += [P(C, CLIMB + ["--rounds", "3"] + resume, "error", mentions=("climb.jsonl:2",), needs=("climb_run",),
            prep=copy_run("climb_run", damage=damage_line("climb.jsonl")), note="a damaged climb.jsonl line"),
          P(C, CLIMB + ["--rounds", "0"] + resume, "error", mentions=("--rounds 0",), needs=("climb_run",),
            prep=copy_run("climb_run"), note="--resume --rounds 0 on a finished run"),
          P(C, CLIMB + resume, "ok", needs=("climb_run",), prep=copy_run("climb_run"),
            check=lambda s, r: config_kept("climb_run")(s, r) + umask_modes(s, r),
            note="resuming a finished run: config.json kept, every file readable as the umask says"),
          P(C, CLIMB + resume, "ok", needs=("climb_run",), prep=copy_run("climb_run", damage=drop_setting(
              "weight_decay")), check=lambda s, r: config_kept("climb_run", "weight_decay")(s, r) + says(
              "has no weight_decay", "--weight-decay 0.0")(s, r), note="config.json without a newer setting"),
          P(C, CLIMB + resume, "error", mentions=("has no loss_probe", "Pass --loss-probe 64"), needs=("climb_run",),
            prep=copy_run("climb_run", damage=drop_setting("loss_probe")),
            note="config.json without a newer setting, another value given"),
          P(C, CLIMB_TEST + run, "error", mentions=("in use by",), needs=("climb_run",), prep=holding("climb_run"),
            check=release_holders, note="--test while another process holds the run"),
          P(C, CLIMB_TEST + run, "ok", needs=("climb_run",), prep=tested, check=says("nothing to test"),
            note="--test with every round tested"),
          P(C, CLIMB + ["--start", "climb_run", "--out", "run"], "error", mentions=("final/",), needs=("climb_run",),
            note="--start a run directory"),
          P(C, CLIMB + ["--start", "climb_run/round_9", "--out", "run"], "error", mentions=("climb_run/round_9",),
            needs=("climb_run",), check=says(absent=("Hugging Face cache",)), note="--start a round never made"),
          P(C, CLIMB + ["--start", "config_list/x", "--out", "run"], "error", check=says(absent=("Hugging Face cache",))),
          P(C, CLIMB_TEST + run, "error", mentions=("config.json",), needs=("climb_run",),
            prep=copy_run("climb_run", damage=lambda d: (d / "config.json").unlink()), note="--test, no config.json"),
          P(C, CLIMB + ["--learner", "drgrpo", "--rl-group-size", "1"] + run, "error", mentions=("--rl-group-size 1",)),
          P(C, CLIMB + ["--rounds", "1"] + run, "ok", check=umask_modes, note="round_N/ readable as the umask says"),
          P("train_rl.py", TR + resume, "error", mentions=("has no max_new_tokens", "Pass --max-new-tokens 512"),
            needs=("base_run",), prep=copy_run("base_run", damage=drop_setting("max_new_tokens")),
            check=says(absent=("(512, 64)",)), note="config.json without a setting --model tiny gives")]
    c += [P("research/rounds/rounds.py", RR + resume, "ok", needs=("rounds_run",), prep=copy_run("rounds_run"),
            check=config_kept("rounds_run"), note="resuming a finished rounds run: config.json kept"),
          P("research/rounds/rounds.py", RR + ["--rounds", "0"] + resume, "error", mentions=("--rounds 0",),
            needs=("rounds_run",), prep=copy_run("rounds_run"), note="rounds.py --resume --rounds 0")]
    c += [P(CT, ["a=climb_run", "a=climb_run"], "error", mentions=("named twice",), needs=("climb_run",),
            note="an arm named twice"),
          P(CT, ["a=arms/s*"], "error", mentions=("s_notes.txt",), needs=("climb_run",), prep=arms,
            note="a glob matching a stray file"),
          P(CT, ["a=e?"], "error", mentions=("e1",), prep=empty_dirs, quick=True, note="only empty directories"),
          P(CT, ["a=nothing*"], "error", mentions=("nothing*",)),
          P(CT, ["a=run"], "error", mentions=("climb.jsonl:2",), needs=("climb_run",),
            prep=copy_run("climb_run", damage=damage_line("climb.jsonl")), note="a damaged climb.jsonl line")]
    c += [P(RT, ["a_file"], "error", mentions=("a_file",), quick=True, note="a file as a run directory"),
          P(RT, ["run"], "error", mentions=("rounds.jsonl",), needs=("rounds_run",),
            prep=copy_run("rounds_run", damage=lambda d: (d / "rounds.jsonl").write_text("")), note="empty rounds.jsonl"),
          P(RT, ["rounds_run", "--sources", "x"], "error", mentions=("--sources x",), needs=("rounds_run",)),
          P(RT, ["run", "--mean"], "error", mentions=("config.json",), needs=("rounds_run",),
            prep=copy_run("rounds_run", damage=lambda d: (d / "config.json").unlink()), note="no config.json"),
          P(RT, ["run", "--temperature", "0.5"], "error", mentions=("rounds_eval",), needs=("rounds_run",),
            prep=copy_run("rounds_run", damage=lambda d: (d / "rounds_eval").write_text("mine\n")),
            note="a user's file where the cache goes"),
          P(RT, ["run", "--temperature", "0.5"], "ok", needs=("rounds_run",), prep=half_cache,
            check=says("| 1 |"), note="after Ctrl-C left an evaluation half made"),
          P(RT, ["rounds_run", "--baseline", "run"], "ok", needs=("rounds_run", "base_run"),
            prep=copy_run("base_run", damage=unlogged_step), note="a baseline interrupted in step 2's validation")]
    RV = "research/rounds/revote.py"
    c += [P(RV, ["a_file"], "error", mentions=("a_file/config.json",), note="revote.py: not a climb run"),
          P(RV, ["climb_run", "--round", "9"], "error", mentions=("--round 9",), needs=("climb_run",),
            note="revote.py: a round the run has not made"),
          P(RV, ["climb_run", "--round", "0", "--rungs", "30"], "error", mentions=("--rungs 30",),
            needs=("climb_run",), note="revote.py: a rung the run does not have")]
    return c


def probes():
    """Every probe, in order: help, then each script's bad inputs."""
    P = Probe
    S = "{S}"  # the scratch directory, for tiny.py whose relative paths are the repository's
    out = ["--out", "run"]
    help_ = [
        P("train_rl.py", ["--help"], "help", quick=True), P("train_rl.py", TINY + ["--help"], "help"),
        P("evaluate.py", ["--help"], "help", quick=True), P("evaluate.py", ["compare", "--help"], "help"),
        P("tiny.py", ["--help"], "help"),
        P("research/bands/bands.py", ["--help"], "help", quick=True),
        P("research/bands/bands.py", ["compare", "--help"], "help"),
        P("research/bands/bands.py", ["table", "--help"], "help"),
        P("research/rounds/rounds.py", ["--help"], "help"), P("research/rounds/climb.py", ["--help"], "help"),
        P("research/rounds/climb_table.py", ["--help"], "help"),
        P("research/rounds/rounds.py", TINY + ["--help"], "help", check=val_default_tiny),
        P("research/rounds/rounds_table.py", ["--help"], "help"),
        P("research/rounds/revote.py", ["--help"], "help"),
        P("research/report.py", ["--help"], "help"),
        P("research/exploration/exploration.py", ["--help"], "help"),
        P("research/ladder/ladder.py", ["--help"], "help"),
        P("research/looped/loop_depth.py", ["--help"], "help"),
        P("research/objectives/compare_objectives.py", ["--help"], "help"),
        P("research/sampler/bench_sample.py", ["--help"], "help"),
        P("objectives.py", ["--help"], "help"), P("reward.py", ["--help"], "help"),
    ]
    for p in help_:
        if p.script in CPU_HEAVY and p.argv[0] != "compare" and p.argv[0] != "table":
            base = p.check
            p.check = (lambda b: lambda s, r: help_shows(r"--threads")(s, r) + (b(s, r) if b else []))(base)

    t = [P("train_rl.py", TINY + a + (out if "--out" not in a else []), w) for a, w in [
        (["--out", "model_copy"], "error"), (["--resume", "--out", "empty"], "error"),
        (["--out", "a_file/run"], "error"), (["--device", "tpu"], "error"), (["--device", "cuda"], "error"),
        (["--lr", "-1"], "error"), (["--top-p", "0"], "error"), (["--temperature", "0"], "error"),
        (["--group-size", "1"], "error"), (["--eval-every", "-1"], "error"), (["--save-every", "-3"], "error"),
        (["--keep-checkpoints", "-2"], "error"), (["--objective", "ppo"], "error"), (["--loop", "9:1:2"], "error"),
        (["--fsdp"], "error"), (["--dataset", "pool8.jsonl", "--val-dataset", "", "--val-size", "100"], "error"),
        (["--dataset", "undecodable.jsonl"], "error"), (["--dataset", "noanswer.jsonl"], "error"),
        (["--dataset", "huge.jsonl"], "error"), (["--dataset", "leak.jsonl"], "error"),
        (["--dataset", "missing.jsonl"], "error"), (["--model", "config_list"], "error"),
        (["--model", "config_typed"], "error"), (["--out", "samples_only"], "error")]]
    t += [P("train_rl.py", ["--model", "Qwen/Qwen3-0.6B-Base", "--out", "run"], "error"),  # offline, uncached
          P("train_rl.py", TINY + ["--dataset", "bom.jsonl", "--val-dataset", "bom.jsonl", "--test-dataset", "",
                                   "--steps", "1", "--problems-per-step", "2", "--out", "run"], "ok",
            check=final_readable, note="final/ readable as the umask allows")]
    t += [P("train_rl.py", TR + ["--dataset", d, "--out", "run"], "error", mentions=(d,), quick=d == "deep.jsonl")
          for d in ("deep.jsonl", "char.jsonl", "bignum.jsonl", "my+data.jsonl")]
    t += [P("train_rl.py", TR + ["--model", m, "--out", "run"], "error", quick=m == "cfg_kv0")
          for m in (*CONFIGS, "nan_model", "trunc_model")]
    t += [P("train_rl.py", TR + ["--seed", SEED20, "--out", "run"], "error", mentions=("--seed",), quick=True),
          P("train_rl.py", TR + ["--out", "notes"], "error", prep=notes(), quick=True),
          P("train_rl.py", TR + ["--out", "ro"], "error", prep=notes("ro", 0o555)),
          P("train_rl.py", TR + ["--out", "a_file"], "error"),
          P("train_rl.py", TR + ["--out", "run", "--resume", "--steps", "1"], "error", prep=copy_run("base_run"),
            needs=("base_run",), note="--resume --steps below the steps done"),
          P("train_rl.py", TR + ["--out", "run", "--resume"], "resume", mentions=("trainer_state.json",),
            prep=copy_run("base_run", damage=garble("trainer_state.json")), needs=("base_run",),
            check=same_final("base_run"), note="broken trainer_state.json"),
          P("train_rl.py", TR + ["--out", "run", "--resume"], "resume", mentions=("trainer_state.safetensors",),
            prep=copy_run("base_run", damage=truncate("trainer_state.safetensors")), needs=("base_run",),
            check=same_final("base_run"), note="truncated trainer_state.safetensors"),
          P("train_rl.py", FIXTURES["base_test"][1] + ["--out", "run", "--resume"], "ok", prep=copy_run("base_test"),
            needs=("base_test",), check=one_test_row, note="resuming a finished run")]

    e = [P("evaluate.py", TINY + a + (out if "--out" not in a else []), w) for a, w in [
        (["--limit", "2", "--out", "model_copy"], "error"), (["--samples", "4"], "error"), (["--top-p", "0"], "error"),
        (["--device", "tpu"], "error"), (["--dataset", "undecodable.jsonl"], "error"),
        (["--dataset", "no_such_set"], "error"), (["--model", "config_list"], "error"),
        (["--limit", "0"], "error"), (["--out", "a_file/run"], "error"), (["--responses", "noanswer.jsonl"], "error"),
        (["--dataset", "bom.jsonl", "--limit", "2"], "ok")]]
    e += [P("evaluate.py", ["--model", "Qwen/Qwen3-0.6B-Base", "--limit", "1", "--out", "run"], "error")]
    e += [P("evaluate.py", EV + ["--dataset", d, "--limit", "100", "--out", "run"], "error", mentions=(d,))
          for d in ("deep.jsonl", "listid.jsonl", "char.jsonl", "bignum.jsonl", "long.jsonl", "my+data.jsonl")]
    e += [P("evaluate.py", EV + ["--model", m, "--out", "run"], "error", quick=m == "nan_model")
          for m in (*CONFIGS, "nan_model", "trunc_model")]
    e += [P("evaluate.py", EV + ["--dataset", "mine+data.jsonl", "--out", "run"], "ok"),
          P("evaluate.py", EV + ["--out", "notes"], "error", prep=notes()),
          P("evaluate.py", EV + ["--out", "a_file"], "error"),
          P("evaluate.py", ["compare", "ev_run/records.jsonl", "ev_run/records.jsonl", "--n-boot", "0"], "error",
            mentions=("--n-boot",), needs=("ev_run",))]

    b = [P("research/bands/bands.py", TINY + a + (out if "--out" not in a else []), w) for a, w in [
        (["--dataset", "tiny_val", "-k", "1"], "error"), (["--dataset", "tiny_val", "--temperature", "0"], "error"),
        (["--dataset", "tiny_val", "--limit", "2", "--heldout-per-group", "0", "--out", "model_copy"], "error"),
        (["--dataset", "undecodable.jsonl"], "error"), (["--dataset", "leak.jsonl"], "error")]]
    b += [P("research/bands/bands.py", BANDS + ["--dataset", d, "--limit", "100", "--heldout-per-group", "0",
                                                     "--out", "run"], "error",
            mentions=(d,))
          for d in ("deep.jsonl", "listid.jsonl", "long.jsonl")]
    b += [P("research/bands/bands.py", BANDS + ["--model", "cfg_kv0", "--out", "run"], "error"),
          P("research/bands/bands.py", BANDS + ["--out", "notes"], "error", prep=notes())]

    r = [P("research/rounds/rounds.py", ROUNDS + a + (out if "--out" not in a else []), w) for a, w in [
        (["--out", "model_copy"], "error"), (["--resume", "--out", "empty"], "error"), (["--selection", "x"], "error"),
        (["--frontier", "2"], "error"), (["--dataset", "huge.jsonl", "--val-dataset", "tiny_ladder_val"], "error"),
        (["--out", "a_file/run"], "error"), (["--temperature", "0"], "error")]]
    r += [P("research/rounds/rounds.py", ROUNDS + ["--dataset", "deep.jsonl", "--val-dataset", "tiny_ladder_val",
                                                   "--out", "run"], "error", mentions=("deep.jsonl",)),
          P("research/rounds/rounds.py", ROUNDS + ["--rl-steps", "1", "--rl-group-size", "1", "--out", "run"], "error"),
          P("research/rounds/rounds.py", ROUNDS + ["--model", "trunc_model", "--out", "run"], "error"),
          P("research/rounds/rounds.py", ROUNDS + ["--model", "cfg_kv0", "--out", "run"], "error"),
          P("research/rounds/rounds.py", ROUNDS + ["--out", "notes"], "error", prep=notes())]

    p = [P("research/report.py", a, w) for a, w in [
        (["model_copy", "--dpi", "0", "--out", "run"], "error"), (["no_such_run", "--out", "run"], "error"),
        (["model_copy", "--out", "run"], "error")]]
    p += [P("research/report.py", ["bad_run", "--out", "rep"], "error", mentions=("metrics.jsonl",),
            prep=copy_run("base_run", "bad_run", undecodable_metrics), needs=("base_run",)),
          P("research/report.py", ["base_run", "--out", "notes"], "error", prep=notes(), needs=("base_run",)),
          P("research/report.py", ["base_run", "--out", "rep", "--no-plots"], "ok", needs=("base_run",))]

    y = [P("tiny.py", a, w) for a, w in [
        ([], "error"), (["--data-only", "--seed", "1"], "error"), (["--threads", "0"], "error")]]
    short = ["--steps", "2", "--data-dir", f"{S}/data_out"]
    y += [P("tiny.py", ["--init", "no_such_model", "--out", f"{S}/run", *short], "error"),
          P("tiny.py", ["--init", f"{S}/trunc_model", "--out", f"{S}/run", *short], "error",
            note="--init with bad weights"),
          P("tiny.py", ["--init", f"{S}/cfg_kv0", "--out", f"{S}/run", *short], "error"),
          P("tiny.py", ["--out", f"{S}/notes", *short], "error", prep=notes(), quick=True),
          P("tiny.py", ["--out", f"{S}/ro", *short], "error", prep=notes("ro", 0o555)),
          P("tiny.py", ["--out", f"{S}/a_file", *short], "error"),
          P("tiny.py", ["--out", f"{S}/run", *short], "error", prep=copy_run("base_run"), needs=("base_run",),
            note="--out a training run"),
          P("tiny.py", ["--out", f"{S}/run", *short], "ok")]
    return help_ + t + e + b + r + p + y + research_probes()


# -----------------------------------------------------------------------------
# Running a probe


def snapshot(root):
    """Every file (size, mtime) and folder (mode) under root: a change or a deletion is data loss."""
    out = {}
    for p in root.rglob("*"):
        st = p.lstat()
        out[p.relative_to(root)] = ("dir", st.st_mode) if p.is_dir() else (st.st_size, st.st_mtime_ns)
    return out


def repo_state():
    state = {}
    for d in ("tiny_model", "tiny_ladder_model", "data"):
        state |= {Path(d) / k: v for k, v in snapshot(ROOT / d).items()}
    return state, {name for name in REPO_WATCH if (ROOT / name).exists()}


def remove(path):
    if path.is_dir() and not path.is_symlink():
        for p in [path, *path.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                os.chmod(p, 0o755)
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def crashed(stderr, code):
    """A traceback, or a crash that printed only its exception (a SyntaxError while the script is compiled)."""
    return "Traceback" in stderr or (code not in (0, 2, 130, 143)
                                     and re.search(r"^\w*(Error|Exception)\b", stderr, re.M) is not None)


def clean_line(script, argv, lines, code):
    """One `prog: error:` line (a subcommand's `prog sub: error:` too), exit 2."""
    prog = Path(script).name
    return code == 2 and bool(lines) and re.match(rf"{re.escape(prog)}( \w+)?: error: ", lines[-1]) is not None


def run_probe(probe, scratch, keep):
    for name in probe.needs:
        run_fixture(scratch, name, *FIXTURES[name])
    if probe.prep:
        probe.prep(scratch)
    argv = [a.replace("{S}", str(scratch)) for a in probe.argv]
    argv += threads_flag(probe.script, argv)
    before, (repo_before, repo_names) = snapshot(scratch), repo_state()
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, str(ROOT / probe.script), *argv], capture_output=True, text=True,
                           cwd=scratch, env=env_for(scratch), timeout=600)
    except subprocess.TimeoutExpired as e:
        r = subprocess.CompletedProcess(e.cmd, -9, e.stdout or "", (e.stderr or "") + "\nhung: killed after 600 s")
    seconds = time.time() - t0
    if argv == ["--help"] and r.returncode == 0:
        HELP_CACHE.setdefault(probe.script, r.stdout)
    after, (repo_after, repo_names_after) = snapshot(scratch), repo_state()
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    clean = clean_line(probe.script, argv, lines, r.returncode)
    new = sorted(str(p) for p in set(after) - set(before) if not str(p).startswith("hf_home"))
    changed = sorted(str(p) for p in before if after.get(p) != before[p] and not str(p).startswith("hf_home"))
    changed += sorted(f"repo/{p}" for p in repo_before if repo_after.get(p) != repo_before[p])
    new += sorted(f"repo/{n}" for n in repo_names_after - repo_names)
    problems = probe.check(scratch, r) if probe.check else []
    said = lines[-1] if lines else ""
    if probe.expect in ("error", "resume") and clean:
        problems += [f"the message does not name {m!r}" for m in probe.mentions if m not in said]
    if probe.expect == "help":
        ok = r.returncode == 0 and (("usage:" in r.stdout) if probe.script not in ("objectives.py", "reward.py") else bool(r.stdout))
        said = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else said
        new, changed = [], []  # --help writes nothing; a change would show in the next probe's snapshot anyway
    elif probe.expect == "error":
        ok = clean and not new and not changed
    elif probe.expect == "resume":  # a clean error with nothing changed, or a fall back that ends exact (check)
        ok = (clean and not new and not changed) or (r.returncode == 0 and not [c for c in changed
                                                                                 if not c.startswith("run/")])
        if r.returncode == 0:
            changed = [c for c in changed if not c.startswith("run/")]
            new = []
    else:
        ok = r.returncode == 0
        changed = [c for c in changed if not c.startswith(("run/", "rep/"))]
        ok = ok and not changed
    ok = ok and not problems
    for name in set(p.parts[0] for p in map(Path, after)) - keep:  # leave the scratch as it was for the next probe
        remove(scratch / name)
    failed_start = probe.expect in ("error", "resume") and r.returncode != 0
    return dict(section="help" if probe.expect == "help" else probe.script, script=probe.script, argv=argv,
                expect=probe.expect, ok=ok, clean=clean, traceback=crashed(r.stderr, r.returncode),
                wrote=new if failed_start else [], changed=changed, problems=problems, last=said,
                code=r.returncode, seconds=seconds, note=probe.note)


# -----------------------------------------------------------------------------
# Interrupt trials: SIGINT / SIGTERM / a double SIGINT at a random moment, then --resume, against a straight run


def logged(path, drop_timing=False):
    if not path.is_file():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in row.items() if not TIMING.search(k)} if drop_timing else row for row in rows]


def start_t4(scratch, name, extra=()):
    log = open(scratch / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "train_rl.py"), *T4, *extra, "--out", name], cwd=scratch,
                            env=env_for(scratch), stdout=log, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    return proc, log


def default_sigint():
    """In the child: Ctrl-C's default disposition, as a terminal gives it. A shell's background job (`probe &`)
    ignores SIGINT, and a child would inherit that and never see the probe's signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_started(scratch, name, proc, timeout=120):
    """Wait until the run has claimed its directory (print_config's `run` line); returns the time it did."""
    t_end = time.time() + timeout
    while time.time() < t_end and proc.poll() is None:
        text = (scratch / f"{name}.log").read_text()
        if re.search(r"^run ", text, re.M):
            return time.time()
        time.sleep(0.02)
    return time.time()


def reference(scratch):
    """The straight run, and how long it runs after claiming its directory (the window the signals spread over)."""
    proc, log = start_t4(scratch, "ref")
    t_start = wait_started(scratch, "ref", proc)
    _, err = proc.communicate(timeout=600)
    span = time.time() - t_start
    log.close()
    if proc.returncode != 0:
        raise RuntimeError(f"the straight run failed: {err.strip()[-300:]}")
    return span


def phase(scratch, name):
    """What the run was doing when the signal was sent: its last line of output."""
    text = (scratch / f"{name}.log").read_text().replace("\r", "\n")
    lines = [x for x in text.splitlines() if x.strip()]
    return lines[-1][:60] if lines else ""


def interrupt_trial(scratch, k, kind, delay):
    """One trial: the run, a signal after `delay` seconds, --resume; returns the result row."""
    name = f"int{k}"
    extra = ["--save-every", "0"] if kind == "SIGTERM" else []  # then only the handler can keep the steps done
    proc, log = start_t4(scratch, name, extra)
    wait_started(scratch, name, proc)
    time.sleep(delay)
    sent = proc.poll() is None
    where = phase(scratch, name) if sent else "(finished first)"
    steps_logged = None
    if sent:
        steps_logged = len(logged(scratch / name / "metrics.jsonl"))
        proc.send_signal(signal.SIGTERM if kind == "SIGTERM" else signal.SIGINT)
        if kind == "double SIGINT":
            time.sleep(random.Random(k).uniform(0.05, 0.4))
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    log.close()
    problems, code = [], proc.returncode
    finished = code == 0 and "done:" in (scratch / f"{name}.log").read_text()
    expected_codes = (130, 143) if kind == "SIGTERM" else (130,)
    if sent and code not in expected_codes and not (kind == "double SIGINT" and code == 0 and finished):
        problems.append(f"exit {code} after the signal, not {' or '.join(map(str, expected_codes))}")
    elif not sent and not finished:
        problems.append(f"exit {code}, not 0, for a run that was never signalled")
    if crashed(err, code) and kind != "double SIGINT":
        problems.append("traceback")
    run_dir, ref = scratch / name, scratch / "ref"
    for ckpt in sorted((run_dir / "checkpoints").glob("step_*")):  # each checkpoint left is the straight run's
        if (ckpt / "model.safetensors").read_bytes() != (ref / "checkpoints" / ckpt.name / "model.safetensors"
                                                         ).read_bytes():
            problems.append(f"{ckpt.name} holds other weights than the straight run's {ckpt.name}")
    saved = max((int(c.name.split("_")[1]) for c in (run_dir / "checkpoints").glob("step_*")), default=0)
    if steps_logged and saved < steps_logged:
        problems.append(f"{steps_logged} steps were logged when the signal came, the last checkpoint is step {saved}")
    r = subprocess.run([sys.executable, str(ROOT / "train_rl.py"), *T4, *extra, "--out", name, "--resume"],
                       cwd=scratch, env=env_for(scratch), capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        problems.append(f"--resume exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:120]}")
    else:
        a, b = run_dir / "final" / "model.safetensors", ref / "final" / "model.safetensors"
        if not a.is_file() or a.read_bytes() != b.read_bytes():
            problems.append("final/model.safetensors differs from the straight run")
        if logged(run_dir / "metrics.jsonl", True) != logged(ref / "metrics.jsonl", True):
            problems.append("metrics.jsonl differs from the straight run (timing dropped)")
        if logged(run_dir / "samples.jsonl") != logged(ref / "samples.jsonl"):
            problems.append("samples.jsonl differs from the straight run")
    remove(run_dir)
    (scratch / f"{name}.log").unlink()
    lost = any("differ" in p or "other weights" in p or "logged" in p for p in problems)
    return dict(section="interrupt", script="train_rl.py", kind=kind, delay=delay, where=where, ok=not problems,
                sent=sent,
                code=code, problems=problems, lost=lost, clean=not problems,
                traceback=crashed(err, code) or crashed(r.stderr, r.returncode),
                wrote=[], changed=[], expect="interrupt", last="; ".join(problems) or f"exit {code}, resume exact",
                argv=[kind, f"after {delay:.2f}s"], seconds=0.0, note=where)


def interrupt_trials(scratch, n_int, n_term, n_double, seed, report):
    """The straight run, then the trials: delays stratified over the run (trial i in the i-th of n equal slices).
    A trial whose run finished before its signal is drawn again (at most n more), so n trials are interrupted."""
    span = reference(scratch)
    print(f"interrupt: the straight run takes {span:.1f}s after claiming its directory", flush=True)
    rng = random.Random(seed)
    results = []
    for kind, n in (("SIGINT", n_int), ("SIGTERM", n_term), ("double SIGINT", n_double)):
        sent, tries = 0, 0
        while sent < n and tries < 2 * n:
            delay = ((sent + rng.random()) / n * span * 0.95) * (0.8 if tries >= n else 1.0)  # late ones, earlier
            res = interrupt_trial(scratch, len(results), kind, delay)
            results.append(res)
            report(res)
            sent, tries = sent + res["sent"], tries + 1
    remove(scratch / "ref")
    return results


# -----------------------------------------------------------------------------
# The research tools' interrupt trials: climb.py and rounds_table.py stopped at seeded random moments, then resumed
# (climb) or rerun (rounds_table), against a straight run, byte for byte

SIGNALS = (("SIGINT", signal.SIGINT, (130,)), ("SIGKILL", signal.SIGKILL, (-9,)), ("SIGTERM", signal.SIGTERM, (143,)))


def climb_files(run_dir):
    """What a climb run's result is: its rows (timing dropped), traces, labelling records, weights, config.json
    (less --out, which names the directory)."""
    out = {"climb.jsonl": logged(run_dir / "climb.jsonl", True)}
    for p in sorted(run_dir.glob("traces_*.jsonl")) + sorted(run_dir.glob("round_*/label/records.jsonl")) + \
            sorted(run_dir.glob("round_*/model.safetensors")):
        out[str(p.relative_to(run_dir))] = p.read_bytes()
    out["config.json"] = {k: v for k, v in json.loads((run_dir / "config.json").read_text()).items() if k != "out"}
    return out


def start(scratch, name, argv, script):
    log = open(scratch / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / script), *argv], cwd=scratch, env=env_for(scratch), stdout=log,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    return proc, log


def signal_ok(sent, code, codes, finished):
    """The exit status a trial expects: the signal's (130, 143; SIGKILL's -9), or 0 when it finished unsignalled. A
    signal that lands as a finished run exits (its work all written) may also end it by the signal itself."""
    if not sent:
        return code == 0
    return code in codes or (finished and code in (0, -2, -15, 130, 143))


def stop(proc, log, sig, delay, ready=lambda: True):
    """Send sig `delay` seconds after ready() holds; returns (whether it was sent, exit status, stderr)."""
    while proc.poll() is None and not ready():
        time.sleep(0.02)
    time.sleep(delay)
    sent = proc.poll() is None
    if sent:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    log.close()
    return sent, proc.returncode, err


def climb_trial(scratch, k, kind, delay, variant, ref):
    """climb.py stopped by `kind`; for a variant, its traces_1.jsonl then removed or torn (the resume must refuse,
    naming it) and put back; --resume; every result file compared with the straight run's."""
    name, (signame, sig, codes) = f"ci{k}", kind
    proc, log = start(scratch, name, CLIMB + ["--threads", "1", "--out", name], "research/rounds/climb.py")
    rows = lambda: len(logged(scratch / name / "climb.jsonl"))  # noqa: E731
    ready = (lambda: rows() >= 2) if variant else (lambda: (scratch / name / "config.json").exists())
    sent, code, err = stop(proc, log, sig, delay, ready)
    problems, where = [], f"{rows()} rows"
    finished = "done:" in (scratch / f"{name}.log").read_text()
    where += " (finished: the signal came as it exited)" if sent and finished else ""
    if not signal_ok(sent, code, codes, finished):
        problems.append(f"exit {code} after {signame if sent else 'no signal'}")
    traces = scratch / name / "traces_1.jsonl"
    if variant and rows() == 2 and traces.is_file():
        good = traces.read_bytes()
        traces.unlink() if variant == "missing" else traces.write_bytes(good[:len(good) // 2])
        r = child(scratch, CLIMB + ["--threads", "1", "--out", name, "--resume"])
        last = (r.stderr.strip().splitlines() or [""])[-1]
        if r.returncode != 2 or "traces_1.jsonl" not in last or "Traceback" in r.stderr:
            problems.append(f"traces_1.jsonl {variant}: --resume exit {r.returncode}, {last[:100]}")
        traces.write_bytes(good)
        where += f", traces_1.jsonl {variant}: refused"
    elif variant:
        where += f", traces_1.jsonl {variant}: not tried (round 2 was done)"
    r = child(scratch, CLIMB + ["--threads", "1", "--out", name, "--resume"])
    if r.returncode != 0:
        problems.append(f"--resume exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:120]}")
    else:
        mine = climb_files(scratch / name)
        problems += [f"{f} differs from the straight run" for f in sorted(set(mine) | set(ref))
                     if mine.get(f) != ref.get(f)]
    remove(scratch / name)
    (scratch / f"{name}.log").unlink()
    return trial_row("research/rounds/climb.py", signame, delay, where, sent, code, problems, err, r)


def table_output(text):
    """rounds_table's table rows (not the run directory's name, nor what the evaluations print on their way)."""
    return [line for line in text.splitlines() if line.startswith("|")]


def rounds_table_trial(scratch, k, kind, delay, ref):
    """rounds_table.py --temperature 0.5 stopped by `kind` while it evaluates; rerun; its table and each cached
    evaluation compared with the straight run's."""
    name, (signame, sig, codes) = f"rt{k}", kind
    shutil.copytree(scratch / "rounds_run", scratch / name)
    argv = [name, "--temperature", "0.5"]
    proc, log = start(scratch, name + "_", argv, "research/rounds/rounds_table.py")
    sent, code, err = stop(proc, log, sig, delay, lambda: (scratch / f"{name}_.log").stat().st_size > 0)
    problems = []
    finished = bool(table_output((scratch / f"{name}_.log").read_text()))
    if not signal_ok(sent, code, codes, finished):
        problems.append(f"exit {code} after {signame if sent else 'no signal'}")
    where = ", ".join(p.name for p in sorted((scratch / name / "rounds_eval" / "T0.5").glob("*"))) \
        if (scratch / name / "rounds_eval").is_dir() else "no cache yet"
    where += " (finished: the signal came as it exited)" if sent and finished else ""
    r = child(scratch, argv, "research/rounds/rounds_table.py")
    if r.returncode != 0:
        problems.append(f"rerun exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:120]}")
    else:
        if table_output(r.stdout) != ref["table"]:
            problems.append("the table differs from the straight run's")
        for rnd in ("round_0", "round_1"):
            if logged(scratch / name / "rounds_eval" / "T0.5" / rnd / "rounds.jsonl", True) != ref[rnd]:
                problems.append(f"the cached {rnd} differs from the straight run's")
    remove(scratch / name)
    (scratch / f"{name}_.log").unlink()
    return trial_row("research/rounds/rounds_table.py", signame, delay, f"cache: {where}", sent, code, problems,
                     err, r)


def trial_row(script, kind, delay, where, sent, code, problems, err, r):
    lost = any("differ" in p or "traces_1" in p for p in problems)
    return dict(section="research interrupt", script=script, kind=f"{Path(script).name} {kind}", delay=delay,
                where=where, ok=not problems, sent=sent, code=code, problems=problems, lost=lost, clean=not problems,
                traceback=(crashed(err, code) and code != -9) or crashed(r.stderr, r.returncode), wrote=[],
                changed=[], expect="interrupt", last="; ".join(problems) or "resumed exact",
                argv=[kind, f"after {delay:.2f}s"], seconds=0.0, note=where)


def research_interrupt_trials(scratch, n, seed, report):
    """n trials of each tool, the signals in turn (SIGINT, SIGKILL, SIGTERM) at delays stratified over the straight
    run; a third of climb's trials stop it in round 2 and remove round 1's traces, a third tear them."""
    run_fixture(scratch, "climb_run", *FIXTURES["climb_run"])
    run_fixture(scratch, "rounds_run", *FIXTURES["rounds_run"])
    rng, results = random.Random(seed), []
    proc, log = start(scratch, "cref", CLIMB + ["--threads", "1", "--out", "cref"], "research/rounds/climb.py")
    while proc.poll() is None and not (scratch / "cref" / "config.json").exists():  # from its claim, as a trial's
        time.sleep(0.02)
    t0 = time.time()
    proc.communicate(timeout=600)
    log.close()
    span, ref = time.time() - t0, climb_files(scratch / "cref")
    print(f"research interrupt: the straight climb takes {span:.1f}s", flush=True)
    for k in range(n):
        variant = ("", "missing", "torn")[k % 3]
        delay = rng.uniform(0, 1.5) if variant else (k + rng.random()) / n * span * 0.9
        results.append(climb_trial(scratch, k, SIGNALS[k % 3], delay, variant, ref))
        report(results[-1])
    shutil.copytree(scratch / "rounds_run", scratch / "rtref")
    proc, log = start(scratch, "rtref", ["rtref", "--temperature", "0.5"], "research/rounds/rounds_table.py")
    while proc.poll() is None and not (scratch / "rtref.log").stat().st_size:  # from its first evaluation's start
        time.sleep(0.02)
    t0 = time.time()
    proc.communicate(timeout=600)
    log.close()
    span = time.time() - t0
    r = child(scratch, ["rtref", "--temperature", "0.5"], "research/rounds/rounds_table.py")  # cached: the table
    ref = dict(table=table_output(r.stdout), **{rnd: logged(scratch / "rtref" / "rounds_eval" / "T0.5" / rnd /
                                                            "rounds.jsonl", True) for rnd in ("round_0", "round_1")})
    print(f"research interrupt: the straight rounds_table.py --temperature 0.5 takes {span:.1f}s", flush=True)
    for k in range(n):
        results.append(rounds_table_trial(scratch, k, SIGNALS[k % 3], (k + rng.random()) / n * span * 0.9, ref))
        report(results[-1])
    for name in ("cref", "rtref"):
        remove(scratch / name)
    for name in ("cref", "rtref"):
        (scratch / f"{name}.log").unlink()
    return results


# -----------------------------------------------------------------------------


def show(res):
    extra = (f" WROTE {res['wrote']}" if res["wrote"] else "")
    extra += f" CHANGED {res['changed']}" if res["changed"] else ""
    extra += "".join(f" [{p}]" for p in res["problems"] if p not in res["last"])
    note = f" ({res['note']})" if res.get("note") else ""
    print(f"{'ok  ' if res['ok'] else 'FAIL'} {res['script']} {' '.join(res['argv'])}{note}: exit {res['code']}, "
          f"{res['last'][:160]}{extra}", flush=True)


def table(results):
    print("\n| section | probes | as expected | one clean error line | tracebacks | wrote on a failed start | "
          "data lost or silently wrong |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for section in dict.fromkeys(r["section"] for r in results):
        mine = [r for r in results if r["section"] == section]
        errors = [r for r in mine if r["expect"] == "error" or (r["expect"] == "resume" and r["code"] != 0)]
        lost = sum(bool(r["changed"]) or r.get("lost", False) for r in mine)
        clean = f"{sum(r['clean'] for r in errors)} of {len(errors)}" if errors else "-"
        rows.append((len(mine), sum(r["ok"] for r in mine), sum(r["clean"] for r in errors), len(errors),
                     sum(r["traceback"] for r in mine), sum(bool(r["wrote"]) for r in mine), lost))
        print(f"| {section} | {len(mine)} | {rows[-1][1]} | {clean} | {rows[-1][4]} | {rows[-1][5]} | {lost} |")
    tot = [sum(x) for x in zip(*rows)] if rows else [0] * 7
    print(f"| **all** | {tot[0]} | {tot[1]} | {tot[2]} of {tot[3]} | {tot[4]} | {tot[5]} | {tot[6]} |")
    print(f"\nprobes {tot[0]}, as expected {tot[1]}, clean one-line errors {tot[2]} of {tot[3]}; "
          f"tracebacks {tot[4]}, files written by failed starts {tot[5]}, data lost {tot[6]} (goal: 0, 0, 0)")
    trials = [r for r in results if r["section"] in ("interrupt", "research interrupt")]
    for kind in dict.fromkeys(r["kind"] for r in trials):
        mine = [r for r in trials if r["kind"] == kind]
        print(f"{kind}: {sum(r['sent'] for r in mine)} runs signalled mid-run (of {len(mine)} trials; the others "
              f"had finished), {sum(r['ok'] for r in mine if r['sent'])} of them resumed exactly"
              + (f"; {sum(r['ok'] for r in mine)} of {len(mine)} trials as expected" if mine[0]["section"] != "interrupt"
                 else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    ap.add_argument("--only", default="", help="only probes whose script, section (help, interrupt) or arguments "
                    "contain this text (e.g. train_rl.py, tiny.py, notes, interrupt)")
    ap.add_argument("--quick", action="store_true", help="a representative subset (about 90 s on 1 thread)")
    ap.add_argument("--trials", type=int, default=20, help="SIGINT trials (--quick: 1)")
    ap.add_argument("--term-trials", type=int, default=3, help="SIGTERM trials (--quick: 1)")
    ap.add_argument("--double-trials", type=int, default=5, help="double SIGINT trials (--quick: 1)")
    ap.add_argument("--research-trials", type=int, default=6, help="interrupt trials of climb.py and of "
                    "rounds_table.py each (--quick: 0)")
    ap.add_argument("--seed", type=int, default=0, help="the interrupt delays' seed")
    args = ap.parse_args(argv)
    if args.quick:
        args.trials, args.term_trials, args.double_trials, args.research_trials = 1, 1, 1, 0
    t0 = time.time()
    results = []
    selected = [p for p in probes() if (not args.quick or p.quick) and (
        not args.only or args.only in p.script or (args.only == "help" and p.expect == "help")
        or args.only in " ".join(p.argv) or args.only in p.note)]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        setup(scratch)
        keep = set(os.listdir(scratch)) | set(FIXTURES) | {"hf_home"}
        for probe in selected:
            try:
                res = run_probe(probe, scratch, keep)
            except Exception as e:  # noqa: BLE001 -- a fixture that failed fails its probe, not the whole run
                res = dict(section=probe.script, script=probe.script, argv=probe.argv, expect=probe.expect, ok=False,
                           clean=False, traceback=False, wrote=[], changed=[], problems=[], last=f"probe: {e}",
                           code=None, seconds=0.0, note=probe.note)
            results.append(res)
            show(res)
        if not args.only or args.only in "interrupt":
            try:
                results += interrupt_trials(scratch, args.trials, args.term_trials, args.double_trials, args.seed, show)
            except Exception as e:  # noqa: BLE001
                results.append(dict(section="interrupt", script="train_rl.py", argv=["reference"], expect="interrupt",
                                    ok=False, clean=False, traceback=False, wrote=[], changed=[], problems=[],
                                    last=f"{e}", code=None, lost=False, seconds=0.0, note=""))
                show(results[-1])
        if args.research_trials and (not args.only or args.only in "research interrupt"):
            try:
                results += research_interrupt_trials(scratch, args.research_trials, args.seed, show)
            except Exception as e:  # noqa: BLE001
                results.append(dict(section="research interrupt", script="research", argv=["reference"],
                                    expect="interrupt", ok=False, clean=False, traceback=False, wrote=[], changed=[],
                                    problems=[], last=f"{e}", code=None, lost=False, seconds=0.0, note=""))
                show(results[-1])
    table(results)
    print(f"wall time {time.time() - t0:.0f}s")
    return 0 if results and all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
