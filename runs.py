"""
A run directory on disk: claiming it safely, its JSONL logs, what a training run prints, and its checkpoints.

    claim("runs/x", "train", resume=False)  # refuses a directory holding anything else, or a live run
    append_jsonl("runs/x/metrics.jsonl", row)
    save_checkpoint("runs/x/checkpoints/step_20", policy, optimizer, tokenizer, 20, cfg, selection)

Every script that writes a run (train_rl.py, evaluate.py, research/rounds, research/bands) claims its --out
first: a directory that holds a run of another kind, a model checkpoint or other files is refused, naming what
is there, and a lock file held for the run's lifetime refuses a second process with its PID and start time (the
lock is released when the process ends, however it ends). Writes are atomic (a temporary name, then rename),
and a JSONL log's torn last line (a killed run or a full disk) is dropped on resume with a warning.

A training checkpoint is the policy in Hugging Face layout (LoRA adapters merged; checkpoint.save_model) plus the
trainer state: optimizer moments and adapters in trainer_state.safetensors, step and settings in
trainer_state.json, and the data state (pass-rate table, replay buffer) in selection.json. Never pickle.
"""

import dataclasses
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

import checkpoint
import distributed as D
import lora

# -----------------------------------------------------------------------------
# What a directory holds, and claiming one

# The file that marks a run of each kind (a directory may hold its other files too).
MARKERS = {"train": "metrics.jsonl", "rounds": "rounds.jsonl", "eval": "settings.json", "bands": "bands.jsonl",
           "climb": "climb.jsonl"}
LOCK = ".lock"
HELD = {}  # run directory -> its open lock file: this process holds it until it ends (so a claim is re-entrant)


def describe(path):
    """What a directory holds, in words: a run of some kind, a model checkpoint, other files, or None if empty."""
    path = Path(path)
    names = sorted(p.name for p in path.iterdir() if p.name != LOCK) if path.is_dir() else []
    if not names:
        return None
    config = read_json_object(path / "config.json") if "config.json" in names else {}
    if "model_type" in config or "model.safetensors" in names:
        return "a model checkpoint (config.json + model.safetensors)"
    if config.get("program") == "climb" or MARKERS["climb"] in names:
        return "a climb run (research/rounds/climb.py)"
    if "rounds" in config or MARKERS["rounds"] in names:
        return "a rounds run (research/rounds/rounds.py)"
    if "objective" in config or MARKERS["train"] in names:
        return "a train_rl.py run"
    if "bands_summary.json" in names or MARKERS["bands"] in names:
        return "a bands run (research/bands/bands.py)"
    if MARKERS["eval"] in names or "records.jsonl" in names:
        return "an evaluate.py output"
    return f"{len(names)} other file(s), e.g. {names[0]}"


KIND_WORDS = {"train": "a train_rl.py run", "rounds": "a rounds run (research/rounds/rounds.py)",
              "eval": "an evaluate.py output", "bands": "a bands run (research/bands/bands.py)",
              "climb": "a climb run (research/rounds/climb.py)"}


def read_json_object(path):
    """A JSON object from a file (UTF-8, a BOM allowed), or {} when the file is not one."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def check_out(path, kind, resume):
    """Refuse --out when it holds anything but a run of this kind (and, without --resume for train and rounds, any
    run at all): nothing is written. Returns whether it holds a run of this kind."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"--out {path}: is a file, not a directory; choose another --out")
    what, ours = describe(path), KIND_WORDS[kind]
    if what is None:
        if resume and kind in ("train", "rounds", "climb"):
            raise FileNotFoundError(f"--resume: {path} holds no run to resume; drop --resume to start one there")
        return False
    if what != ours and not (kind == "bands" and what == KIND_WORDS["eval"]):  # a bands run starts as an evaluation
        raise FileExistsError(f"--out {path}: holds {what}, not {ours}; refusing to write into it. Choose another "
                              f"--out (an empty or new directory)")
    if not resume and kind in ("train", "rounds", "climb"):
        raise FileExistsError(f"--out {path}: already holds {ours}; pass --resume to continue it or choose another "
                              f"--out")
    return True


def claim(path, kind, resume=False):
    """Make --out and hold its lock for this process's lifetime (check_out first). A second process claiming it
    is refused with the first one's PID and start time; this process may claim it again (a resume in-process)."""
    path = Path(path)
    if D.this_rank() != 0:  # rank 0 claims for all; the others checked --out before the barrier, and may now see its run
        return
    check_out(path, kind, resume)
    if path.resolve() in HELD:
        return
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    handle = open(path / LOCK, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise FileExistsError(f"--out {path}: in use by {holder}; wait for it to finish, or choose another --out") \
            from None
    try:
        check_out(path, kind, resume)  # again, now that no other process can write here
    except (FileExistsError, FileNotFoundError):
        handle.close()
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise
    handle.seek(0)
    handle.truncate()
    handle.write(f"PID {os.getpid()} (started {time.strftime('%Y-%m-%d %H:%M:%S')}, {' '.join(sys.argv)[:200]})\n")
    handle.flush()
    HELD[path.resolve()] = handle


def check_resume(path, now, resumable, config_class=None):
    """--resume: every setting in `now` (a dict) but the resumable ones must equal the saved config.json's. A setting
    newer than the run (not in its config.json) ran as its default (config_class's; a new option's default is the
    plain behaviour it had): the resume goes on with it, and a note says so; another value is refused, naming the
    flag to pass, never quoting a saved value that is not there."""
    saved = read_json_object(path)
    if not saved:
        raise ValueError(f"--resume: {path} is missing or not a JSON object; nothing to resume")
    defaults = {}
    if config_class is not None:
        names = {f.name for f in dataclasses.fields(config_class)}
        try:
            defaults = dataclasses.asdict(config_class(**{k: v for k, v in saved.items() if k in names}))
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"--resume: {path} does not hold these settings ({e})") from None
    diff = {k: (saved[k], v) for k, v in now.items() if k not in resumable and k in saved and saved[k] != v}
    if diff:
        raise ValueError(f"--resume: settings differ from {path} (saved, now): {diff}")
    newer = {k: defaults.get(k, v) for k, v in now.items() if k not in resumable and k not in saved}
    flags = lambda d: ", ".join(f"--{k.replace('_', '-')} {v!r}" for k, v in d.items())  # noqa: E731
    other = {k: now[k] for k, v in newer.items() if now[k] != v}
    if other:
        raise ValueError(f"--resume: {path} has no {', '.join(other)} (settings newer than the run, which ran as "
                         f"their defaults: {flags({k: newer[k] for k in other})}); this command gives {flags(other)}. "
                         f"Pass {flags({k: newer[k] for k in other})} to resume it as it ran")
    if newer:
        print(f"note: --resume: {path} has no {', '.join(newer)} (settings newer than the run); it goes on with "
              f"their defaults, as it ran: {flags(newer)}", file=sys.stderr)


def write_config(path, settings, resume=False, resumable=()):
    """config.json: on a fresh start the run's settings and code_version (this code's commit). On --resume the
    first run's file is kept, and a resume under another commit, or with other resumable settings (e.g. more
    --rounds), is added to its `resumes` list beside the first: the commit that made the earlier steps is never
    lost. Call it once the run's checks have passed: a failing resume rewrites nothing."""
    version = code_version()
    if not resume:
        write_json(path, dict(settings, code_version=version))
        return
    saved = read_json_object(path)
    resumes = saved.get("resumes", [])
    entry = dict(code_version=version, **{k: v for k, v in settings.items() if k in resumable and k not in
                                          ("resume", "out") and k in saved and saved[k] != v})  # (a run may move)
    last = resumes[-1] if resumes else dict(code_version=saved.get("code_version"))
    if entry != last:
        write_json(path, dict(saved, resumes=[*resumes, entry]))


def check_rounds_left(run_dir, done, rounds):
    """--resume --rounds N (research/rounds): N may not be below the rounds the run has completed."""
    if rounds < done:
        raise ValueError(f"--rounds {rounds}: the run in {run_dir} has completed {done} round(s) already; pass "
                         f"--rounds {done} or more to resume it")


def release(path):
    """Let go of a directory this process claimed (at the end of its run)."""
    handle = HELD.pop(Path(path).resolve(), None)
    if handle is not None:
        handle.close()


def write_json(path, obj):
    """Write JSON atomically: a reader never sees half a file."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def code_version():
    """The git commit of this code, '-dirty' when it has uncommitted changes; 'unknown' outside git."""
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "") if commit else "unknown"
    except OSError:
        return "unknown"


# -----------------------------------------------------------------------------
# JSONL logs: one object per line, appended


def append_jsonl(path, obj):
    """Append one line (rank 0 writes the run's files)."""
    if D.this_rank() != 0:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")


def read_log(path, repair=False, strict=False):
    """The rows of a JSONL log. A torn last line (no newline, or not JSON: a killed run or a full disk) is dropped
    with a warning, and with repair cut from the file, to be rewritten by what comes next. Any other bad line is
    an error naming the file and line; with strict (a file written whole, write_jsonl: never torn), any bad line."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows, good = [], 0
    for i, line in enumerate(lines, 1):
        last = i == len(lines) or (i == len(lines) - 1 and not lines[-1])
        if not line.strip():
            good += len(line) + 1
            continue
        try:
            row = json.loads(line.decode("utf-8-sig" if i == 1 else "utf-8"))
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if not last or strict:
                raise ValueError(f"{path}:{i}: not a JSON object ({e}); this log is damaged") from None
            print(f"{path}:{i}: dropping a torn last line (an interrupted write); it is redone", file=sys.stderr)
            if repair and D.this_rank() == 0:
                os.truncate(path, good)
            break
        if i == len(lines) and data and not data.endswith(b"\n"):  # complete JSON, but the newline never came
            if strict:
                raise ValueError(f"{path}:{i}: the last line has no newline; this file is damaged (cut short)")
            if repair and D.this_rank() == 0:
                with open(path, "ab") as f:
                    f.write(b"\n")
        rows.append(row)
        good += len(line) + 1
    return rows


def truncate_log(path, last_step, tests_before=None):
    """Keep the lines logged at or before last_step (the steps after it are redone on resume), and of the held-out
    test rows only those before step tests_before (the resumed run evaluates the test split again at that step:
    at 0, before training, or at the end of a finished run). Atomic: a kill here leaves the old log or the new."""
    path = Path(path)
    if path.exists() and D.this_rank() == 0:
        tests_before = last_step + 1 if tests_before is None else tests_before
        keep = [row for row in read_log(path, repair=True)
                if row["step"] <= last_step and ("test_accuracy" not in row or row["step"] < tests_before)]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in keep))
        os.replace(tmp, path)


def resume_logs(run_dir, start_step, unlogged):
    """On a resume from start_step: cut the logs to what the checkpoint holds (to the step before, when its own
    lines are still to be written: `unlogged`, see save_checkpoint), and the compute totals to go on from.
    Returns (the last step logged, the totals)."""
    logged = start_step - 1 if unlogged else start_step
    totals = logged_totals(Path(run_dir) / "metrics.jsonl", logged)
    if unlogged:
        totals = {k: unlogged["metrics"][k] for k in totals}
    D.barrier()  # every rank has read the totals before rank 0 truncates the log
    truncate_log(Path(run_dir) / "metrics.jsonl", logged, tests_before=start_step)  # a test there is evaluated again
    truncate_log(Path(run_dir) / "samples.jsonl", logged)
    return logged, totals


def sample_rows(rollouts, step):
    """samples.jsonl's lines for a step's first rollouts."""
    return [dict(step=step, id=r.problem["id"], answer=r.problem["answer"], response=r.text, reward=r.reward,
                 correct=r.correct) for r in rollouts]


def log_step(run_dir, pending, validate, eval_every):
    """A finished step's lines in metrics.jsonl and samples.jsonl (pending: its metrics row and samples), after
    its validation when due: validate(label) -> (accuracy, by group), every eval_every steps. Returns the seconds
    the validation took, or None."""
    metrics, seconds = pending["metrics"], None
    if validate and eval_every and metrics["step"] % eval_every == 0:
        t0 = time.time()
        metrics["val_accuracy"], metrics["val_accuracy_by_group"] = validate(f"validation after step {metrics['step']}")
        seconds = time.time() - t0
    for name, row in [("metrics", metrics)] + [("samples", row) for row in pending["samples"]]:
        append_jsonl(Path(run_dir) / f"{name}.jsonl", row)
    return seconds


def logged_totals(path, last_step):
    """The running totals (generated tokens, training tokens, FLOPs) logged at last_step, so a resumed run
    counts its compute from where the checkpoint was taken, not from zero."""
    totals = dict(generated_tokens=0, training_tokens=0, flops=0.0)
    for row in read_log(path):
        if "generated_tokens" in row and row["step"] <= last_step:
            totals = {k: row[k] for k in totals}
    return totals


# -----------------------------------------------------------------------------
# What a training run prints


def set_threads(threads, device):
    """--threads N, and a warning when other jobs already keep the cores busy: there one thread per core makes a
    tiny-world step 4.8x slower than one thread (benchmarks/bench_threads.py, 2 cores)."""
    if threads:
        torch.set_num_threads(threads)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if device == "cpu" and not threads and torch.get_num_threads() > 1 and load >= 0.5:
        print(f"note: the load average is {load:.1f} on {cores} cores, so other jobs are running; with "
              f"{torch.get_num_threads()} torch threads each step can be several times slower than with "
              f"--threads 1 (benchmarks/bench_threads.py)", flush=True)


def print_config(cfg, run_dir, device, n_train, n_val, n_params):
    """The settings that shape the run, in a few lines (config.json has every one), and the progress line's legend."""
    print(f"run        {run_dir}, seed {cfg.seed}, {device} ({torch.get_num_threads()} CPU threads); every setting in "
          f"config.json\nmodel      {cfg.model}: {n_params:,} trainable parameters{f', --loop {cfg.loop}' * bool(cfg.loop)}"
          f"\ndata       {n_train} training problems ({cfg.dataset}), {n_val} validation, test {cfg.test_dataset or '-'}"
          f"\nobjective  {cfg.objective}, grader {cfg.grader}: {cfg.steps} steps x {cfg.problems_per_step} problems x "
          f"{cfg.group_size} samples of <= {cfg.max_new_tokens} tokens at T {cfg.temperature:g}; AdamW lr {cfg.lr:g}"
          f"\ncolumns    [reward: mean, shown when it differs from acc] acc: share right | val: greedy validation "
          f"accuracy | len: mean tokens | direct: share of bare \\boxed{{}} answers | seconds sampling / grading / "
          f"training", flush=True)


def print_progress(m, cfg, elapsed, done, eval_seconds):
    """One line per step; the ETA counts the evaluations still to come."""
    per_step = elapsed / done
    evals_left = cfg.eval_every and (cfg.steps // cfg.eval_every - m["step"] // cfg.eval_every)
    eta = per_step * (cfg.steps - m["step"]) + (evals_left or 0) * eval_seconds
    val = f" | val {m['val_accuracy']:.3f}" if "val_accuracy" in m else ""
    if len(m.get("val_accuracy_by_group", {})) > 1:
        val += " (" + ", ".join(f"{cfg.eval_group_by} {k}: {v:.2f}" for k, v in m["val_accuracy_by_group"].items()) + ")"
    reward = f"reward {m['reward_mean']:.3f} | " if m["reward_mean"] != m["accuracy"] else ""
    print(f"step {m['step']}/{cfg.steps} | {reward}acc {m['accuracy']:.3f}{val} | "
          f"len {m['response_tokens_mean']:.0f} | direct {m['direct_answer_rate']:.2f} | loss {m['loss']:+.4f} | "
          f"{m['sampling_seconds']:.1f}s / {m['verifying_seconds']:.1f}s / {m['training_seconds']:.1f}s"
          f" | ETA {eta / 60:.1f} min", flush=True)


# -----------------------------------------------------------------------------
# Interrupts: Ctrl-C (SIGINT) and SIGTERM (cli.run_main raises both) held back while what must finish whole runs

HOLD = dict(previous=None, received=[])  # the handlers held signals replace, and the signals that came meanwhile


def hold_interrupts():
    """From now until release_interrupts(), Ctrl-C and SIGTERM are remembered, not raised: an optimizer update and
    the bookkeeping that names its step, or the checkpoint an interrupt saves, is never cut in two. (Main thread
    only; calling it again while held changes nothing.)"""
    if HOLD["previous"] is not None or threading.current_thread() is not threading.main_thread():
        return
    HOLD.update(previous={s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}, received=[])
    for s in HOLD["previous"]:
        signal.signal(s, remember_signal)


def remember_signal(signum, frame):
    HOLD["received"].append(signum)
    print(f"\n{signal.Signals(signum).name} received: it takes effect once the update or checkpoint in progress is "
          f"complete", file=sys.stderr, flush=True)


def release_interrupts(raise_held=True):
    """Stop holding. With raise_held, a signal that came meanwhile is delivered now to the handler it would have met
    (Ctrl-C's KeyboardInterrupt, cli.run_main's SIGTERM), so it is raised here."""
    previous, received = HOLD["previous"], HOLD["received"]
    if previous is None:
        return
    for s, handler in previous.items():
        signal.signal(s, handler)
    HOLD.update(previous=None, received=[])
    if raise_held and received:
        signal.raise_signal(received[0])


# -----------------------------------------------------------------------------
# Training checkpoints: checkpoints/step_N/ (the model, and what --resume needs), final/


def save_checkpoint(path, policy, optimizer, tokenizer, step, cfg, selection=None, unlogged=None):
    """HF-layout weights (adapters merged) + optimizer state (safetensors) + trainer state (JSON) + the data
    state (selection.json: pass-rate table, replay buffer), atomically. unlogged: the step's metrics row and
    samples when an interrupt came before they were logged (a resume logs them, validating first if due). Every
    rank calls it (FSDP gathers shards, a collective); rank 0 writes."""
    weights, opt_state = D.gathered_state(policy, optimizer) if D.is_sharded(policy) else (None, optimizer.state_dict())
    if D.this_rank() != 0:
        return
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        checkpoint.save_model(D.plain_model(policy, weights), tmp, tokenizer)
        tensors = {f"state.{i}.{k}": v.contiguous().cpu() for i, s in opt_state["state"].items() for k, v in s.items()}
        if D.has_lora(policy):
            tensors.update({f"adapter.{k}": v.contiguous().cpu() for k, v in lora.adapter_state_dict(policy).items()})
        checkpoint.save_tensors(tensors, tmp / "trainer_state.safetensors")
        meta = dict(step=step, param_groups=opt_state["param_groups"], config=dataclasses.asdict(cfg),
                    **({"unlogged": unlogged} if unlogged else {}))
        (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=2))
        if selection:
            (tmp / "selection.json").write_text(json.dumps({k: v.state() for k, v in selection.items()}))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk leaves no half checkpoint behind
        raise
    checkpoint.replace_dir(tmp, path)


def damaged(path, e):
    return ValueError(f"{path}: cannot be read ({type(e).__name__}: {str(e)[:200]}); the checkpoint is damaged or "
                      f"incomplete")


def load_trainer_state(path, policy, optimizer):
    """Restore optimizer moments and LoRA adapters; returns the step the checkpoint was taken after. A damaged
    file is a ValueError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    path = Path(path)
    try:
        meta = json.loads((path / "trainer_state.json").read_text())
        step, groups = int(meta["step"]), meta["param_groups"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise damaged(path / "trainer_state.json", e) from None
    try:
        tensors = load_file(str(path / "trainer_state.safetensors"))
        state = {}
        for key, v in tensors.items():
            if key.startswith("state."):
                _, i, name = key.split(".", 2)
                state.setdefault(int(i), {})[name] = v
        adapters = {k[len("adapter."):]: v for k, v in tensors.items() if k.startswith("adapter.")}
        if adapters:
            policy.load_state_dict(adapters, strict=False)
        if D.is_sharded(policy) and state:  # (with no state yet, there is nothing to shard)
            D.load_sharded_optimizer_state(policy, optimizer, {"state": state, "param_groups": groups})
        else:
            optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (OSError, SafetensorError, ValueError, KeyError, RuntimeError) as e:
        raise damaged(path / "trainer_state.safetensors", e) from None
    return step


def check_steps_left(run_dir, steps):
    """--resume --steps N: N may not be below the step the run's newest checkpoint holds."""
    saved = checkpoint_steps(run_dir)
    if saved and saved[-1] > steps:
        raise ValueError(f"--steps {steps}: the run in {run_dir} is at step {saved[-1]} already; pass --steps "
                         f"{saved[-1]} or more to resume it")


def check_finite_weights(policy, step):
    """A run whose weights went NaN or inf ends here, naming the step, not in the sampler of the next one."""
    params = [p.to_local() if hasattr(p, "to_local") else p for p in policy.parameters()]
    bad = D.reduce_numbers([int(not torch.stack([torch.isfinite(p.detach()).all() for p in params]).all())])[0]
    if bad:
        raise ValueError(f"step {step}: the update made the weights non-finite (NaN or inf); lower --lr or --grad-clip, "
                         f"and --resume from the last checkpoint or start again")


def check_checkpoint(path):
    """Read every file of a training checkpoint: the JSON whole, the safetensors' headers (which must cover the file
    exactly, so a truncated one fails there without its tensors being read); a damaged or missing one is a
    ValueError naming it."""
    from safetensors import SafetensorError, safe_open
    path = Path(path)
    for name in ("config.json", "trainer_state.json", "selection.json"):
        if name != "selection.json" or (path / name).exists():
            try:
                meta = json.loads((path / name).read_text())
                if name == "trainer_state.json":
                    int(meta["step"]), meta["param_groups"]  # noqa: B018 -- what load_trainer_state reads
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise damaged(path / name, e) from None
    for name in ("model.safetensors", "trainer_state.safetensors"):
        try:
            with safe_open(str(path / name), "pt"):
                pass
        except (OSError, SafetensorError) as e:
            raise damaged(path / name, e) from None


def readable_checkpoint(run_dir):
    """The newest checkpoint that reads whole (check_checkpoint), or None if there is none at all. Newer ones that
    do not are moved aside (checkpoints/step_N.damaged) with a warning; when every one is damaged, a ValueError
    names the newest one's bad file and nothing is moved."""
    damaged_ones = []
    for step in reversed(checkpoint_steps(run_dir)):
        path = Path(run_dir) / "checkpoints" / f"step_{step}"
        try:
            check_checkpoint(path)
        except ValueError as e:
            damaged_ones.append((path, e))
            continue
        for bad, e in damaged_ones:
            aside = bad.with_name(f"{bad.name}.damaged")
            print(f"warning: {e}; moved to {aside}; resuming from {path.name}", file=sys.stderr)
            if D.this_rank() == 0:
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(bad, aside)
        return path
    if damaged_ones:
        raise ValueError(f"--resume: {damaged_ones[0][1]}, and no earlier checkpoint reads whole; start the run "
                         f"again in a new --out")
    return None


def unlogged(path):
    """The metrics row and samples of the checkpoint's step if an interrupt came before they were logged, else None."""
    return json.loads((Path(path) / "trainer_state.json").read_text()).get("unlogged")


def load_selection(path, selection):
    """The data state saved with a checkpoint into the live selection objects (curriculum.py)."""
    if selection:
        try:
            saved = json.loads((Path(path) / "selection.json").read_text())
        except (OSError, ValueError) as e:
            raise damaged(Path(path) / "selection.json", e) from None
        for name, state in saved.items():
            selection[name].load(state)


def selection_state(selection):
    """A copy of the data state, to put back if the step that changes it is interrupted."""
    return json.loads(json.dumps({k: v.state() for k, v in selection.items()}))


def load_selection_state(selection, state):
    for name, saved in state.items():
        selection[name].load(saved)


def checkpoint_steps(run_dir):
    return sorted(int(p.name[5:]) for p in (Path(run_dir) / "checkpoints").glob("step_*") if p.name[5:].isdigit())


def keep_last_checkpoints(run_dir, n):
    """--keep-checkpoints N: delete all but the newest n periodic checkpoints (0 keeps all); each is renamed
    first, so one an interrupt cuts short is never left half-deleted under its name."""
    if n and D.this_rank() == 0:
        for step in checkpoint_steps(run_dir)[:-n]:
            path = Path(run_dir) / "checkpoints" / f"step_{step}"
            gone = path.with_name(f".{path.name}.old")
            shutil.rmtree(gone, ignore_errors=True)
            os.replace(path, gone)
            shutil.rmtree(gone, ignore_errors=True)


def write_final(run_dir, step):
    """final/: the last checkpoint's model without its trainer state, what evaluate.py --model loads. File by
    file, so a full disk is the OSError naming the file (cli prints one line), and nothing half-copied is left."""
    if D.this_rank() != 0:
        return
    final, tmp = Path(run_dir) / "final", Path(run_dir) / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for f in sorted((Path(run_dir) / "checkpoints" / f"step_{step}").iterdir()):
            if not f.name.startswith("trainer_state."):
                try:
                    shutil.copyfile(f, tmp / f.name)
                except OSError as e:
                    raise OSError(e.errno, e.strerror, str(final / f.name)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    checkpoint.replace_dir(tmp, final)


def write_jsonl(path, rows):
    """A whole JSONL file, one row per line: written to a temporary name, then renamed, so a reader never sees
    half a file."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
