"""The embedded tiny world: task generator, splits, tokenizer, pretraining, and the committed files."""

import hashlib
import os
import json
import random
import re

import pytest
import torch

import model as qwen
import tiny
from problems import DATA_DIR, format_prompt, load_problems
import checkpoint
import coupled
import verify

SEED = tiny.TinyConfig().seed  # the seed the committed files were built from


def evaluate_text(text):
    """Value of an expression over + - * ( ) with the usual precedence: our own recursive descent, so the
    rendered text (its parentheses) is checked independently of the generator."""
    tokens = re.findall(r"\d+|[-+*()]", text)
    assert "".join(tokens) == text.replace(" ", ""), f"unexpected characters in {text!r}"
    value, rest = _sum(tokens)
    assert not rest, f"trailing tokens {rest} in {text!r}"
    return value


def _sum(tokens):
    value, tokens = _product(tokens)
    while tokens and tokens[0] in "+-":
        op, (rhs, tokens) = tokens[0], _product(tokens[1:])
        value = value + rhs if op == "+" else value - rhs
    return value, tokens


def _product(tokens):
    value, tokens = _atom(tokens)
    while tokens and tokens[0] == "*":
        rhs, tokens = _atom(tokens[1:])
        value *= rhs
    return value, tokens


def _atom(tokens):
    if tokens[0] == "(":
        value, tokens = _sum(tokens[1:])
        assert tokens[0] == ")"
        return value, tokens[1:]
    return int(tokens[0]), tokens[1:]


def check_solution(row):
    """Every step line is true arithmetic, each step uses the previous result, and the box holds the answer."""
    *steps, box = row["solution"].split("\n")
    assert box == f"\\boxed{{{row['answer']}}}"
    assert len(steps) == row["level"]
    previous = None
    for step in steps:
        a, op, b, eq, c = step.split(" ")
        assert eq == "="
        a, b, c = int(a), int(b), int(c)
        assert c == {"+": a + b, "-": a - b, "*": a * b}[op], step
        assert previous is None or a == previous
        assert 0 <= c <= tiny.MAX_VALUE
        previous = c
    assert previous == int(row["answer"])


def test_make_problem_is_deterministic_and_correct():
    first = [tiny.make_problem(random.Random(7), n) for n in (2, 3)]
    again = [tiny.make_problem(random.Random(7), n) for n in (2, 3)]
    assert first == again
    rng = random.Random(1)
    for _ in range(2000):
        p = tiny.make_problem(rng, rng.choice(tiny.LEVELS))
        assert len(p["ops"]) == p["level"] and len(p["numbers"]) == p["level"] + 1
        assert all(1 <= n <= 99 for n in p["numbers"])
        value = p["numbers"][0]  # left to right, from the structured form
        for op, n in zip(p["ops"], p["numbers"][1:]):
            value = {"+": value + n, "-": value - n, "*": value * n}[op]
            assert 0 <= value <= tiny.MAX_VALUE
        assert int(p["answer"]) == value == evaluate_text(p["problem"])
        check_solution(p)


def test_splits_are_deterministic_and_disjoint():
    sizes = {"test": 50, "val": 50, "train": 400}
    splits = tiny.make_splits(3, sizes)
    assert splits == tiny.make_splits(3, sizes)
    assert splits != tiny.make_splits(4, sizes)
    assert {k: len(v) for k, v in splits.items()} == sizes
    texts = [r["problem"] for rows in splits.values() for r in rows]
    assert len(set(texts)) == len(texts)
    # the test split does not move when the train split grows
    assert tiny.make_splits(3, {"test": 50, "val": 50, "train": 800})["test"] == splits["test"]


def test_committed_data_matches_generator():
    splits = tiny.make_splits(SEED)
    for name, rows in splits.items():
        path = DATA_DIR / f"tiny_{name}.jsonl"
        committed = [json.loads(line) for line in path.read_text().splitlines()]
        assert committed == rows, f"{path} differs from make_splits({SEED}); rebuild with `python tiny.py`"
        assert load_problems(f"tiny_{name}")[0]["id"] == f"tiny_{name}/00000"
    texts = [{r["problem"] for r in rows} for rows in splits.values()]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    for rows in splits.values():
        for r in rows:
            assert r["source"] == "tiny" and int(r["answer"]) == evaluate_text(r["problem"])
            check_solution(r)


def test_tokenizer_round_trip(tmp_path):
    rows = tiny.make_splits(0, {"test": 20, "val": 20, "train": 200})["train"]
    texts = [format_prompt("")] + [r["problem"] + r["solution"] for r in rows]
    tok = tiny.build_tokenizer(texts, tmp_path / "tokenizer.json")
    assert tok.eos_id == 0 and tok.pad_id == tok.eos_id
    for r in rows[:20]:
        text = format_prompt(r["problem"]) + tiny.completion_text(r, bare=False)
        ids = tok.encode(text)
        assert len(ids) == len(text)  # one token per character
        assert tok.decode(ids) == text
    assert tok.encode("1 \n\n2" + tiny.EOS)[-1] == tok.eos_id
    assert tok.decode(tok.encode("  a\n \\boxed{7}" + tiny.EOS)) == "  a\n \\boxed{7}"


def tokenizer_for(rows, tmp_path):
    return tiny.build_tokenizer([format_prompt("")] + [r["problem"] + r["solution"] for r in rows],
                                tmp_path / "tokenizer.json")


def test_solution_line_k_uses_the_problems_number_k_plus_1_as_coupling_assumes():
    """coupled.coupled_positions puts line k at the chain's (k + 1)-th number: every worked solution of the ladder's
    generator uses them in that order (line 1 also starts from number 1)."""
    rows = tiny.make_ladder(0, {"train": 20}, levels=(2, 3, 4, 5, 6, 10, 20))["ladder_train"]
    for row in rows:
        numbers = re.findall(r"\d+", row["problem"])
        lines = row["solution"].strip().split("\n")[:-1]  # the last line is the box
        assert len(lines) == len(numbers) - 1 == row["level"]
        assert lines[0].split()[0] == numbers[0]
        for k, line in enumerate(lines, 1):
            assert line.split()[2] == numbers[k], (row["problem"], line)


@pytest.mark.parametrize("couple", [False, True])
def test_shared_head_forward_equals_the_full_forward(tmp_path, couple):
    rows = tiny.make_splits(0, {"test": 1, "val": 1, "train": 8})["train"]
    tok = tokenizer_for(rows, tmp_path)
    model = tiny.new_model(tok, seed=0, couple=couple)
    assert (model.config.position_coupling is not None) == couple
    head, inputs, targets, mask = tiny.make_batch(tok, rows, [i % 2 == 0 for i in range(8)])
    full = torch.cat([head.expand(len(rows), -1), inputs], 1)
    assert tok.decode(full[0].tolist()).startswith(format_prompt(rows[0]["problem"]))
    assert tok.decode(targets[1][mask[1].bool()].tolist(), skip_special_tokens=False) == \
        tiny.completion_text(rows[1], bare=False) + tiny.EOS
    shared = tiny.forward_shared_head(model, head, inputs)
    plain = model(full)[:, len(head):]
    assert (shared - plain).abs().max().item() < 1e-5
    g_shared = torch.autograd.grad(shared.square().mean(), list(model.parameters()))
    g_plain = torch.autograd.grad(model(full)[:, len(head):].square().mean(), list(model.parameters()))
    assert max((a - b).abs().max().item() for a, b in zip(g_shared, g_plain)) < 1e-5


def test_short_pretraining_lowers_the_loss(tmp_path):
    rows = tiny.make_splits(0, {"test": 10, "val": 10, "train": 500})["train"]
    tok = tokenizer_for(rows, tmp_path)
    model = tiny.new_model(tok, seed=0)
    cfg = tiny.TinyConfig(steps=40, batch_size=8, warmup=5, eval_every=0)
    losses = tiny.pretrain(model, tok, rows, cfg, log=lambda msg: None)
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    again = tiny.new_model(tok, seed=0)  # the same seed replays the same run (within warmup the schedule is the same)
    assert tiny.pretrain(again, tok, rows, tiny.TinyConfig(steps=3, batch_size=8, warmup=5, eval_every=0),
                         log=lambda msg: None) == losses[:3]


def test_rope_theta_1e300_leaves_only_the_first_rotary_pair_turning(tmp_path):
    """NoPE as a Qwen3 config (Kazemnejad et al. 2023): inv_freq = theta^(-2i/d) is 1 for pair 0 and 0 for
    every other pair, so queries and keys meet with no position in them but one pair at 1 radian per token."""
    rows = tiny.make_splits(0, {"test": 1, "val": 1, "train": 8})["train"]
    model = tiny.new_model(tokenizer_for(rows, tmp_path), seed=0, rope_theta=1e300)
    c = model.config
    assert c.rope_theta == 1e300 and json.loads(json.dumps(c.rope_theta)) == 1e300  # survives config.json
    positions = torch.arange(300)[None]
    cos, sin = qwen.rope_cos_sin(positions, c.head_dim, c.rope_theta, torch.float32)
    half = c.head_dim // 2
    angle = positions[0].float()  # pair 0 lives at dims 0 and half (Qwen rotates halves; sin is -sin on the first)
    for dim, sign in ((0, -1), (half, 1)):
        assert torch.allclose(cos[0, :, 0, dim], angle.cos(), atol=1e-5)
        assert torch.allclose(sin[0, :, 0, dim], sign * angle.sin(), atol=1e-5)
    others = [d for d in range(c.head_dim) if d % half != 0]
    assert (cos[..., others] == 1).all() and (sin[..., others] == 0).all()


@pytest.fixture(scope="module")
def committed():
    return checkpoint.load_model("tiny", device="cpu"), checkpoint.load_tokenizer("tiny")


def test_committed_checkpoint_matches_transformers(committed):
    transformers = pytest.importorskip("transformers")
    model, tok = committed
    assert model.config.vocab_size >= tok.vocab_size and model.config.eos_token_id == tok.eos_id
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint.TINY_MODEL_DIR), dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode(format_prompt("(37 + 12) * 3 - 45") + "\n37 + 12 = 49")])
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_committed_checkpoint_decodes_batched_as_alone(committed):
    model, tok = committed
    rows = load_problems("tiny_test", limit=6)
    problems = [r["problem"] for r in rows]  # different lengths, so the batch is left-padded
    batched = tiny.greedy_complete(model, tok, problems)
    alone = [tiny.greedy_complete(model, tok, [p])[0] for p in problems]
    assert batched == alone
    assert all(c.rstrip().endswith("}") for c in batched), batched


def test_committed_checkpoint_is_sometimes_right_as_recorded(committed):
    # the record tiny.py wrote at build time, recomputed from the committed files: "sometimes right" means
    # greedy test accuracy well inside (10%, 60%), with the planted direct-answer habit
    model, tok = committed
    recorded = json.loads((checkpoint.TINY_MODEL_DIR / "pretrain.json").read_text())
    assert recorded["config"]["steps"] == tiny.TinyConfig().steps and recorded["config"]["seed"] == SEED
    metrics = tiny.evaluate(model, tok, load_problems("tiny_test"))
    assert metrics == pytest.approx(recorded["test"], abs=1e-9)
    assert 0.10 < metrics["accuracy"] < 0.60 and metrics["direct_share"] > 0.3


def test_couple_writes_a_coupled_checkpoint_whose_ids_are_the_colon_newline_and_digits(tmp_path, monkeypatch):
    monkeypatch.setattr(tiny, "evaluate", lambda model, tok, rows: dict(
        accuracy=0.0, accuracy_level2=0.0, accuracy_level3=0.0, direct_share=0.0, n=len(rows)))
    tiny.main(["--couple", "--steps", "2", "--batch-size", "4", "--warmup", "1", "--out", str(tmp_path / "out"),
               "--data-dir", str(tmp_path / "data")])
    model, tok = checkpoint.load_model(tmp_path / "out", device="cpu"), checkpoint.load_tokenizer(tmp_path / "out")
    c = model.config.position_coupling
    assert type(model) is coupled.CoupledQwen3  # config.json says model_type coupled_qwen3
    assert [tok.decode([c["colon"]]), tok.decode([c["newline"]])] == [":", "\n"]
    assert [tok.decode([d]) for d in c["digits"]] == list("0123456789")


# -----------------------------------------------------------------------------
# --init: a mid-training that continues a checkpoint, and the ladder's checkpoint built by one


def test_init_continues_a_checkpoint_as_pretrain_would(tmp_path, monkeypatch):
    # tiny.py --init tiny writes what tiny.pretrain gives when it continues the loaded checkpoint on the same
    # mix (long solutions included), with the checkpoint's own tokenizer; the evaluations are tested below
    monkeypatch.setattr(tiny, "evaluate", lambda model, tok, rows: dict(
        accuracy=0.0, accuracy_level2=0.0, accuracy_level3=0.0, direct_share=0.0, n=len(rows)))
    monkeypatch.setattr(tiny, "evaluate_ladder", lambda model, tok, rows: {"n": len(rows)})
    flags = dict(steps=3, batch_size=6, lr=3e-4, warmup=1, min_lr_frac=1.0, long_5=0.5)
    argv = ["--init", "tiny", "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data")]
    tiny.main(argv + [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()])
    cfg = tiny.TinyConfig(**flags)
    model, tok = checkpoint.load_model("tiny", device="cpu"), checkpoint.load_tokenizer("tiny")
    splits = tiny.make_splits(SEED)
    ladder = tiny.make_ladder(SEED, exclude={r["problem"] for rows in splits.values() for r in rows})
    seen = {r["problem"] for rows in {**splits, **ladder}.values() for r in rows}
    tiny.pretrain(model, tok, splits["train"], cfg, log=lambda msg: None, long_rows=tiny.make_long(SEED, (5,), seen))
    written = checkpoint.load_model(tmp_path / "out", device="cpu")
    for (name, a), b in zip(model.state_dict().items(), written.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(written.lm_head.weight, checkpoint.load_model("tiny", device="cpu").lm_head.weight)
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (checkpoint.TINY_MODEL_DIR / "tokenizer.json").read_bytes()
    record = json.loads((tmp_path / "out" / "pretrain.json").read_text())
    assert record["config"]["init"] == "tiny" and record["ladder_val"] == {"n": 500}  # seeded rungs: measured
    with pytest.raises(ValueError, match="--rope-theta"):
        tiny.check_config(tiny.TinyConfig(init="tiny", rope_theta=1e300))
    with pytest.raises(ValueError, match="--couple builds a new model"):
        tiny.check_config(tiny.TinyConfig(init="tiny", couple=True))


def test_evaluate_ladder_is_greedy_step_valid_accuracy_per_rung(monkeypatch):
    rows = load_problems("tiny_ladder_val", 10)  # two of each rung, the rungs taking turns
    calls = []

    def fake_greedy(model, tok, problems, max_new_tokens):  # the first of each rung worked, the second bare
        calls.append(max_new_tokens)
        return [r["solution"] if i < 5 else f"\\boxed{{{r['answer']}}}" for i, r in enumerate(rows)]
    monkeypatch.setattr(tiny, "greedy_complete", fake_greedy)
    assert tiny.evaluate_ladder(None, None, rows) == {"2": 0.5, "3": 0.5, "4": 0.5, "5": 0.5, "6": 0.5}
    assert calls == [tiny.LADDER_MAX_NEW_TOKENS]


def test_ladder_checkpoint_is_the_recorded_continuation_and_reaches_every_seeded_rung():
    # tiny_ladder_model/ (--model tiny-ladder): tiny continued by `tiny.py --init tiny` with complete 4-6-operation
    # solutions; its build record recomputed from the committed files, and the rungs it seeds within greedy reach
    record = json.loads((checkpoint.TINY_MODELS["tiny-ladder"] / "pretrain.json").read_text())
    assert record["config"]["init"] == "tiny" and tiny.long_shares(tiny.TinyConfig(**record["config"])) == \
        {4: 0.04, 5: 0.2, 6: 0.25}
    assert record["init_sha256"] == hashlib.sha256((checkpoint.TINY_MODEL_DIR / "model.safetensors").read_bytes()).hexdigest()
    assert checkpoint.is_tiny_world("tiny-ladder") and checkpoint.resolve_model_dir("tiny-ladder").name == "tiny_ladder_model"
    assert (checkpoint.resolve_model_dir("tiny-ladder") / "tokenizer.json").read_bytes() == \
        (checkpoint.TINY_MODEL_DIR / "tokenizer.json").read_bytes()
    model, tok = checkpoint.load_model("tiny-ladder", device="cpu"), checkpoint.load_tokenizer("tiny-ladder")
    by_rung = tiny.evaluate_ladder(model, tok, load_problems("tiny_ladder_val"))
    assert by_rung == pytest.approx(record["ladder_val"], abs=1e-9)
    assert all(by_rung[str(lv)] > 0 for lv in (4, 5, 6)) and by_rung["2"] > 0.5 > by_rung["3"]


# -----------------------------------------------------------------------------
# The ladder: rungs of 2-6 operations, graded by the step check


def existing_texts(seed, sizes=None):
    return {r["problem"] for rows in tiny.make_splits(seed, sizes).values() for r in rows}


def test_ladder_is_deterministic_disjoint_and_takes_turns():
    small = {"test": 20, "val": 20, "train": 200}
    exclude = existing_texts(3, small)
    ladder = tiny.make_ladder(3, {"test": 10, "val": 5, "train": 30}, exclude)
    assert ladder == tiny.make_ladder(3, {"test": 10, "val": 5, "train": 30}, exclude)
    assert ladder != tiny.make_ladder(4, {"test": 10, "val": 5, "train": 30}, exclude)
    for name, n in (("ladder_test", 10), ("ladder_val", 5), ("ladder_train", 30)):
        levels = [r["level"] for r in ladder[name]]
        assert levels[:5] == [2, 3, 4, 5, 6] and sorted(levels) == sorted([2, 3, 4, 5, 6] * n)
    texts = [r["problem"] for rows in ladder.values() for r in rows]
    assert len(set(texts)) == len(texts) and not set(texts) & exclude
    for rows in ladder.values():
        for r in rows:
            assert int(r["answer"]) == evaluate_text(r["problem"])
            check_solution(r)


def test_long_solutions_are_new_problems_mixed_in_at_their_shares():
    exclude = existing_texts(3, {"test": 20, "val": 20, "train": 200})
    long_rows = tiny.make_long(3, (4, 6), exclude, n=40)
    assert long_rows == tiny.make_long(3, (4, 6), exclude, n=40) and set(long_rows) == {4, 6}
    for level, rows in long_rows.items():
        texts = {r["problem"] for r in rows}
        assert len(texts) == 40 and not texts & exclude
        for r in rows:
            assert r["level"] == level and int(r["answer"]) == evaluate_text(r["problem"])
            check_solution(r)
    # each batch row becomes a long solution with its level's share, always worked; the others keep their draw
    n, shares = 6000, {4: 0.2, 6: 0.05}
    short = [dict(problem=str(i), level=2) for i in range(n)]
    rows, bare = tiny.mix_long(list(short), [True] * n, long_rows, shares, torch.Generator().manual_seed(0))
    for level, share in shares.items():
        got = [b for r, b in zip(rows, bare) if r.get("level") == level]
        assert abs(len(got) - n * share) < 4 * (n * share * (1 - share)) ** 0.5 and not any(got)
    kept = [(r, b) for r, b in zip(rows, bare) if r["level"] == 2]
    assert len(kept) > 0.7 * n and all(b for _, b in kept) and all(r is short[int(r["problem"])] for r, _ in kept)
    assert tiny.long_shares(tiny.TinyConfig()) == {}  # the default build draws nothing more: the committed one
    assert tiny.long_shares(tiny.TinyConfig(long_5=0.01)) == {5: 0.01}


def test_committed_ladder_matches_generator_and_fits_the_context():
    splits = tiny.make_splits(SEED)
    ladder = tiny.make_ladder(SEED, exclude={r["problem"] for rows in splits.values() for r in rows})
    tok = checkpoint.load_tokenizer("tiny")
    context = json.loads((checkpoint.TINY_MODEL_DIR / "config.json").read_text())["max_position_embeddings"]
    for name, rows in ladder.items():
        path = DATA_DIR / f"tiny_{name}.jsonl"
        committed = [json.loads(line) for line in path.read_text().splitlines()]
        assert committed == rows, f"{path} differs from make_ladder({SEED}); rewrite with `python tiny.py --data-only`"
        assert sorted({r["level"] for r in rows}) == list(tiny.LADDER_LEVELS)
    for r in ladder["ladder_test"]:  # the longest texts sit on the top rung
        completion = len(tok.encode(tiny.completion_text(r, bare=False))) + 1  # + end of text
        assert completion <= tiny.LADDER_MAX_NEW_TOKENS
        assert len(tok.encode(format_prompt(r["problem"]))) + tiny.LADDER_MAX_NEW_TOKENS <= context
    old = {r["problem"] for rows in splits.values() for r in rows}
    assert all(not {r["problem"] for r in rows} & old for rows in ladder.values())


PROBLEM = "(37 + 12) * 2 - 45"  # 49, 98, 53
RIGHT = "\n37 + 12 = 49\n49 * 2 = 98\n98 - 45 = 53\n\\boxed{53}"


@pytest.mark.parametrize("response, ok", [
    (RIGHT, True),
    ("37+12=49\n\n49 *2 = 98\n98 - 45 = 53\n\\boxed{53}\n", True),  # spacing is free
    ("\\boxed{53}", False),  # bare: the right answer with no steps
    ("37 + 12 = 49\n49 * 2 = 99\n98 - 45 = 53\n\\boxed{53}", False),  # a wrong step, the right answer
    ("37 + 12 = 49\n49 * 3 = 98\n98 - 45 = 53\n\\boxed{53}", False),  # an operand copied wrong
    ("37 + 12 = 49\n98 - 45 = 53\n\\boxed{53}", False),  # a step skipped
    ("37 + 12 = 49\n49 * 2 = 98\n98 - 45 = 53\n\\boxed{54}", False),  # right steps, wrong box
    (RIGHT + "\n53 + 0 = 53", False),  # something after the box
    ("37 + 12 = 49\n49 * 2 = 98\n\\boxed{98}", False),  # stopped a step early
])
def test_check_steps_on_hand_written_solutions(response, ok):
    assert verify.chain(PROBLEM) == (["37 + 12 = 49", "49 * 2 = 98", "98 - 45 = 53"], evaluate_text(PROBLEM))
    assert verify.check_steps(response, PROBLEM, "53") is ok
    row = dict(problem=PROBLEM, answer="53")
    assert verify.grade_with("steps", [response, "no box"], [row, row]) == [ok, False]


def corrupt_one_line(solution, rng):
    """The solution with one worked line's result or operand off by one, the final box kept: a lucky answer."""
    lines = solution.split("\n")
    i = rng.randrange(len(lines) - 1)
    numbers = re.findall(r"\d+", lines[i])
    j = rng.choice([1, 2])  # the operand or the result
    numbers[j] = str(int(numbers[j]) + rng.choice([-1, 1]))
    a, op, _, eq, _ = lines[i].split(" ")
    lines[i] = f"{a} {op} {numbers[1]} {eq} {numbers[2]}"
    return "\n".join(lines)


def test_steps_grader_keeps_the_guess_rate_under_one_percent():
    # a seeded sample of every rung: guessed bare answers in 0..99 and solutions with one wrong line and the
    # right box; verify.grade (the answer alone) pays about 1% and 100% of them, the step check nothing
    from verify import grade
    rng, rows = random.Random(0), load_problems("tiny_ladder_val")
    guesses = [f"\\boxed{{{rng.randint(0, 99)}}}" for _ in rows]
    lucky = [corrupt_one_line(r["solution"], rng) for r in rows]
    problems = [dict(problem=r["problem"], answer=r["answer"]) for r in rows]
    for responses, answer_rate in ((guesses, (0.0, 0.03)), (lucky, (1.0, 1.0))):
        by_answer = sum(grade(x, r["answer"]) for x, r in zip(responses, rows)) / len(rows)
        assert answer_rate[0] <= by_answer <= answer_rate[1]
        correct = verify.grade_with("steps", responses, problems)
        assert sum(correct) / len(rows) <= 0.01 and not any(correct)
    assert all(verify.grade_with("steps", [r["solution"] for r in rows], problems))


def test_ladder_datasets_bring_the_ladder_defaults():
    from research.bands import bands
    import evaluate
    import train_rl
    cfg = train_rl.parse_args(["--model", "tiny", "--dataset", "tiny_ladder_train"])
    assert (cfg.val_dataset, cfg.test_dataset, cfg.grader, cfg.eval_group_by, cfg.max_new_tokens) == \
        ("tiny_ladder_val", "tiny_ladder_test", "steps", "level", tiny.LADDER_MAX_NEW_TOKENS)
    assert train_rl.parse_args(["--model", "tiny"]).grader == "answer"
    assert train_rl.parse_args(["--model", "tiny", "--dataset", "tiny_ladder_train", "--grader", "answer"]).grader \
        == "answer"
    for script, dataset in ((evaluate, ["--dataset", "tiny_ladder_test"]),
                            (bands, ["--dataset", "tiny_ladder_val", "--out", "x"])):
        config = script.EvalConfig if script is evaluate else script.BandsConfig
        cfg = cli_parse(config, ["--model", "tiny", *dataset], script.flag_defaults)
        assert (cfg.grader, cfg.group_by, cfg.max_new_tokens) == ("steps", "level", tiny.LADDER_MAX_NEW_TOKENS)
    problems = load_problems("tiny_ladder_val", 2)
    samples = [[dict(response="\\boxed{" + p["answer"] + "}", completion_tokens=4, finish_reason="stop")]
               for p in problems]
    by_steps = evaluate.grade_records(problems, [0, 0], samples, grader="steps")
    by_answer = evaluate.grade_records(problems, [0, 0], samples)
    assert [r["correct"] for r in by_steps] == [False, False] and [r["correct"] for r in by_answer] == [True, True]


def cli_parse(config, argv, defaults):
    from cli import parse_config
    return parse_config(config, argv, "", defaults=defaults)


def test_check_steps_refuses_a_problem_that_is_not_a_tiny_expression():
    with pytest.raises(ValueError, match="grader steps"):
        verify.check_steps("\\boxed{2}", "What is $1 + 1$?", "2")


@pytest.fixture(scope="module")
def built():
    """Every split tiny.py writes, from the committed seed: the three splits, the ladder and each far family."""
    splits = tiny.make_splits(SEED)
    return {**splits, **tiny.make_ladders(SEED, tiny.problem_texts(splits))}


def committed_rows(name):
    return [json.loads(line) for line in (DATA_DIR / f"tiny_{name}.jsonl").read_text().splitlines()]


def test_every_committed_tiny_file_is_what_tiny_py_writes_byte_for_byte(built, tmp_path):
    """Adding a family (far2, far3) left every earlier file as it was: tiny.py's code rewrites each byte for byte."""
    tiny.write_splits(built, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {p.name for p in DATA_DIR.glob("tiny_*.jsonl")}
    for path in sorted(tmp_path.iterdir()):
        assert path.read_bytes() == (DATA_DIR / path.name).read_bytes(), f"{path.name} differs from tiny.py's build"


def test_committed_far_rungs_match_the_generator_hold_no_solution_and_fit_the_budget(built):
    """Rungs 7-8 (tiny_ladder_far_*): questions and answers only, texts outside every other split, and an 8-line
    chain within the ladder's 128-token budget; the step grader checks them as any rung."""
    seen = tiny.problem_texts({k: v for k, v in built.items() if "_far" not in k})
    tok = checkpoint.load_tokenizer("tiny")
    far = {k: v for k, v in built.items() if k.startswith("ladder_far_")}
    assert set(far) == {"ladder_far_train", "ladder_far_val", "ladder_far_test"}
    for name, rows in far.items():
        assert committed_rows(name) == rows and all("solution" not in r for r in rows)
        assert sorted({r["level"] for r in rows}) == [7, 8] and not {r["problem"] for r in rows} & seen
        assert len(rows) == len(tiny.FAR_LEVELS) * tiny.FAR_SIZES[name.split("_")[-1]]
        for r in rows[:50]:
            lines, value = verify.chain(r["problem"])
            solution = "\n".join(lines + [f"\\boxed{{{value}}}"])
            assert str(value) == r["answer"] and verify.check_steps(solution, r["problem"], r["answer"])
            assert len(tok.encode("\n" + solution)) + 1 <= tiny.LADDER_MAX_NEW_TOKENS
    seen |= tiny.problem_texts(far)
    far2 = {k: v for k, v in built.items() if k.startswith("ladder_far2_")}  # rungs 9-10: added later
    assert set(far2) == {"ladder_far2_train", "ladder_far2_val", "ladder_far2_test"}
    for name, rows in far2.items():
        assert committed_rows(name) == rows and all("solution" not in r for r in rows)
        assert [r["level"] for r in rows[:4]] == [9, 10, 9, 10] and not {r["problem"] for r in rows} & seen
        assert len(rows) == 2 * tiny.FAR2_SIZES[name.split("_")[-1]]
        for r in rows[:50]:
            lines, value = verify.chain(r["problem"])
            assert len(lines) == r["level"] and str(value) == r["answer"]
            solution = "\n".join(lines + [f"\\boxed{{{value}}}"])
            assert len(tok.encode("\n" + solution)) + 1 <= tiny.FAR2_MAX_NEW_TOKENS
    joined = load_problems("tiny_ladder_val+tiny_ladder_far_val")  # a pool of names joined by +
    assert [r["id"] for r in joined] == [r["id"] for r in load_problems("tiny_ladder_val") + far["ladder_far_val"]]
    assert len(load_problems("tiny_ladder_val+tiny_ladder_far_val", limit=510)) == 510


def test_rungs_11_to_20_are_new_questions_with_the_verifiers_answers_and_fit_the_context(built):
    """tiny_ladder_far3_*: rungs 11-20 taking turns, far2's fields and no more, texts outside every earlier split, each
    answer the verifier's own chain's; every row's prompt + FAR3_MAX_NEW_TOKENS fits both tiny models' context, and
    every row's worked chain (its lines, its box, end of text) fits the budget."""
    earlier = tiny.problem_texts({k: v for k, v in built.items() if "_far3_" not in k})
    far3 = {k: v for k, v in built.items() if k.startswith("ladder_far3_")}
    assert set(far3) == {"ladder_far3_train", "ladder_far3_val", "ladder_far3_test"}
    assert tiny.FAR3_LEVELS == tuple(range(11, 21))
    tok, keys = checkpoint.load_tokenizer("tiny"), set(built["ladder_far2_test"][0])
    context = min(checkpoint.read_config(checkpoint.resolve_model_dir(m)).max_position_embeddings
                  for m in ("tiny", "tiny-ladder"))
    assert context == tiny.CONTEXT == 512 and tiny.FAR3_MAX_PROMPT + tiny.FAR3_MAX_NEW_TOKENS == context
    longest = {}
    for name, rows in far3.items():
        assert committed_rows(name) == rows and all(set(r) == keys for r in rows)  # no worked solutions
        assert [r["level"] for r in rows] == list(tiny.FAR3_LEVELS) * tiny.FAR3_SIZES[name.split("_")[-1]]
        assert all(r["source"] == "tiny_ladder_far3" and r["id"] == f"tiny_{name}/{i:05d}" for i, r in enumerate(rows))
        assert not {r["problem"] for r in rows} & earlier
        for r in rows:
            lines, value = verify.chain(r["problem"])
            assert len(lines) == r["level"] and str(value) == r["answer"] == str(evaluate_text(r["problem"]))
            prompt = len(tok.encode(format_prompt(r["problem"])))
            chain = len(tok.encode("\n" + "\n".join(lines + [f"\\boxed{{{value}}}"]))) + 1  # + end of text
            assert prompt + tiny.FAR3_MAX_NEW_TOKENS <= context and chain <= tiny.FAR3_MAX_NEW_TOKENS, r["id"]
            longest[r["level"]] = max(longest.get(r["level"], 0), prompt + chain)
    assert len(tiny.problem_texts(far3)) == sum(map(len, far3.values())) == 23000
    print("longest prompt + chain by rung:", longest)  # 347 at rung 11 ... 509 at rung 20 when measured


def test_max_prompt_draws_a_text_with_a_longer_prompt_again():
    """new_problem's max_prompt (far3's 240 tokens) skips a text whose prompt is longer; without it, the first draw."""
    first = tiny.make_problem(random.Random(5), 20)
    assert tiny.new_problem(random.Random(5), 20, set()) == first
    seen, limit = set(), len(format_prompt(first["problem"])) - 1
    p = tiny.new_problem(random.Random(5), 20, seen, limit)
    assert len(format_prompt(p["problem"])) <= limit and seen == {p["problem"]}


# -----------------------------------------------------------------------------
# --out: tiny.py replaces it whole, so it writes only where nothing but its own checkpoint would be lost


def run_tiny(argv):
    """tiny.py's exit status and stderr, as a user sees them."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "tiny.py", "--threads", "1", "--steps", "2", *map(str, argv)],
                       cwd=checkpoint.REPO_DIR, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return r.returncode, r.stderr


def tree(path):
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("force", [False, True])
def test_out_holding_other_files_is_refused_and_nothing_is_written(tmp_path, force):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("keep\n")
    run = tmp_path / "run"  # a training run, with its final model
    (run / "final").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (run / "final" / name).write_bytes((checkpoint.TINY_MODEL_DIR / name).read_bytes())
    (tmp_path / "afile").write_text("keep\n")
    model_plus = tmp_path / "model_plus"  # a tiny.py checkpoint with a user's file beside it
    model_plus.mkdir()
    for name in tiny.TINY_FILES:
        (model_plus / name).write_bytes((checkpoint.TINY_MODEL_DIR / name).read_bytes())
    (model_plus / "README.md").write_text("my notes\n")
    before = tree(tmp_path)
    cases = {notes: "notes.txt", run: "train_rl.py run", run / "final": "not a tiny.py checkpoint",
             tmp_path / "afile": "is a file", model_plus: "README.md"}
    for out, words in cases.items():
        code, err = run_tiny(["--out", out, "--data-dir", tmp_path / "data"] + ["--force"] * force)
        assert code == 2, err
        assert err.strip().count("\n") == 0 and err.startswith("tiny.py: error: --out") and words in err, err
    code, err = run_tiny(["--out", tmp_path / "new", "--data-dir", tmp_path / "new" / "data"])  # data inside --out
    assert code == 2 and "--data-dir" in err, err
    assert tree(tmp_path) == before  # nothing deleted, renamed, or written (no data files either)


def test_read_only_out_is_refused(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    for name in tiny.TINY_FILES:  # even a tiny.py checkpoint, with --force
        (out / name).write_bytes((checkpoint.TINY_MODEL_DIR / name).read_bytes())
    out.chmod(0o555)
    try:
        with pytest.raises(FileExistsError, match="read-only"):
            tiny.check_out(tiny.TinyConfig(force=True), out, tmp_path / "data")
    finally:
        out.chmod(0o755)


def test_force_rebuilds_a_tiny_checkpoint_only(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    for name in tiny.TINY_FILES:
        (out / name).write_bytes((checkpoint.TINY_MODEL_DIR / name).read_bytes())
    with pytest.raises(FileExistsError, match="pass --force"):
        tiny.check_out(tiny.TinyConfig(), out, tmp_path / "data")
    tiny.check_out(tiny.TinyConfig(force=True), out, tmp_path / "data")  # allowed: it is tiny.py's own
    tiny.check_out(tiny.TinyConfig(), tmp_path / "empty_or_new", tmp_path / "data")


def test_bad_init_weights_fail_before_any_file_is_written(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (bad / name).write_bytes((checkpoint.TINY_MODEL_DIR / name).read_bytes())
    (bad / "model.safetensors").write_bytes((checkpoint.TINY_MODEL_DIR / "model.safetensors").read_bytes()[:5000])
    code, err = run_tiny(["--init", bad, "--out", tmp_path / "out", "--data-dir", tmp_path / "data"])
    assert code == 2 and "model.safetensors" in err and err.count("\n") == 1, err
    assert not (tmp_path / "data").exists() and not (tmp_path / "out").exists()


def test_save_model_leaves_a_file_and_a_users_old_folder_alone(tmp_path):
    net = checkpoint.load_model("tiny", device="cpu")
    (tmp_path / "m").write_text("keep\n")
    with pytest.raises(FileExistsError, match="is a file"):
        checkpoint.save_model(net, tmp_path / "m")
    assert (tmp_path / "m").read_text() == "keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    (tmp_path / "d.old").mkdir()
    (tmp_path / "d.old" / "notes.txt").write_text("keep\n")
    checkpoint.save_model(net, tmp_path / "d")
    checkpoint.save_model(net, tmp_path / "d")  # replaces the first
    assert (tmp_path / "d.old" / "notes.txt").read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "d.old", "m"]
