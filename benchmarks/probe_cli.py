"""
A new user's bad inputs, every entry point: each probe runs a script as a user would, in a scratch directory,
and checks that an expected error ends in one `prog: error:` line (exit 2, no traceback), that a failed start
wrote nothing, and that nothing outside a run directory was changed or deleted.

    python benchmarks/probe_cli.py            # every probe (about 4 minutes on 2 cores)
    python benchmarks/probe_cli.py --only train_rl.py

Prints one line per probe and a table per script: probes, one clean line, tracebacks, wrote on a failed start,
changed or deleted something it should not have.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny"]


def setup(scratch):
    """The files the probes point at: a copy of the tiny model, a run, bad data files."""
    shutil.copytree(ROOT / "tiny_model", scratch / "model_copy")
    rows = [dict(problem=f"{i} + 1", answer=str(i + 1)) for i in range(8)]
    write = lambda name, data: (scratch / name).write_bytes(data)  # noqa: E731
    write("pool8.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    write("bom.jsonl", b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    write("undecodable.jsonl", b'{"problem": "\xd0\xd0", "answer": "1"}\n')
    write("noanswer.jsonl", b'{"problem": "1 + 1"}\n')
    write("huge.jsonl", (json.dumps(dict(id="huge", problem="1 + " * 300_000 + "1", answer="1")) + "\n").encode())
    write("leak.jsonl", open(ROOT / "data" / "math500.jsonl", "rb").readline())
    write("a_file", b"not a directory")
    for name, edit in (("config_list", "[1, 2]"), ("config_typed", None)):
        shutil.copytree(ROOT / "tiny_model", scratch / name)
        d = json.loads((scratch / name / "config.json").read_text())
        (scratch / name / "config.json").write_text(edit or json.dumps(dict(d, hidden_size="128")))
    (scratch / "samples_only").mkdir()
    write("samples_only/samples.jsonl", b"not json\n")


def probes():
    """(script, argv, what is expected): 'error' for one clean line and nothing written, 'ok' for a run that works."""
    out = ["--out", "run"]
    t = [("train_rl.py", TINY + a + (out if "--out" not in a else []), w) for a, w in [
        (["--out", "model_copy"], "error"), (["--resume", "--out", "empty"], "error"),
        (["--out", "a_file/run"], "error"), (["--device", "tpu"], "error"), (["--device", "cuda"], "error"),
        (["--lr", "-1"], "error"), (["--top-p", "0"], "error"), (["--temperature", "0"], "error"),
        (["--group-size", "1"], "error"), (["--eval-every", "-1"], "error"), (["--save-every", "-3"], "error"),
        (["--keep-checkpoints", "-2"], "error"), (["--objective", "ppo"], "error"), (["--loop", "9:1:2"], "error"),
        (["--fsdp"], "error"), (["--dataset", "pool8.jsonl", "--val-dataset", "", "--val-size", "100"], "error"),
        (["--dataset", "undecodable.jsonl"], "error"), (["--dataset", "noanswer.jsonl"], "error"),
        (["--dataset", "huge.jsonl"], "error"), (["--dataset", "leak.jsonl"], "error"),
        (["--dataset", "missing.jsonl"], "error"), (["--model", "config_list"], "error"),
        (["--model", "config_typed"], "error"), (["--out", "samples_only"], "error"),
        (["--dataset", "bom.jsonl", "--val-dataset", "bom.jsonl", "--test-dataset", "", "--steps", "1",
          "--problems-per-step", "2"], "ok")]]
    t += [("train_rl.py", ["--model", "Qwen/Qwen3-0.6B-Base", "--out", "run"], "error")]  # offline, uncached
    e = [("evaluate.py", TINY + a + (out if "--out" not in a else []), w) for a, w in [
        (["--limit", "2", "--out", "model_copy"], "error"), (["--samples", "4"], "error"), (["--top-p", "0"], "error"),
        (["--device", "tpu"], "error"), (["--dataset", "undecodable.jsonl"], "error"),
        (["--dataset", "no_such_set"], "error"), (["--model", "config_list"], "error"),
        (["--limit", "0"], "error"), (["--out", "a_file/run"], "error"), (["--responses", "noanswer.jsonl"], "error"),
        (["--dataset", "bom.jsonl", "--limit", "2"], "ok")]]
    e += [("evaluate.py", ["--model", "Qwen/Qwen3-0.6B-Base", "--limit", "1", "--out", "run"], "error")]
    b = [("research/bands/bands.py", TINY + a + (out if "--out" not in a else []), w) for a, w in [
        (["--dataset", "tiny_val", "-k", "1"], "error"), (["--dataset", "tiny_val", "--temperature", "0"], "error"),
        (["--dataset", "tiny_val", "--limit", "2", "--heldout-per-group", "0", "--out", "model_copy"], "error"),
        (["--dataset", "undecodable.jsonl"], "error"), (["--dataset", "leak.jsonl"], "error")]]
    r = [("research/rounds/rounds.py", TINY + ["--dataset", "tiny_ladder_train"] + a + (out if "--out" not in a else []),
          w) for a, w in [
        (["--out", "model_copy"], "error"), (["--resume", "--out", "empty"], "error"), (["--selection", "x"], "error"),
        (["--frontier", "2"], "error"), (["--dataset", "huge.jsonl", "--val-dataset", "tiny_ladder_val"], "error"),
        (["--out", "a_file/run"], "error"), (["--temperature", "0"], "error")]]
    p = [("research/report.py", a, w) for a, w in [
        (["model_copy", "--dpi", "0", "--out", "run"], "error"), (["no_such_run", "--out", "run"], "error"),
        (["model_copy", "--out", "run"], "error")]]
    y = [("tiny.py", a, w) for a, w in [
        ([], "error"), (["--data-only", "--seed", "1"], "error"), (["--threads", "0"], "error"),
        (["--init", "no_such_model", "--out", "run", "--data-dir", "data_out"], "error")]]
    return t + e + b + r + p + y


def files(root):
    return {p.relative_to(root): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def run_probe(script, argv, expect, scratch):
    before, repo_before = files(scratch), files(ROOT / "tiny_model") | files(ROOT / "data")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(scratch / "hf_home"), PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, str(ROOT / script), *argv], capture_output=True, text=True, cwd=scratch,
                       env=env, timeout=600)
    after, repo_after = files(scratch), files(ROOT / "tiny_model") | files(ROOT / "data")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    clean = r.returncode == 2 and bool(lines) and lines[-1].startswith(f"{Path(script).name}: error: ")
    new = sorted(str(p) for p in set(after) - set(before) if not str(p).startswith("hf_home"))
    changed = sorted(str(p) for p in before if p not in after or after[p] != before[p])
    changed += sorted(f"repo/{p}" for p in repo_before if repo_after.get(p) != repo_before[p])
    for d in ("run", "empty", "data_out"):  # leave the scratch as it was for the next probe
        shutil.rmtree(scratch / d, ignore_errors=True)
    ok = clean and not new and not changed if expect == "error" else r.returncode == 0 and not changed
    return dict(script=script, argv=argv, expect=expect, ok=ok, clean=clean, traceback="Traceback" in r.stderr,
                wrote=new if expect == "error" else [], changed=changed, last=lines[-1] if lines else "",
                code=r.returncode)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="probe this script only (e.g. train_rl.py)")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        setup(scratch)
        for script, argv, expect in probes():
            if args.only and script != args.only:
                continue
            res = run_probe(script, argv, expect, scratch)
            results.append(res)
            print(f"{'ok  ' if res['ok'] else 'FAIL'} {script} {' '.join(argv)}: exit {res['code']}, "
                  f"{res['last'][:150]}" + (f" WROTE {res['wrote']}" if res["wrote"] else "")
                  + (f" CHANGED {res['changed']}" if res["changed"] else ""), flush=True)
    print("\n| script | probes | as expected | one clean error line | tracebacks | wrote on a failed start | "
          "changed or deleted |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for script in dict.fromkeys(r["script"] for r in results):
        mine = [r for r in results if r["script"] == script]
        errors = [r for r in mine if r["expect"] == "error"]
        print(f"| {script} | {len(mine)} | {sum(r['ok'] for r in mine)} | {sum(r['clean'] for r in errors)} of "
              f"{len(errors)} | {sum(r['traceback'] for r in mine)} | {sum(bool(r['wrote']) for r in mine)} | "
              f"{sum(bool(r['changed']) for r in mine)} |")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
