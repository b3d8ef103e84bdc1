"""objectives.py: every advantage and loss against values computed by hand from its paper's equations, and the
table as the one list of objectives."""

import contextlib
import dataclasses
import io
import math

import pytest
import torch

import objectives
import train_rl as T

# -----------------------------------------------------------------------------
# Pure functions against hand-computed values


def test_group_advantages_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    dr = objectives.group_advantages(r, scale_by_std=False)
    assert torch.allclose(dr, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]]))
    # unbiased std: [1,0,0,1] -> sqrt(4 * 0.25 / 3) = 0.57735; [1,0,0,0] -> sqrt(0.75 / 3) = 0.5
    g = objectives.group_advantages(r, scale_by_std=True)
    assert torch.allclose(g[0], torch.tensor([1, -1, -1, 1]) * 0.5 / math.sqrt(1 / 3), atol=1e-4)
    assert torch.allclose(g[1], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-4)
    assert torch.equal(objectives.group_advantages(torch.ones(1, 4), True), torch.zeros(1, 4))


def test_rloo_and_reinforce_pp_advantages_hand_computed():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    # leave-one-out: row 0 sample 0 -> 1 - mean(0,0,0) = 1; sample 1 -> 0 - mean(1,0,0) = -1/3
    assert torch.allclose(objectives.leave_one_out_advantages(r)[0], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    # REINFORCE++ baseline: centred [[.75,-.25,-.25,-.25],[.5,.5,-.5,-.5]], batch mean 0,
    # unbiased batch std sqrt((.5625 + 3 * .0625 + 4 * .25) / 7) = 0.5
    expected = torch.tensor([[1.5, -0.5, -0.5, -0.5], [1.0, 1.0, -1.0, -1.0]])
    assert torch.allclose(objectives.batch_normalized_advantages(r), expected, atol=1e-5)


def micro_batch(logp, old_logp, adv, mask, **extra):
    b = objectives.MicroBatch(logp=logp, old_logp=old_logp, ref_logp=None, mask=mask, tis=torch.ones_like(mask),
                              adv=adv, n_sequences=len(adv), n_tokens=int(mask.sum()))
    return dataclasses.replace(b, **extra)


def test_ppo_terms_decoupled_clip_and_kl_estimators_hand_values():
    logp = torch.log(torch.tensor([[1.5], [1.5], [0.5], [0.5]]))
    b = micro_batch(logp, torch.zeros(4, 1), torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.ones(4, 1))
    # rho=1.5, A=+1 -> min(1.5, 1.2) = 1.2; A=-1 -> min(-1.5, -1.2) = -1.5
    # rho=0.5, A=+1 -> min(0.5, 0.8) = 0.5; A=-1 -> min(-0.5, -0.8) = -0.8
    sym = T.Config(clip_low=0.2, clip_high=0.2)
    assert torch.allclose(objectives.ppo_terms(b, sym).flatten(), torch.tensor([1.2, -1.5, 0.5, -0.8]))
    higher = T.Config(clip_low=0.2, clip_high=0.28)  # DAPO clip-higher: only the first term moves
    assert torch.allclose(objectives.ppo_terms(b, higher).flatten(), torch.tensor([1.28, -1.5, 0.5, -0.8]))
    # pi = 0.5, pi_ref = 0.25: log r = ln 2; k1 = ln 2, k2 = (ln 2)^2 / 2, k3 = 1/2 - 1 + ln 2
    pi, ref = torch.log(torch.tensor([0.5, 0.3])), torch.log(torch.tensor([0.25, 0.3]))
    ln2 = math.log(2)
    for est, value in (("k1", ln2), ("k2", ln2 ** 2 / 2), ("k3", 0.5 - 1 + ln2)):
        assert torch.allclose(objectives.kl_estimate(pi, ref, est), torch.tensor([value, 0.0]), atol=1e-6), est


def test_truncated_is_weights_hand_values():
    old = torch.log(torch.tensor([[0.5, 0.3, 0.9]]))
    sampler = torch.log(torch.tensor([[0.25, 0.6, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # ratios 2 and 0.5; the cap 1.5 truncates the first; padding gets weight 1
    assert torch.allclose(objectives.truncated_is_weights(old, sampler, mask, 1.5), torch.tensor([[1.5, 0.5, 1.0]]))
    assert torch.equal(objectives.truncated_is_weights(old, sampler, mask, 0.0), torch.ones(1, 3))


def loss_grad(objective, rewards, lengths, budget, passed=None, **cfg_kw):
    """Loss, d loss / d logp and advantages of one group; passed defaults to reward == 1."""
    cfg = T.Config(objective=objective, max_new_tokens=budget, **cfg_kw)
    r = torch.tensor([rewards], dtype=torch.float32)
    c = r == 1 if passed is None else torch.tensor([passed])
    adv = objectives.OBJECTIVES[objective].advantages(r, c, cfg).flatten()
    mask = torch.tensor([[1.0] * n + [0.0] * (budget - n) for n in lengths])
    logp = torch.full(mask.shape, -1.0, requires_grad=True)
    ref = torch.full(mask.shape, -1.5)
    loss = objectives.OBJECTIVES[objective].loss(micro_batch(logp, logp.detach(), adv, mask, ref_logp=ref), cfg)
    loss.backward()
    return loss.item(), logp.grad, adv


def per_token(values, lengths, budget):
    """(N, budget) tensor holding values[i] on sequence i's completion tokens, 0 on padding."""
    return torch.tensor([[v] * n + [0.0] * (budget - n) for v, n in zip(values, lengths)])


def test_drgrpo_loss_and_gradient_hand_computed():
    # rewards [1,0,0,0]: A = [.75,-.25,-.25,-.25]; lengths [2,3,1,4]; budget 4; N = 4 sequences
    loss, grad, adv = loss_grad("drgrpo", [1, 0, 0, 0], [2, 3, 1, 4], budget=4)
    assert loss == pytest.approx(-(0.75 * 2 - 0.25 * (3 + 1 + 4)) / (4 * 4))  # = 0.03125
    # d loss / d logp_it = -A_i / (budget * N) on completion tokens, 0 on padding
    assert torch.allclose(grad, per_token([-0.75, 0.25, 0.25, 0.25], [2, 3, 1, 4], 4) / 16)
    # a k1 KL loss term adds beta * (logp - ref) per token: gradient -(A_i - beta) / (budget * N)
    _, grad, _ = loss_grad("drgrpo", [1, 0, 0, 0], [2, 3, 1, 4], budget=4, kl_coef=0.1, kl_estimator="k1")
    assert torch.allclose(grad, per_token([-0.65, 0.35, 0.35, 0.35], [2, 3, 1, 4], 4) / 16)


def test_grpo_and_gspo_loss_and_gradient_hand_computed():
    for objective in ("grpo", "gspo"):  # at rho = 1 GSPO's gradient is GRPO's (Zheng et al. 2025, sec. 4.2)
        loss, grad, adv = loss_grad(objective, [1, 0, 0, 0], [2, 3, 1, 4], budget=4)
        assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-4)
        assert loss == pytest.approx(0.0, abs=1e-5)  # at rho = 1 the per-sequence means are the advantages
        a = adv.tolist()  # d loss / d logp_it = -A_i / (|o_i| * N)
        assert torch.allclose(grad, per_token([-a[0] / 2, -a[1] / 3, -a[2], -a[3] / 4], [2, 3, 1, 4], 4) / 4,
                              atol=1e-5), objective


def test_gspo_clips_the_sequence_ratio():
    # one sequence with token log-ratios 0.1 and 0.3: s = exp(0.2) = 1.2214, outside [1 - 3e-4, 1 + 4e-4]
    old = torch.zeros(1, 2)
    for adv, expected_grad in ((1.0, 0.0), (-1.0, math.exp(0.2) / 2)):
        logp = torch.tensor([[0.1, 0.3]], requires_grad=True)
        cfg = T.Config(objective="gspo", clip_low=3e-4, clip_high=4e-4)
        objectives.gspo_loss(micro_batch(logp, old, torch.tensor([adv]), torch.ones(1, 2)), cfg).backward()
        # A > 0: min(s, 1.0004) is the clipped constant, no gradient; A < 0: -s is kept, d/dlogp_t = s / 2
        assert torch.allclose(logp.grad, torch.full((1, 2), expected_grad)), adv


def test_dapo_and_cispo_token_level_mean_hand_computed():
    for objective in ("dapo", "cispo"):
        loss, grad, adv = loss_grad(objective, [1, 0, 0, 0], [2, 3, 1, 4], budget=4)
        # 10 tokens in the batch: loss = -(1.5 * 2 - 0.5 * 8) / 10 = 0.1; d loss / d logp_it = -A_i / 10
        # (CISPO's loss is A * logp with logp = -1, so its value is -(sum A_i |o_i| * -1) / 10 = -0.1)
        assert loss == pytest.approx(0.1 if objective == "dapo" else -0.1, abs=1e-5)
        assert torch.allclose(grad, per_token([-1.5, 0.5, 0.5, 0.5], [2, 3, 1, 4], 4) / 10, atol=1e-5)


def test_cispo_kl_term_is_a_penalty():
    # k1 KL in the loss adds beta * (logp - ref) per token, token-level mean: d loss / d logp = -(A_i - beta) / 10
    _, grad, adv = loss_grad("cispo", [1, 0, 0, 0], [2, 3, 1, 4], budget=4, kl_coef=0.1, kl_estimator="k1")
    assert torch.allclose(grad, per_token([-1.4, 0.6, 0.6, 0.6], [2, 3, 1, 4], 4) / 10, atol=1e-5)


def test_cispo_keeps_the_gradient_that_ppo_clipping_drops():
    # token ratios 1.5 and 0.5, A = +1: PPO clips the first token (no gradient); CISPO weights it by
    # the clipped, detached ratio 1.2 and the second by 0.5: gradient -[1.2, 0.5] / 2 tokens
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_()
    b = micro_batch(logp, old, torch.tensor([1.0]), torch.ones(1, 2))
    objectives.cispo_loss(b, T.Config(clip_low=1.0, clip_high=0.2)).backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.6, -0.25]]))
    logp.grad = None
    objectives.token_mean_loss(b, T.Config(clip_low=0.2, clip_high=0.2)).backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.25]]))


BASELINE_FREE = {"w_reinforce"}  # objectives whose all-right and all-wrong groups both still move the policy


@pytest.mark.parametrize("objective", sorted(objectives.OBJECTIVES))
def test_all_equal_group_gives_zero_gradient(objective):
    extra = dict(passk_k=2) if objective == "passk" else {}  # k < G = 4 (objectives.check_passk)
    for value in (1, 0):
        _, grad, adv = loss_grad(objective, [value] * 4, [2, 3, 1, 4], budget=4, **extra)
        zero = torch.equal(adv, torch.zeros(4)) and torch.count_nonzero(grad) == 0
        assert zero != (objective in BASELINE_FREE), f"{objective}: all-{value} group, advantages {adv.tolist()}"


def test_w_reinforce_weights_successes_by_lambda_from_passed():
    # passed [T, F, F, T] with shaped rewards that disagree (a format penalty made the last one -0.2)
    _, grad, adv = loss_grad("w_reinforce", [1.0, 0.0, -0.2, 0.0], [2, 3, 1, 4], budget=4,
                             passed=[True, False, False, True], positive_weight=0.5)
    assert torch.equal(adv, torch.tensor([0.5, -1.0, -1.0, 0.5]))  # A = +lambda right, -1 wrong, no baseline
    # token-level mean over the batch's 10 tokens: d loss / d logp_it = -A_i / 10
    assert torch.allclose(grad, per_token([-0.5, 1.0, 1.0, -0.5], [2, 3, 1, 4], 4) / 10)
    assert T.Config(objective="w_reinforce").positive_weight == 0.1  # the paper's lambda
    assert T.parse_args(["--objective", "w_reinforce", "--positive-weight", "0.3"]).positive_weight == 0.3


def test_the_table_is_the_one_list_of_objectives():
    """The flag's choices, its help, `python objectives.py` and the loop all read OBJECTIVES; a row added at run time
    (as a fork adds one) is accepted by the command line at once."""
    names = list(objectives.OBJECTIVES)
    flag = next(f for f in dataclasses.fields(T.Config) if f.name == "objective")
    assert T.parse_args(["--objective", names[-1]]).objective == names[-1]
    table = objectives.table().splitlines()[2:]
    assert [row.split("`")[1] for row in table] == names
    assert all(o.paper and o.change for o in objectives.OBJECTIVES.values())
    assert all(set(d) <= set(objectives.OBJECTIVE_FLAGS) for d in (o.defaults for o in objectives.OBJECTIVES.values()))
    assert "objectives.py" in flag.metadata["help"]
    with pytest.raises(ValueError, match="--objective must be one of grpo, drgrpo, .*, got 'mine'"):
        T.check_config(T.Config(objective="mine"))
    mine = objectives.Objective(lambda r, c, cfg: r - r.mean(1, keepdim=True), objectives.drgrpo_loss, "a fork", "x")
    objectives.OBJECTIVES["mine"] = mine
    try:
        T.check_config(T.parse_args(["--objective", "mine"]))
        with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as help_text:
            T.parse_args(["--help"])
        assert "{" + ",".join(objectives.OBJECTIVES) + "}" in help_text.getvalue() and ",mine}" in help_text.getvalue()
    finally:
        del objectives.OBJECTIVES["mine"]


def test_group_size_one_is_refused_for_group_baselines_only():
    for name, o in objectives.OBJECTIVES.items():
        cfg = T.Config(objective=name, group_size=1, passk_k=1)
        if o.needs_group:
            with pytest.raises(ValueError, match="--group-size 1: --objective .* every advantage would be 0"):
                objectives.check(cfg, 1)
        else:
            objectives.check(cfg, 1)
