"""
Problem sets, a run's pools and validation split, prompt templates and the held-out guard: the first stage of the
data flow, problem -> prompt text, shared by evaluate.py, train_rl.py and research/.

MATH-500 is held out: training, tuning and selection never see it. `check_held_out` refuses any training
pool that contains a MATH-500 problem (compared after normalizing whitespace and case), and
`train_val_split` carves the validation set that tuning uses from the training pool instead.
"""

import hashlib
import json
import random
import re
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
DATASETS = {
    "math500": "math500.jsonl",  # held out: evaluation only
    "math_train": "math_train.jsonl",
    "gsm8k": "gsm8k.jsonl",
    "aime24": "aime24.jsonl",
    "aime25": "aime25.jsonl",
    "amc23": "amc23.jsonl",
    "hmmt25_feb": "hmmt25_feb.jsonl",
    "hmmt25_nov": "hmmt25_nov.jsonl",
    "minerva": "minerva.jsonl",
    "olympiadbench": "olympiadbench.jsonl",
    "tiny_train": "tiny_train.jsonl",  # the embedded tiny world (tiny.py)
    "tiny_val": "tiny_val.jsonl",
    "tiny_test": "tiny_test.jsonl",
    "tiny_ladder_train": "tiny_ladder_train.jsonl",  # the tiny world's ladder: rungs of 2-6 operations
    "tiny_ladder_val": "tiny_ladder_val.jsonl",
    "tiny_ladder_test": "tiny_ladder_test.jsonl",
    "tiny_ladder_far_train": "tiny_ladder_far_train.jsonl",  # the far rungs, 7-8 operations: no solution ever shown
    "tiny_ladder_far_val": "tiny_ladder_far_val.jsonl",
    "tiny_ladder_far_test": "tiny_ladder_far_test.jsonl",
    "tiny_ladder_far2_train": "tiny_ladder_far2_train.jsonl",  # the next far rungs, 9-10 operations, likewise
    "tiny_ladder_far2_val": "tiny_ladder_far2_val.jsonl",
    "tiny_ladder_far2_test": "tiny_ladder_far2_test.jsonl",
    "tiny_ladder_far3_train": "tiny_ladder_far3_train.jsonl",  # rungs 11-20, likewise (a 272-token budget)
    "tiny_ladder_far3_val": "tiny_ladder_far3_val.jsonl",
    "tiny_ladder_far3_test": "tiny_ladder_far3_test.jsonl",
}
HELD_OUT = "math500"

# -----------------------------------------------------------------------------
# Loading


def dataset_path(name_or_path):
    if name_or_path in DATASETS:
        return DATA_DIR / DATASETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".jsonl" or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such dataset file")
        return path
    raise ValueError(f"unknown dataset {name_or_path!r}; known: {', '.join(DATASETS)}, or a path to a .jsonl "
                     f"file with 'problem' and 'answer' fields")


def parse_json_line(path, lineno, line):
    """One JSON object from one line of a JSONL file; errors name the file and line."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"{path}:{lineno}: JSON nested too deeply to read") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise ValueError(f"{path}:{lineno}: not readable JSON ({str(e)[:200]})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
    return row


def check_id(path, lineno, row):
    """A row's "id", when it has one, is a string or an integer (it keys records, bands and responses)."""
    if "id" in row and (not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool)):
        raise ValueError(f"{path}:{lineno}: 'id' must be a string or an integer, got {type(row['id']).__name__}")


def read_jsonl(path):
    """(line number, object) for every non-blank line of a JSONL file, read as UTF-8 with or without a BOM; a line
    that is not UTF-8 is an error naming the file and line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                                 f"save the file as UTF-8") from None
            if line.strip():
                yield lineno, parse_json_line(path, lineno, line)


def load_problems(name_or_path, limit=None):
    """Rows of a dataset as dicts with at least id, source, problem, answer (errors name file and line). Names joined
    by + are concatenated (tiny_ladder_val+tiny_ladder_far_val); limit applies to the whole."""
    if "+" in str(name_or_path) and not Path(name_or_path).is_file():
        parts = str(name_or_path).split("+")
        for part in parts:
            if part not in DATASETS and not Path(part).is_file():
                raise FileNotFoundError(f"{name_or_path}: no such dataset file, nor data sets joined by + ({part!r} is "
                                        f"neither a known name nor a file); known: {', '.join(DATASETS)}")
        rows = [row for part in parts for row in load_problems(part)]
        return rows[:limit] if limit is not None else rows
    path = dataset_path(name_or_path)
    name = name_or_path if name_or_path in DATASETS else path.stem
    rows = []
    for lineno, row in read_jsonl(path):
        for key in ("problem", "answer"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise ValueError(f"{path}:{lineno}: missing or empty {key!r} field")
        check_id(path, lineno, row)
        row.setdefault("id", f"{name}/{lineno - 1:05d}")
        row.setdefault("source", name)
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise ValueError(f"{path}: no problems")
    return rows


def dataset_hash(problems):
    """A short content hash of (id, problem, answer) rows, recorded with every result."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([p["id"], p["problem"], p["answer"]], ensure_ascii=False).encode())
    return h.hexdigest()[:16]


# -----------------------------------------------------------------------------
# Held-out discipline


def normalize_problem(text):
    return re.sub(r"\s+", " ", text).strip().lower()


def check_held_out(problems, held_out=HELD_OUT):
    """Refuse a training pool that contains any problem of the held-out set."""
    banned = {normalize_problem(p["problem"]) for p in load_problems(held_out)}
    leaks = [p["id"] for p in problems if normalize_problem(p["problem"]) in banned]
    if leaks:
        raise ValueError(f"{len(leaks)} training problem(s) appear in the held-out set {held_out} "
                         f"(e.g. {leaks[:3]}); MATH-500 is never trained, tuned or selected on")
    return problems


def train_val_split(problems, val_size, seed=0):
    """Deterministic (seeded) split of a training pool into train and validation problems."""
    if not 0 <= val_size < len(problems):
        raise ValueError(f"val_size={val_size} must be in [0, {len(problems)})")
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    val_ids = set(order[:val_size])
    train = [p for i, p in enumerate(problems) if i not in val_ids]
    val = [p for i, p in enumerate(problems) if i in val_ids]
    return train, val


def load_pools(cfg):
    """(train, val, test) problem lists of a run's settings (cfg: dataset, subject, num_problems, val_dataset, val_size,
    test_dataset, seed, as train_rl.Config names them); training and validation are checked against MATH-500."""
    pool = load_problems(cfg.dataset)
    if cfg.subject:
        pool = [p for p in pool if p.get("subject") == cfg.subject]
        if not pool:
            raise ValueError(f"--subject {cfg.subject!r}: no problems of that subject in {cfg.dataset}")
    if cfg.val_dataset:
        train, val = pool, load_problems(cfg.val_dataset)
    elif cfg.num_problems:  # the first N train; validation comes from the rest of the pool
        train, rest = pool[:cfg.num_problems], pool[cfg.num_problems:]
        val = train_val_split(rest, min(cfg.val_size, len(rest) - 1), cfg.seed)[1] if len(rest) > 1 else []
    else:
        train, val = train_val_split(pool, min(cfg.val_size, len(pool) - 1), cfg.seed)
        if len(train) < len(val):
            raise ValueError(f"--val-size {cfg.val_size} carves {len(val)} of {cfg.dataset}'s {len(pool)} problems for "
                             f"validation and leaves {len(train)} to train on; lower --val-size or give --val-dataset")
    if cfg.num_problems:
        train = train[:cfg.num_problems]
    check_held_out(train + val)
    test = load_problems(cfg.test_dataset) if cfg.test_dataset else []
    return train, val, test


# -----------------------------------------------------------------------------
# Prompts: one place for every template, shared by training and evaluation

BASE_TEMPLATE = (
    "You are a helpful math assistant.\n"
    "Solve the problem and write the final answer on its own line as \\boxed{{ANSWER}}.\n\n"
    "Problem:\n{problem}\n\nSolution:"
)
CHAT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{{}}."


def format_prompt(problem, template="base"):
    """Prompt text for a problem string: `base` (plain text for base models), `chat` / `chat_think`
    (the Qwen3 chat template with thinking off / on, for chat models)."""
    if template == "base":
        return BASE_TEMPLATE.format(problem=problem.strip())
    if template in ("chat", "chat_think"):
        user = f"{problem.strip()}\n{CHAT_INSTRUCTION.format()}"
        prompt = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        # Qwen3's template turns thinking off by pre-filling an empty think block
        return prompt if template == "chat_think" else prompt + "<think>\n\n</think>\n\n"
    raise ValueError(f"unknown prompt template {template!r}; known: base, chat, chat_think")


TEMPLATES = ("base", "chat", "chat_think")

def check_prompts_fit(named_sets, tokenizer, template, budget, context):
    """Every prompt of every (name, problems) set, plus the generation budget, fits the model's context: a problem
    too long fails before anything is written, named, not mid-run. Returns each set's longest prompt in tokens."""
    longest = []
    for name, rows in named_sets:
        longest.append(0)
        for p in rows:
            n = len(encode_prompt(tokenizer, format_prompt(p["problem"], template), name, p))
            if n + budget > context:
                raise ValueError(f"{name}: problem {p['id']!r} has a {n}-token prompt, which with a {budget}-token "
                                 f"budget exceeds the model's {context}-token context; drop it or lower the budget")
            longest[-1] = max(longest[-1], n)
    return longest


def encode_prompt(tokenizer, text, name, problem):
    """The token ids of a prompt; a character the tokenizer cannot encode (the tiny world's has no unknown token) is
    an error naming the data set, the problem and the characters."""
    try:
        return tokenizer.encode(text)
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception ("WordLevel error: Missing [UNK] ...")
        bad = []
        for c in sorted(set(text)):
            try:
                tokenizer.encode(c)
            except Exception:  # noqa: BLE001
                bad.append(c)
        raise ValueError(f"{name}: problem {problem['id']!r} has characters the model's tokenizer cannot encode "
                         f"({', '.join(map(repr, bad[:10])) or e}); drop the problem or use another model") from None
