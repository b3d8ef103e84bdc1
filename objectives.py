"""
Every RL objective of this repo: how rewards become advantages, and advantages a loss. One function each and
one row in OBJECTIVES; `python objectives.py` prints the table, `train_rl.py --objective NAME` trains with a row.

Each is a short diff from GRPO (Shao et al. 2024, DeepSeekMath, eq. 3), which samples a group of G completions
per problem and takes
    A_i  = (r_i - mean(r)) / (std(r) + eps)                                        group-normalized advantage
    loss = -(1/G) sum_i (1/|o_i|) sum_t min(rho_it A_i, clip(rho_it, 1-e, 1+e) A_i)  [+ beta KL]
with rho_it = pi(o_it) / pi_old(o_it). With one update per batch (the default) rho = 1, so clipping changes
nothing and the gradient is REINFORCE with the group mean as baseline.

Adding an objective is this file and its test: write its advantage function ((rewards, passed, cfg) -> (P, G))
and/or its loss ((MicroBatch, cfg) -> this micro-batch's share of the batch loss), add a row to OBJECTIVES, and,
if it has a knob, a field to ObjectiveConfig. The flag's choices and help, `python objectives.py` and
research/objectives/compare_objectives.py all read the table. Plain REINFORCE (Williams 1992), for example, pays
each sample its reward with no baseline; one row (tests/test_forks.py applies it and runs the main command):

    "reinforce": Objective(lambda r, passed, cfg: r.clone(), drgrpo_loss, "Williams 1992, REINFORCE",
                           "the reward itself as the advantage: no baseline"),
"""

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

import cli

arg = cli.arg_group("objective")  # the flags below show under "objective" in train_rl.py --help


# -----------------------------------------------------------------------------
# Advantages: rewards (P, G) of P groups of G samples -> advantages (P, G)


def group_advantages(rewards, scale_by_std, eps=1e-6):
    """Reward minus its group's mean; GRPO also divides by the group's std (DeepSeekMath sec. 4.1.2)."""
    adv = rewards - rewards.mean(dim=1, keepdim=True)
    if scale_by_std:
        adv = adv / (rewards.std(dim=1, keepdim=True) + eps)  # unbiased std, as DeepSeekMath's code
    return adv


def leave_one_out_advantages(rewards):
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024, eq. 4): r_i minus the mean of the group's other G-1 rewards."""
    G = rewards.shape[1]
    return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (G - 1)


def batch_normalized_advantages(rewards, eps=1e-6):
    """REINFORCE++ with baseline (Hu et al. 2025, sec. 3): subtract the group mean, then divide by the std of
    those centred rewards over the whole batch (global, not per-group, normalization; their batch mean is 0)."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred / (centred.std() + eps)


def weighted_reinforce_advantages(passed, positive_weight):
    """W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
    sec. 5): A = +lambda for a success, -1 for a failure, no baseline; lambda = 0.1 in the paper puts the weight
    on pushing mass away from wrong answers. Defined on `passed` (the verdict, or a reward control's), not the
    shaped reward."""
    return torch.where(passed, positive_weight, -1.0)


def check_passk(k, group_size):
    """The one range rule of --passk-k: 1 <= k < G (at k = G every group's advantage is 0: no gradient)."""
    if not 1 <= k < group_size:
        raise ValueError(f"--passk-k must be in [1, --group-size {group_size}) (at k = G no group has a "
                         f"gradient), got {k}")


def passk_advantages(passed, k):
    """(P, G) bools -> (P, G) advantages that maximize pass@k of the group (Chen et al. 2025, "Pass@k Training",
    sec. 3.3): with N samples, c passed, rho = 1 - C(N-c, k)/C(N, k), sigma = sqrt(rho (1 - rho)), a success
    gets (1 - rho)/sigma and a failure (1 - rho - C(N-c-1, k-1)/C(N-1, k-1))/sigma; 0 where sigma = 0 (all
    passed or all failed). Exact integer binomials (math.comb), so nothing overflows."""
    N = passed.shape[1]
    check_passk(k, N)
    out = torch.zeros(passed.shape, dtype=torch.float32)
    for i, row in enumerate(passed.tolist()):
        c = sum(row)
        rho = 1 - math.comb(N - c, k) / math.comb(N, k)
        sigma = math.sqrt(rho * (1 - rho))
        if sigma < 1e-12:
            continue
        wrong = (1 - rho - math.comb(N - c - 1, k - 1) / math.comb(N - 1, k - 1)) / sigma
        out[i] = torch.tensor([(1 - rho) / sigma if ok else wrong for ok in row])
    return out


# -----------------------------------------------------------------------------
# Losses: a MicroBatch -> its share of one batch loss (it divides by the whole batch's counts)


@dataclass
class MicroBatch:
    """A loss's input, built by update.micro_batch. Per target token (B, T-1), the prompt's zero in mask."""
    logp: torch.Tensor  # (B, T-1) log-probs of the policy being trained, with gradient
    old_logp: torch.Tensor  # (B, T-1) pi_old of the PPO ratio: the behavior policy's (update.old_logprobs)
    ref_logp: torch.Tensor | None  # (B, T-1) the frozen reference's, with --kl-in loss; else None
    mask: torch.Tensor  # (B, T-1) 1.0 on completion tokens, 0.0 on prompt and padding
    tis: torch.Tensor  # (B, T-1) truncated importance weights (ones when --tis-cap is 0)
    adv: torch.Tensor  # (B,) each row's advantage
    n_sequences: int  # rows in the whole batch (every rank's, zero-advantage ones too)
    n_tokens: int  # completion tokens in the whole batch


def kl_estimate(logp, ref_logp, estimator):
    """Per-token estimate of KL(pi || pi_ref) on samples of pi (Schulman 2020, "Approximating KL divergence"):
    k1 = log r, k2 = (log r)^2 / 2, k3 = 1/r - 1 + log r with r = pi / pi_ref (k3 is DeepSeekMath eq. 4)."""
    log_r = logp - ref_logp
    if estimator == "k1":
        return log_r
    if estimator == "k2":
        return 0.5 * log_r ** 2
    return torch.exp(-log_r) - 1 + log_r


def kl_penalty(b, cfg):
    """beta * KL per token when the KL is a loss term (DeepSeekMath eq. 3), else 0."""
    if not cfg.kl_coef or cfg.kl_in != "loss":
        return 0.0
    return cfg.kl_coef * kl_estimate(b.logp, b.ref_logp, cfg.kl_estimator)


def truncated_is_weights(old_logp, sampler_logp, mask, cap):
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"): min(pi_trainer / pi_sampler, C) per token corrects for the sampler's numerics
    (e.g. a bf16 copy) differing from the trainer's; ones when off, and on padding."""
    if not cap:
        return torch.ones_like(mask)
    return torch.where(mask.bool(), torch.exp(old_logp - sampler_logp).clamp(max=cap), torch.ones_like(mask))


def ppo_terms(b, cfg):
    """min(rho A, clip(rho, 1 - e_low, 1 + e_high) A) per token (PPO, Schulman et al. 2017, eq. 7, with DAPO's
    decoupled range, Yu et al. 2025, eq. 10), times the truncated importance weight, minus the KL term."""
    ratio, adv = torch.exp(b.logp - b.old_logp), b.adv[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv)
    return surrogate * b.tis - kl_penalty(b, cfg)


def sequence_mean(x, mask):
    """(B, T) -> (B,): the mean over each sequence's own completion tokens."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def grpo_loss(b, cfg):
    """Mean over each sequence's tokens, then over sequences (DeepSeekMath eq. 3)."""
    return -sequence_mean(ppo_terms(b, cfg), b.mask).sum() / b.n_sequences


def drgrpo_loss(b, cfg):
    """Token terms summed and divided by one constant, the generation budget, not |o_i| (Dr. GRPO, sec. 3.2).
    On-policy (--epochs-per-batch 1, the default) rho = 1, the clip never binds, tis = 1 and the KL term is 0:
    the gradient is -sum_i A_i sum_t grad log pi(o_it) / (max_new_tokens x n_sequences), REINFORCE with the
    group mean as baseline, and the logged value is -sum_i A_i |o_i| / (max_new_tokens x n_sequences): below 0
    when the right answers are the longer ones."""
    return -(ppo_terms(b, cfg) * b.mask).sum() / (cfg.max_new_tokens * b.n_sequences)


def token_mean_loss(b, cfg):
    """Token terms averaged over all the batch's tokens, so long answers weigh by their length (DAPO eq. 12)."""
    return -(ppo_terms(b, cfg) * b.mask).sum() / b.n_tokens


def gspo_loss(b, cfg):
    """GSPO (Zheng et al. 2025, eq. 5-7): one importance ratio per sequence, the geometric mean of its token
    ratios, clipped as a whole; the sequence terms are averaged over the batch."""
    mask, adv = b.mask, b.adv
    ratio = torch.exp(sequence_mean(b.logp - b.old_logp, mask))  # (B,) s_i(theta)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv)
    tis = torch.exp(sequence_mean(b.tis.log(), mask))  # per-sequence truncated weight, same geometric mean
    return -(surrogate * tis - sequence_mean(kl_penalty(b, cfg), mask)).sum() / b.n_sequences


def cispo_loss(b, cfg):
    """CISPO (MiniMax-M1 2025, eq. 4-5): REINFORCE on every token, weighted by the clipped ratio with its
    gradient stopped, so clipping never drops a token's gradient; token-level mean as DAPO."""
    weight = torch.exp(b.logp - b.old_logp).detach().clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    terms = weight * b.tis * b.adv[:, None] * b.logp - kl_penalty(b, cfg)
    return -(terms * b.mask).sum() / b.n_tokens


# -----------------------------------------------------------------------------
# The table


@dataclass
class Objective:
    # (rewards, passed, cfg) -> advantages, each (P, G): rewards are the reward table's (reward.py: penalties, KL
    # in the reward); passed is what the learner counts as a success: the verifier's verdict, or under --reward
    # random / format the control's (a seeded coin, a final \boxed{}); an objective may use either
    advantages: Callable
    loss: Callable  # (MicroBatch, cfg) -> this micro-batch's share of the batch loss
    paper: str  # where it comes from
    change: str  # what it changes from GRPO, in a line
    defaults: dict = field(default_factory=dict)  # the paper's flag defaults (keys of OBJECTIVE_FLAGS); flags win
    needs_group: bool = True  # its advantage compares a sample with its group's others: G = 1 gives no signal


OBJECTIVES = {
    "grpo": Objective(lambda r, passed, cfg: group_advantages(r, scale_by_std=True), grpo_loss,
                      "Shao et al. 2024, DeepSeekMath, eq. 3", "the reference: the formulas above"),
    "drgrpo": Objective(lambda r, passed, cfg: group_advantages(r, scale_by_std=False), drgrpo_loss,
                        "Liu et al. 2025, Dr. GRPO, sec. 3.2",
                        "A = r - mean (no std); token terms summed and divided by the generation budget, "
                        "not |o_i| (no length bias)"),
    "dapo": Objective(lambda r, passed, cfg: group_advantages(r, scale_by_std=True), token_mean_loss,
                      "Yu et al. 2025, DAPO, eq. 8-13",
                      "token-level mean over the batch; clip-higher (clip_high 0.28); dynamic sampling (redraw "
                      "until P groups are mixed); --overlong-buffer for the soft length penalty",
                      dict(clip_high=0.28, dynamic_sampling=True)),
    "gspo": Objective(lambda r, passed, cfg: group_advantages(r, scale_by_std=True), gspo_loss,
                      "Zheng et al. 2025, GSPO, eq. 5-7",
                      "one importance ratio per sequence (the geometric mean of its token ratios), clipped per "
                      "sequence with a tiny range",
                      dict(clip_low=3e-4, clip_high=4e-4)),  # sec. 5.1: sequence ratios need a tiny range
    "cispo": Objective(lambda r, passed, cfg: group_advantages(r, scale_by_std=True), cispo_loss,
                       "MiniMax 2025, MiniMax-M1, eq. 4-5",
                       "REINFORCE on every token weighted by the clipped, stop-gradient ratio: clipping never "
                       "drops a token's gradient; token-level mean",
                       dict(clip_low=1.0, clip_high=0.2)),  # no lower bound on the weight, as MiniMax-M1
    "rloo": Objective(lambda r, passed, cfg: leave_one_out_advantages(r), drgrpo_loss,
                      "Ahmadian et al. 2024, eq. 4 (Kool et al. 2019)",
                      "A = r minus the mean of the other G - 1 rewards; summed token log-probs"),
    "reinforce_pp": Objective(lambda r, passed, cfg: batch_normalized_advantages(r), token_mean_loss,
                              "Hu et al. 2025, REINFORCE++ (with baseline)",
                              "group mean removed, then divided by the std over the whole batch; token-level mean"),
    "w_reinforce": Objective(lambda r, passed, cfg: weighted_reinforce_advantages(passed, cfg.positive_weight), token_mean_loss,
                             "Zhu et al. 2025, negative sample reinforcement, sec. 5",
                             "A = +lambda passed (--positive-weight), -1 failed, no baseline, from the verdict; "
                             "token-level mean", needs_group=False),
    "passk": Objective(lambda r, passed, cfg: passk_advantages(passed, cfg.passk_k), drgrpo_loss,
                       "Chen et al. 2025, Pass@k Training, sec. 3.3",
                       "the advantage that maximizes the group's pass@k (--passk-k); Dr. GRPO's loss"),
}


# -----------------------------------------------------------------------------
# The flags


@dataclass
class ObjectiveConfig:
    """train_rl.py's objective flags (train_rl.Config inherits them). None means "the objective's own default"
    (Objective.defaults, its paper's value), else the value in OBJECTIVE_FLAGS."""
    objective: str = arg("drgrpo", "a row of OBJECTIVES (python objectives.py prints the table)",
                         choices=OBJECTIVES)  # the live table: rows a fork adds too
    epochs_per_batch: int = arg(1, "mu: updates per batch of rollouts (> 1 uses the clipped ratio)", range="[1, inf)")
    clip_low: float | None = arg(None, "ratio clip range below 1: clip(rho, 1 - clip_low, 1 + clip_high) (default: the "
                                       "objective's, else 0.2)", range="[0, inf)")
    clip_high: float | None = arg(None, "ratio clip range above 1 (default: the objective's, e.g. DAPO's clip-higher "
                                        "0.28, else 0.2)", range="[0, inf)")
    kl_coef: float = arg(0.0, "beta of the KL to the frozen initial policy (0: no KL and no reference model)",
                         range="[0, inf)")
    kl_estimator: str = arg("k3", "KL estimator per token", choices=("k1", "k2", "k3"))
    kl_in: str = arg("loss", "where the KL goes: a penalty term in the loss, or subtracted from each reward",
                     choices=("loss", "reward"))
    tis_cap: float = arg(0.0, "truncated importance sampling: weight tokens by min(pi_trainer / pi_sampler, C) (0: off)",
                         range="[0, inf)")
    dynamic_sampling: bool | None = arg(None, "DAPO: draw more problems until P groups have mixed correctness (default: "
                                              "the objective's, on for dapo)")
    max_draws: int = arg(4, "dynamic sampling: at most this many draws of P problems per step", range="[1, inf)")
    positive_weight: float = arg(0.1, "w_reinforce: lambda, the advantage of a right answer (a wrong one gets -1)")
    passk_k: int = arg(4, "passk: the k of the pass@k the advantage maximizes (1 <= k < group size)")

    def __post_init__(self):  # the objective's paper defaults fill the flags left unset, from Python as from the CLI
        own = OBJECTIVES[self.objective].defaults if self.objective in OBJECTIVES else {}
        for name, value in OBJECTIVE_FLAGS.items():
            if getattr(self, name) is None:
                setattr(self, name, own.get(name, value))


# Flags an objective may give its paper's value (Objective.defaults), and their value otherwise.
OBJECTIVE_FLAGS = dict(clip_low=0.2, clip_high=0.2, dynamic_sampling=False)


def check(cfg, group_size):
    """Refuse objective settings that cannot train, naming the flag (each flag's own range is on its field)."""
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"--objective {cfg.objective!r} is unknown; choose from {', '.join(OBJECTIVES)}")
    if OBJECTIVES[cfg.objective].needs_group and group_size < 2:
        raise ValueError(f"--group-size {group_size}: --objective {cfg.objective} compares each sample with the "
                         f"rest of its group, so every advantage would be 0; use --group-size >= 2")
    if cfg.objective == "passk":
        check_passk(cfg.passk_k, group_size)


def table():
    """The objectives as a Markdown table, generated from OBJECTIVES."""
    rows = [f"| `{name}` | {o.paper} | {o.change} |" for name, o in OBJECTIVES.items()]
    return "\n".join(["| `--objective` | paper | what changes from GRPO |", "| --- | --- | --- |", *rows])


if __name__ == "__main__":
    print(table())
