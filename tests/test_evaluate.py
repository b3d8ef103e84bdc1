"""evaluate.py: statistics against hand-computed values, records/summary agreement, resume, --responses,
compare, and bad inputs. A tiny random Qwen3 (real Qwen3 tokenizer, hidden size 16) keeps it to seconds."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import evaluate as E
import model as M
import problems as P
import sample
from sample import Completion
import checkpoint
import stats

PROBLEMS = [  # (problem, answer, subject, level)
    ("What is $2+2$?", "4", "Algebra", 1),
    ("What is $3 \\cdot 3$?", "9", "Algebra", 2),
    ("Simplify $\\frac{2}{4}$.", "\\frac{1}{2}", "Prealgebra", 1),
    ("How many primes are less than 10?", "4", "Number Theory", 3),
    ("What is $10-7$?", "3", "Prealgebra", 2),
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    rows = [dict(id=f"p{i}", source="toy", problem=q, answer=a, subject=s, level=lv)
            for i, (q, a, s, lv) in enumerate(PROBLEMS)]
    return write_jsonl(d / "toy.jsonl", rows)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random Qwen3 with the real Qwen3 vocabulary: hidden size 16 keeps the 152k-row embedding small."""
    tokenizer = checkpoint.load_tokenizer("Qwen/Qwen3-0.6B-Base")
    cfg = M.Qwen3Config(vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=2048)
    torch.manual_seed(0)
    path = checkpoint.save_model(M.Qwen3(cfg), tmp_path_factory.mktemp("m") / "tiny-random", tokenizer)
    return str(path)


@pytest.fixture
def count_generate(monkeypatch):
    """Wrap sample.generate to count the prompts it is asked to complete."""
    calls, real = [], sample.generate

    def counting(model, prompts, *args, **kw):
        calls.append(len(prompts))
        return real(model, prompts, *args, **kw)
    monkeypatch.setattr(sample, "generate", counting)
    return calls


def run_cli(tiny, data, out, *extra):
    return E.main(["--model", tiny, "--dataset", str(data), "--max-new-tokens", "6", "--batch-size", "2",
                   "--out", str(out), *extra])


def read_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def check_summary_against_records(summary, records):
    n, correct = len(records), sum(r["correct"] for r in records)
    flat = [s for r in records for s in E.samples_of(r)]
    assert summary["n"] == n and summary["correct"] == correct and summary["accuracy"] == pytest.approx(correct / n)
    assert summary["completion_tokens_total"] == sum(s["completion_tokens"] for s in flat)
    assert summary["prompt_tokens_total"] == sum(r["prompt_tokens"] for r in records)
    assert summary["truncation_rate"] == pytest.approx(sum(s["finish_reason"] == "length" for s in flat) / len(flat))
    assert summary["ci95"] == pytest.approx(list(stats.wilson(correct, n)))
    assert summary["mean_reward"] == pytest.approx(sum(s["reward"] for s in flat) / len(flat))
    for key in ("subject", "level"):
        assert sum(row["n"] for row in summary[f"by_{key}"].values()) == n
        for value, row in summary[f"by_{key}"].items():
            mine = [r["correct"] for r in records if str(r[key]) == value]
            assert row == dict(n=len(mine), correct=sum(mine), accuracy=pytest.approx(sum(mine) / len(mine)))


# -----------------------------------------------------------------------------
# The protocol's selection rule


def test_majority_vote_hand_example():
    same = lambda a, b: a.replace(" ", "") == b.replace(" ", "")  # noqa: E731
    assert E.majority_vote(["3", "1/2", None, "1 / 2", "3", "1/2"], same) == 1  # 1/2 has three votes
    assert E.majority_vote(["3", "2", "2", "3"], same) == 0  # tie: the answer sampled first wins
    assert E.majority_vote([None, "2", "3", "3", "2"], same) == 1
    assert E.majority_vote([None, None], same) is None
    assert E.majority_vote(["\\frac{1}{2}", "7", "0.5"]) == 0  # the default equivalence is verify's


# -----------------------------------------------------------------------------
# Generation runs with the tiny random model


def test_cli_writes_records_and_summary(tiny, data, tmp_path, capsys):
    summary = run_cli(tiny, data, tmp_path / "run")
    for name in ("settings.json", "records.jsonl", "summary.json"):
        assert (tmp_path / "run" / name).is_file()
    records = read_lines(tmp_path / "run" / "records.jsonl")
    assert [r["id"] for r in records] == [f"p{i}" for i in range(5)]
    for r in records:
        assert {"id", "source", "subject", "level", "answer", "prompt_tokens", "response", "completion_tokens",
                "finish_reason", "extracted", "correct", "reward", "seconds"} <= set(r)
        assert 1 <= r["completion_tokens"] <= 6 and r["finish_reason"] in ("stop", "length")
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    check_summary_against_records(on_disk, records)
    for key in ("model", "dataset_hash", "settings"):
        assert on_disk[key] is not None
    assert on_disk["selection"] == "one response per problem, greedy"
    # speed and compute follow from the records: tokens over generation seconds, FLOPs per token and context
    assert on_disk["generation_seconds"] == pytest.approx(sum(r["seconds"] for r in records)) and on_disk["wall_time_s"] > 0
    assert on_disk["tokens_per_s"] == pytest.approx(on_disk["completion_tokens_total"] / on_disk["generation_seconds"])
    config = checkpoint.load_model(tiny, device="cpu").config
    assert on_disk["inference_flops"] == pytest.approx(E.inference_flops(config, records)) and on_disk["inference_flops"] > 0
    assert on_disk["settings"]["max_new_tokens"] == 6 and on_disk["settings"]["temperature"] == 0.0
    assert "accuracy" in capsys.readouterr().out


def test_inference_flops_sums_per_token_contexts():
    cfg = M.Qwen3Config(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    record = dict(prompt_tokens=5, samples=[dict(completion_tokens=3), dict(completion_tokens=1)])
    by_hand = sum(M.flops_per_token(cfg, c) for c in range(1, 6))  # prefill
    by_hand += sum(M.flops_per_token(cfg, c) for c in (6, 7))  # decoding feeds 2 of the 3 tokens back
    assert E.inference_flops(cfg, [record]) == pytest.approx(by_hand)


def test_resume_after_limit_generates_only_the_rest(tiny, data, tmp_path, count_generate):
    out = tmp_path / "run"
    run_cli(tiny, data, out, "--limit", "3")
    assert sum(count_generate) == 3
    first = read_lines(out / "records.jsonl")
    summary = run_cli(tiny, data, out)
    assert sum(count_generate) == 5  # only p3, p4 were generated the second time
    records = read_lines(out / "records.jsonl")
    assert records[:3] == first and [r["id"] for r in records] == ["p0", "p1", "p2", "p3", "p4"]
    check_summary_against_records(summary, records)


def test_resume_after_kill_redoes_partial_line(tiny, data, tmp_path, count_generate):
    out = tmp_path / "run"
    run_cli(tiny, data, out)
    full = read_lines(out / "records.jsonl")
    lines = (out / "records.jsonl").read_text().splitlines(keepends=True)
    (out / "records.jsonl").write_text("".join(lines[:2]) + lines[2][:40])  # killed while writing line 3
    count_generate.clear()
    run_cli(tiny, data, out)
    assert sum(count_generate) == 3
    records = read_lines(out / "records.jsonl")
    assert sorted(r["id"] for r in records) == [f"p{i}" for i in range(5)]
    strip = lambda r: {k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
    assert sorted(map(json.dumps, map(strip, records))) == sorted(map(json.dumps, map(strip, full)))  # greedy


def test_resume_refuses_another_protocol(tiny, data, tmp_path):
    out = tmp_path / "run"
    run_cli(tiny, data, out, "--limit", "1")
    with pytest.raises(ValueError, match="max_new_tokens: 6 there, 4 now"):
        run_cli(tiny, data, out, "--max-new-tokens", "4")
    with pytest.raises(ValueError, match="dataset"):
        run_cli(tiny, data, out, "--dataset", "aime24")
    record = read_lines(out / "records.jsonl")[0]
    write_jsonl(out / "records.jsonl", [dict(record, answer="5")])  # made with another version of the data
    with pytest.raises(ValueError, match="'p0' has reference answer '5', the data set '4'"):
        run_cli(tiny, data, out)
    (out / "settings.json").unlink()
    with pytest.raises(ValueError, match="without settings.json"):
        run_cli(tiny, data, out)


def test_multi_sample_run(tiny, data, tmp_path, capsys):
    summary = run_cli(tiny, data, tmp_path / "run", "--samples", "3", "--temperature", "1.0", "--limit", "2")
    records = read_lines(tmp_path / "run" / "records.jsonl")
    assert all(len(r["samples"]) == 3 and "n_correct" in r and "selected" in r for r in records)
    assert set(summary["pass_at_k"]) == {"pass@1", "pass@2", "pass@3"} and "majority vote" in summary["selection"]
    check_summary_against_records(summary, records)
    # the dispersion of each problem's samples, and its mean and cost in the summary
    assert all(0.0 <= r["dispersion"] <= 2.0 and r["embedding_seconds"] > 0 for r in records)
    assert summary["dispersion_mean"] == pytest.approx(sum(r["dispersion"] for r in records) / len(records))
    assert summary["embedding_seconds"] == pytest.approx(sum(r["embedding_seconds"] for r in records))
    assert "dispersion " in capsys.readouterr().out
    assert "dispersion_mean" not in run_cli(tiny, data, tmp_path / "greedy1", "--limit", "1")  # one sample: none
    off = run_cli(tiny, data, tmp_path / "off", "--samples", "3", "--temperature", "1.0", "--limit", "1",
                  "--no-dispersion")
    assert off["dispersion_mean"] is None and "dispersion" not in read_lines(tmp_path / "off" / "records.jsonl")[0]
    with pytest.raises(ValueError, match="temperature > 0"):
        run_cli(tiny, data, tmp_path / "greedy", "--samples", "3")


def test_sampled_run_does_not_depend_on_batch_size(tiny, data, tmp_path):
    sampled = ("--samples", "2", "--temperature", "1.0", "--max-new-tokens", "12")
    run_cli(tiny, data, tmp_path / "b2", *sampled)
    run_cli(tiny, data, tmp_path / "b5", *sampled, "--batch-size", "5")
    a, b = read_lines(tmp_path / "b2" / "records.jsonl"), read_lines(tmp_path / "b5" / "records.jsonl")
    responses = [[s["response"] for s in r["samples"]] for r in a]
    assert responses == [[s["response"] for s in r["samples"]] for r in b]
    assert len({x for r in responses for x in r}) > 1  # and the samples are not all the same


def test_continuous_batching_writes_the_chunked_records(tiny, data, tmp_path):
    """evaluate(continuous=True), the CUDA default, against chunks (the CPU default): the same records, sampled
    (2 slots' worth of problems decode while the rest wait) and greedy; only the timing fields differ."""
    net, tokenizer = checkpoint.load_model(tiny, device="cpu"), checkpoint.load_tokenizer(tiny)
    problems = P.load_problems(str(data))
    for kw in (dict(samples=3, temperature=1.0, seed=5), dict()):
        runs = [E.evaluate(net, tokenizer, problems, max_new_tokens=8, batch_size=2, continuous=c, **kw)[0]
                for c in (False, True)]
        strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
        assert strip(runs[0]) == strip(runs[1])
    assert E.use_slots(net) is False  # on this CPU, chunks


# -----------------------------------------------------------------------------
# The evaluate() function with scripted completions: known right and wrong answers


def scripted_generate(script):
    """A stand-in for sample.generate: for the prompt of problem text q, sample j answers script[q][j]."""
    tokenizer = checkpoint.load_tokenizer("Qwen/Qwen3-0.6B-Base")

    def generate(model, prompts, max_new_tokens, n=1, **kw):
        out = []
        for i, p in enumerate(prompts):
            text = tokenizer.decode(p)
            answers = next(v for q, v in script.items() if q in text)
            for j in range(n):
                ids = tokenizer.encode(f" So the answer is $\\boxed{{{answers[j]}}}$.")
                out.append(Completion(prompt_index=i, tokens=ids + [tokenizer.eos_id], finish_reason="stop"))
        return out
    return generate


def test_evaluate_function_with_known_answers(tiny, data, monkeypatch):
    script = {q: [a if i in (0, 2, 4) else "17"] for i, (q, a, _, _) in enumerate(PROBLEMS)}
    monkeypatch.setattr(sample, "generate", scripted_generate(script))
    net, tokenizer = checkpoint.load_model(tiny, device="cpu"), checkpoint.load_tokenizer(tiny)
    records, summary = E.evaluate(net, tokenizer, P.load_problems(str(data)), max_new_tokens=32, batch_size=2)
    assert [r["correct"] for r in records] == [True, False, True, False, True]
    assert summary["accuracy"] == pytest.approx(0.6) and summary["truncation_rate"] == 0.0
    assert summary["by_subject"]["Prealgebra"] == dict(n=2, correct=2, accuracy=1.0)
    assert summary["by_level"]["1"]["accuracy"] == 1.0 and summary["by_level"]["2"]["accuracy"] == 0.5
    check_summary_against_records(summary, records)


def test_per_group_accuracy_with_missing_field(tiny, tmp_path, monkeypatch, capsys):
    topics = ["geo", "alg", None, "geo", "alg"]  # p2 has no topic: counted under "?"
    rows = [dict(id=f"p{i}", problem=q, answer=a, **({"topic": t} if t else {}))
            for i, ((q, a, _, _), t) in enumerate(zip(PROBLEMS, topics))]
    data = write_jsonl(tmp_path / "topics.jsonl", rows)
    right = (0, 1, 2, 4)  # geo: p0 right, p3 wrong -> 1/2; alg: p1, p4 right -> 2/2; ?: p2 right -> 1/1
    script = {q: [a if i in right else "17"] for i, (q, a, _, _) in enumerate(PROBLEMS)}
    expected = {"?": dict(n=1, correct=1, accuracy=1.0), "alg": dict(n=2, correct=2, accuracy=1.0),
                "geo": dict(n=2, correct=1, accuracy=0.5)}
    monkeypatch.setattr(sample, "generate", scripted_generate(script))
    net, tokenizer = checkpoint.load_model(tiny, device="cpu"), checkpoint.load_tokenizer(tiny)
    records, summary = E.evaluate(net, tokenizer, P.load_problems(str(data)), 32, group_by="topic")
    assert summary["per_group"] == expected and summary["accuracy"] == pytest.approx(0.8)
    assert [r["topic"] for r in records] == topics
    assert "per_group" not in E.evaluate(net, tokenizer, P.load_problems(str(data)), 32)[1]
    # the CLI flag, through --responses: the same answers graded from a file
    responses = write_jsonl(tmp_path / "engine.jsonl", [dict(id=f"p{i}", response=f"\\boxed{{{script[q][0]}}}")
                                                        for i, (q, *_) in enumerate(PROBLEMS)])
    summary = E.main(["--responses", str(responses), "--dataset", str(data), "--group-by", "topic",
                      "--out", str(tmp_path / "graded")])
    assert json.loads((tmp_path / "graded" / "summary.json").read_text())["per_group"] == expected
    assert "per topic  ? 100.0% (1/1), alg 100.0% (2/2), geo 50.0% (1/2)" in capsys.readouterr().out


def test_evaluate_majority_and_pass_at_k_with_known_samples(tiny, data, monkeypatch):
    script = {PROBLEMS[0][0]: ["4", "5", "5", "4.0", "6"],  # 4 vs 5 tie 2:2, 4 sampled first -> right
              PROBLEMS[1][0]: ["8", "9", "8", "1", "2"]}  # 8 wins -> wrong, 1 of 5 right
    monkeypatch.setattr(sample, "generate", scripted_generate(script))
    net, tokenizer = checkpoint.load_model(tiny, device="cpu"), checkpoint.load_tokenizer(tiny)
    records, summary = E.evaluate(net, tokenizer, P.load_problems(str(data), limit=2), 32, samples=5,
                                  temperature=0.7)
    assert [(r["n_correct"], r["selected"], r["correct"]) for r in records] == [(2, 0, True), (1, 0, False)]
    assert summary["accuracy"] == 0.5
    assert summary["pass_at_k"]["pass@1"] == pytest.approx((0.4 + 0.2) / 2)
    assert summary["pass_at_k"]["pass@2"] == pytest.approx((0.7 + 0.4) / 2)
    assert summary["pass_at_k"]["pass@5"] == 1.0


def test_dispersion_of_scripted_samples(tiny, data, monkeypatch):
    script = {PROBLEMS[0][0]: ["4"] * 4,  # four identical completions: dispersion 0
              PROBLEMS[1][0]: ["9", "8", "9", "1000000"]}  # different completions: above 0
    monkeypatch.setattr(sample, "generate", scripted_generate(script))
    net, tokenizer = checkpoint.load_model(tiny, device="cpu"), checkpoint.load_tokenizer(tiny)
    records, summary = E.evaluate(net, tokenizer, P.load_problems(str(data), limit=2), 32, samples=4,
                                  temperature=0.7, batch_size=1, dispersion=True)
    assert records[0]["dispersion"] == pytest.approx(0.0, abs=1e-6) and records[1]["dispersion"] > 1e-4
    assert summary["dispersion_mean"] == pytest.approx((records[0]["dispersion"] + records[1]["dispersion"]) / 2)
    # a record depends on its own samples only: the same with both problems in one batch
    again, _ = E.evaluate(net, tokenizer, P.load_problems(str(data), limit=2), 32, samples=4, temperature=0.7,
                          dispersion=True)
    assert [r["dispersion"] for r in again] == pytest.approx([r["dispersion"] for r in records], abs=1e-6)


def test_chat_template_prompts_and_stop_tokens(tiny, data, monkeypatch):
    seen = {}

    def fake_generate(model, prompts, max_new_tokens, n=1, stop_token_ids=(), **kw):
        seen.update(prompts=prompts, stop=stop_token_ids)
        return [Completion(prompt_index=i, tokens=[5], finish_reason="length") for i in range(len(prompts))]
    monkeypatch.setattr(sample, "generate", fake_generate)
    net, tokenizer = checkpoint.load_model(tiny, device="cpu"), checkpoint.load_tokenizer(tiny)
    rows = P.load_problems(str(data), limit=1)
    records, summary = E.evaluate(net, tokenizer, rows, 8, template="chat_think")
    assert seen["prompts"][0] == tokenizer.encode(P.format_prompt(rows[0]["problem"], "chat_think"))
    assert seen["stop"] == tokenizer.stop_token_ids(chat=True) == [tokenizer.eos_id, tokenizer.im_end_id]
    assert records[0]["prompt_tokens"] == len(seen["prompts"][0]) and summary["truncation_rate"] == 1.0


def test_the_hint_seam_prompts_its_problem_and_the_settings_say_so(tiny, data, tmp_path, monkeypatch):
    """evaluate(hint=f): each prompt is f's problem row (research/hint.py states the answer); settings.json says hint:
    true, so a plain run never resumes a hinted one's records, and one written before the key existed is plain."""
    seen = []

    def fake_generate(model, prompts, max_new_tokens, **kw):
        seen.extend(prompts)
        return [Completion(prompt_index=i, tokens=[5], finish_reason="length") for i in range(len(prompts))]
    monkeypatch.setattr(sample, "generate", fake_generate)
    net, tokenizer = checkpoint.load_model(tiny, device="cpu"), checkpoint.load_tokenizer(tiny)
    rows = P.load_problems(str(data), limit=2)
    with_answer = lambda p: dict(p, problem=f"{p['problem']} (answer {p['answer']})")  # noqa: E731
    records, _ = E.evaluate(net, tokenizer, rows, 8, out_dir=tmp_path / "hinted", hint=with_answer)
    assert seen == [tokenizer.encode(P.format_prompt(f"{p['problem']} (answer {p['answer']})", "base")) for p in rows]
    assert [r["answer"] for r in records] == [p["answer"] for p in rows]  # graded against the rows' own answers
    assert json.loads((tmp_path / "hinted" / "settings.json").read_text())["hint"] is True
    with pytest.raises(ValueError, match="hint: True there, False now"):
        E.evaluate(net, tokenizer, rows, 8, out_dir=tmp_path / "hinted")
    E.evaluate(net, tokenizer, rows, 8, out_dir=tmp_path / "plain")
    assert seen[-1] == tokenizer.encode(P.format_prompt(rows[-1]["problem"], "base"))
    settings = json.loads((tmp_path / "plain" / "settings.json").read_text())
    assert settings.pop("hint") is False
    (tmp_path / "plain" / "settings.json").write_text(json.dumps(settings))  # as written before the key existed
    E.evaluate(net, tokenizer, rows, 8, out_dir=tmp_path / "plain")  # the same protocol: resumed
    with pytest.raises(ValueError, match="hint: None there, True now"):
        E.evaluate(net, tokenizer, rows, 8, out_dir=tmp_path / "plain", hint=with_answer)


# -----------------------------------------------------------------------------
# --responses: grading outputs of other engines


def test_responses_exact_accuracy(data, tmp_path):
    rows = [dict(id="p0", response="2+2 = 4, so \\boxed{4}"), dict(id="p1", response="\\boxed{6}"),
            dict(id="p2", response="It is \\boxed{0.5}.", completion_tokens=7, finish_reason="stop"),
            dict(id="p3", response="no boxed answer here"), dict(id="p4", response="\\boxed{3}")]
    path = write_jsonl(tmp_path / "engine.jsonl", rows)
    summary = E.main(["--responses", str(path), "--dataset", str(data), "--out", str(tmp_path / "graded")])
    records = read_lines(tmp_path / "graded" / "records.jsonl")
    assert [r["correct"] for r in records] == [True, False, True, False, True]
    assert summary["accuracy"] == pytest.approx(0.6) and summary["n"] == 5
    assert records[2]["completion_tokens"] == 7 and records[0]["finish_reason"] is None
    assert records[3]["extracted"] is None  # no box: at training's default format penalty (0) paid as a wrong answer
    assert [r["reward"] for r in records] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert summary["completion_tokens_total"] == sum(r["completion_tokens"] for r in records)
    assert summary["truncation_rate"] == 0.0  # over the rows that report a finish reason


def test_responses_multi_sample(data, tmp_path):
    rows = [dict(id=f"p{i}", response=f"\\boxed{{{a}}}") for i in range(5) for a in ("3", "9", "3")]
    path = write_jsonl(tmp_path / "engine.jsonl", rows)
    records, summary = E.grade_responses(path, E.P.load_problems(str(data)))
    assert summary["accuracy"] == pytest.approx(1 / 5)  # the vote picks 3: right for p4 only
    assert summary["pass_at_k"]["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 5)  # p1 has one 9, p4 two 3s


@pytest.mark.parametrize("line, message", [
    ('{"id": "p9", "response": "\\\\boxed{1}"}', "engine.jsonl:2: unknown id 'p9'"),
    ('{"id": "p1"}', "engine.jsonl:2: each row needs 'id' and 'response'"),
    ('{"response": "x"}', "engine.jsonl:2: each row needs 'id' and 'response'"),
    ('{"id": "p1", "response": "x", "completion_tokens": "7"}', "engine.jsonl:2: .* completion_tokens an integer"),
    ('{"id": "p1", "response": ', "engine.jsonl:2: not valid JSON"),
])
def test_responses_bad_rows_name_file_and_line(data, tmp_path, line, message):
    path = tmp_path / "engine.jsonl"
    path.write_text('{"id": "p0", "response": "\\\\boxed{4}"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        E.grade_responses(path, E.P.load_problems(str(data)))


def test_responses_missing_problems(data, tmp_path):
    path = write_jsonl(tmp_path / "engine.jsonl", [dict(id="p0", response="\\boxed{4}")])
    with pytest.raises(ValueError, match="no response for 4 of 5 problems"):
        E.grade_responses(path, E.P.load_problems(str(data)))
    assert E.grade_responses(path, E.P.load_problems(str(data), limit=1))[1]["accuracy"] == 1.0


# -----------------------------------------------------------------------------
# compare and bad data


def hand_records(path, correct):
    return write_jsonl(path, [dict(id=f"q{i}", answer="1", correct=bool(c)) for i, c in enumerate(correct)])


def test_compare_hand_made_records(tmp_path, capsys):
    a = hand_records(tmp_path / "a.jsonl", [1, 1, 1, 0, 0, 0, 1, 1, 0, 1])
    b = hand_records(tmp_path / "b.jsonl", [1, 0, 1, 1, 1, 1, 1, 1, 0, 1])
    c = E.main(["compare", str(a), str(b), "--n-boot", "2000"])
    assert (c["both_correct"], c["only_a_correct"], c["only_b_correct"], c["neither_correct"]) == (5, 1, 3, 1)
    assert c["accuracy_a"] == 0.6 and c["accuracy_b"] == 0.8 and c["difference"] == pytest.approx(0.2)
    assert c["ci95"][0] < 0.2 < c["ci95"][1]
    assert "+20.0 points" in capsys.readouterr().out


def test_compare_refuses_other_problems_from_the_shell(tmp_path):
    a = hand_records(tmp_path / "a.jsonl", [1, 0, 1])
    b = hand_records(tmp_path / "b.jsonl", [1, 0])
    r = subprocess.run([sys.executable, "evaluate.py", "compare", str(a), str(b)], capture_output=True, text=True,
                       cwd=Path(E.__file__).parent)
    assert r.returncode != 0 and "cover different problems" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "b.jsonl").write_text('{"id": "q0", "answer": "1", "correct": true}\n{"id": "q1", "answ\n')
    with pytest.raises(ValueError, match="b.jsonl:2: not valid JSON"):
        E.compare(a, tmp_path / "b.jsonl")


def test_bad_datasets(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'math5000'; known: math500, math_train, gsm8k"):
        E.main(["--dataset", "math5000"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: missing or empty 'answer'"):
        E.main(["--dataset", str(bad)])
    bad.write_text('{"problem": "1+1?", "answer": "2"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        E.main(["--dataset", str(bad)])


@pytest.mark.parametrize("dataset", sorted(P.DATASETS))
def test_every_shipped_dataset_evaluates_with_the_real_tokenizer(dataset, qwen_vocab_model_dir, tmp_path):
    summary = E.main(["--model", str(qwen_vocab_model_dir), "--dataset", dataset, "--limit", "2",
                      "--max-new-tokens", "4", "--out", str(tmp_path / "eval")])
    records = [json.loads(line) for line in (tmp_path / "eval" / "records.jsonl").read_text().splitlines()]
    assert summary["n"] == 2 and [r["id"] for r in records] == [p["id"] for p in P.load_problems(dataset, 2)]
    assert all(r["prompt_tokens"] > 20 and 1 <= r["completion_tokens"] <= 4 for r in records)


# -----------------------------------------------------------------------------
# Refusals that protect a result: each names what is wrong


def test_duplicate_problem_ids_are_refused(tiny, tmp_path):
    dup = write_jsonl(tmp_path / "dup.jsonl", [dict(id="q", problem="1+1?", answer="2"), dict(id="q", problem="2+2?",
                                                                                           answer="4")])
    with pytest.raises(ValueError, match="problem ids are not unique \\(e.g. 'q'\\)"):
        run_cli(tiny, dup, tmp_path / "out")


def test_duplicate_record_ids_are_refused(tmp_path):
    records = write_jsonl(tmp_path / "records.jsonl", [dict(id="a", correct=True), dict(id="b", correct=False),
                                                       dict(id="a", correct=False)])
    with pytest.raises(ValueError, match="records.jsonl:3: id 'a' was already recorded on line 1"):
        E.read_records(records)


def test_responses_refuse_another_runs_directory(tiny, data, tmp_path):
    run_cli(tiny, data, tmp_path / "model_run")  # a model's evaluation lives here
    responses = write_jsonl(tmp_path / "resp.jsonl", [dict(id=f"p{i}", response="\\boxed{4}") for i in range(5)])
    before = (tmp_path / "model_run" / "records.jsonl").read_text()
    with pytest.raises(ValueError, match="holds another evaluation"):
        E.main(["--responses", str(responses), "--dataset", str(data), "--out", str(tmp_path / "model_run")])
    assert (tmp_path / "model_run" / "records.jsonl").read_text() == before  # nothing lost


def test_responses_need_equal_counts_per_problem(data, tmp_path):
    rows = [dict(id=f"p{i}", response="\\boxed{4}") for i in range(5)] + [dict(id="p0", response="\\boxed{3}")]
    with pytest.raises(ValueError, match="different numbers of responses"):
        E.read_responses(write_jsonl(tmp_path / "resp.jsonl", rows), P.load_problems(str(data)))


def test_compare_refuses_records_with_other_reference_answers(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [dict(id="q0", answer="1", correct=True), dict(id="q1", answer="2",
                                                                                        correct=False)])
    b = write_jsonl(tmp_path / "b.jsonl", [dict(id="q0", answer="1", correct=True), dict(id="q1", answer="3",
                                                                                        correct=True)])
    with pytest.raises(ValueError, match="problem 'q1' has reference answer '2' in .*a.jsonl but '3'"):
        E.compare(a, b)


def run_shell(*argv):
    r = subprocess.run([sys.executable, "evaluate.py", *map(str, argv)], capture_output=True, text=True,
                       cwd=Path(E.__file__).parent, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    return r.returncode, r.stderr


def test_compare_n_boot_below_one_is_a_flag_error(tmp_path):
    a = hand_records(tmp_path / "a.jsonl", [1, 0, 1])
    code, err = run_shell("compare", a, a, "--n-boot", "0")
    assert (code, err) == (2, "evaluate.py: error: --n-boot must be at least 1, got 0\n")
    with pytest.raises(ValueError, match="n_boot must be an integer >= 1"):  # from Python too
        E.compare(a, a, n_boot=0)


def test_a_too_long_or_unencodable_problem_is_named_before_out_is_claimed(tmp_path):
    long = write_jsonl(tmp_path / "long.jsonl", [dict(id="ok", problem="1 + 2", answer="3"),
                                                 dict(id="big", problem="1 + " * 300 + "2", answer="0")])
    out = tmp_path / "out"
    with pytest.raises(ValueError) as e:
        E.main(["--model", "tiny", "--dataset", str(long), "--out", str(out)])
    assert str(e.value).startswith(f"{long}: problem 'big' has a ") and "context" in str(e.value)
    accent = write_jsonl(tmp_path / "accent.jsonl", [dict(id="q1", problem="1 + \u00e9", answer="3")])
    for extra in ([], ["--responses", str(write_jsonl(tmp_path / "r.jsonl", [dict(id="q1", response="3")]))]):
        with pytest.raises(ValueError) as e:
            E.main(["--model", "tiny", "--dataset", str(accent), "--out", str(out), *extra])
        assert str(e.value).startswith(f"{accent}: problem 'q1' has characters the model's tokenizer cannot encode")
    assert not out.exists()


@pytest.mark.parametrize("line, words", [
    ('{"id": ["a"], "problem": "1 + 2", "answer": "3"}', ":1: 'id' must be a string or an integer, got list"),
    ("[" * 100_000 + "]" * 100_000, ":1: JSON nested too deeply"),
], ids=["list-id", "deep"])
def test_hostile_data_lines_are_one_line_errors(tmp_path, line, words):
    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    code, err = run_shell("--model", "tiny", "--dataset", path, "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"evaluate.py: error: {path}{words}"), err
    assert not (tmp_path / "out").exists()


def test_records_with_a_list_id_are_named(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [dict(id="q0", correct=True), dict(id=["q1"], correct=True)])
    with pytest.raises(ValueError, match=r"r.jsonl:2: 'id' must be a string or an integer, got list"):
        E.compare(path, path)


def test_threads_flag_sets_torch_threads(tiny, data, tmp_path, monkeypatch):
    import torch as T
    seen = []
    monkeypatch.setattr(T, "set_num_threads", lambda n: seen.append(n))
    run_cli(tiny, data, tmp_path / "out", "--limit", "1", "--threads", "1")
    assert seen == [1]
    with pytest.raises(ValueError, match="--threads must be >= 0"):
        run_cli(tiny, data, tmp_path / "out2", "--threads", "-1")
