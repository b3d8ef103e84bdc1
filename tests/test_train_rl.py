"""train_rl.py: hand-computed advantages and losses, then the loop's mechanics on a tiny random model."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import model as M
import problems as P
import train_rl as T
import checkpoint
import objectives
import diversity
import runs
import verify
import distributed as D

REAL_GRADE_BATCH = T.verify.grade_batch  # before any test stubs it

# -----------------------------------------------------------------------------
# The loop on a tiny random model. The reward is a stand-in (is the first character a vowel-ish half of
# the alphabet?) so that groups are mixed; the real verifier is tested in test_verify.py.


def fake_grade(texts, refs):
    return [bool(t) and t[0] in "abcdefghijklmABCDEFGHIJKLM0123456789 " for t in texts]


@pytest.fixture
def run_setup(tmp_path, char_model_dir, monkeypatch):
    monkeypatch.setattr(T.verify, "grade_batch", fake_grade)
    data = tmp_path / "pool.jsonl"
    data.write_text("".join(json.dumps(dict(id=f"p{i}", problem=f"What is {i} + {i}?", answer=str(2 * i))) + "\n"
                            for i in range(6)))

    def config(**kw):
        base = dict(model=str(char_model_dir), dataset=str(data), subject="", num_problems=0, val_size=0, steps=2,
                    problems_per_step=2, group_size=4, max_new_tokens=8, lr=1e-2, seed=0, device="cpu",
                    out=str(tmp_path / "run"), save_every=0, micro_batch_tokens=200, samples_per_step=1)
        base.update(kw)
        return T.Config(**base)
    return config


def make_run(cfg, policy, tok, pool=(), reference=None, optimizer=None):
    """A Run on the CPU whose sampler is the policy, as train() builds it there."""
    return T.Run(cfg, policy, policy, reference, optimizer, tok, list(pool), "cpu", {})


def weights(path):
    return checkpoint.load_model(path, device="cpu").state_dict()


def test_one_step_updates_weights_and_writes_a_run_transformers_loads(run_setup, char_model_dir):
    run = T.train(run_setup(steps=1))
    before, after = weights(char_model_dir), weights(run / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    m = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(m) == 1 and m[0]["step"] == 1
    for key in ("reward_mean", "accuracy", "format_failure_rate", "response_tokens_mean", "response_tokens_max",
                "truncation_rate", "entropy", "clip_fraction", "loss", "grad_norm", "lr", "sampling_seconds",
                "verifying_seconds", "training_seconds", "tokens_per_second", "generated_tokens", "flops"):
        assert key in m[0], key
    assert m[0]["grad_norm"] > 0 and m[0]["entropy"] > 0
    assert 0 <= m[0]["truncation_rate"] <= 1 and (m[0]["truncation_rate"] * 8).is_integer()  # a share of 8 samples
    # compute and speed from their definitions: 2 problems x G = 4 samples drawn, prompts known
    cfg, step = run_setup(steps=1), m[0]
    assert step["generated_tokens"] == pytest.approx(step["response_tokens_mean"] * 8)
    assert 0 < step["training_tokens"] <= step["generated_tokens"]
    tok, pool = checkpoint.load_tokenizer(cfg.model), P.load_problems(cfg.dataset)
    prompts = [len(tok.encode(P.format_prompt(pool[i]["problem"]))) for i in T.problems_for_step(6, 0, 2, 0)]
    context = sum(prompts) / 2 + step["response_tokens_mean"] / 2
    net = checkpoint.load_model(cfg.model, device="cpu").config
    assert step["flops"] == pytest.approx(step["generated_tokens"] * M.flops_per_token(net, context)
                                          + step["training_tokens"] * M.flops_per_token(net, context, training=True))
    assert step["tokens_per_second"] == pytest.approx(step["generated_tokens"] / step["sampling_seconds"])
    assert min(step["sampling_seconds"], step["training_seconds"]) > 0 and step["verifying_seconds"] >= 0
    assert (run / "samples.jsonl").read_text().count("\n") == 1
    assert json.loads((run / "config.json").read_text())["objective"] == "drgrpo"
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(run / "final").eval()
    ours = checkpoint.load_model(run / "final", device="cpu")
    ids = torch.randint(1, 90, (2, 12))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max() < 1e-4


def test_resume_continues_exactly(run_setup, tmp_path):
    straight = T.train(run_setup(steps=4, out=str(tmp_path / "straight")))
    T.train(run_setup(steps=2, out=str(tmp_path / "split")))
    split = T.train(run_setup(steps=4, out=str(tmp_path / "split"), resume=True))
    a, b = weights(straight / "final"), weights(split / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit

    def steady(path):  # metrics without wall-clock fields
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if "second" not in k} for r in rows]
    sa, sb = steady(straight), steady(split)
    assert [r["step"] for r in sb] == [1, 2, 3, 4]
    for ra, rb in zip(sa, sb):
        assert ra.keys() == rb.keys()
        assert ra == rb  # every logged value, the running compute totals too


def test_a_killed_run_and_an_interrupted_run_resume_exactly(run_setup, tmp_path, monkeypatch):
    straight = T.train(run_setup(steps=4, save_every=2, out=str(tmp_path / "straight")))
    real_step = T.rl_step

    def dies_at(index, error):
        def step(run, step, totals):
            if step == index:  # the 0-based step about to run
                raise error
            return real_step(run, step, totals)
        return step
    # killed during step 4: metrics of step 3 were logged after the step-2 checkpoint and must be redone once
    monkeypatch.setattr(T, "rl_step", dies_at(3, RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        T.train(run_setup(steps=4, save_every=2, out=str(tmp_path / "killed")))
    assert [json.loads(x)["step"] for x in (tmp_path / "killed/metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    # Ctrl-C during step 4: the three finished steps are saved first (a step_3 checkpoint), then the interrupt goes
    # on up (cli.run_main makes it exit status 130)
    monkeypatch.setattr(T, "rl_step", dies_at(3, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        T.train(run_setup(steps=4, save_every=0, out=str(tmp_path / "ctrl_c")))
    assert sorted(p.name for p in (tmp_path / "ctrl_c/checkpoints").iterdir()) == ["step_3"]
    monkeypatch.setattr(T, "rl_step", real_step)
    for name in ("killed", "ctrl_c"):
        run = T.train(run_setup(steps=4, save_every=2, out=str(tmp_path / name), resume=True))
        a, b = weights(straight / "final"), weights(run / "final")
        assert all(torch.equal(a[k], b[k]) for k in a), name

        def steady(path):
            rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
            return [{k: v for k, v in r.items() if "second" not in k} for r in rows]
        assert steady(run) == steady(straight), name  # each step once, the compute totals continued


def test_truncate_and_logged_totals_hand_made(tmp_path):
    log = tmp_path / "metrics.jsonl"
    rows = [dict(step=0, test_accuracy=0.5), dict(step=1, generated_tokens=10, training_tokens=8, flops=1.5),
            dict(step=2, generated_tokens=25, training_tokens=20, flops=4.0), dict(step=3, generated_tokens=40,
            training_tokens=33, flops=7.0)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert runs.logged_totals(log, 2) == dict(generated_tokens=25, training_tokens=20, flops=4.0)
    assert runs.logged_totals(log, 0) == dict(generated_tokens=0, training_tokens=0, flops=0.0)
    runs.truncate_log(log, 2)
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [0, 1, 2]


def test_lr_schedules_hand_values():
    cfg = lambda schedule: T.Config(lr=1.0, warmup_steps=2, steps=6, schedule=schedule)  # noqa: E731
    # warmup: (step + 1) / 2; then progress = (step - 2) / 4 over steps 2..5
    assert [T.lr_at(s, cfg("constant")) for s in range(6)] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert [T.lr_at(s, cfg("linear")) for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    cosine = [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))]
    assert [T.lr_at(s, cfg("cosine")) for s in range(6)] == pytest.approx(cosine)


def test_the_loop_steps_with_the_scheduled_lr(run_setup, tmp_path):
    run = T.train(run_setup(steps=3, warmup_steps=2, schedule="linear", lr=0.01))
    logged = [json.loads(x)["lr"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged == pytest.approx([0.005, 0.01, 0.01])


def test_rollouts_are_scored_by_the_reward_table_with_the_real_verifier():
    cfg = T.Config(max_new_tokens=10, overlong_buffer=4, format_penalty=0.2)
    rollouts = [T.Rollout(problem=dict(answer="4"), prompt=[], tokens=[0] * n, text=text, finish_reason="stop",
                          sampler_logprobs=[0.0] * n, seed=0, sample=j)
                for j, (text, n) in enumerate((("so \\boxed{4}", 5), ("so \\boxed{4}", 8), ("so \\boxed{5}", 10),
                                               ("four", 3)))]
    T.reward.score(rollouts, cfg)
    # right, short: 1; right at 8 of 10 tokens with a 4-token buffer: 1 + (10 - 4 - 8) / 4 = 0.5;
    # wrong and truncated at the budget: 0 - 1; no box: the format penalty, -0.2
    assert [r.reward for r in rollouts] == pytest.approx([1.0, 0.5, -1.0, -0.2])
    assert [(r.correct, r.boxed, r.passed) for r in rollouts] == [(True, True, True), (True, True, True),
                                                                  (False, True, False), (False, False, False)]


def test_format_penalty_reaches_the_reward_in_a_run(run_setup, monkeypatch):
    monkeypatch.setattr(T.verify, "grade_batch", REAL_GRADE_BATCH)
    run = T.train(run_setup(steps=1, format_penalty=0.3))
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    # a random character model never boxes an answer: every sample is a format failure worth -0.3
    assert m["format_failure_rate"] == 1.0 and m["reward_mean"] == pytest.approx(-0.3)


def test_load_pools_subject_filter_and_first_n_carve_out(tmp_path):
    pool = tmp_path / "pool.jsonl"
    subjects = "AABABAAB"
    pool.write_text("".join(json.dumps(dict(id=f"p{i}", problem=f"Q{i}", answer=str(i), subject=s)) + "\n"
                            for i, s in enumerate(subjects)))
    cfg = T.Config(dataset=str(pool), subject="A", num_problems=2, val_size=2, seed=0)
    train, val, test = P.load_pools(cfg)
    assert [p["id"] for p in train] == ["p0", "p1"]  # the first 2 of subject A, in file order
    assert len(val) == 2 and {p["id"] for p in val} < {"p3", "p5", "p6"} and test == []  # from the rest of A
    train, val, _ = P.load_pools(dataclasses.replace(cfg, subject="", num_problems=0, val_size=3))
    assert len(train) == 5 and len(val) == 3 and {p["id"] for p in train + val} == {f"p{i}" for i in range(8)}
    with pytest.raises(ValueError, match="--subject 'C': no problems of that subject"):
        P.load_pools(dataclasses.replace(cfg, subject="C"))


def test_test_dataset_is_evaluated_before_and_after(run_setup, tmp_path):
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps(dict(id=f"t{i}", problem=f"{i} + 1", answer=str(i + 1))) + "\n" for i in range(5)))
    run = T.train(run_setup(steps=2, test_dataset=str(test)))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 2] and "test_accuracy" in rows[0] and "test_accuracy" in rows[-1]
    from evaluate import evaluate  # the same protocol on the saved checkpoints gives the logged numbers
    problems = P.load_problems(str(test))
    for model, logged in ((run_setup().model, rows[0]), (run / "final", rows[-1])):
        _, summary = evaluate(checkpoint.load_model(model, device="cpu"), checkpoint.load_tokenizer(model), problems, 8)
        assert summary["accuracy"] == logged["test_accuracy"]


def test_mu1_clipping_changes_nothing(run_setup, tmp_path):
    a = T.train(run_setup(steps=1, clip_low=0.2, clip_high=0.2, out=str(tmp_path / "a")))
    b = T.train(run_setup(steps=1, clip_low=1e9, clip_high=1e9, out=str(tmp_path / "b")))
    wa, wb = weights(a / "final"), weights(b / "final")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    m = json.loads((a / "metrics.jsonl").read_text().splitlines()[0])
    assert m["clip_fraction"] == 0.0


def test_epochs_per_batch_clips_later_epochs(run_setup):
    run = T.train(run_setup(steps=1, epochs_per_batch=3, clip_low=0.01, clip_high=0.01, lr=5e-2))
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert m["clip_fraction"] > 0  # the policy moved between epochs, so ratios left [1-e, 1+e]


def test_grpo_with_kl_logs_a_nonnegative_kl(run_setup):
    run = T.train(run_setup(objective="grpo", kl_coef=0.1, steps=2))
    m = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert m[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first step: policy == reference
    assert m[1]["kl"] > 0


@pytest.mark.parametrize("objective", sorted(objectives.OBJECTIVES))
def test_every_objective_runs_and_updates(run_setup, char_model_dir, objective):
    # k must be below the group size of 4; seed 0 draws a group that pass@2 gives a signal in both steps
    extra = dict(passk_k=2) if objective == "passk" else {}
    run = T.train(run_setup(objective=objective, steps=2, out=str(run_setup().out) + objective, **extra))
    m = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) and not r["skipped_update"] for r in m), m
    before, after = weights(char_model_dir), weights(run / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_kl_in_reward_subtracts_beta_times_the_sequence_kl(run_setup, char_model_dir):
    cfg = run_setup(kl_coef=0.5, kl_in="reward", kl_estimator="k1")
    policy, tok = checkpoint.load_model(char_model_dir, device="cpu"), checkpoint.load_tokenizer(char_model_dir)
    reference = checkpoint.load_model(char_model_dir, device="cpu")
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = T.collect_rollouts(policy, tok, [dict(problem="What is 1 + 1?", answer="2")], cfg, seeds=[0])
    for r in rows:
        r.reward = 1.0
    T.add_reference_kl(make_run(cfg, policy, tok, reference=reference), rows)
    for r in rows:  # independently: full forward of the reference, log-softmax of each completion token
        seq = torch.tensor([r.prompt + r.tokens])
        with torch.no_grad():
            ref = reference(seq)[0, len(r.prompt) - 1:-1].log_softmax(-1)
        ref_logp = ref.gather(-1, torch.tensor(r.tokens)[:, None]).squeeze(-1)
        kl = sum(r.sampler_logprobs) - ref_logp.sum().item()  # k1 summed over the sequence
        assert r.kl == pytest.approx(kl, abs=1e-4) and r.reward == pytest.approx(1.0 - 0.5 * kl, abs=1e-4)
    run = T.train(run_setup(objective="reinforce_pp", kl_coef=0.1, kl_in="reward", steps=2))
    m = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert m[0]["kl"] == pytest.approx(0.0, abs=1e-5) and m[1]["kl"] > 0  # k3: zero while policy == reference


def test_dynamic_sampling_keeps_only_mixed_groups(run_setup, char_model_dir):
    policy, tok = checkpoint.load_model(char_model_dir, device="cpu"), checkpoint.load_tokenizer(char_model_dir)
    pool = P.load_problems(run_setup().dataset)
    plain_drawn, plain_batch, _, seconds = T.draw_rollouts(make_run(run_setup(), policy, tok, pool), 0)
    assert plain_drawn == plain_batch and len(plain_batch) == 2 * 4
    for step in range(4):
        cfg = run_setup(dynamic_sampling=True, max_draws=3)
        drawn, batch, _, seconds = T.draw_rollouts(make_run(cfg, policy, tok, pool), step)
        groups = [batch[i:i + 4] for i in range(0, len(batch), 4)]
        assert all(0 < sum(r.passed for r in g) < 4 for g in groups)  # mixed only
        assert len(drawn) % 8 == 0 and len(drawn) <= 3 * 8 and len(groups) <= 2
        assert len(groups) == 2 or len(drawn) == 3 * 8  # short of P groups only when the draws ran out
        assert all(any(r is d for d in drawn) for r in batch)
        if step == 0:  # the first draw is the one a plain run makes
            assert [r.tokens for r in drawn[:8]] == [r.tokens for r in plain_drawn]
    assert seconds["sampling"] > 0


def test_the_plain_draw_is_the_options_loop_with_no_option_on(run_setup, char_model_dir):
    """draw_rollouts' one draw and draw_with_options' loop (uniform selector, no replay, no dynamic sampling) draw
    the same problems and the same samples, at step 0 and in a later epoch."""
    policy, tok = checkpoint.load_model(char_model_dir, device="cpu"), checkpoint.load_tokenizer(char_model_dir)
    pool = P.load_problems(run_setup().dataset)
    for step in (0, 3):
        run = make_run(run_setup(), policy, tok, pool)
        plain = T.draw_rollouts(run, step)
        looped = T.draw_with_options(run, step, dict(sampling=0.0, verifying=0.0, unverified=0))
        for a, b in zip(plain[:2], looped[:2]):
            assert [(r.problem["id"], r.tokens, r.reward) for r in a] == [(r.problem["id"], r.tokens, r.reward) for r in b]
        assert plain[2] == looped[2] == 0 and len(plain[1]) == 2 * 4


def test_validation_is_reported_per_source(run_setup, tmp_path):
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(dict(id=f"v{i}", source="ab"[i % 2] * 3, problem=f"What is {i}?", answer=str(i)))
                           + "\n" for i in range(5)))
    run = T.train(run_setup(steps=1, eval_every=1, val_dataset=str(val)))
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    by = m["val_accuracy_by_group"]
    assert set(by) == {"aaa", "bbb"}  # 3 problems from aaa, 2 from bbb: the overall mean is their weighted mean
    assert m["val_accuracy"] == pytest.approx((3 * by["aaa"] + 2 * by["bbb"]) / 5)
    for key in ("group_length_std", "group_distinct_answers", "group_ngram_overlap", "draws", "batch_groups"):
        assert key in m, key


def test_truncated_is_weights_are_one_when_sampler_equals_trainer(run_setup, char_model_dir):
    # on the CPU the sampler is the fp32 policy itself, so pi_trainer / pi_sampler = 1 on every token: TIS is
    # a no-op there, and what it corrects on GPU is only the bf16 sampler's numerics
    cfg = run_setup(tis_cap=2.0)
    policy, tok = checkpoint.load_model(char_model_dir, device="cpu"), checkpoint.load_tokenizer(char_model_dir)
    rows = T.collect_rollouts(policy, tok, [dict(problem="What is 1 + 1?", answer="2"),
                                            dict(problem="And 12 * 3?", answer="36")], cfg, seeds=[0, 1])
    ids, mask, sampler_logp = T.rollout_tensors(rows, tok.pad_id, "cpu")
    with torch.no_grad():
        trainer_logp, _ = M.token_logprobs(policy, ids)
    weights = objectives.truncated_is_weights(trainer_logp, sampler_logp, mask, cfg.tis_cap)
    assert mask.sum() > 10 and torch.allclose(weights, torch.ones_like(weights), atol=1e-4)


def test_objective_defaults_apply_from_python_and_the_command_line_and_flags_win():
    for make in (lambda name, **kw: T.Config(objective=name, **kw),
                 lambda name, **kw: T.parse_args(["--objective", name] + [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])):
        assert (make("dapo").clip_high, make("dapo").dynamic_sampling, make("dapo").clip_low) == (0.28, True, 0.2)
        assert make("dapo", clip_high=0.3).clip_high == 0.3
        assert (make("gspo").clip_low, make("gspo").clip_high) == (3e-4, 4e-4)
        assert (make("grpo").clip_high, make("grpo").dynamic_sampling) == (0.2, False)
    assert T.parse_args(["--objective", "dapo", "--no-dynamic-sampling"]).dynamic_sampling is False


def test_lora_trains_only_adapters_and_merged_checkpoint_matches(run_setup, char_model_dir):
    cfg = run_setup(steps=1, lora_rank=4, lora_alpha=8.0, lr=5e-2)
    policy = checkpoint.load_model(cfg.model, device="cpu")
    T.lora.add_lora(policy, 4, 8.0)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    run = T.train(cfg)
    # the run's adapters, restored into a fresh LoRA model, must give the merged checkpoint's logits
    runs.load_trainer_state(run / "checkpoints" / "step_1", policy, torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad]))
    merged = checkpoint.load_model(run / "final", device="cpu")
    base = checkpoint.load_model(char_model_dir, device="cpu")
    ids = torch.randint(1, 90, (2, 10))
    with torch.no_grad():
        assert (policy(ids) - merged(ids)).abs().max() < 1e-5
        assert (base(ids) - merged(ids)).abs().max() > 1e-4  # and the adapter did change the model
    for k, v in base.state_dict().items():  # only the adapted projections differ from the base
        if not any(t in k for t in T.lora.TARGETS):
            assert torch.equal(v, merged.state_dict()[k]), k


def test_lora_run_resumes_exactly(run_setup, tmp_path):
    lora = dict(lora_rank=4, lora_alpha=8.0, lr=5e-2, save_every=2)
    straight = T.train(run_setup(steps=4, out=str(tmp_path / "straight"), **lora))
    T.train(run_setup(steps=2, out=str(tmp_path / "split"), **lora))
    split = T.train(run_setup(steps=4, out=str(tmp_path / "split"), resume=True, **lora))
    a, b = weights(straight / "final"), weights(split / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the adapters and their AdamW moments came back
    assert any(not torch.equal(a[k], weights(run_setup().model)[k]) for k in a)


def test_nonfinite_loss_skips_the_update(run_setup, char_model_dir, monkeypatch):
    nan_loss = objectives.Objective(objectives.OBJECTIVES["drgrpo"].advantages, lambda b, cfg: b.logp.sum() * float("nan"),
                                    "a test", "a NaN loss")
    monkeypatch.setitem(objectives.OBJECTIVES, "drgrpo", nan_loss)
    run = T.train(run_setup(steps=1))
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert m["skipped_update"] is True
    before, after = weights(char_model_dir), weights(run / "final")
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_bad_inputs_error_clearly(run_setup, tmp_path):
    with pytest.raises(ValueError, match="grpo, drgrpo, dapo"):
        T.train(run_setup(objective="ppo"))
    for bad, flag in ((dict(kl_estimator="k4"), "kl-estimator"), (dict(kl_in="advantage"), "kl-in"),
                      (dict(clip_low=-0.1), "clip-low"), (dict(clip_high=-0.1), "clip-high"),
                      (dict(kl_coef=-0.1), "kl-coef"), (dict(tis_cap=-1.0), "tis-cap"),
                      (dict(overlong_buffer=8), "overlong-buffer"), (dict(max_draws=0), "max-draws"),
                      (dict(objective="rloo", group_size=1), "group-size")):
        with pytest.raises(ValueError, match=flag):
            T.train(run_setup(**bad))
    for flag in ("steps", "group_size", "problems_per_step", "max_new_tokens", "epochs_per_batch",
                 "micro_batch_tokens"):
        with pytest.raises(ValueError, match=flag.replace("_", "-")):
            T.train(run_setup(**{flag: 0}))
    no_answer = tmp_path / "noanswer.jsonl"
    no_answer.write_text(json.dumps(dict(problem="1+1?")) + "\n")
    with pytest.raises(ValueError, match="noanswer.jsonl:1.*answer"):
        T.train(run_setup(dataset=str(no_answer)))
    leak = tmp_path / "leak.jsonl"
    leak.write_text(open(checkpoint.REPO_DIR / "data" / "math500.jsonl").readline())
    with pytest.raises(ValueError, match="held-out"):
        T.train(run_setup(dataset=str(leak)))
    T.train(run_setup(steps=1))
    with pytest.raises(FileExistsError, match="--resume"):
        T.train(run_setup(steps=1))
    with pytest.raises(ValueError, match="lr"):
        T.train(run_setup(steps=2, lr=0.5, resume=True))
    with pytest.raises(FileNotFoundError, match="empty holds no run to resume"):
        T.train(run_setup(out=str(tmp_path / "empty"), resume=True))


def test_cli_flags_come_from_the_config():
    cfg = T.parse_args(["--objective", "grpo", "--group-size", "4", "--no-skip-zero-advantage"])
    assert cfg.objective == "grpo" and cfg.group_size == 4 and cfg.skip_zero_advantage is False
    assert T.parse_args([]).model == checkpoint.DEFAULT_MODEL and T.parse_args([]).num_problems == 50
    tiny = T.parse_args(["--model", "tiny", "--steps", "7"])
    assert tiny.dataset == "tiny_train" and tiny.steps == 7
    with pytest.raises(SystemExit):
        T.parse_args(["--no-such-flag", "1"])


def test_problem_order_is_a_function_of_the_step():
    draws = [T.problems_for_step(5, s, 2, seed=3) for s in range(5)]
    flat = [i for d in draws for i in d]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))  # each epoch a permutation
    assert draws == [T.problems_for_step(5, s, 2, seed=3) for s in range(5)]


def test_gpu_rollout_copy_is_bf16_and_tracks_the_policy(char_model_dir):
    # the CUDA path samples from a bf16 copy; its construction and refresh are device-independent
    for rank in (0, 4):
        policy = checkpoint.load_model(char_model_dir, device="cpu")
        if rank:
            T.lora.add_lora(policy, rank, 8.0)
        rollout = D.sampling_copy(policy, "cuda")
        assert rollout is not policy and rollout.lm_head.weight.dtype == torch.bfloat16
        assert D.sampling_copy(policy, "cpu") is policy
        ids = torch.randint(1, 90, (2, 10))
        with torch.no_grad():
            stale = rollout(ids).float()
        with torch.no_grad():  # an "update" of the trainable weights
            for p in policy.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn_like(p))
        D.refresh_sampling_copy(rollout, policy)
        with torch.no_grad():
            fresh, target = rollout(ids).float(), policy(ids)
        # equal up to bf16 rounding, far closer than the copy taken before the update
        assert (fresh - target).abs().max() < 0.2 * (stale - target).abs().max()
        assert rollout.lm_head.weight.dtype == torch.bfloat16


# -----------------------------------------------------------------------------
# End to end on the embedded tiny world: RL must raise held-out accuracy from the committed checkpoint


# Measured from the committed checkpoint over seeds 0-2 (8 problems x 8 samples a step, greedy on 200 test
# problems, from 41.0% and a direct-answer share of 0.60), every objective with its own defaults: after 12 steps
# +15.0 to +38.0 points (+30.0 to +38.0 on seed 0, the one these tests run), share down to 0.17-0.39
# (research/objectives/compare_objectives.py, the numbers in research/objectives/README.md); after 6 steps +5.0 to +8.5 points, share
# down to 0.48-0.52 (the same with --steps 6, measured with the sampler before inverse CDF). The issue asks drgrpo and
# grpo for a clear rise (12 steps, a wide margin) and the other objectives for "improves or at least does not
# break it": 6 steps, the bar half the smallest measured gain, so the nine runs take half as long.
HEADLINE = ("drgrpo", "grpo")


@pytest.mark.parametrize("objective", sorted(objectives.OBJECTIVES))
def test_tiny_world_rl_raises_held_out_accuracy(objective, tmp_path):
    from research.objectives.compare_objectives import rl_effect
    steps, gain, drop = (12, 0.15, 0.20) if objective in HEADLINE else (6, 0.02, 0.04)
    (acc0, direct0, _), (acc1, direct1, _) = rl_effect(objective, seed=0, out=tmp_path / "run", steps=steps)
    assert 0.10 < acc0 < 0.60  # the committed checkpoint is "sometimes right"
    assert acc1 >= acc0 + gain, (acc0, acc1)
    assert direct1 <= direct0 - drop, (direct0, direct1)  # RL teaches it to work step by step


def test_tiny_world_rl_on_gpu_with_compiled_sampling(tmp_path, gpu):
    """The GPU path end to end: fp32 master weights under bf16 autocast, rollouts from the bf16 copy through
    the compiled decode step; the same bar as the CPU runs above."""
    from research.objectives.compare_objectives import rl_effect
    (acc0, direct0, _), (acc1, direct1, _) = rl_effect("drgrpo", seed=0, out=tmp_path / "run",
                                                       flags=("--device", gpu, "--compile"))
    assert acc1 >= acc0 + 0.15, (acc0, acc1)
    assert direct1 <= direct0 - 0.20, (direct0, direct1)


# -----------------------------------------------------------------------------
# The real-data path a GPU user takes: train_rl.py's own defaults (MATH pool, Algebra, first 50, base template,
# the real verifier) on a random model with the real Qwen3 tokenizer


def test_default_config_trains_on_the_shipped_math_pool(qwen_vocab_model_dir, tmp_path):
    cfg = T.parse_args(["--model", str(qwen_vocab_model_dir), "--steps", "1", "--max-new-tokens", "4",
                        "--out", str(tmp_path / "run")])
    assert (cfg.dataset, cfg.subject, cfg.num_problems, cfg.template) == ("math_train", "Algebra", 50, "base")
    train, val, _ = P.load_pools(cfg)
    assert len(train) == 50 and all(p["subject"] == "Algebra" for p in train + val) and len(val) == cfg.val_size
    run = T.train(cfg)
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert m["step"] == 1 and m["generated_tokens"] > 0 and m["flops"] > 0 and 0 <= m["accuracy"] <= 1
    saved = json.loads((run / "config.json").read_text())
    assert saved["dataset"] == "math_train" and saved["subject"] == "Algebra"
    assert (run / "final" / "model.safetensors").is_file() and (run / "final" / "tokenizer.json").is_file()


def test_a_run_saved_before_a_new_setting_resumes_at_its_default(run_setup, tmp_path):
    T.train(run_setup(steps=1, save_every=1, out=str(tmp_path / "old")))
    path = tmp_path / "old" / "config.json"
    saved = json.loads(path.read_text())
    del saved["positive_weight"], saved["compile"]  # as written by code older than these fields
    path.write_text(json.dumps(saved))
    T.train(run_setup(steps=2, save_every=1, out=str(tmp_path / "old"), resume=True))
    with pytest.raises(ValueError, match="positive_weight"):  # a value other than the default still differs
        T.train(run_setup(steps=3, out=str(tmp_path / "old"), resume=True, positive_weight=0.5))


def test_checks_without_a_verdict_are_counted_per_step(run_setup, monkeypatch):
    def grade_with_two_errors(texts, refs):
        T.verify.ERRORS["rule"] += 2  # as two rules raising inside is_equivalent would
        return fake_grade(texts, refs)
    run = run_setup(steps=2)
    monkeypatch.setattr(T.verify, "grade_batch", grade_with_two_errors)
    rows = [json.loads(x) for x in (T.train(run) / "metrics.jsonl").read_text().splitlines()]
    assert [r["verifier_errors"] for r in rows] == [2, 2]


def test_group_dispersion_is_logged_and_zero_for_identical_completions(run_setup, char_model_dir):
    import evaluate as E
    run = T.train(run_setup(steps=2, dispersion_every=2))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "group_dispersion" not in rows[0] and 0 <= rows[1]["group_dispersion"] <= 2
    policy = checkpoint.load_model(char_model_dir, device="cpu")
    same = [T.Example(prompt=[5, 6], tokens=[7, 8, 9]) for _ in range(3)]
    assert diversity.group_dispersion(policy, same, 3) == pytest.approx(0, abs=1e-6)
    mixed = same + [T.Example(prompt=[5, 6], tokens=[t, 9, 8]) for t in (10, 11, 12)]
    emb = diversity.completion_embeddings(policy, [r.prompt for r in mixed], [r.tokens for r in mixed])
    assert diversity.group_dispersion(policy, mixed, 3) == pytest.approx(diversity.embedding_dispersion(emb[3:]) / 2, abs=1e-6)


def test_keep_checkpoints_keeps_the_newest_and_a_torn_log_line_resumes(run_setup, tmp_path):
    """--keep-checkpoints 2 keeps the two newest periodic checkpoints; a metrics.jsonl whose last line was torn (a
    full disk, a kill mid-write) resumes with the line dropped and redone, to the straight run's metrics."""
    straight = T.train(run_setup(steps=4, save_every=1, keep_checkpoints=2, out=str(tmp_path / "straight")))
    assert runs.checkpoint_steps(straight) == [3, 4] and (straight / "final" / "model.safetensors").is_file()
    split = T.train(run_setup(steps=2, save_every=1, keep_checkpoints=2, out=str(tmp_path / "split")))
    with open(split / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward_mean": 0.')  # what a write cut short leaves
    T.train(run_setup(steps=4, save_every=1, keep_checkpoints=2, out=str(split), resume=True))
    steady = lambda p: [{k: v for k, v in json.loads(x).items() if "second" not in k}  # noqa: E731
                        for x in (p / "metrics.jsonl").read_text().splitlines()]
    assert steady(split) == steady(straight)


# -----------------------------------------------------------------------------
# Interrupts and resume (issue #55): a Ctrl-C or SIGTERM at any moment, then --resume, gives the straight run


def steady_logs(run):
    """metrics.jsonl without wall-clock fields, and samples.jsonl."""
    metrics = [{k: v for k, v in json.loads(x).items() if "second" not in k}
               for x in (run / "metrics.jsonl").read_text().splitlines()]
    return metrics, (run / "samples.jsonl").read_text()


def ctrl_c():
    import signal
    signal.raise_signal(signal.SIGINT)  # a real Ctrl-C: its handler decides where the KeyboardInterrupt lands


@pytest.mark.parametrize("moment", ["validation", "samples_log", "periodic_save", "after_update_in_step"])
def test_ctrl_c_after_an_update_saves_it_under_its_own_step_and_resumes_exactly(run_setup, tmp_path, monkeypatch,
                                                                                moment):
    """Ctrl-C once step 2's update is in the weights (during its validation, its log lines, its periodic save, or
    still inside rl_step after the optimizer step): the checkpoint is step_2 holding exactly the straight run's
    step-2 weights, and --resume ends bit-identical to the straight run, logs included."""
    kw = dict(steps=4, save_every=2, eval_every=2, val_size=2, samples_per_step=2)
    straight = T.train(run_setup(out=str(tmp_path / "straight"), **kw))
    calls = dict(n=0)

    def once(real, when):
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            out = real(*args, **kwargs)
            if when(args, kwargs, calls["n"]):
                ctrl_c()
            return out
        return wrapped
    originals = [(T, "evaluate_accuracy", T.evaluate_accuracy), (runs, "append_jsonl", runs.append_jsonl),
                 (runs, "save_checkpoint", runs.save_checkpoint), (T, "step_metrics", T.step_metrics)]
    if moment == "validation":
        monkeypatch.setattr(T, "evaluate_accuracy", once(T.evaluate_accuracy, lambda a, k, n: "step 2" in a[4]))
    elif moment == "samples_log":  # metrics line written, the samples lines not yet all
        monkeypatch.setattr(runs, "append_jsonl", once(runs.append_jsonl, lambda a, k, n: a[1].get("step") == 2
                                                       and "response" in a[1]))
    elif moment == "periodic_save":
        monkeypatch.setattr(runs, "save_checkpoint", once(runs.save_checkpoint, lambda a, k, n: n == 1))
    else:  # the update is applied; the step's metrics are still being computed
        monkeypatch.setattr(T, "step_metrics", once(T.step_metrics, lambda a, k, n: a[1] == 1))
    with pytest.raises(KeyboardInterrupt):
        T.train(run_setup(out=str(tmp_path / "cut"), **kw))
    for module, name, real in originals:
        monkeypatch.setattr(module, name, real)
    cut = tmp_path / "cut"
    assert runs.checkpoint_steps(cut) == [2]
    assert (cut / "checkpoints/step_2/model.safetensors").read_bytes() == \
        (straight / "checkpoints/step_2/model.safetensors").read_bytes()  # labelled by the update it holds
    T.train(run_setup(out=str(cut), resume=True, **kw))
    assert (cut / "final/model.safetensors").read_bytes() == (straight / "final/model.safetensors").read_bytes()
    assert steady_logs(cut) == steady_logs(straight)


def test_ctrl_c_before_the_update_puts_the_pass_rate_table_back(run_setup, tmp_path, monkeypatch):
    """With the pass-rate curriculum a step changes the data state before its update: cut short there, the
    step is redone from the state before it."""
    kw = dict(steps=3, select="pass_rate")
    straight = T.train(run_setup(out=str(tmp_path / "straight"), save_every=1, **kw))
    real, calls = T.policy_update, []

    def cut(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # step 2, its rollouts drawn and the table updated, the update not begun
            ctrl_c()
        return real(*args, **kwargs)
    monkeypatch.setattr(T, "policy_update", cut)
    with pytest.raises(KeyboardInterrupt):
        T.train(run_setup(out=str(tmp_path / "cut"), **kw))
    monkeypatch.setattr(T, "policy_update", real)
    assert runs.checkpoint_steps(tmp_path / "cut") == [1]
    saved = lambda run: json.loads((run / "checkpoints/step_1/selection.json").read_text())  # noqa: E731
    assert saved(tmp_path / "cut") == saved(straight)  # the table after step 1, not after half of step 2
    T.train(run_setup(out=str(tmp_path / "cut"), resume=True, **kw))
    assert (tmp_path / "cut/final/model.safetensors").read_bytes() == (straight / "final/model.safetensors").read_bytes()
    assert steady_logs(tmp_path / "cut") == steady_logs(straight)


def test_resume_with_fewer_steps_than_done_is_refused_before_writing(run_setup, tmp_path):
    run = T.train(run_setup(steps=2))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != runs.LOCK}
    with pytest.raises(ValueError, match=r"--steps 1: the run in .*run is at step 2 already; pass --steps 2 or more"):
        T.train(run_setup(steps=1, resume=True))
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != runs.LOCK} == before


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(run_setup, tmp_path, capsys):
    straight = T.train(run_setup(steps=4, save_every=1, out=str(tmp_path / "straight")))
    run = T.train(run_setup(steps=3, save_every=1, out=str(tmp_path / "split")))
    state = run / "checkpoints/step_3/trainer_state.safetensors"
    state.write_bytes(state.read_bytes()[:-100])  # a truncated copy, a disk fault
    T.train(run_setup(steps=4, save_every=1, out=str(run), resume=True))
    assert "trainer_state.safetensors: cannot be read" in capsys.readouterr().err
    assert (run / "final/model.safetensors").read_bytes() == (straight / "final/model.safetensors").read_bytes()
    assert steady_logs(run) == steady_logs(straight) and (run / "checkpoints/step_3.damaged").is_dir()


def test_a_damaged_only_checkpoint_is_one_error_naming_the_file(run_setup, tmp_path):
    run = T.train(run_setup(steps=2))
    state = run / "checkpoints/step_2/trainer_state.safetensors"
    state.write_bytes(state.read_bytes()[:40])
    with pytest.raises(ValueError, match=r"step_2/trainer_state.safetensors: cannot be read .* no earlier checkpoint"):
        T.train(run_setup(steps=3, resume=True))
    state.unlink()
    T.train(run_setup(steps=2, out=str(tmp_path / "again")))
    (tmp_path / "again/checkpoints/step_2/trainer_state.json").write_text('{"step": ')
    with pytest.raises(ValueError, match=r"step_2/trainer_state.json: cannot be read"):
        T.train(run_setup(steps=3, out=str(tmp_path / "again"), resume=True))


def test_a_failed_start_writes_nothing(run_setup, tmp_path, char_model_dir):
    import shutil
    bad = tmp_path / "bad_model"
    shutil.copytree(char_model_dir, bad)
    weights_file = bad / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:200])
    with pytest.raises(Exception):
        T.train(run_setup(model=str(bad)))
    assert not (tmp_path / "run").exists()


def test_resuming_a_finished_run_adds_no_second_test_row(run_setup, tmp_path):
    run = T.train(run_setup(steps=2, test_dataset=run_setup().dataset))
    first = steady_logs(run)
    assert [r["step"] for r in first[0] if "test_accuracy" in r] == [0, 2]
    T.train(run_setup(steps=2, test_dataset=run_setup().dataset, resume=True))
    assert steady_logs(run) == first


def test_final_and_checkpoints_get_the_umask_permissions(run_setup):
    import os
    old = os.umask(0o022)
    try:
        run = T.train(run_setup(steps=1))
    finally:
        os.umask(old)
    for d in (run / "final", run / "checkpoints/step_1"):
        assert d.stat().st_mode & 0o777 == 0o755, d


def test_weights_gone_non_finite_end_the_run_naming_the_step(run_setup, monkeypatch):
    real = T.policy_update

    def poisoned(run, *args, **kw):
        stats = real(run, *args, **kw)
        with torch.no_grad():
            next(run.policy.parameters()).fill_(float("nan"))
        return stats
    monkeypatch.setattr(T, "policy_update", poisoned)
    with pytest.raises(ValueError, match="step 1: the update made the weights non-finite"):
        T.train(run_setup(steps=2))


# -----------------------------------------------------------------------------
# The seams of the plain path


def test_the_uniform_selector_is_problems_for_step_and_extra_draws_are_seeded(run_setup):
    cfg = run_setup(problems_per_step=3)
    run = make_run(cfg, None, None, pool=range(6))
    for step in range(4):
        assert T.choose_problems(run, step, 0, []) == T.problems_for_step(6, step, 3, cfg.seed)
    extra = T.choose_problems(run, 1, 2, [])
    assert extra == T.choose_problems(run, 1, 2, []) and len(set(extra)) == 3  # a function of (seed, step, draw)
