"""
The real shape end to end, offline: a random-weight Qwen3-0.6B-Base checkpoint (checkpoint.random_checkpoint, the
shipped tokenizer), then train_rl.py and evaluate.py on it as a user's first real run makes them, each timed.

    python benchmarks/gpu_rl_check.py --device cuda --out runs/gpu_check/rl     # on a GPU (benchmarks/gpu_check.sh)
    python benchmarks/gpu_rl_check.py --device cpu --quick --out /tmp/rl_check  # small shapes on a CPU (a test)

1. train_rl.py --objective drgrpo: 8 MATH problems x 8 samples, 512 new tokens, 3 steps, --eval-every 0, bf16 on
   CUDA, every row trained (random weights earn no reward, so no group would have an advantage): seconds per step
   split into sampling / grading / training, sampling tokens/s, peak GPU memory beside the memory plan the run
   printed (memory.py: each part and the total, and the measured peak over the planned total); and the
   same run killed after step 2 (a checkpoint there) and resumed to step 3, which must give the straight run's
   weights and metrics.
2. evaluate.py on math500 --limit 128 at the protocol's 2,048 tokens (random weights write to the budget, the worst
   case), continuous batching on and off: tokens/s, and the same records.
3. --fsdp under torchrun with one process (two processes need two devices; tests/test_distributed.py runs two
   on the CPU with gloo).
Each part runs as its own process; a part that fails is reported and the rest still run. The random checkpoint
stays in OUT for the next try; each try writes to a new folder OUT/try-N, prints its summary and writes it to
OUT/try-N/summary.json, and deletes the weights it trained once it has compared them (a try at the real shape
writes about 40 GB of them, and a device machine's disk holds 64 GiB).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(cmd, log, timeout):
    """A command's exit status and seconds, its output in log."""
    t0 = time.time()
    with open(log, "w") as f:
        try:
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    return code, time.time() - t0


def metrics(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if "reward_mean" in r]


def memory_plan(log):
    """The memory plan train_rl.py printed before loading (memory.py), {part: GiB}: the first GPU run checks it against
    the measured peak (torch.cuda.max_memory_allocated, the metrics' peak_gpu_memory_gb)."""
    lines = Path(log).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("memory plan")), None)
    plan = {}
    for line in lines[start + 1:] if start is not None else []:
        if not line.startswith("  "):
            break
        plan[line[2:24].strip()] = float(line[24:32])
    return plan


def steady(rows):
    return [{k: v for k, v in r.items() if "second" not in k and k != "peak_gpu_memory_gb"} for r in rows]


def drop_weights(folder):
    """Delete the weights this try wrote under folder, keeping its logs and metrics."""
    for f in Path(folder).rglob("*.safetensors"):
        f.unlink()


def weights(path):
    from safetensors.torch import load_file
    return load_file(str(Path(path) / "model.safetensors"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a 2-layer model of the real vocabulary, tiny budgets")
    ap.add_argument("--out", default="runs/gpu_check/rl")
    ap.add_argument("--timeout", type=int, default=200, help="seconds each part may take")
    args = ap.parse_args()
    import torch
    import checkpoint
    from model import Qwen3Config
    base = Path(args.out).resolve()
    base.mkdir(parents=True, exist_ok=True)
    model = base / "qwen3-0.6b-random"
    out = base / f"try-{1 + max((int(p.name[4:]) for p in base.glob('try-*') if p.name[4:].isdigit()), default=0)}"
    out.mkdir()  # a new folder: a rerun never meets (or deletes) an earlier try's runs
    py, summary = sys.executable, dict(device=args.device, quick=args.quick, folder=str(out))
    config = Qwen3Config(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16) if args.quick else Qwen3Config()
    t0 = time.time()
    if not (model / "model.safetensors").is_file():
        checkpoint.random_checkpoint(model, config, torch.float32 if args.quick else torch.bfloat16)
    summary["checkpoint_seconds"] = time.time() - t0
    shape = ["--problems-per-step", "2", "--group-size", "2", "--max-new-tokens", "16"] if args.quick else \
        ["--problems-per-step", "8", "--group-size", "8", "--max-new-tokens", "512"]
    train = [py, "train_rl.py", "--model", str(model), "--objective", "drgrpo", *shape, "--eval-every", "0",
             "--dataset", "math_train", "--subject", "", "--num-problems", "64", "--test-dataset", "",
             "--save-every", "2", "--dispersion-every", "0", "--no-skip-zero-advantage", "--device", args.device]
    # 1. straight, then killed after step 2 and resumed
    code, secs = run([*train, "--steps", "3", "--out", str(out / "straight")], out / "train.log", args.timeout)
    summary["train"] = dict(exit=code, seconds=secs)
    if code == 0:
        rows = metrics(out / "straight")
        summary["train"].update(
            steps=[{k: r.get(k) for k in ("sampling_seconds", "verifying_seconds", "training_seconds",
                                          "tokens_per_second", "response_tokens_mean", "peak_gpu_memory_gb")}
                   for r in rows])
        peaks = [r["peak_gpu_memory_gb"] for r in rows if "peak_gpu_memory_gb" in r]
        plan = memory_plan(out / "train.log")
        summary["train"].update(memory_plan_gib=plan, peak_gib=max(peaks) if peaks else None,
                                peak_over_plan=max(peaks) / plan["total"] if peaks and plan.get("total") else None)
    code2, _ = run([*train, "--steps", "2", "--out", str(out / "split")], out / "split.log", args.timeout)
    code3, _ = run([*train, "--steps", "3", "--resume", "--out", str(out / "split")], out / "resume.log", args.timeout)
    if code == code2 == code3 == 0:
        a, b = weights(out / "straight" / "final"), weights(out / "split" / "final")
        summary["resume_matches"] = bool(all(torch.equal(a[k], b[k]) for k in a)
                                         and steady(metrics(out / "straight")) == steady(metrics(out / "split")))
    else:
        summary["resume_matches"] = f"not run to the end (exits {code2}, {code3})"
    drop_weights(out / "straight")
    drop_weights(out / "split")
    # 2. evaluation at the protocol's budget, continuous batching on and off
    limit, budget = ("8", "16") if args.quick else ("128", "2048")
    for mode in ("continuous", "no-continuous"):
        code, secs = run([py, "evaluate.py", "--model", str(model), "--dataset", "math500", "--limit", limit,
                          "--max-new-tokens", budget, f"--{mode}", "--device", args.device, "--out",
                          str(out / f"eval-{mode}")], out / f"eval-{mode}.log", args.timeout)
        s = json.loads((out / f"eval-{mode}" / "summary.json").read_text()) if code == 0 else {}
        summary[f"eval_{mode}"] = dict(exit=code, seconds=secs, tokens_per_s=s.get("tokens_per_s"),
                                       tokens=s.get("completion_tokens_total"))
    recs = [out / f"eval-{m}" / "records.jsonl" for m in ("continuous", "no-continuous")]
    if all(p.is_file() for p in recs):
        strip = lambda p: [{k: v for k, v in json.loads(x).items() if k != "seconds"}  # noqa: E731
                           for x in p.read_text().splitlines()]
        summary["eval_records_equal"] = strip(recs[0]) == strip(recs[1])
    # 3. --fsdp with one process
    env_port = dict(os.environ, MASTER_PORT=str(29500 + os.getpid() % 1000))
    t0 = time.time()
    with open(out / "fsdp.log", "w") as f:
        try:
            code = subprocess.run([py, "-m", "torch.distributed.run", "--nproc_per_node", "1", "train_rl.py",
                                   *train[2:], "--steps", "1", "--fsdp", "--save-every", "0", "--out",
                                   str(out / "fsdp")], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env_port,
                                  timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    summary["fsdp_world_size_1"] = dict(exit=code, seconds=time.time() - t0)
    drop_weights(out / "fsdp")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    ok = summary["train"]["exit"] == 0 and summary["resume_matches"] is True and \
        summary.get("eval_records_equal") is True and summary["fsdp_world_size_1"]["exit"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
