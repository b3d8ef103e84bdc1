"""
How many planted bugs does the test suite catch? Mutation testing of the core files (train_rl.py, objectives.py,
runs.py, evaluate.py, problems.py, verify.py and symbolic.py by default; any file TESTS names): each mutant is one
small change (a comparison or arithmetic operator swapped, a constant moved by one, a condition forced false, an
error left unraised, a statement dropped), applied in a scratch copy of the repo; the file's own tests run against
it, and a mutant that passes them all survives.

    python benchmarks/mutation.py                     # 70 seeded mutants over the seven files (~35 min, not re-timed)
    python benchmarks/mutation.py --per-file 4 --files problems.py   # a quick look
    python benchmarks/mutation.py --rev REV           # the same draw over git REV's code, judged by its tests

Mutants are drawn from the functions' bodies only (not docstrings, module constants or the CLI's __main__),
with a seed, so a rerun draws the same ones. A mutant that makes the tests time out counts as caught. A
surviving mutant is a place to look: either a missing test or a change that does not alter behaviour (an
equivalent mutant); the report prints each survivor's line so a reader can tell which.
"""

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The tests that own each file (tests mirror files; the command-line tests cover every script). A `-k` filter
# leaves out the slow tiny-world training runs; it applies to every file listed with it.
NOT_SLOW = ["-k", "not tiny_world_rl"]
TESTS = {
    "train_rl.py": ["tests/test_train_rl.py", "tests/test_cli.py", *NOT_SLOW],
    # the flags' ranges (ObjectiveConfig's fields) and paper defaults are checked through train_rl.Config
    "objectives.py": ["tests/test_objectives.py", "tests/test_train_rl.py", *NOT_SLOW],
    "reward.py": ["tests/test_reward.py", "tests/test_train_rl.py", *NOT_SLOW],
    # no test_runs.py: the run directory, logs and training checkpoints are exercised by the scripts that write them
    "runs.py": ["tests/test_train_rl.py", "tests/test_evaluate.py", "tests/test_cli.py", *NOT_SLOW],
    "evaluate.py": ["tests/test_evaluate.py", "tests/test_cli.py"],
    # load_pools (the subject filter, the num_problems carve-out) is tested in test_train_rl.py
    "problems.py": ["tests/test_problems.py", "tests/test_evaluate.py", "tests/test_cli.py", "tests/test_train_rl.py",
                    *NOT_SLOW],
    "verify.py": ["tests/test_verify.py"],
    "symbolic.py": ["tests/test_symbolic.py", "tests/test_verify.py"],  # is_equivalent runs it end to end
    # the caches are tested through the sampler; config.json parsing errors through checkpoint.load_model
    "model.py": ["tests/test_model.py", "tests/test_checkpoint.py", "tests/test_sample.py"],
    "model_kernels.py": ["tests/test_model_kernels.py", "tests/test_model.py"],
    "checkpoint.py": ["tests/test_checkpoint.py", "tests/test_model.py"],
    "looped.py": ["tests/test_looped.py"],
    "model_options.py": ["tests/test_looped.py"],  # evaluate.py --loop, on a plain and on a looped checkpoint
    "stats.py": ["tests/test_stats.py"],
    "diversity.py": ["tests/test_diversity.py"],
}
# The planted bugs of issue #21 (every one survived the suite then): (file, text, replacement, what it breaks).
# `python benchmarks/mutation.py --named` checks that each is now caught. Re-pointed after the split of train_rl.py
# (objectives.py, runs.py, problems.load_pools) and model.py (checkpoint.py): each text occurs once in its file.
NAMED = [
    ("train_rl.py", "return cfg.lr * (step + 1) / cfg.warmup_steps", "return cfg.lr", "lr_at: no warmup"),
    ("train_rl.py", "return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))", "return cfg.lr", "lr_at: cosine constant"),
    ("train_rl.py", "return cfg.lr * (1 - progress)", "return cfg.lr", "lr_at: linear constant"),
    ("runs.py", 'tmp.write_text("".join(json.dumps(row) + "\\n" for row in keep))', "pass",
     "truncate_log (was truncate_jsonl): a no-op"),
    ("train_rl.py", 'selection, unlogged=pending if logged < done else None)',
     'selection, unlogged=None)', "Ctrl-C loses the step's pending log lines"),
    ("reward.py", "return max(-1.0, (budget - buffer - length) / buffer)", "return 0.0", "no overlong penalty"),
    ("reward.py", "return -cfg.format_penalty if", "return 0.0 if", "--format-penalty ignored"),
    ("runs.py", "policy.load_state_dict(adapters, strict=False)", "pass", "LoRA adapters not resumed"),
    ("problems.py", 'pool = [p for p in pool if p.get("subject") == cfg.subject]', "pool = pool",
     "--subject ignored (load_pools)"),
    ("problems.py", "train, rest = pool[:cfg.num_problems], pool[cfg.num_problems:]", "train, rest = pool, pool",
     "num_problems carve-out: validation overlaps training (load_pools)"),
    ("train_rl.py", "if test_set and start_step == 0:", "if False:", "no test evaluation before training"),
    ("train_rl.py", "    if test_set:\n        acc, _ = evaluate_accuracy", "    if False:\n        acc, _ = evaluate_accuracy",
     "no test evaluation after training"),
    # the flags' ranges are now declared on their fields (cli.check_fields): the bug is a field without its range
    ("train_rl.py", '"accumulation)", range="[1, inf)")', '"accumulation)")',
     "micro_batch_tokens 0 accepted (its field's range removed)"),
    ("objectives.py", '"mu: updates per batch of rollouts (> 1 uses the clipped ratio)", range="[1, inf)")',
     '"mu: updates per batch of rollouts (> 1 uses the clipped ratio)")',
     "epochs_per_batch 0 accepted (its field's range removed)"),
    ("objectives.py", "\"0.28, else 0.2)\", range=\"[0, inf)\")", "\"0.28, else 0.2)\")",
     "negative clip_high accepted (its field's range removed)"),
    ("evaluate.py", 'raise ValueError(f"problem ids are not unique', 'None if True else ValueError(f"problem ids are not unique',
     "duplicate problem ids accepted"),
    ("evaluate.py", "raise ValueError(f\"{path}:{lineno}: id {r['id']!r} was already recorded",
     "None if True else ValueError(f\"{path}:{lineno}: id {r['id']!r} was already recorded", "duplicate record ids accepted"),
    ("evaluate.py", 'raise ValueError(f"{out_dir}: holds another evaluation', 'None if True else ValueError(f"{out_dir}: holds another evaluation',
     "--responses overwrites another run"),
    ("evaluate.py", 'raise ValueError(f"{path}: problems have different numbers', 'None if True else ValueError(f"{path}: problems have different numbers',
     "unequal response counts accepted"),
    ("evaluate.py", 'raise ValueError(f"problem {i!r} has reference answer', 'None if True else ValueError(f"problem {i!r} has reference answer',
     "compare across data versions"),
    ("problems.py", 'return re.sub(r"\\s+", " ", text).strip().lower()', "return text", "held-out guard: exact copies only"),
    ("problems.py", 'else prompt + "<think>\\n\\n</think>\\n\\n"', "else prompt", "chat template without the empty think block"),
    ("model.py", "if self.num_attention_heads % self.num_key_value_heads:", "if False:", "heads % kv_heads unchecked"),
    ("checkpoint.py", 'if name.count("/") != 1 or name.startswith((".", "/")) or', 'if False and name.count("/") != 1 or',
     "bad repo ids go to the network"),
    ("checkpoint.py", 'shards = sorted(set(index["weight_map"].values()))', 'shards = ["model.safetensors"]',
     "sharded downloads ignore the index"),
    ("checkpoint.py", "if total and done != total:", "if False:", "truncated downloads kept"),
    ("model.py", 'raise ValueError(f"{path}: not valid JSON ({e})") from None', "raise", "bad config.json unnamed"),
    ("checkpoint.py", 'raise ValueError(f"{path}: not a valid tokenizer.json ({e})") from None', "raise",
     "bad tokenizer.json unnamed"),
    ("model_kernels.py", "dot.unsqueeze(-1).div_(-x_hat.shape[-1])", "dot.unsqueeze(-1).div_(-x_hat.shape[-1] - 1)",
     "RMSNorm backward off by a little"),
]
SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
         ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.Add: ast.Sub,
         ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.And: ast.Or, ast.Or: ast.And}


def swapped(node):
    """A copy of a Compare/BinOp/BoolOp node with its (first) operator swapped, or None."""
    new = ast.parse(ast.unparse(node), mode="eval").body
    if isinstance(new, ast.Compare) and type(new.ops[0]) in SWAPS:
        new.ops[0] = SWAPS[type(new.ops[0])]()
    elif isinstance(new, ast.BinOp) and any(isinstance(x, ast.JoinedStr) or isinstance(x, ast.Constant) and
                                            isinstance(x.value, str) for x in (new.left, new.right)):
        return None  # "a" - "b" only raises a TypeError: a mutant any test catches
    elif isinstance(new, (ast.BinOp, ast.BoolOp)) and type(new.op) in SWAPS:
        new.op = SWAPS[type(new.op)]()
    else:
        return None
    return ast.unparse(new)


def candidates(source):
    """(line, col, end_line, end_col, replacement, what) for every mutation point inside a function body."""
    tree, out = ast.parse(source), []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and \
            isinstance(fn.body[0].value, ast.Constant) and isinstance(fn.body[0].value.value, str) else fn.body
        for stmt in body:
            for node in ast.walk(stmt):
                span = (getattr(node, "lineno", None), getattr(node, "col_offset", None),
                        getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None))
                if None in span:
                    continue
                if isinstance(node, (ast.Compare, ast.BinOp, ast.BoolOp)) and (text := swapped(node)):
                    out.append((*span, text, "operator swapped"))
                elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value not in (0, 1):
                    out.append((*span, repr(node.value + 1 if isinstance(node.value, int) else node.value * 2),
                                "constant changed"))
                elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                    out.append((*span, ast.unparse(node.operand), "`not` dropped"))
                elif isinstance(node, ast.If):
                    t = node.test
                    out.append((t.lineno, t.col_offset, t.end_lineno, t.end_col_offset, "False", "condition forced false"))
                elif isinstance(node, ast.Raise):
                    out.append((*span, "pass", "error not raised"))
                elif isinstance(node, ast.AugAssign) or isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                    out.append((*span, "pass", "statement dropped"))  # x += ..., f(...): a side effect lost
    return out


def apply(source, mutant):
    """The source with the span replaced (lines are 1-based, columns are byte offsets as ast gives them)."""
    line, col, end_line, end_col, text, _ = mutant
    lines = source.encode().splitlines(keepends=True)
    start = sum(len(x) for x in lines[:line - 1]) + col
    end = sum(len(x) for x in lines[:end_line - 1]) + end_col
    raw = source.encode()
    return (raw[:start] + text.encode() + raw[end:]).decode()


def draw(root, name, k, seed):
    """k seeded mutants of one file that still compile: [(mutant, mutated source)]."""
    source = (root / name).read_text()
    pool = candidates(source)
    random.Random(f"{seed}/{name}").shuffle(pool)
    chosen = []
    for m in pool:
        mutated = apply(source, m)
        if mutated == source:
            continue
        try:
            compile(mutated, name, "exec")
        except SyntaxError:
            continue
        chosen.append((m, mutated))
        if len(chosen) == k:
            break
    return chosen


def run_tests(workdir, name, timeout):
    """'caught' when the file's tests fail or time out, else 'survived'."""
    tests = [t for t in TESTS[name] if not t.endswith(".py") or (workdir / t).is_file()]  # an older rev has fewer
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    try:
        r = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    except subprocess.TimeoutExpired:
        return "caught (timeout)"
    return "survived" if r.returncode == 0 else "caught"


def scratch_copy(rev):
    """A copy of the working tree, or of git revision rev (its code and its tests), to mutate."""
    tmp = Path(tempfile.mkdtemp(prefix="mutants-"))
    if rev:
        (tmp / "repo").mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tmp / "repo")], input=archive.stdout, check=True)
    else:
        shutil.copytree(ROOT, tmp / "repo", ignore=shutil.ignore_patterns(".git", "runs", "__pycache__", ".pytest_cache"))
    return tmp / "repo"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files",
                    default="train_rl.py,objectives.py,runs.py,evaluate.py,problems.py,verify.py,symbolic.py",
                    help=f"comma-separated, each one of {', '.join(TESTS)}")
    ap.add_argument("--per-file", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rev", default="", help="mutate this git revision (its code, judged by its tests) instead")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default="", help="also write the results as JSON here")
    ap.add_argument("--named", action="store_true", help="run the planted bugs of NAMED instead of a random draw")
    args = ap.parse_args()
    work = scratch_copy(args.rev)
    if args.named:
        return run_named(work, args.timeout)
    rows = []
    try:
        check_baseline(work, args.files.split(","), args.timeout)
        for name in args.files.split(","):
            original = (work / name).read_text()
            for (line, col, _, _, text, what), mutated in draw(work, name, args.per_file, args.seed):
                (work / name).write_text(mutated)
                t0 = time.time()
                verdict = run_tests(work, name, args.timeout)
                (work / name).write_text(original)
                code = original.splitlines()[line - 1].strip()
                rows.append(dict(file=name, line=line, what=what, replacement=text, code=code, verdict=verdict,
                                 seconds=round(time.time() - t0, 1)))
                print(f"{name}:{line} {what} -> {text!r}: {verdict} ({rows[-1]['seconds']}s)   {code[:90]}", flush=True)
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)
    print(f"\n| file | mutants | caught | survived |\n|---|---:|---:|---:|")
    for name in args.files.split(","):
        mine = [r for r in rows if r["file"] == name]
        alive = sum(r["verdict"] == "survived" for r in mine)
        print(f"| {name} | {len(mine)} | {len(mine) - alive} | {alive} |")
    print("\nsurvivors:")
    for r in rows:
        if r["verdict"] == "survived":
            print(f"  {r['file']}:{r['line']} {r['what']} -> {r['replacement']!r}   {r['code'][:100]}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


def check_baseline(work, names, timeout):
    """The unmutated tests must pass, or every mutant would look caught."""
    for name in names:
        if run_tests(work, name, timeout) != "survived":
            raise SystemExit(f"mutation.py: error: the tests of {name} fail before any mutation ({' '.join(TESTS[name])})")


def run_named(work, timeout):
    """Each NAMED mutant against its file's tests: a table of caught / survived."""
    try:
        check_baseline(work, sorted({name for name, *_ in NAMED}), timeout)
        print("| planted bug | file | verdict |\n|---|---|---|")
        for name, old, new, what in NAMED:
            original = (work / name).read_text()
            assert original.count(old) == 1, f"{name}: {old!r} is not in the file exactly once"
            (work / name).write_text(original.replace(old, new))
            print(f"| {what} | {name} | {run_tests(work, name, timeout)} |", flush=True)
            (work / name).write_text(original)
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
