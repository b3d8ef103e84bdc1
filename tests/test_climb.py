"""climb.py: fresh problems per rung and the replay mix by hand, the lr schedule against train_rl.lr_at, one tiny
round end to end and a --resume after it that changes nothing."""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import checkpoint
import evaluate as E
import model as M
import problems as P
import runs
import tiny
import train_rl as T
import update as U
import verify as V
from research.rounds import climb as C
from research.rounds import rounds as R

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["--rounds", "1", "--label-problems", "4", "--updates", "2", "--val-limit", "2", "--chunk-ops", "2",
         "--batch-size", "4", "--min-traces", "1", "--threads", "1", "--device", "cpu"]


def test_each_rung_is_labelled_from_its_own_split_never_twice_by_hand(tmp_path):
    assert [C.split_of(k, 1) for k in (2, 6, 7, 8, 9, 10)] == ["tiny_ladder_train"] * 2 + \
        ["tiny_ladder_far_train"] * 2 + ["tiny_ladder_far2_train"] * 2
    assert [C.split_of(k, 2) for k in (6, 7, 9)] == ["tiny_ladder_val", "tiny_ladder_far_val", "tiny_ladder_far2_val"]
    pool = [dict(id=f"p{i}", level=level) for i, level in enumerate([7, 8, 7, 7, 8, 7, 7])]
    first = C.fresh_problems(pool, 7, 2, set())
    assert [p["id"] for p in first] == ["p0", "p2"]  # the rung's rows in order
    assert [p["id"] for p in C.fresh_problems(pool, 7, 2, {"p0", "p2"})] == ["p3", "p5"]  # never one used before
    assert [p["id"] for p in C.fresh_problems(pool, 8, 5, set())] == ["p1", "p4"]  # fewer where the rung has fewer
    for q, ids in ((1, ["a", "b"]), (2, ["c"])):  # the ids used are read from the earlier rounds' labelling records
        (tmp_path / f"round_{q}" / "label").mkdir(parents=True)
        runs.write_jsonl(tmp_path / f"round_{q}" / "label" / "records.jsonl", [dict(id=i, correct=False) for i in ids])
    assert C.used_ids(tmp_path, 1) == set() and C.used_ids(tmp_path, 3) == {"a", "b", "c"}
    # the real splits: rung 9's first problems come from far2, rung 6's from the ladder
    far2 = P.load_problems("tiny_ladder_far2_train")
    assert all(p["level"] == 9 for p in C.fresh_problems(far2, 9, 3, set()))


def test_a_run_evaluates_rungs_2_10_or_up_to_the_last_rung_it_labels():
    """Rungs 11-20 (tiny_ladder_far3_*) enter a run only when it labels past rung 10: the default climb (rungs 6-10)
    reads the three splits it read before they existed."""
    cases = [(dict(), 10, 3), (dict(rounds=0), 10, 3), (dict(rounds=6, max_new_tokens=272), 11, 4),
             (dict(rounds=15, max_new_tokens=272), 20, 4), (dict(start_rung=2, rounds=3), 10, 3)]
    for flags, top, n_splits in cases:
        cfg = C.ClimbConfig(**flags)
        C.check_config(cfg)
        assert C.top_rung(cfg) == top and list(C.rungs_for(cfg)) == list(range(2, top + 1))
        assert [s[1] for s in C.splits_for(cfg)] == ["tiny_ladder_train", "tiny_ladder_far_train",
                                                     "tiny_ladder_far2_train", "tiny_ladder_far3_train"][:n_splits]
    train, val = C.load_data(C.ClimbConfig(rounds=6, max_new_tokens=272, val_limit=3))
    assert sorted(val) == list(range(2, 12)) and all(len(v) == 3 and {p["level"] for p in v} == {k}
                                                     for k, v in val.items())
    assert C.split_of(11, 1) == "tiny_ladder_far3_train" and C.split_of(20, 2) == "tiny_ladder_far3_val"
    assert sum(p["level"] == 20 for p in train["tiny_ladder_far3_train"]) == 2000


def test_each_seed_draws_its_own_problems_with_problem_order_seeded():
    pool = P.load_problems("tiny_ladder_far_train")
    rung7 = [p["id"] for p in pool if p["level"] == 7]
    assert C.order_seed(C.ClimbConfig(seed=3)) is None  # the default: the split's order, as before the flag
    assert C.order_seed(C.ClimbConfig(seed=3, problem_order="seeded")) == 3
    draws = {s: [p["id"] for p in C.fresh_problems(pool, 7, 50, set(), s)] for s in (0, 1)}
    assert draws[0] != draws[1] and len(set(draws[0]) & set(draws[1])) < 25  # 50 of 1,000: about 2.5 shared
    assert draws[0] == [p["id"] for p in C.fresh_problems(pool, 7, 50, set(), 0)]  # the same seed, the same draw
    assert draws[0] != rung7[:50] and set(draws[0]) <= set(rung7)
    every = [p["id"] for p in C.fresh_problems(pool, 7, 10_000, set(), 0)]
    assert sorted(every) == sorted(rung7)  # all of them, each once: an order, not a sample with replacement
    later = [p["id"] for p in C.fresh_problems(pool, 7, 50, set(draws[0]), 0)]
    assert later == every[50:100]  # a later round goes on down the same order, never taking a problem again


def test_replay_mix_counts_by_hand():
    assert C.replay_counts({2: 100, 3: 100, 6: 3}, 10) == {2: 4, 3: 3, 6: 3}  # 10 over 3 rungs: 4, 3, 3
    assert C.replay_counts({2: 100, 6: 1}, 10) == {2: 9, 6: 1}  # what rung 6 lacks goes to rung 2
    assert C.replay_counts({2: 1, 3: 2}, 10) == {2: 1, 3: 2}  # all there is
    assert C.replay_counts({2: 5}, 0) == {2: 0} and C.replay_counts({}, 7) == {}
    earlier = {k: [dict(id=f"{k}-{i}", level=k) for i in range(n)] for k, n in ((2, 50), (5, 50), (6, 2))}
    mix = C.replay(earlier, 10, 1.0, 0, 3)  # ratio 1: as many replayed as new
    assert len(mix) == 10 and len({t["id"] for t in mix}) == 10
    assert {k: len(v) for k, v in C.by_rung(mix).items()} == {2: 4, 5: 4, 6: 2}
    assert len(C.replay(earlier, 10, 0.5, 0, 3)) == 5 and C.replay(earlier, 10, 0.0, 0, 3) == []
    assert C.replay(earlier, 10, 1.0, 0, 3) == mix and C.replay(earlier, 10, 1.0, 1, 3) != mix  # seeded


def decomposed_record(problem, responses, finish=None):
    """A labelling record as rounds.decompose writes it: graded by the step key (evaluate.grade_records, grader
    steps), one sample per response."""
    group = [dict(response=x, completion_tokens=len(x), finish_reason=(finish or {}).get(i, "stop"))
             for i, x in enumerate(responses)]
    return E.grade_records([problem], [5], [group], group_by="level", grader="steps")[0]


def test_each_label_source_keeps_what_it_should_and_precision_says_so_by_hand():
    """5 + 3 - 2: the reference chain ends in 6; a trace with wrong steps can still box 6, and a wrong majority
    boxes 7. key keeps only the reference chain; answer keeps the first trace boxing 6, steps or no; vote keeps
    the plurality's trace, wrong or not, and never reads the answer; precision is measured against both truths."""
    p = dict(id="p", problem="5 + 3 - 2", answer="6", level=2)
    ref, lucky, wrong = "\n5 + 3 = 8\n8 - 2 = 6\n\\boxed{6}", "\n5 + 3 = 9\n9 - 2 = 6\n\\boxed{6}", \
        "\n5 + 3 = 9\n9 - 2 = 7\n\\boxed{7}"
    assert V.check_steps(ref, p["problem"], "6") and not V.check_steps(lucky, p["problem"], "6")
    majority_wrong = decomposed_record(p, [lucky, wrong, ref, wrong + " ", "\n5 + 3 = 8", wrong])
    tie = decomposed_record(p, [ref, wrong, lucky, wrong])  # 6 twice, 7 twice: no label
    lone = decomposed_record(p, [ref, "\n5 + 3 = 8", "\n5 +"])  # one vote: below --vote-min 2
    cut = decomposed_record(p, [wrong, ref, ref], finish={1: "length"})  # 6 wins, but its first sample was cut
    texts = lambda rec, src, cap=1, votes=2: [s["response"] for s in R.select_traces(rec, "distinct", cap, src, votes)]
    assert texts(majority_wrong, "key") == [ref] and texts(majority_wrong, "answer") == [lucky]
    assert texts(majority_wrong, "vote") == [wrong] and texts(majority_wrong, "vote", 3) == [wrong, wrong + " "]
    assert R.vote_answer(majority_wrong, 2) == "7" and R.vote_answer(majority_wrong, 4) is None  # 3 votes for 7
    assert texts(tie, "vote") == [] and R.vote_answer(tie, 1) is None and texts(tie, "answer", 2) == [ref, lucky]
    assert texts(lone, "vote") == [] and texts(lone, "vote", votes=1) == [ref] and texts(lone, "key") == [ref]
    assert R.vote_answer(cut, 2) == "6" and texts(cut, "vote") == [ref] and texts(cut, "key") == [ref]
    # the vote never reads the answer: the same samples under another answer give the same vote labels
    assert texts(dict(majority_wrong, answer="999"), "vote") == [wrong]
    assert texts(dict(majority_wrong, answer="999"), "answer") == []
    records = [majority_wrong, tie, lone, cut]
    assert R.label_precision(records, "distinct", 1, "key") == dict(kept=4, problems=4, precision_steps=1.0,
                                                                    precision_answer=1.0)
    assert R.label_precision(records, "distinct", 1, "answer") == dict(kept=4, problems=4, precision_steps=0.75,
                                                                       precision_answer=1.0)  # lucky in majority_wrong
    assert R.label_precision(records, "distinct", 1, "vote") == dict(kept=2, problems=2, precision_steps=0.5,
                                                                     precision_answer=0.5)  # wrong, then cut's ref
    assert R.label_precision([tie], "distinct", 1, "vote") == dict(kept=0, problems=0, precision_steps=None,
                                                                   precision_answer=None)


def test_the_scaffold_learner_rewards_each_sample_by_the_label_source_with_dr_grpos_gradient_by_hand(monkeypatch):
    """--learner scaffold: a group is a record that --label-source splits; each sample's advantage is Dr. GRPO's
    r - mean (2 of 4 right: +0.5, -0.5, +0.5, -0.5); the update's gradient is -sum_i A_i log pi(o_i | x) / (budget x
    rows) over System 1's prompt, computed here by hand, and its step raises that sum."""
    p = dict(id="p", problem="5 + 3 - 2", answer="6", level=2)
    ref, lucky, wrong = "\n5 + 3 = 8\n8 - 2 = 6\n\\boxed{6}", "\n5 + 3 = 9\n9 - 2 = 6\n\\boxed{6}", \
        "\n5 + 3 = 9\n9 - 2 = 7\n\\boxed{7}"
    split = decomposed_record(p, [ref, wrong, lucky, "\n5 + 3 = 8\n8 - 2 = 7"], finish={3: "length"})
    same = decomposed_record(dict(p, id="q"), [ref, ref, ref, ref])  # all accepted: no signal, not a group
    cfg = C.ClimbConfig(label_source="answer", learner="scaffold", base_labels="own", samples=4, batch_size=4,
                        updates=1, warmup=0, lr=1e-5)
    groups = C.scaffold_groups([split, same], cfg)
    assert [g["id"] for g in groups] == ["p"] and groups[0]["rewards"] == [1.0, 0.0, 1.0, 0.0]
    assert [g["rewards"] for g in C.scaffold_groups([split], dataclasses.replace(cfg, label_source="key"))] == \
        [[1.0, 0.0, 0.0, 0.0]]  # the step key refuses the lucky chain
    tokenizer = checkpoint.load_tokenizer("tiny-ladder")
    rows = C.scaffold_rollouts(groups, {"p": p}, tokenizer)
    eos = tokenizer.stop_token_ids(chat=False)[0]
    assert [r.advantage for r in rows] == [0.5, -0.5, 0.5, -0.5]
    assert [r.advantage for r in C.scaffold_rollouts(groups, {"p": p}, tokenizer, negatives=False)] == \
        [0.5, 0.0, 0.5, 0.0]  # --no-scaffold-negatives: the rejected samples are not pushed down
    assert rows[0].prompt == tokenizer.encode(P.format_prompt(p["problem"], "base"))  # System 1's prompt
    assert rows[0].tokens == tokenizer.encode(ref) + [eos] and rows[3].tokens[-1] != eos  # the cut one: no stop
    policy = checkpoint.load_model("tiny-ladder", dtype=torch.float32, device="cpu")

    def completion_logp():  # each row's summed log-prob of its completion after its prompt, with gradient
        return [M.token_logprobs(policy, torch.tensor([r.prompt + r.tokens]))[0][0, len(r.prompt) - 1:].sum()
                for r in rows]
    # the expected gradient, by hand: -sum_i A_i log pi(o_i | x) / (--max-new-tokens x 4 rows)
    (-sum(r.advantage * lp for r, lp in zip(rows, completion_logp())) / (cfg.max_new_tokens * 4)).backward()
    expected = {n: q.grad.clone() for n, q in policy.named_parameters()}
    policy.zero_grad()
    seen, apply = {}, U.apply_gradients
    monkeypatch.setattr(U, "apply_gradients", lambda m, *a: seen.update(
        {n: q.grad.clone() for n, q in m.named_parameters()}) or apply(m, *a))
    with torch.no_grad():
        before = sum(r.advantage * float(lp) for r, lp in zip(rows, completion_logp()))
    losses, trained = C.scaffold_learn(policy, groups, cfg, 1, "cpu", tokenizer, {"p": p})
    assert len(losses) == 1 and len(trained) == 4 and seen.keys() == expected.keys()
    for n in expected:
        torch.testing.assert_close(seen[n], expected[n], rtol=1e-4, atol=1e-7)
    with torch.no_grad():  # one small step raises sum_i A_i log pi(o_i): right traces up, wrong ones down
        assert sum(r.advantage * float(lp) for r, lp in zip(rows, completion_logp())) > before


def test_a_scaffold_round_learns_from_the_groups_of_its_rung_and_of_the_base_replay(tmp_path):
    out = tmp_path / "scaffold"
    rows = C.main(SMOKE + ["--start-rung", "4", "--learner", "scaffold", "--base-labels", "own", "--base-problems", "4",
                           "--label-source", "answer", "--samples", "4", "--out", str(out)])
    row = rows[1]
    groups = C.scaffold_groups(C.label_records(out, 1), C.ClimbConfig(label_source="answer"))
    base = C.scaffold_groups(C.label_records(out, 0), C.ClimbConfig(label_source="answer"))
    assert groups and base  # these seeds give both (else the round would train on nothing)
    assert row["groups_new"] == len(groups) and row["traces_new"] == row["labels_by_source"]["answer"]["kept"]
    mix = {int(k): v for k, v in row["mix_by_rung"].items()}
    assert mix.get(4, 0) == len(groups) and sum(v for k, v in mix.items() if k < 4) == min(len(base), len(groups))
    assert row["updates"] == (2 if groups else 0) and (row["distillation_flops"] > 0) == bool(groups)
    assert row["cumulative_flops"] == rows[0]["cumulative_flops"] + row["deliberation_flops"] + \
        row["distillation_flops"]


def test_the_label_source_is_for_system_2s_samples_only():
    for bad in (dict(labels="generator"), dict(learner="drgrpo")):
        with pytest.raises(ValueError, match="--label-source vote chooses among System 2's samples"):
            C.check_config(C.ClimbConfig(label_source="vote", **bad))
        with pytest.raises(ValueError, match="--base-labels own labels with System 2's samples"):
            C.check_config(C.ClimbConfig(base_labels="own", **bad))
    with pytest.raises(ValueError, match="--no-base-replay has none"):
        C.check_config(C.ClimbConfig(base_labels="own", base_replay=False))
    for bad in (dict(labels="generator", base_labels="own"), dict(base_labels="ladder")):
        with pytest.raises(ValueError, match="--learner scaffold rewards System 2's samples"):
            C.check_config(C.ClimbConfig(learner="scaffold", **bad))
    C.check_config(C.ClimbConfig(learner="scaffold", base_replay=False))  # no base replay: nothing to label
    with pytest.raises(ValueError, match="--no-scaffold-negatives changes --learner scaffold's advantages"):
        C.check_config(C.ClimbConfig(scaffold_negatives=False))


def test_base_labels_own_replays_pi_0s_own_labels_of_the_rungs_below_and_a_resume_reads_them_again(tmp_path):
    """--base-labels own: round 0's System 2 labels --base-problems rows of each rung below --start-rung; the label
    source keeps what it accepts (answer: the boxed answer is the problem's, checked here by the verifier), row 0
    records each source's precision and the labelling FLOPs, round 1 replays only those traces, and a resume after
    round 1 is lost gives the same weights from the cached records."""
    out = tmp_path / "own"
    flags = SMOKE + ["--start-rung", "4", "--base-labels", "own", "--base-problems", "3", "--label-source", "answer",
                     "--samples", "4"]
    rows = C.main(flags + ["--out", str(out)])
    records = E.read_records(out / "round_0" / "base_label" / "records.jsonl")[0]
    ladder = P.load_problems("tiny_ladder_train")
    first = {k: [p["id"] for p in ladder if p["level"] == k][:3] for k in (2, 3)}  # in the split's order
    assert [r["id"] for r in records] == first[2] + first[3]
    by_id = {p["id"]: p for p in ladder}
    right = [(r, s) for r in records for s in E.samples_of(r)
             if V.extract_answer(s["response"]) == str(by_id[r["id"]]["answer"])]
    row0 = rows[0]
    answer = row0["base_labels_by_source"]["answer"]
    assert answer["kept"] == row0["base_traces"] == len({r["id"] for r, _ in right})  # one trace a problem
    assert answer["precision_answer"] in (1.0, None) and row0["base_problems_labelled"] == 6
    assert row0["label_samples"] == 24 and row0["deliberation_flops"] > 0
    assert row0["cumulative_flops"] == row0["round_flops"] == row0["deliberation_flops"]  # counted in round 0
    replayed = {k: v for k, v in rows[1]["mix_by_rung"].items() if int(k) < 4}
    assert sum(replayed.values()) <= answer["kept"] and set(replayed) <= {"2", "3"}
    weights = (out / "round_1" / "model.safetensors").read_bytes()
    log = out / "climb.jsonl"
    log.write_bytes(log.read_bytes().splitlines(keepends=True)[0])  # round 1 lost: the base is read from the cache
    (out / "round_1" / "model.safetensors").unlink()
    C.main(flags + ["--out", str(out), "--resume"])
    assert (out / "round_1" / "model.safetensors").read_bytes() == weights


def test_lr_warms_up_then_decays_by_cosine_as_lr_at(monkeypatch):
    seen = []

    def fake_update(policy, optimizer, batch, cfg, device, pad_id):
        seen.append((optimizer.param_groups[0]["lr"], list(batch)))
        return dict(loss=0.0, tokens=0)
    monkeypatch.setattr(T, "sft_update", fake_update)
    cfg = C.ClimbConfig(updates=10, warmup=3, lr=1e-3, batch_size=2)
    rows = list("abcde")
    losses, trained = C.distil(torch.nn.Linear(2, 2), rows, cfg, 1, "cpu", 0)
    lrs = [lr for lr, _ in seen]
    assert lrs == [T.lr_at(u, C.distil_config(cfg)) for u in range(10)]
    by_hand = [1e-3 * (u + 1) / 3 for u in range(3)] + [1e-3 * 0.5 * (1 + math.cos(math.pi * (u - 3) / 7))
                                                        for u in range(3, 10)]
    assert lrs == pytest.approx(by_hand) and lrs[2] == pytest.approx(1e-3) and lrs[-1] < 1e-4
    assert len(losses) == 10 and len(trained) == 20  # 10 updates of 2 rows: 4 seeded passes over the 5 rows
    assert all(sorted(trained[i:i + 5]) == list(range(5)) for i in range(0, 20, 5))
    assert [b for _, b in seen] == [[rows[i] for i in trained[j:j + 2]] for j in range(0, 20, 2)]


def test_one_round_writes_its_row_and_checkpoint_and_resume_changes_nothing(tmp_path):
    out = tmp_path / "climb"
    rows = C.main(SMOKE + ["--out", str(out)])
    log = out / "climb.jsonl"
    assert [r["round"] for r in runs.read_log(log)] == [0, 1] and (out / "round_1" / "model.safetensors").is_file()
    row = rows[1]
    for key in ("rung", "problems_labelled", "solved", "traces_new", "mix_by_rung", "token_share_by_rung",
                "loss_share_first_by_rung", "updates", "deliberation_flops", "distillation_flops", "fast_by_rung",
                "vote_rung", "vote_accuracy", "cumulative_flops"):
        assert key in row, key
    assert row["rung"] == 6 and row["problems_labelled"] == 4 and row["vote_rung"] == 7 and rows[0]["vote_rung"] == 6
    assert sorted(row["fast_by_rung"], key=int) == [str(k) for k in range(2, 11)]
    labelled = [json.loads(x)["id"] for x in (out / "round_1" / "label" / "records.jsonl").read_text().splitlines()]
    assert labelled == [p["id"] for p in P.load_problems("tiny_ladder_train") if p["level"] == 6][:4]
    traces = runs.read_log(out / "traces_1.jsonl")
    assert len(traces) == row["traces_new"] <= row["solved"] and all(t["level"] == 6 for t in traces)
    assert sum(row["mix_by_rung"].values()) == 2 * row["traces_new"]  # --replay-ratio 1
    assert row["updates"] == (2 if traces else 0) and row["deliberation_flops"] > 0
    assert row["label_source"] == "key" and set(row["labels_by_source"]) == {"key", "answer", "vote"}
    assert row["labels_by_source"]["key"]["kept"] == row["traces_new"]  # the default filters by the step key
    assert row["labels_by_source"]["key"]["precision_steps"] in (1.0, None)
    assert (row["distillation_flops"] > 0) == bool(traces)
    before, weights = log.read_bytes(), (out / "round_1" / "model.safetensors").read_bytes()
    C.main(SMOKE + ["--out", str(out), "--resume"])  # every round complete: nothing is redone
    assert log.read_bytes() == before and (out / "round_1" / "model.safetensors").read_bytes() == weights
    # killed before round 1's row was written: --resume redoes the round and gives the uninterrupted run's weights
    log.write_bytes(before.splitlines(keepends=True)[0])
    (out / "round_1" / "model.safetensors").unlink()
    again = C.main(SMOKE + ["--out", str(out), "--resume"])[1]
    assert (out / "round_1" / "model.safetensors").read_bytes() == weights
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in row.items() if k != "seconds"}


def test_a_round_from_a_coupled_start_distils_a_coupled_model_and_resumes_exactly(tmp_path):
    """A position-coupled start (tiny.py --couple) climbs as any start: the generator's chains distil into a model
    that is still coupled, and a round redone after a kill gives the same weights."""
    tok = checkpoint.load_tokenizer("tiny")
    checkpoint.save_model(tiny.new_model(tok, seed=0, couple=True), tmp_path / "start", tok)
    out, argv = tmp_path / "climb", SMOKE + ["--start", str(tmp_path / "start"), "--labels", "generator"]
    row = C.main(argv + ["--out", str(out)])[1]
    assert row["updates"] == 2 and row["traces_new"] > 0
    config = json.loads((out / "round_1" / "config.json").read_text())
    assert config["model_type"] == "coupled_qwen3" and config["position_coupling"] == tiny.coupling_ids(tok)
    weights, log = (out / "round_1" / "model.safetensors").read_bytes(), out / "climb.jsonl"
    assert weights != (tmp_path / "start" / "model.safetensors").read_bytes()
    log.write_bytes(log.read_bytes().splitlines(keepends=True)[0])
    (out / "round_1" / "model.safetensors").unlink()
    C.main(argv + ["--out", str(out), "--resume"])
    assert (out / "round_1" / "model.safetensors").read_bytes() == weights


def test_generator_labels_are_the_worked_chains_and_test_evaluates_each_round_once(tmp_path, capsys):
    ladder = [p for p in P.load_problems("tiny_ladder_train") if p["level"] == 3][:3]
    tok = checkpoint.load_tokenizer("tiny-ladder")
    assert [t["response"] for t in C.worked_traces(ladder, tok, 0, "ladder")] == \
        [tiny.completion_text(p, bare=False) for p in ladder]  # the generator's own solution text, byte for byte
    out = tmp_path / "gen"
    rows = C.main(SMOKE + ["--labels", "generator", "--out", str(out), "--rounds", "2"])
    traces = runs.read_log(out / "traces_1.jsonl") + runs.read_log(out / "traces_2.jsonl")
    problems = {p["id"]: p for s in C.SPLITS for p in P.load_problems(s[1])}
    for row in rows[1:]:
        assert row["solved"] == row["traces_new"] == row["problems_labelled"] == 4 and row["deliberation_flops"] == 0
    assert [t["level"] for t in traces] == [6] * 4 + [7] * 4  # round 2 labels rung 7 (its ids read from round 1)
    assert all(V.check_steps(t["response"], problems[t["id"]]["problem"], problems[t["id"]]["answer"]) for t in traces)
    C.main(["--test", "--test-limit", "2", "--test-vote-limit", "1", "--reach-samples", "3", "--reach-limit", "1",
            "--out", str(out), "--device", "cpu"])
    tests = runs.read_log(out / "test.jsonl")
    assert [t["round"] for t in tests] == [0, 1, 2] and all(t["fast_n"] == 18 and t["vote_n"] == 9 for t in tests)
    assert [sorted(t["reach"]) for t in tests] == [["5", "6"], ["6", "7"], ["7", "8"]]  # the round's rung and one up
    greedy = E.read_records(out / "round_1" / "test" / "fast" / "records.jsonl")[0]
    assert [r["id"] for r in greedy] == [p["id"] for k in range(2, 11) for p in
                                         [q for s in C.SPLITS for q in P.load_problems(s[3]) if q["level"] == k][:2]]
    for rung, cell in tests[1]["reach"].items():
        assert 0 <= cell["pass_at_1"] <= cell["pass_at_k"] <= 1 and sum(cell["first_errors"].values()) <= 1 + 1e-9
    before = (out / "test.jsonl").read_bytes()
    capsys.readouterr()
    C.main(["--test", "--out", str(out), "--device", "cpu", "--test-limit", "5"])  # every round tested: once only
    assert (out / "test.jsonl").read_bytes() == before
    said = capsys.readouterr().out
    assert "every complete round of" in said and "(rounds 0, 1, 2) is in test.jsonl already" in said
    assert "these --test flags are not applied" in said
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); import runs; "
                               "runs.claim(sys.argv[2], 'climb', resume=True); print('held', flush=True); "
                               "time.sleep(60)", str(ROOT), str(out)], stdout=subprocess.PIPE, text=True)
    try:  # another process's run (or --test) in --out: a second --test is refused, test.jsonl untouched
        assert holder.stdout.readline().strip() == "held"
        (out / "test.jsonl").write_bytes(before.splitlines(keepends=True)[0])
        with pytest.raises(FileExistsError, match="in use by PID"):
            C.main(["--test", "--out", str(out), "--device", "cpu"])
        assert (out / "test.jsonl").read_bytes() == before.splitlines(keepends=True)[0]
    finally:
        holder.kill()
        holder.wait()


def test_the_drgrpo_baseline_learns_the_rounds_problems_dense_then_binary(tmp_path):
    out = tmp_path / "rl"
    rows = C.main(SMOKE + ["--learner", "drgrpo", "--rl-steps", "3", "--dense-steps", "1", "--rl-problems-per-step",
                           "2", "--rl-group-size", "2", "--replay-ratio", "0.5", "--out", str(out), "--rounds", "2"])
    row = rows[1]
    pool_2 = runs.read_log(out / "round_2" / "rl_pool.jsonl")  # round 2: rung 7's problems, and rung 6's among the old
    assert [p["level"] for p in pool_2[:4]] == [7] * 4 and rows[2]["mix_by_rung"]["7"] == 4
    phases = [json.loads((out / "round_1" / f"rl_{i}" / "config.json").read_text()) for i in (0, 1)]
    assert [(c["steps"], c["prefix_credit"], c["objective"], c["grader"]) for c in phases] == \
        [(1, 0.5, "drgrpo", "steps"), (2, 0.0, "drgrpo", "steps")]  # dense first, then the binary reward
    assert phases[0]["model"] == str(out / "round_0") and phases[1]["model"] == str(out / "round_1" / "rl_0" / "final")
    pool = runs.read_log(out / "round_1" / "rl_pool.jsonl")
    rung6 = [p["id"] for p in P.load_problems("tiny_ladder_train") if p["level"] == 6][:4]
    assert [p["id"] for p in pool[:4]] == rung6 and len(pool) == 6  # the round's 4 problems and 0.5 x 4 replayed
    assert all(p["level"] < 6 for p in pool[4:]) and row["mix_by_rung"]["6"] == 4
    flops = sum(runs.read_log(out / "round_1" / f"rl_{i}" / "metrics.jsonl")[-1]["flops"] for i in (0, 1))
    assert row["updates"] == 3 and row["deliberation_flops"] == 0 and row["distillation_flops"] == pytest.approx(flops)
    final = checkpoint.load_model(out / "round_1" / "rl_1" / "final", device="cpu").state_dict()
    saved = checkpoint.load_model(out / "round_1", device="cpu").state_dict()
    assert all(torch.equal(final[k], saved[k]) for k in final)  # pi_1 is the second phase's final weights


def test_bad_input_is_one_error_line(tmp_path):
    for flags, said in [(["--rounds", "16"], "--start-rung 6 --rounds 16 would label rung 21; the ladder's top rung "
                                             "is 20"),
                        (["--rounds", "6"], "--max-new-tokens 160 cannot hold rung 11's chain; a run past rung 10 needs "
                                            "--max-new-tokens 272 (a 20-line chain)")]:
        done = subprocess.run([sys.executable, str(ROOT / "research/rounds/climb.py"), *flags, "--out",
                               str(tmp_path / "x")], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"climb.py: error: {said}"]
        assert not (tmp_path / "x").exists()
    with pytest.raises(FileExistsError, match="holds a rounds run"):  # a rounds.py run is never resumed as a climb
        (tmp_path / "r").mkdir()
        (tmp_path / "r" / "config.json").write_text(json.dumps(dict(rounds=3)))
        C.main(["--out", str(tmp_path / "r"), "--resume", "--device", "cpu"])


def snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_a_resume_refuses_missing_or_damaged_traces_keeps_the_first_config_and_records_a_new_commit(tmp_path,
                                                                                                     monkeypatch, capsys):
    """Round 2 replays round 1's traces: a resume without them whole would learn from other data (exit 0, other
    weights), so it is refused naming the file and writing nothing. A resume under another commit ends as the
    straight run, config.json kept with the new commit beside the first; a setting the run's config.json lacks is
    named with the value the resume goes on with, and not written into it."""
    flags = SMOKE + ["--labels", "generator", "--rounds", "2"]
    straight = tmp_path / "straight"
    C.main(flags + ["--out", str(straight)])
    run = tmp_path / "run"
    C.main(flags + ["--out", str(run), "--rounds", "1"])
    saved = json.loads((run / "config.json").read_text())
    for newer in ("loss_probe", "label_source", "vote_min", "problem_order", "base_labels", "base_problems"):
        del saved[newer]
    runs.write_json(run / "config.json", dict(saved, rounds=2))
    first = (run / "config.json").read_bytes()
    traces = run / "traces_1.jsonl"
    good = traces.read_bytes()
    lines = good.splitlines(keepends=True)
    assert len(lines) == 4
    for damage, said in [(None, "round 1's traces are missing"), (good[:-30], "traces_1.jsonl:4: not a JSON object"),
                         (b"".join(lines[:3]), "3 rows where climb.jsonl's round 1 made 4")]:
        traces.unlink(missing_ok=True)
        if damage is not None:
            traces.write_bytes(damage)
        before = snapshot(run)
        with pytest.raises((ValueError, FileNotFoundError), match=said) as e:
            C.main(flags + ["--out", str(run), "--resume"])
        assert str(traces) in str(e.value) and snapshot(run) == before  # named, and nothing written
    traces.write_bytes(good)
    with pytest.raises(ValueError, match="--rounds 0: the run in .* has completed 1 round"):
        C.main(flags + ["--out", str(run), "--resume", "--rounds", "0"])
    assert (run / "config.json").read_bytes() == first
    monkeypatch.setattr(runs, "code_version", lambda: "another-commit")
    capsys.readouterr()
    C.main(flags + ["--out", str(run), "--resume"])
    assert f"note: --resume: {run / 'config.json'} has no label_source, vote_min, problem_order, base_labels, " \
           f"base_problems, loss_probe (settings newer than the run); it goes on with their defaults, as it ran: " \
           f"--label-source 'key', --vote-min 2, --problem-order 'file', --base-labels 'ladder', --base-problems " \
           f"400, --loss-probe 64" in capsys.readouterr().err
    assert (run / "round_2" / "model.safetensors").read_bytes() == \
        (straight / "round_2" / "model.safetensors").read_bytes()
    saved = json.loads((run / "config.json").read_text())
    assert saved == dict(json.loads(first), resumes=[dict(code_version="another-commit")])
    assert saved["code_version"] == json.loads((straight / "config.json").read_text())["code_version"]


def test_the_baselines_errors_name_its_own_flags():
    with pytest.raises(ValueError, match=r"the Dr. GRPO baseline: --rl-group-size 1: .* use --rl-group-size >= 2$"):
        C.check_config(C.ClimbConfig(learner="drgrpo", rl_group_size=1))
