"""benchmarks/gpu_check.sh on the CPU with small shapes (DEVICE=cpu QUICK=1): its RL part (gpu_rl_check.py) writes
a random checkpoint of the real vocabulary offline, trains it with train_rl.py, resumes a run killed after step 2 to
the straight run's weights and metrics, evaluates with continuous batching on and off to the same records, and
runs --fsdp under torchrun with one process; so the script cannot rot between the GPU sessions that run it whole.
A device run brings back at most 8 plain files from $OUT, each under 16 MiB with a plain name, and a rerun on the
same machine meets the first try's folders: both are checked here."""

import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_check(out, work, **env):
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, DEVICE="cpu", QUICK="1", OUT=str(out), WORK=str(work), **env), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_gpu_check_runs_on_the_cpu_with_small_shapes_and_reruns(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    gpu_check(out, work)
    summary = json.loads((work / "rl" / "try-1" / "summary.json").read_text())
    assert summary["train"]["exit"] == 0 and len(summary["train"]["steps"]) == 3
    assert all(s["training_seconds"] > 0 and s["response_tokens_mean"] > 0 for s in summary["train"]["steps"])
    plan = summary["train"]["memory_plan_gib"]  # the plan the run printed, recorded beside the GPU's peak (None here)
    assert plan["total"] > 0 and {"weights (fp32)", "KV cache", "activations"} <= set(plan)
    assert summary["resume_matches"] is True and summary["eval_records_equal"] is True
    assert summary["eval_continuous"]["tokens"] == summary["eval_no-continuous"]["tokens"] > 0
    assert summary["fsdp_world_size_1"]["exit"] == 0
    # what a device run brings back: at most 8 plain files, small, plainly named, at most 2 folders down
    files = [p for p in out.rglob("*")]
    assert all(p.is_file() and not p.is_symlink() for p in files) and len(files) <= 8, files
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) and p.stat().st_size < 16 * 2**20 for p in files)
    assert "step 5 (rl_check.txt): exit 0" in (out / "summary.txt").read_text()
    with tarfile.open(out / "rl_logs.tar.gz") as t:
        names = t.getnames()
    assert "try-1/summary.json" in names and "try-1/train.log" in names and "try-1/straight/metrics.jsonl" in names
    assert not [n for n in names if n.endswith(".safetensors")]
    # the trained weights are gone once compared; the random checkpoint stays for the next try
    assert not list((work / "rl" / "try-1").rglob("*.safetensors"))
    assert (work / "rl" / "qwen3-0.6b-random" / "model.safetensors").is_file()
    # a rerun of step 5 alone in the same folders: a new try, the same training metrics
    stdout = gpu_check(out, work, STEPS="5")
    again = json.loads((work / "rl" / "try-2" / "summary.json").read_text())
    assert again["resume_matches"] is True and again["fsdp_world_size_1"]["exit"] == 0
    assert [s["response_tokens_mean"] for s in again["train"]["steps"]] == \
        [s["response_tokens_mean"] for s in summary["train"]["steps"]]
    assert "step 5 (rl_check.txt): exit 0" in stdout


def test_gpu_check_runs_only_the_steps_named(tmp_path):
    gpu_check(tmp_path / "out", tmp_path / "work", STEPS="1")  # on a CPU steps 1-4 do not run; 5 is not named
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["summary.txt"]
    assert not (tmp_path / "work" / "rl").exists()
