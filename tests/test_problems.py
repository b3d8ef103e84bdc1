"""problems.py: every data set the repo ships, loaded by name and checked row by row against its schema and
data/SHA256SUMS; the held-out guard; the prompt templates."""

import hashlib
import json

import pytest

import model as M
import problems as P
import checkpoint

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
    provenance = (checkpoint.QWEN3_TOKENIZER.parent / "PROVENANCE.md").read_text()
    assert hashlib.sha256(checkpoint.QWEN3_TOKENIZER.read_bytes()).hexdigest() in provenance
    tok = checkpoint.load_tokenizer(checkpoint.QWEN3_TOKENIZER)
    assert tok.encode("Hello world") == [9707, 1879]  # reference encodings from PROVENANCE.md
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert (tok.eos_id, tok.im_end_id, tok.vocab_size) == (151643, 151645, 151669)


def test_held_out_guard_sees_through_case_and_whitespace():
    math500 = P.load_problems("math500")
    disguised = dict(id="x", problem="  " + math500[7]["problem"].upper().replace(" ", " \n\t "), answer="1")
    with pytest.raises(ValueError, match="held-out set math500.*\\['x'\\]"):
        P.check_held_out([dict(id="ok", problem="What is 1 + 1?", answer="2"), disguised])
    P.check_held_out([dict(id="near", problem=math500[7]["problem"] + " Explain.", answer="1")])  # not a copy


# The generation-prompt part of Qwen3's published chat template (tokenizer_config.json of the Qwen3 models):
# a user turn, then the assistant header, then the empty think block when enable_thinking is false.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")


def test_chat_templates_render_as_qwen3s_own_template():
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=str(checkpoint.QWEN3_TOKENIZER))
    problem = "What is $1 + 1$?"
    user = [dict(role="user", content=f"{problem}\n{P.CHAT_INSTRUCTION.format()}")]
    for template, thinking in (("chat", False), ("chat_think", True)):
        reference = hf.apply_chat_template(user, chat_template=QWEN3_TEMPLATE, tokenize=False,
                                           add_generation_prompt=True, enable_thinking=thinking)
        assert P.format_prompt(problem, template) == reference, template
    assert P.format_prompt(problem, "chat").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with pytest.raises(ValueError, match="unknown prompt template 'chatml'"):
        P.format_prompt(problem, "chatml")


def test_rows_that_are_not_objects_name_the_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"problem": "1 + 1", "answer": "2"}\n\n["problem", "answer"]\n')
    with pytest.raises(ValueError, match="rows.jsonl:3: expected a JSON object, got list"):
        P.load_problems(str(path))


def test_train_val_split_is_seeded_disjoint_and_bounded():
    pool = [dict(id=f"p{i}") for i in range(10)]
    train, val = P.train_val_split(pool, 3, seed=1)
    assert len(val) == 3 and len(train) == 7 and {p["id"] for p in train} | {p["id"] for p in val} == {f"p{i}" for i in range(10)}
    assert [p["id"] for p in train] == sorted((p["id"] for p in train), key=lambda i: int(i[1:]))  # pool order kept
    assert (train, val) == P.train_val_split(pool, 3, seed=1) and val != P.train_val_split(pool, 3, seed=2)[1]
    assert P.train_val_split(pool, 0) == (pool, [])
    for bad in (-1, 10):
        with pytest.raises(ValueError, match=f"val_size={bad} must be in \\[0, 10\\)"):
            P.train_val_split(pool, bad)


def test_dataset_hash_is_16_hex_digits_of_id_problem_answer():
    rows = [dict(id="a", problem="1 + 1", answer="2", level=1)]
    expected = hashlib.sha256(json.dumps(["a", "1 + 1", "2"], ensure_ascii=False).encode()).hexdigest()[:16]
    assert P.dataset_hash(rows) == expected
    assert P.dataset_hash([dict(rows[0], level=5)]) == expected  # other fields do not version the data
    assert P.dataset_hash([dict(rows[0], answer="3")]) != expected


def test_dataset_names_and_paths(tmp_path):
    assert P.dataset_path("math500") == P.DATA_DIR / "math500.jsonl"
    other = tmp_path / "pool.txt"  # any existing file is read as JSONL, whatever its suffix
    other.write_text(json.dumps(dict(problem="1 + 1", answer="2")) + "\n")
    assert P.load_problems(str(other)) == [dict(problem="1 + 1", answer="2", id="pool/00000", source="pool")]
    with pytest.raises(FileNotFoundError, match="missing.jsonl: no such dataset file"):
        P.load_problems(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="unknown dataset 'math5000'; known: math500"):
        P.load_problems("math5000")


@pytest.mark.parametrize("line, words", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # json.loads raises RecursionError, not JSONDecodeError
    ('{"problem": "1+1", "answer": ' + "9" * 5000 + "}", "digits"),  # Python's int-string conversion limit
    ('{"id": ["a"], "problem": "1+1", "answer": "2"}', "'id' must be a string or an integer, got list"),
    ('{"id": null, "problem": "1+1", "answer": "2"}', "'id' must be"),
], ids=["deep", "digits", "list-id", "null-id"])
def test_hostile_data_lines_name_the_file_and_line(tmp_path, line, words):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "2+2", "answer": "4"}\n' + line + "\n")
    with pytest.raises(ValueError) as e:
        P.load_problems(path)
    assert str(e.value).startswith(f"{path}:2: ") and words in str(e.value)


def test_a_plus_in_a_file_name_is_a_file_not_two_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my+data.jsonl").write_text('{"problem": "2+2", "answer": "4"}\n')
    assert [p["answer"] for p in P.load_problems("my+data.jsonl")] == ["4"]
    with pytest.raises(FileNotFoundError) as e:  # missing: the whole value is named, not its first part
        P.load_problems("other+data.jsonl")
    assert str(e.value).startswith("other+data.jsonl: no such dataset file")
    assert len(P.load_problems("tiny_val+tiny_test")) == len(P.load_problems("tiny_val")) + len(P.load_problems("tiny_test"))


def test_a_character_the_tokenizer_lacks_names_the_set_and_problem():
    tok = checkpoint.load_tokenizer("tiny")  # the tiny world's character tokenizer has no unknown token
    rows = [{"id": "ok", "problem": "1 + 2"}, {"id": "q7", "problem": "1 + \u00e9 + 2"}]
    with pytest.raises(ValueError) as e:
        P.check_prompts_fit([("my.jsonl", rows)], tok, "base", 16, 512)
    assert str(e.value).startswith("my.jsonl: problem 'q7' has characters") and "'\u00e9'" in str(e.value)
