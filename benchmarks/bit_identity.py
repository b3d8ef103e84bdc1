"""
Bit for bit before and after a change that should change no result: run a fixed set of tiny-world jobs at one
thread, hash what each writes (metrics without their timing fields, samples, records, weights), then compare.

    python benchmarks/bit_identity.py --out /tmp/after                      # this checkout
    python benchmarks/bit_identity.py --repo /tmp/base --out /tmp/before    # another checkout (git worktree add)
    python benchmarks/bit_identity.py --compare /tmp/before /tmp/after      # one line per job: same / DIFFERS
    python benchmarks/bit_identity.py --compare benchmarks/bit_identity_reference /tmp/after   # against the stored

benchmarks/bit_identity_reference/manifest.json is the reference: the jobs at e28bbbe (issue #66) on a 2-core AMD
EPYC (CPU family 25, AVX-512 BF16, no AMX); another CPU may round differently (benchmarks/LOG.md, 2026-12-06).

The jobs: the README's main command, 3 steps of every objective, replay, the pass-rate curriculum, --loop, LoRA,
KL in the loss and in the reward, an evaluate.py run, a rounds run and a bands run. About 10 minutes on one core
(OMP_NUM_THREADS=1 for every job; the thread count moves float rounding).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS3 = ["--model", "tiny", "--steps", "3", "--test-dataset", "", "--eval-every", "0", "--threads", "1"]


def jobs(objectives):
    """(name, script, argv): every job writes its outputs under --out."""
    out = [("main", "train_rl.py", ["--objective", "drgrpo", "--model", "tiny", "--threads", "1"])]
    out += [(f"objective_{o}", "train_rl.py", STEPS3 + ["--objective", o]) for o in objectives]
    out += [("replay", "train_rl.py", STEPS3 + ["--replay-fraction", "0.5", "--replay-max-rate", "1.0"]),
            ("curriculum", "train_rl.py", STEPS3 + ["--select", "pass_rate"]),
            ("loop", "train_rl.py", STEPS3 + ["--loop", "1:3:2"]),
            ("lora", "train_rl.py", STEPS3 + ["--lora-rank", "4", "--lr", "1e-3"]),
            ("kl_loss", "train_rl.py", STEPS3 + ["--kl-coef", "0.05", "--kl-in", "loss"]),
            ("kl_reward", "train_rl.py", STEPS3 + ["--kl-coef", "0.05", "--kl-in", "reward"]),
            ("evaluate", "evaluate.py", ["--model", "tiny", "--limit", "100"]),
            ("evaluate_sampled", "evaluate.py", ["--model", "tiny", "--limit", "30", "--samples", "4",
                                                 "--temperature", "1.0"]),
            ("rounds", "research/rounds/rounds.py", ["--model", "tiny", "--dataset", "tiny_ladder_train",
                                                     "--num-problems", "10", "--val-limit", "5", "--samples", "2",
                                                     "--rounds", "1", "--test-dataset", "", "--device", "cpu"]),
            ("bands", "research/bands/bands.py", ["--model", "tiny", "--dataset", "tiny_val", "--limit", "20",
                                                  "-k", "4", "--max-new-tokens", "16"])]
    return out


def canonical(path):
    """A file's bytes; JSON and JSONL without their timing fields (seconds, tokens per second, wall clock)."""
    timing = ("seconds", "per_second", "time", "time_s", "elapsed")
    if path.suffix == ".json":
        return json.dumps(drop_keys(json.loads(path.read_text()), timing), sort_keys=True).encode()
    if path.suffix != ".jsonl":
        return path.read_bytes()
    rows = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows.append(json.dumps(drop_keys(row, timing), sort_keys=True))
    return "\n".join(rows).encode()


def drop_keys(obj, endings):
    if isinstance(obj, dict):
        return {k: drop_keys(v, endings) for k, v in obj.items() if not k.endswith(endings)}
    if isinstance(obj, list):
        return [drop_keys(v, endings) for v in obj]
    return obj


def digest(run_dir):
    """{relative path: sha256} of every result file in a run directory (configs and locks left out: they hold
    paths and the commit)."""
    skip = {"config.json", ".lock", "settings.json", "summary.json", "trainer_state.json", "pretrain.json"}
    return {str(p.relative_to(run_dir)): hashlib.sha256(canonical(p)).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name not in skip}


def run_all(repo, out, only, objectives):
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    manifest = {}
    for name, script, argv in jobs(objectives):
        if only and name not in only:
            continue
        run_dir = out / name
        r = subprocess.run([sys.executable, str(repo / script), *argv, "--out", str(run_dir)], cwd=repo, env=env,
                           capture_output=True, text=True)
        manifest[name] = dict(code=r.returncode, files=digest(run_dir) if run_dir.exists() else {})
        print(f"{name}: exit {r.returncode}, {len(manifest[name]['files'])} files"
              + (f"\n{r.stderr[-600:]}" if r.returncode else ""), flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def compare(a, b):
    ma, mb = (json.loads((Path(p) / "manifest.json").read_text()) for p in (a, b))
    same = 0
    for name in ma:
        if name not in mb:
            print(f"{name}: only in {a}")
            continue
        fa, fb = ma[name]["files"], mb[name]["files"]
        diff = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
        ok = not diff and ma[name]["code"] == mb[name]["code"] == 0
        same += ok
        print(f"{name}: {'same' if ok else 'DIFFERS'} ({len(fa)} files)" + (f": {diff[:6]}" if diff else ""))
    print(f"{same} of {len(ma)} jobs bit-identical")
    return 0 if same == len(ma) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    ap.add_argument("--repo", default=str(ROOT), help="the checkout whose scripts run (default: this one)")
    ap.add_argument("--out", help="where the jobs write, and manifest.json")
    ap.add_argument("--only", default="", help="comma-separated job names")
    ap.add_argument("--objectives", default="", help="comma-separated objectives to run (default: every row of the "
                                                     "repo's objectives table)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two --out directories")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        ap.error("--out is required (or --compare BEFORE AFTER)")
    repo = Path(args.repo).resolve()
    objectives = args.objectives.split(",") if args.objectives else subprocess.run(
        [sys.executable, "-c", "import objectives; print(' '.join(objectives.OBJECTIVES))"], cwd=repo,
        capture_output=True, text=True, check=True).stdout.split()
    run_all(repo, Path(args.out), set(filter(None, args.only.split(","))), objectives)
    return 0


if __name__ == "__main__":
    sys.exit(main())
