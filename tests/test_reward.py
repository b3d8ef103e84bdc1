import hashlib
import itertools
import random
from types import SimpleNamespace

import pytest

import cli
import reward as R
from reward import RewardConfig


def make_cfg(**kw):
    """RewardConfig's fields plus what the terms read of train_rl.Config (the budget, the KL's flags)."""
    base = dict(vars(RewardConfig()), max_new_tokens=10, kl_coef=0.0, kl_in="loss")
    return SimpleNamespace(**dict(base, **kw))


def rollout(text, n_tokens=3, answer="4", problem="2 + 2", seed=0, sample=0):
    return SimpleNamespace(problem=dict(problem=problem, answer=answer), text=text, tokens=[0] * n_tokens,
                           seed=seed, sample=sample)


def scored(cfg, *rollouts):
    R.score(list(rollouts), cfg)
    return [r.reward for r in rollouts]


def test_each_term_by_hand():
    cfg = make_cfg(format_penalty=0.2, overlong_buffer=4)
    right, wrong, unboxed = rollout("so \\boxed{4}"), rollout("so \\boxed{5}"), rollout("four")
    R.score([right, wrong, unboxed], cfg)
    assert [(r.correct, r.boxed, r.passed) for r in (right, wrong, unboxed)] == [(True, True, True),
                                                                                 (False, True, False),
                                                                                 (False, False, False)]
    assert [R.correctness(r, cfg) for r in (right, wrong, unboxed)] == [1.0, 0.0, 0.0]
    assert [R.format_penalty(r, cfg) for r in (right, wrong, unboxed)] == [0.0, 0.0, -0.2]
    # budget 10, buffer 4: free up to 6 tokens, then -1/4 per token down to -1 at 10
    assert [R.overlong_penalty(rollout("", n), cfg) for n in (3, 6, 7, 8, 10)] == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert R.overlong_penalty(rollout("", 10), make_cfg(overlong_buffer=0)) == 0.0  # off
    right.kl = 2.0
    assert R.kl_penalty(right, make_cfg(kl_coef=0.1, kl_in="reward")) == pytest.approx(-0.2)
    assert R.kl_penalty(right, make_cfg(kl_coef=0.1, kl_in="loss")) == 0.0  # the KL goes into the loss instead


def test_prefix_credit_pays_the_right_leading_lines_of_a_failed_chain_by_hand():
    cfg = make_cfg(grader="steps", prefix_credit=0.5)
    problem = "(3 + 4) * 2 - 5"  # 3 + 4 = 7, 7 * 2 = 14, 14 - 5 = 9: 3 lines and the box, 4 in all
    texts = ["3 + 4 = 7\n7 * 2 = 14\n14 - 5 = 9\n\\boxed{9}",  # passes: the correctness term pays 1, this 0
             "3 + 4 = 7\n7 * 2 = 15\n\\boxed{15}",  # 1 line right of 4
             "3 + 4 = 7\n7 * 2 = 14\n14 - 5 = 9\n\\boxed{8}",  # 3 lines right, the box wrong
             "\\boxed{9}"]  # a bare answer: no line right
    rs = [rollout(t, answer="9", problem=problem) for t in texts]
    assert scored(cfg, *rs) == pytest.approx([1.0, 0.5 * 1 / 4, 0.5 * 3 / 4, 0.0])
    assert scored(make_cfg(grader="steps"), *rs) == [1.0, 0.0, 0.0, 0.0]  # off by default: the binary reward
    with pytest.raises(ValueError, match="--prefix-credit 0.5 needs --grader steps"):
        R.check(make_cfg(prefix_credit=0.5))


def test_combinations_sum_the_terms():
    cfg = make_cfg(format_penalty=0.2, overlong_buffer=4)
    rewards = scored(cfg, rollout("so \\boxed{4}", 5), rollout("so \\boxed{4}", 8), rollout("so \\boxed{5}", 10),
                     rollout("four", 3), rollout("four", 9))
    # right and short: 1; right at 8 of 10: 1 - 0.5; wrong, cut at the budget: 0 - 1; no box: -0.2;
    # no box and 9 tokens: -0.2 - 0.75
    assert rewards == pytest.approx([1.0, 0.5, -1.0, -0.2, -0.95])


def test_kl_is_paid_after_the_reference_has_scored_the_rollouts():
    cfg = make_cfg(format_penalty=0.2, kl_coef=0.5, kl_in="reward")
    rs = [rollout("so \\boxed{4}"), rollout("four")]
    R.score(rs, cfg)
    assert [r.reward for r in rs] == pytest.approx([1.0, -0.2])  # no KL at grading
    rs[0].kl, rs[1].kl = 0.4, -0.2  # k1 estimates may be negative
    R.add_kl(rs, cfg)
    assert [r.reward for r in rs] == pytest.approx([1.0 - 0.2, -0.2 + 0.1])


def test_format_penalty_applies_to_the_true_reward_only():
    for control in ("random", "format"):
        cfg = make_cfg(reward=control, format_penalty=0.2)
        r = rollout("four")
        R.score([r], cfg)
        assert r.reward == float(r.passed) and not r.correct  # 1 or 0, never -0.2


def test_the_format_control_pays_any_box_and_accuracy_stays_the_verifiers():
    rs = [rollout(t, seed=3, sample=j) for j, t in enumerate(["\\boxed{4}", "\\boxed{3}", "no answer"])]
    assert scored(make_cfg(reward="format", format_penalty=0.2), *rs) == [1.0, 1.0, 0.0]
    assert [(r.correct, r.passed) for r in rs] == [(True, True), (False, True), (False, False)]


def test_the_random_control_is_a_seeded_fair_coin():
    coin = lambda seed, j: R.control_pass("random", rollout("", seed=seed, sample=j))  # noqa: E731
    coins = [coin(seed, j) for seed in range(125) for j in range(8)]  # 1,000 rollouts
    assert coins == [coin(seed, j) for seed in range(125) for j in range(8)]  # repeatable
    assert 0.45 < sum(coins) / len(coins) < 0.55
    # pinned: torch.Generator().manual_seed(seed * 1_000_003 + j), heads when the first uniform is below 1/2; the
    # first 16 coins, and a hash of all 1,000, as curriculum.control_pass drew them before #56 (commit 51f8ea4)
    bits = "".join("1" if c else "0" for c in coins)
    assert bits[:16] == "1001000010111000" and bits.count("1") == 497
    assert hashlib.sha256(bits.encode()).hexdigest()[:16] == "dc976ccaceb6bb5a"


def test_rewards_reproduce_the_old_arithmetic_bit_for_bit():
    # before #56: float(paid + overlong), paid = 1 right / -format_penalty unboxed / 0 wrong, or the control's 0/1
    texts = ["so \\boxed{4}", "so \\boxed{5}", "four", "\\boxed{4"]
    rng = random.Random(0)
    for control, penalty, buffer in itertools.product(R.REWARDS, (0.0, 0.2, 0.3), (0, 3, 7)):
        cfg = make_cfg(reward=control, format_penalty=penalty, overlong_buffer=buffer, max_new_tokens=13)
        rs = [rollout(t, rng.randrange(1, 14), seed=rng.randrange(99), sample=rng.randrange(8)) for t in texts * 3]
        R.score(rs, cfg)
        for r in rs:
            verdict = 1.0 if r.correct else -penalty if not r.boxed else 0.0
            paid = verdict if control == "verifier" else float(r.passed)
            n = len(r.tokens)
            overlong = 0.0 if buffer <= 0 or n <= 13 - buffer else max(-1.0, (13 - buffer - n) / buffer)
            assert r.reward == float(paid + overlong)  # exactly, not approximately
            r.kl = rng.uniform(-1, 1)
            want = r.reward - 0.05 * r.kl
            R.add_kl([r], SimpleNamespace(**dict(vars(cfg), kl_coef=0.05, kl_in="reward")))
            assert r.reward == want


def test_the_steps_grader_pays_the_worked_chain_only():
    cfg = make_cfg(grader="steps", max_new_tokens=64)
    worked = rollout("1 + 2 = 3\n3 * 3 = 9\n\\boxed{9}", answer="9", problem="(1 + 2) * 3")
    bare = rollout("\\boxed{9}", answer="9", problem="(1 + 2) * 3")
    assert scored(cfg, worked, bare) == [1.0, 0.0]
    assert bare.boxed and not bare.correct


def test_flags_ranges_and_the_check():
    cfg = cli.parse_config(RewardConfig, ["--reward", "random", "--format-penalty", "0.5"], "reward flags")
    assert (cfg.grader, cfg.reward, cfg.format_penalty, cfg.overlong_buffer) == ("answer", "random", 0.5, 0)
    with pytest.raises(ValueError, match="--format-penalty must be >= 0"):
        cli.check_fields(RewardConfig(format_penalty=-0.1))
    with pytest.raises(ValueError, match="--reward must be one of verifier, random, format"):
        cli.check_fields(RewardConfig(reward="coin"))
    with pytest.raises(ValueError, match="--overlong-buffer 10 must be below --max-new-tokens 10"):
        R.check(make_cfg(overlong_buffer=10))


def test_a_new_term_is_one_function_one_row_one_field(monkeypatch):
    # the module docstring's fork: a length penalty
    def length_penalty(r, cfg):
        return -cfg.length_coef * len(r.tokens) / cfg.max_new_tokens
    monkeypatch.setitem(R.TERMS, "length", R.Term(length_penalty, "Team Kimi 2025, Kimi k1.5, sec. 2.3.3",
                                                  "-coef x the share of the budget used"))
    assert scored(make_cfg(length_coef=0.5), rollout("so \\boxed{4}", 4)) == pytest.approx([1.0 - 0.5 * 4 / 10])
    assert "| `length` | Team Kimi 2025" in R.table()


def test_an_evaluation_record_is_paid_at_trainings_defaults():
    # right and boxed 1; wrong 0; no box 0 too: training's default format penalty is 0 (it was -0.2 in records)
    assert [R.record_reward(c, b) for c, b in ((True, True), (False, True), (False, False))] == [1.0, 0.0, 0.0]


def test_the_table_lists_every_term_in_order():
    lines = R.table().splitlines()
    assert [line.split("`")[1] for line in lines[2:]] == ["correctness", "format", "overlong", "prefix", "kl"]
