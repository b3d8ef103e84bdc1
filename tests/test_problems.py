"""problems.py: every data set the repo ships, loaded by name and checked row by row against its schema and
data/SHA256SUMS; the held-out guard; the prompt templates."""

import hashlib
import json

import pytest

import model as M
import problems as P

SUMS = dict(reversed(line.split("  ")) for line in (P.DATA_DIR / "SHA256SUMS").read_text().splitlines())


def test_every_shipped_file_is_a_named_dataset_with_a_hash():
    shipped = {p.name for p in P.DATA_DIR.glob("*.jsonl")}
    assert shipped == set(P.DATASETS.values()) == {n for n in SUMS if n.endswith(".jsonl")}


@pytest.mark.parametrize("name", list(P.DATASETS))
def test_shipped_dataset_rows_match_the_schema(name):
    path = P.DATA_DIR / P.DATASETS[name]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SUMS[path.name], f"{path.name}: hash differs from SHA256SUMS"
    raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for lineno, row in enumerate(raw, 1):
        where = f"{path.name}:{lineno}"
        for key in ("id", "source", "problem", "answer"):
            assert isinstance(row.get(key), str) and row[key].strip(), f"{where}: empty or missing {key!r}"
        if "level" in row:  # MATH levels 1-5 (a few MATH problems have none), tiny-world operation counts
            assert row["level"] is None or (type(row["level"]) is int and row["level"] >= 1), where
        if "subject" in row:
            assert isinstance(row["subject"], str) and row["subject"], where
        if "solution" in row:
            assert isinstance(row["solution"], str) and row["solution"].strip(), where
    ids = [r["id"] for r in raw]
    assert len(set(ids)) == len(ids), f"{path.name}: duplicate ids"
    loaded = P.load_problems(name)  # the loader accepts every row and keeps the file's ids
    assert [r["id"] for r in loaded] == ids


def test_math_training_pool_keeps_its_documented_shape():
    pool = P.load_problems("math_train")
    algebra = [p for p in pool if p["subject"] == "Algebra"]
    assert len(pool) == 12000 and pool[:len(algebra)] == algebra  # "ordered by subject, Algebra first"
    fixed = {p["id"]: p["answer"] for p in pool if p["id"] in ("math_train/07828", "math_train/08228")}
    assert fixed == {"math_train/07828": "\\text{(A)}", "math_train/08228": "\\text{(A)}"}
    P.check_held_out(pool)  # the training pool shares no problem with MATH-500


def test_shipped_qwen3_tokenizer_is_the_documented_file():
    provenance = (M.QWEN3_TOKENIZER.parent / "PROVENANCE.md").read_text()
    assert hashlib.sha256(M.QWEN3_TOKENIZER.read_bytes()).hexdigest() in provenance
    tok = M.load_tokenizer(M.QWEN3_TOKENIZER)
    assert tok.encode("Hello world") == [9707, 1879]  # reference encodings from PROVENANCE.md
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert (tok.eos_id, tok.im_end_id, tok.vocab_size) == (151643, 151645, 151669)
