"""benchmarks/gpu_check.sh on the CPU with small shapes (DEVICE=cpu QUICK=1): its RL part (gpu_rl_check.py) writes
a random checkpoint of the real vocabulary offline, trains it with train_rl.py, resumes a run killed after step 2 to
the straight run's weights and metrics, evaluates with continuous batching on and off to the same records, and
runs --fsdp under torchrun with one process; so the script cannot rot between the GPU sessions that run it whole."""

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_the_cpu_with_small_shapes(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, DEVICE="cpu", QUICK="1", OUT=str(tmp_path)), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "rl" / "summary.json").read_text())
    assert summary["train"]["exit"] == 0 and len(summary["train"]["steps"]) == 3
    assert all(s["training_seconds"] > 0 and s["response_tokens_mean"] > 0 for s in summary["train"]["steps"])
    assert summary["resume_matches"] is True and summary["eval_records_equal"] is True
    assert summary["eval_continuous"]["tokens"] == summary["eval_no-continuous"]["tokens"] > 0
    assert summary["fsdp_world_size_1"]["exit"] == 0
