"""
Reinforcement learning with verifiable rewards (RLVR) on math, in plain PyTorch.

One step of the loop:
    draw P problems -> prompt text -> token ids -> sample G completions each (sample.generate, with the
    sampler's log-probs) -> rewards (verify.reward_batch) -> group advantages -> policy loss of the chosen
    objective over the completion tokens -> optimizer step -> metrics, samples and checkpoints.
With --epochs-per-batch mu > 1 the same rollouts are reused for mu updates with PPO-style ratio clipping
against the log-probs the policy had when the batch was drawn.

Objectives (one small entry each in OBJECTIVES: an advantage function, a loss function, flag defaults):
- grpo   (Shao et al. 2024, DeepSeekMath, eq. 3): A_i = (r_i - mean r) / (std r + eps) within a group;
         loss = -(1/G) sum_i (1/|o_i|) sum_t min(rho A, clip(rho, 1-e, 1+e) A) [- beta KL with --kl-coef].
- drgrpo (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.2): A_i = r_i - mean r (no std
         division); token terms are summed and divided by one constant, the generation budget.
- dapo   (Yu et al. 2025): GRPO advantages, token-level mean over the batch, clip-higher (e_high = 0.28),
         dynamic sampling (groups of mixed correctness only); --overlong-buffer adds the soft length penalty.
- gspo   (Zheng et al. 2025): one length-normalized importance ratio per sequence, clipped per sequence.
- cispo  (MiniMax-M1, 2025): REINFORCE on every token weighted by the clipped, stop-gradient ratio.
- rloo   (Ahmadian et al. 2024): leave-one-out baseline, summed token log-probs.
- reinforce_pp (Hu et al. 2025, REINFORCE++ with baseline): group mean removed, then batch-level std.
- w_reinforce (Zhu et al. 2025, negative sample reinforcement): A = +lambda right, -1 wrong, token-level mean.
- passk  (Chen et al. 2025, "Pass@k Training"): the group's pass@k advantage (curriculum.passk_advantages),
         Dr. GRPO's loss, so only the advantage differs from drgrpo.
Which problems a step draws and which rollouts it learns from (a pass-rate curriculum, replay of rare
successes) is curriculum.py; --reward random / format are the controls every claimed gain is set beside.
KL (--kl-coef, off by default as in most RLVR work): estimator k1/k2/k3, as a loss term or in the reward; a
frozen reference model exists only when it is used. --tis-cap corrects for sampler/trainer mismatch.
With one epoch per batch rho = 1, clipping changes nothing, and the gradient is REINFORCE with a baseline.

Run: `python train_rl.py --objective drgrpo` (Qwen3-0.6B-Base on the first 50 Algebra problems of the MATH
training pool), or `python train_rl.py --objective drgrpo --model tiny` (the embedded tiny world, CPU).
Several GPUs or nodes: `torchrun --nproc_per_node N train_rl.py ...`, the same run (distributed.py says how).
MATH-500 is held out: the training pool is checked against it, and --eval-every evaluates on a validation
split carved from the training pool.
"""

import copy
import dataclasses
import json
import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import cli
import curriculum as C
import distributed as D
import lora
import model as M
import problems as P
import tiny
import verify
from cli import arg
from sample import generate, pack_by_length


@dataclass
class Config:
    # model and data
    model: str = arg(M.DEFAULT_MODEL, "Hugging Face repo id, local checkpoint directory, or 'tiny'")
    dataset: str = arg("math_train", "training pool: a dataset name from problems.py or a .jsonl path")
    subject: str = arg("Algebra", "keep only problems of this subject ('' keeps all)")
    num_problems: int = arg(50, "train on the first N problems of the pool (0: all)")
    val_dataset: str = arg("", "validation set for --eval-every (default: carved from the training pool)")
    val_size: int = arg(100, "validation problems carved from the pool when --val-dataset is not given")
    test_dataset: str = arg("", "evaluated before and after training (never used for choices; '' skips)")
    template: str = arg("base", "prompt template: base, chat, chat_think")
    # the RL objective
    objective: str = arg("drgrpo", "one of OBJECTIVES: grpo, drgrpo, dapo, gspo, cispo, rloo, reinforce_pp, "
                                   "w_reinforce, passk")
    steps: int = arg(50, "optimizer updates (one batch of rollouts each)")
    problems_per_step: int = arg(1, "P: problems drawn per step")
    group_size: int = arg(8, "G: completions sampled per problem")
    max_new_tokens: int = arg(512, "generation budget per completion (also Dr. GRPO's loss constant)")
    temperature: float = arg(1.0, "sampling temperature for rollouts")
    top_p: float = arg(1.0, "nucleus sampling for rollouts")
    compile: bool = arg(False, "torch.compile the sampler's decode step (for CUDA; slower on a CPU)")
    epochs_per_batch: int = arg(1, "mu: updates per batch of rollouts (> 1 uses the clipped ratio)")
    clip_low: float | None = arg(None, "ratio clip range below 1: clip(rho, 1 - clip_low, 1 + clip_high) "
                                       "(default: the objective's, else 0.2)")
    clip_high: float | None = arg(None, "ratio clip range above 1 (default: the objective's, e.g. DAPO's "
                                        "clip-higher 0.28, else 0.2)")
    kl_coef: float = arg(0.0, "beta of the KL to the frozen initial policy (0: no KL and no reference model)")
    kl_estimator: str = arg("k3", "KL estimator per token: k1, k2 or k3")
    kl_in: str = arg("loss", "where the KL goes: 'loss' (a penalty term) or 'reward' (subtracted from each reward)")
    tis_cap: float = arg(0.0, "truncated importance sampling: weight tokens by min(pi_trainer / pi_sampler, C) (0: off)")
    format_penalty: float = arg(0.0, "reward subtracted when a response has no final \\boxed{} answer")
    grader: str = arg("answer", "reward and validation rule: answer (verify.grade) or steps (the tiny ladder's "
                                "tiny.check_steps: the worked lines must be the problem's chain too)")
    overlong_buffer: int = arg(0, "DAPO soft overlong penalty: last N tokens of the budget ramp the reward to -1 (0: off)")
    dynamic_sampling: bool | None = arg(None, "DAPO: draw more problems until P groups have mixed correctness "
                                              "(default: the objective's, on for dapo)")
    max_draws: int = arg(4, "dynamic sampling: at most this many draws of P problems per step")
    positive_weight: float = arg(0.1, "w_reinforce: lambda, the advantage of a right answer (a wrong one gets -1)")
    passk_k: int = arg(4, "passk: the k of the pass@k the advantage maximizes (Chen et al. 2025; 1 <= k < G)")
    reward: str = arg("verifier", "what the learner is paid for: verifier (the true reward), or the controls random "
                                  "(a seeded fair coin) and format (any final \\boxed{}; Shao et al. 2025); "
                                  "accuracy is always the verifier's")
    # which problems a step draws and which rollouts it learns from (curriculum.py)
    select: str = arg("uniform", "problem selection: uniform (an epoch's permutation) or pass_rate (weights "
                                 "p(1-p), Bae et al. 2025; GRESO skips, Zheng et al. 2025)")
    pass_rate_floor: float = arg(0.01, "pass_rate: the least weight of any problem, so none is starved")
    skip_window: int = arg(2, "pass_rate: skip a problem whose last N groups were all right or all wrong (0: never)")
    replay_fraction: float = arg(0.0, "share of a step's groups given one replayed past success in place of a "
                                      "fresh wrong sample (ExGRPO, Zhan et al. 2025; 0: off)")
    replay_size: int = arg(256, "replay: the buffer's capacity in rollouts (first in, first out)")
    replay_max_rate: float = arg(0.25, "replay: keep successes of groups whose pass rate is at most this")
    skip_zero_advantage: bool = arg(True, "leave rows with zero advantage (groups of equal rewards) out of the backward")
    # optimization
    lr: float = arg(1e-5, "peak learning rate of AdamW")
    weight_decay: float = arg(0.0, "AdamW weight decay")
    warmup_steps: int = arg(0, "linear warmup steps")
    schedule: str = arg("constant", "after warmup: constant, cosine or linear decay to 0")
    grad_clip: float = arg(1.0, "max gradient norm (0: no clipping)")
    micro_batch_tokens: int = arg(4096, "padded tokens per forward/backward micro-batch (gradient accumulation)")
    grad_checkpointing: bool = arg(False, "recompute activations in backward to save memory")
    fsdp: bool = arg(False, "under torchrun: shard parameters, gradients and optimizer state over the ranks (FSDP2)")
    lora_rank: int = arg(0, "LoRA rank (0: full fine-tuning)")
    lora_alpha: float = arg(16.0, "LoRA alpha (the update is scaled by alpha / rank)")
    loop: str = arg("", "looped depth START:END:N: layers [START, END) run N times, weights shared, gates and loop "
                        "embeddings zero so training starts from exactly --model (model.py; '': plain)")
    loop_lr: float = arg(0.0, "learning rate of the loop's gates and embeddings (0: --lr; a zero gate barely moves "
                              "at an RL learning rate)")
    loop_lora_rank: int = arg(0, "--loop: a LoRA adapter per extra loop on the looped layers (0: none)")
    # run
    seed: int = arg(0, "seed for data order, sampling and initialization")
    device: str = arg("", "cuda or cpu (default: cuda when available)")
    out: str = arg("", "run directory (default: runs/<objective>-<model>)")
    resume: bool = arg(False, "continue the run in --out from its last checkpoint")
    save_every: int = arg(25, "checkpoint every N steps (0: only at the end)")
    eval_every: int = arg(0, "evaluate on the validation split every N steps (0: never)")
    eval_max_new_tokens: int = arg(0, "generation budget for evaluation (0: --max-new-tokens)")
    eval_group_by: str = arg("source", "also log validation accuracy per value of this problem field ('' skips)")
    samples_per_step: int = arg(2, "completions per step written to samples.jsonl")
    dispersion_every: int = arg(10, "every N steps log the groups' embedding dispersion (evaluate.embedding_dispersion; "
                                    "costs about 0.7x the step's sampling on the tiny world's CPU; 0: never)")

    def __post_init__(self):  # the objective's paper defaults fill the flags left unset, from Python as from the CLI
        own = OBJECTIVES[self.objective].defaults if self.objective in OBJECTIVES else {}
        for name, value in OBJECTIVE_FLAGS.items():
            if getattr(self, name) is None:
                setattr(self, name, own.get(name, value))


# Flags an objective may give its paper's value (Objective.defaults), and their value otherwise.
OBJECTIVE_FLAGS = dict(clip_low=0.2, clip_high=0.2, dynamic_sampling=False)


# The embedded tiny world has its own settings (tiny.py): used with --model tiny, or a model trained from it,
# unless a flag overrides.
TINY_DEFAULTS = dict(dataset="tiny_train", subject="", num_problems=0, val_dataset="tiny_val",
                     test_dataset="tiny_test", steps=60, problems_per_step=16, group_size=8,
                     max_new_tokens=tiny.MAX_NEW_TOKENS,
                     lr=1e-4, eval_every=20, save_every=20, eval_group_by="level")
# The tiny ladder (--dataset tiny_ladder_train, tiny.py): its own validation and test rungs, a budget that fits
# the top rung, and the step-checking grader as the reward.
LADDER_DEFAULTS = dict(val_dataset="tiny_ladder_val", test_dataset="tiny_ladder_test", eval_group_by="level",
                       max_new_tokens=tiny.LADDER_MAX_NEW_TOKENS, grader="steps")
# Settings that may change when a run is resumed; everything else must match the saved config.
RESUMABLE = {"steps", "resume", "save_every", "eval_every", "samples_per_step", "device", "out", "fsdp", "compile",
             "dispersion_every"}
KL_ESTIMATORS, KL_PLACES = ("k1", "k2", "k3"), ("loss", "reward")
SCHEDULES = ("constant", "cosine", "linear")


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


# -----------------------------------------------------------------------------
# Losses. A micro-batch b holds, per completion token, (B, T): logp (policy, with gradient), old_logp (the
# policy that drew the batch), ref_logp (frozen reference, when KL is used), tis (truncated importance weights,
# ones when off) and mask; per row, (B,): adv; and the batch's n_sequences and n_tokens, so every micro-batch
# returns its share of one batch loss.


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
    return cfg.kl_coef * kl_estimate(b["logp"], b["ref_logp"], cfg.kl_estimator)


def ppo_terms(b, cfg):
    """min(rho A, clip(rho, 1 - e_low, 1 + e_high) A) per token (PPO, Schulman et al. 2017, eq. 7, with DAPO's
    decoupled range, Yu et al. 2025, eq. 10), times the truncated importance weight, minus the KL term."""
    ratio, adv = torch.exp(b["logp"] - b["old_logp"]), b["adv"][:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv)
    return surrogate * b["tis"] - kl_penalty(b, cfg)


def sequence_mean(x, mask):
    """(B, T) -> (B,): the mean over each sequence's own completion tokens."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def grpo_loss(b, cfg):
    """Mean over each sequence's tokens, then over sequences (DeepSeekMath eq. 3)."""
    return -sequence_mean(ppo_terms(b, cfg), b["mask"]).sum() / b["n_sequences"]


def drgrpo_loss(b, cfg):
    """Token terms summed and divided by one constant, the generation budget, not |o_i| (Dr. GRPO, sec. 3.2)."""
    return -(ppo_terms(b, cfg) * b["mask"]).sum() / (cfg.max_new_tokens * b["n_sequences"])


def token_mean_loss(b, cfg):
    """Token terms averaged over all the batch's tokens, so long answers weigh by their length (DAPO eq. 12)."""
    return -(ppo_terms(b, cfg) * b["mask"]).sum() / b["n_tokens"]


def gspo_loss(b, cfg):
    """GSPO (Zheng et al. 2025, eq. 5-7): one importance ratio per sequence, the geometric mean of its token
    ratios, clipped as a whole; the sequence terms are averaged over the batch."""
    mask, adv = b["mask"], b["adv"]
    ratio = torch.exp(sequence_mean(b["logp"] - b["old_logp"], mask))  # (B,) s_i(theta)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv)
    tis = torch.exp(sequence_mean(b["tis"].log(), mask))  # per-sequence truncated weight, same geometric mean
    return -(surrogate * tis - sequence_mean(kl_penalty(b, cfg), mask)).sum() / b["n_sequences"]


def cispo_loss(b, cfg):
    """CISPO (MiniMax-M1 2025, eq. 4-5): REINFORCE on every token, weighted by the clipped ratio with its
    gradient stopped, so clipping never drops a token's gradient; token-level mean as DAPO."""
    weight = torch.exp(b["logp"] - b["old_logp"]).detach().clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    terms = weight * b["tis"] * b["adv"][:, None] * b["logp"] - kl_penalty(b, cfg)
    return -(terms * b["mask"]).sum() / b["n_tokens"]


def weighted_reinforce_advantages(correct, positive_weight):
    """W-REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
    sec. 5): A = +lambda for a right answer, -1 for a wrong one, no baseline; lambda = 0.1 in the paper puts
    the weight on pushing mass away from wrong answers. Defined on correctness, not the shaped reward."""
    return torch.where(correct, positive_weight, -1.0)


@dataclass
class Objective:
    # (rewards, correct, cfg) -> advantages, each (P, G): rewards are shaped (penalties, KL in the reward),
    # correct is the verifier's verdict; an objective may use either
    advantages: callable
    loss: callable  # (micro-batch dict, cfg) -> this micro-batch's share of the batch loss
    defaults: dict = field(default_factory=dict)  # the paper's flag defaults (keys of OBJECTIVE_FLAGS); flags win


OBJECTIVES = {
    "grpo": Objective(lambda r, c, cfg: group_advantages(r, scale_by_std=True), grpo_loss),
    "drgrpo": Objective(lambda r, c, cfg: group_advantages(r, scale_by_std=False), drgrpo_loss),
    "dapo": Objective(lambda r, c, cfg: group_advantages(r, scale_by_std=True), token_mean_loss,
                      dict(clip_high=0.28, dynamic_sampling=True)),  # DAPO sec. 3.1-3.2
    "gspo": Objective(lambda r, c, cfg: group_advantages(r, scale_by_std=True), gspo_loss,
                      dict(clip_low=3e-4, clip_high=4e-4)),  # GSPO sec. 5.1: sequence ratios need a tiny range
    "cispo": Objective(lambda r, c, cfg: group_advantages(r, scale_by_std=True), cispo_loss,
                       dict(clip_low=1.0, clip_high=0.2)),  # no lower bound on the weight, as MiniMax-M1
    "rloo": Objective(lambda r, c, cfg: leave_one_out_advantages(r), drgrpo_loss),  # REINFORCE, summed log-probs
    "reinforce_pp": Objective(lambda r, c, cfg: batch_normalized_advantages(r), token_mean_loss),
    "w_reinforce": Objective(lambda r, c, cfg: weighted_reinforce_advantages(c, cfg.positive_weight), token_mean_loss),
    "passk": Objective(lambda r, c, cfg: C.passk_advantages(c, cfg.passk_k), drgrpo_loss),
}


def overlong_penalty(length, budget, buffer):
    """DAPO's soft overlong punishment (eq. 13): 0 up to budget - buffer tokens, then linear down to -1 at the
    budget (reached only by truncated answers)."""
    if buffer <= 0 or length <= budget - buffer:
        return 0.0
    return max(-1.0, (budget - buffer - length) / buffer)


# -----------------------------------------------------------------------------
# Data: the training pool, its validation split, and the order problems are drawn in


def load_pools(cfg):
    """(train, val, test) problem lists; training and validation problems are checked against MATH-500."""
    pool = P.load_problems(cfg.dataset)
    if cfg.subject:
        pool = [p for p in pool if p.get("subject") == cfg.subject]
        if not pool:
            raise ValueError(f"--subject {cfg.subject!r}: no problems of that subject in {cfg.dataset}")
    if cfg.val_dataset:
        train, val = pool, P.load_problems(cfg.val_dataset)
    elif cfg.num_problems:  # the first N train; validation comes from the rest of the pool
        train, rest = pool[:cfg.num_problems], pool[cfg.num_problems:]
        val = P.train_val_split(rest, min(cfg.val_size, len(rest) - 1), cfg.seed)[1] if len(rest) > 1 else []
    else:
        train, val = P.train_val_split(pool, min(cfg.val_size, len(pool) - 1), cfg.seed)
    if cfg.num_problems:
        train = train[:cfg.num_problems]
    P.check_held_out(train + val)
    test = P.load_problems(cfg.test_dataset) if cfg.test_dataset else []
    return train, val, test


def problems_for_step(n_train, step, per_step, seed):
    """Indices drawn at `step`: a fresh seeded permutation each epoch, so the order is a function of step."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(k, n_train)
        perm = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.append(int(perm[i]))
    return out


# -----------------------------------------------------------------------------
# Rollouts -> rewards


def is_direct_answer(text):
    """The response opens with its boxed answer: no reasoning before it."""
    return text.lstrip().startswith("\\boxed")


def sampling_seeds(cfg, step, draw, n):
    """One seed per problem of a draw, from (seed, step, draw, position): a group's samples do not depend on
    which other problems share its batch or on which process draws it."""
    return [(((cfg.seed * 1_000_003 + step) * 1_009 + draw) * 100_003 + k) % 2**32 for k in range(n)]


def collect_rollouts(policy, tokenizer, batch, cfg, seeds):
    """Sample G completions per problem (problem k with seeds[k]): a list of dicts, problem-major."""
    prompts = [tokenizer.encode(P.format_prompt(p["problem"], cfg.template)) for p in batch]
    completions = generate(policy, prompts, cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                           n=cfg.group_size, stop_token_ids=tokenizer.stop_token_ids(chat=cfg.template != "base"),
                           seed=seeds, pad_id=tokenizer.pad_id, compile=cfg.compile)
    return [dict(problem=batch[c.prompt_index], prompt=prompts[c.prompt_index], tokens=c.tokens,
                 sampler_logprobs=c.logprobs, finish_reason=c.finish_reason, text=tokenizer.decode(c.tokens),
                 seed=seeds[c.prompt_index], sample=j % cfg.group_size)
            for j, c in enumerate(completions)]


def score_rollouts(rollouts, cfg):
    """Grade each rollout and set its reward: correctness, minus the format and overlong penalties. 'pass' is
    what the learner counts as a success: the verifier's verdict, or under --reward random / format the
    control's (whose reward is then 1 or 0); 'correct' stays the verifier's, for the logged accuracy."""
    correct, rewards = tiny.grade_with(cfg.grader, [r["text"] for r in rollouts], [r["problem"] for r in rollouts],
                                       cfg.format_penalty)
    for r, c, w in zip(rollouts, correct, rewards):
        r.update(correct=bool(c), boxed=verify.extract_answer(r["text"]) is not None)
        r["pass"] = C.control_pass(cfg.reward, r)
        paid = w if cfg.reward == "verifier" else float(r["pass"])
        r["reward"] = float(paid + overlong_penalty(len(r["tokens"]), cfg.max_new_tokens, cfg.overlong_buffer))


def draw_rollouts(policy, tokenizer, train_set, cfg, step, seconds, pass_rates=None, replay=None):
    """(every rollout drawn, the batch to learn from, groups given a replayed success); adds the time spent to
    seconds. Without dynamic sampling both are the G samples of the step's P problems, drawn uniformly or by
    the pass-rate table. With --replay-fraction some groups get a past success in place of a fresh wrong
    sample (curriculum.ReplayBuffer). With dynamic sampling (DAPO sec. 3.2) groups that are all right or all
    wrong are then dropped and more problems drawn, at most --max-draws times, until P groups are mixed.
    Every fresh group updates the pass-rate table and the replay buffer, after the step's choices."""
    G, drawn, batch_groups, fresh, replayed = cfg.group_size, [], [], [], 0
    for draw in range(cfg.max_draws if cfg.dynamic_sampling else 1):
        gen = torch.Generator().manual_seed((cfg.seed * 100_003 + step) * 1_009 + draw)  # a function of the step
        if pass_rates is not None:
            idx = pass_rates.draw(cfg.problems_per_step, gen, exclude={pass_rates.index[g[0]["problem"]["id"]]
                                                                       for g in fresh})
        elif draw == 0:
            idx = problems_for_step(len(train_set), step, cfg.problems_per_step, cfg.seed)
        else:  # extra draws: a permutation seeded by (seed, step, draw), so a resumed run draws the same
            idx = torch.randperm(len(train_set), generator=gen)[:cfg.problems_per_step].tolist()
        t0 = time.time()  # each rank samples and grades its share of the problems, each with its own seed
        rollouts = collect_rollouts(policy, tokenizer, D.rank_share([train_set[i] for i in idx]), cfg,
                                    D.rank_share(sampling_seeds(cfg, step, draw, len(idx))))
        t1 = time.time()
        score_rollouts(rollouts, cfg)
        seconds["sampling"] += t1 - t0
        seconds["verifying"] += time.time() - t1
        rollouts = D.gather_lists(rollouts)  # every rank has the whole draw, so all make the same choices below
        drawn += rollouts
        groups = [rollouts[i:i + G] for i in range(0, len(rollouts), G)]
        fresh += [list(g) for g in groups]  # the samples as drawn, before replay changes the groups
        if replay is not None:
            replayed += replay.apply(groups, cfg.replay_fraction)
        if cfg.dynamic_sampling:
            groups = [g for g in groups if 0 < sum(r["pass"] for r in g) < G]
        batch_groups += groups[:cfg.problems_per_step - len(batch_groups)]
        if len(batch_groups) == cfg.problems_per_step:
            break
    if pass_rates is not None:
        pass_rates.update(fresh)
    if replay is not None:
        replay.add(fresh, step + 1)
    return drawn, [r for g in batch_groups for r in g], replayed


def ngrams(tokens, n=4):
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def group_diversity(rollouts, G):
    """Simple diversity signals averaged over groups: the std of completion lengths, the number of distinct
    final answers, and the mean pairwise Jaccard overlap of token 4-gram sets (1 = identical samples)."""
    spread, answers, overlap = [], [], []
    for g in (rollouts[i:i + G] for i in range(0, len(rollouts), G)):
        lengths = torch.tensor([float(len(r["tokens"])) for r in g])
        spread.append(lengths.std().item() if G > 1 else 0.0)
        answers.append(len({verify.extract_answer(r["text"]) for r in g}))
        sets = [ngrams(r["tokens"]) for r in g]
        pairs = [(a, b) for i, a in enumerate(sets) for b in sets[i + 1:]]
        overlap += [len(a & b) / len(a | b) for a, b in pairs if a | b]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    return dict(group_length_std=mean(spread), group_distinct_answers=mean(answers), group_ngram_overlap=mean(overlap))


def group_dispersion(model, rollouts, G):
    """The mean over groups of the mean pairwise cosine distance between the completions' mean-pooled final
    hidden states under the sampling model (evaluate.embedding_dispersion): diversity of content, as the policy
    itself represents it, where length spread and n-gram overlap see only the surface."""
    from evaluate import completion_embeddings, embedding_dispersion
    if G < 2 or not rollouts or not all(r["tokens"] for r in rollouts):  # an empty completion has nothing to pool
        return float("nan")
    emb = completion_embeddings(model, [r["prompt"] for r in rollouts], [r["tokens"] for r in rollouts])
    return sum(embedding_dispersion(emb[i:i + G]) for i in range(0, len(rollouts), G)) / (len(rollouts) // G)


# -----------------------------------------------------------------------------
# The policy update


def micro_batches(rows, budget):
    """Pack rollouts (longest first) into micro-batches of at most `budget` padded tokens."""
    groups = pack_by_length([len(r["prompt"]) + len(r["tokens"]) for r in rows], budget)
    return [[rows[i] for i in g] for g in groups]


def to_tensors(rows, pad_id, device):
    """Right-padded prompt+completion ids (B, T), and over the targets ids[:, 1:] the completion mask and the
    sampler's log-probs (B, T-1)."""
    T = max(len(r["prompt"]) + len(r["tokens"]) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask, sampler_logp = torch.zeros(len(rows), T - 1), torch.zeros(len(rows), T - 1)
    for i, r in enumerate(rows):
        seq, start = r["prompt"] + r["tokens"], len(r["prompt"]) - 1
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, start:len(seq) - 1] = 1.0  # targets that are completion tokens
        sampler_logp[i, start:len(seq) - 1] = torch.tensor(r["sampler_logprobs"], dtype=torch.float32)
    return ids.to(device), mask.to(device), sampler_logp.to(device)


@torch.no_grad()
def add_reference_kl(reference, rows, cfg, device, pad_id):
    """--kl-in reward: r["kl"] = the KL estimate of each rollout summed over its tokens, and the reward pays
    beta times it (the per-sequence form of the KL-in-reward of REINFORCE++ and InstructGPT)."""
    for rb in micro_batches(rows, cfg.micro_batch_tokens):
        ids, mask, sampler_logp = to_tensors(rb, pad_id, device)
        with autocast(device):
            ref_logp, _ = M.token_logprobs(reference, ids)
        kl = (kl_estimate(sampler_logp, ref_logp.float(), cfg.kl_estimator) * mask).sum(-1)
        for r, k in zip(rb, kl.tolist()):
            r.update(kl=k, reward=r["reward"] - cfg.kl_coef * k)


def autocast(device):
    """bf16 autocast on CUDA (fp32 master weights), plain fp32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast("cpu", enabled=False)


def truncated_is_weights(old_logp, sampler_logp, mask, cap):
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"): min(pi_trainer / pi_sampler, C) per token corrects for the sampler's numerics
    (e.g. a bf16 copy) differing from the trainer's; ones when off, and on padding."""
    if not cap:
        return torch.ones_like(mask)
    return torch.where(mask.bool(), torch.exp(old_logp - sampler_logp).clamp(max=cap), torch.ones_like(mask))


def policy_update(policy, reference, optimizer, rows, n_sequences, n_tokens, cfg, device, pad_id):
    """mu epochs over the batch, each one optimizer step with gradients accumulated over micro-batches.
    n_sequences and n_tokens count the whole batch (rows may leave out zero-advantage ones, and with several
    ranks hold this rank's share of it)."""
    objective = OBJECTIVES[cfg.objective]
    batches = micro_batches(rows, cfg.micro_batch_tokens)
    if D.is_sharded(policy):  # FSDP: every rank must run as many forward/backward passes as the others
        batches += [[]] * (D.reduce_numbers([len(batches)], "max")[0] - len(batches))
    stats = dict(loss=0.0, entropy=0.0, clip_fraction=0.0, kl=0.0, grad_norm=0.0, tokens=0, nonfinite=False)
    old = {}  # log-probs of the policy that drew the batch, per micro-batch (for mu > 1)
    params = [p for p in policy.parameters() if p.requires_grad]
    policy.train()
    for epoch in range(cfg.epochs_per_batch):
        optimizer.zero_grad(set_to_none=True)
        epoch_loss, seen, ent, clipped, kl = 0.0, 0, 0.0, 0.0, 0.0
        for j, rb in enumerate(batches):
            if not rb:  # FSDP padding: a pass with zero gradient that joins the other ranks' collectives
                M.token_logprobs(policy, torch.full((1, 2), pad_id, device=device))[0].sum().mul(0).backward()
                continue
            ids, mask, sampler_logp = to_tensors(rb, pad_id, device)
            with autocast(device):
                logp, entropy = M.token_logprobs(policy, ids)  # (B, T-1) each
                ref_logp = None
                if reference is not None and cfg.kl_in == "loss":
                    with torch.no_grad():
                        ref_logp, _ = M.token_logprobs(reference, ids)
                        ref_logp = ref_logp.float()
            logp = logp.float()
            replayed = torch.tensor([r.get("replayed", False) for r in rb], device=device)[:, None]
            # epoch 0: the current policy, so rho = 1; a replayed rollout's ratio is to the policy that sampled it
            old_logp = old.setdefault(j, torch.where(replayed, sampler_logp, logp.detach()))
            b = dict(logp=logp, old_logp=old_logp, ref_logp=ref_logp, mask=mask, n_sequences=n_sequences,
                     n_tokens=n_tokens, tis=truncated_is_weights(old_logp, sampler_logp, mask, cfg.tis_cap),
                     adv=torch.tensor([r["advantage"] for r in rb], device=device))
            loss = objective.loss(b, cfg)
            if not torch.isfinite(loss):
                stats["nonfinite"] = True
                if not D.is_sharded(policy):
                    break
                loss = logp.sum() * 0  # FSDP: still join this pass's collectives; the update is skipped below
            loss.backward()
            epoch_loss += loss.item()
            m = mask.bool()
            seen += int(m.sum())
            ent += float(entropy.float()[m].sum())
            ratio = torch.exp(logp.detach() - old_logp)[m]
            clipped += float(((ratio < 1 - cfg.clip_low) | (ratio > 1 + cfg.clip_high)).float().sum())
            if ref_logp is not None:
                kl += float(kl_estimate(logp.detach(), ref_logp, cfg.kl_estimator)[m].sum())
        # each rank saw its share of the batch: add up the shares, and skip the update on every rank or on none
        epoch_loss, seen, ent, clipped, kl, stats["nonfinite"] = D.reduce_numbers(
            [epoch_loss, seen, ent, clipped, kl, stats["nonfinite"]])
        D.all_reduce_gradients(policy)
        grad_norm = D.whole(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf")))
        if stats["nonfinite"] or not torch.isfinite(grad_norm):
            stats["nonfinite"] = True  # skip the update: a NaN/inf step is logged, never applied or saved
            optimizer.zero_grad(set_to_none=True)
            break
        optimizer.step()
        if epoch == 0:
            stats.update(loss=epoch_loss, entropy=ent / max(seen, 1), grad_norm=float(grad_norm),
                         tokens=seen, kl=kl / max(seen, 1))
        stats["clip_fraction"] = clipped / max(seen, 1)  # of the last epoch (0 when mu = 1)
    optimizer.zero_grad(set_to_none=True)
    policy.eval()
    return stats


# -----------------------------------------------------------------------------
# Optimizer, schedule, checkpoints


def lr_at(step, cfg):
    """Linear warmup, then constant / cosine / linear decay to zero; a function of the step alone."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    if cfg.schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))
    if cfg.schedule == "linear":
        return cfg.lr * (1 - progress)
    return cfg.lr


def has_lora(policy):
    return any(isinstance(m, lora.LoRALinear) for m in policy.modules())


def plain_model(policy, state=None):
    """The policy as an ordinary Qwen3 (LoRA adapters merged), sharing tensors where it can; or with the
    weights `state` (FSDP's gathered ones)."""
    with torch.device("meta"):
        plain = M.Qwen3(policy.config)
    if state is None:
        state = lora.merged_state_dict(policy) if has_lora(policy) else policy.state_dict()
    plain.load_state_dict(state, assign=True)
    if policy.config.tie_word_embeddings:
        plain.lm_head.weight = plain.model.embed_tokens.weight
    return plain


def make_rollout_model(policy, device):
    """CPU: sample from the fp32 policy itself. GPU: from a bf16 copy, refreshed after every update. With
    --fsdp the policy holds only shards, so each rank samples from a whole copy (fp32 on CPU)."""
    if D.is_sharded(policy):
        with torch.device("meta"):
            rollout = M.Qwen3(policy.config)
        rollout = rollout.to_empty(device=device).to(torch.bfloat16 if device.startswith("cuda") else torch.float32)
        if policy.config.tie_word_embeddings:
            rollout.lm_head.weight = rollout.model.embed_tokens.weight
        refresh_rollout_model(rollout, policy)
        return rollout.eval()
    return policy if not device.startswith("cuda") else plain_model(policy).to(torch.bfloat16).eval()


def refresh_rollout_model(rollout_model, policy):
    if rollout_model is policy:
        return
    if D.is_sharded(policy):  # gather one tensor at a time: no rank ever holds a second whole fp32 model
        with torch.no_grad():
            target = rollout_model.state_dict()
            for name, t in policy.state_dict().items():
                target[name].copy_(D.whole(t))
        return
    rollout_model.load_state_dict(plain_model(policy).state_dict())


def save_checkpoint(path, policy, optimizer, tokenizer, step, cfg, selection=None):
    """HF-layout weights (adapters merged) + optimizer state (safetensors) + trainer state (JSON) + the data
    state (selection.json: pass-rate table, replay buffer), atomically. Every rank calls it (FSDP gathers
    shards, a collective); rank 0 writes."""
    from safetensors.torch import save_file
    weights, opt_state = D.gathered_state(policy, optimizer) if D.is_sharded(policy) else (None, optimizer.state_dict())
    if D.this_rank() != 0:
        return
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    M.save_model(plain_model(policy, weights), tmp, tokenizer)
    tensors = {f"state.{i}.{k}": v.contiguous().cpu() for i, s in opt_state["state"].items() for k, v in s.items()}
    if has_lora(policy):
        tensors.update({f"adapter.{k}": v.contiguous().cpu() for k, v in lora.adapter_state_dict(policy).items()})
    save_file(tensors, str(tmp / "trainer_state.safetensors"))
    meta = dict(step=step, param_groups=opt_state["param_groups"], config=dataclasses.asdict(cfg))
    (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=2))
    if selection:
        (tmp / "selection.json").write_text(json.dumps({k: v.state() for k, v in selection.items()}))
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def load_trainer_state(path, policy, optimizer):
    """Restore optimizer moments and LoRA adapters; returns the step the checkpoint was taken after."""
    from safetensors.torch import load_file
    meta = json.loads((Path(path) / "trainer_state.json").read_text())
    tensors = load_file(str(Path(path) / "trainer_state.safetensors"))
    state = {}
    for key, v in tensors.items():
        if key.startswith("state."):
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = v
    adapters = {k[len("adapter."):]: v for k, v in tensors.items() if k.startswith("adapter.")}
    if adapters:
        policy.load_state_dict(adapters, strict=False)
    if D.is_sharded(policy) and state:  # (with no state yet, there is nothing to shard)
        D.load_sharded_optimizer_state(policy, optimizer, {"state": state, "param_groups": meta["param_groups"]})
    else:
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta["step"]


def new_selection(cfg, train_set):
    """The data state the steps share (curriculum.py): the pass-rate table and the replay buffer, when on."""
    out = {}
    if cfg.select == "pass_rate":
        out["pass_rates"] = C.PassRates([p["id"] for p in train_set], cfg.pass_rate_floor, cfg.skip_window)
    if cfg.replay_fraction:
        out["replay"] = C.ReplayBuffer(cfg.replay_size, cfg.replay_max_rate)
    return out


def load_selection(path, selection):
    if selection:
        for name, state in json.loads((Path(path) / "selection.json").read_text()).items():
            selection[name].load(state)


def selection_metrics(selection, replayed):
    """The pass-rate histogram and how many problems are skipped; groups given a replayed success."""
    out = {}
    if "pass_rates" in selection:
        table = selection["pass_rates"]
        out.update(pass_rate_histogram=table.histogram(),
                   skipped_problems=sum(table.skipped(i) for i in range(len(table.attempts))))
    if "replay" in selection:
        out.update(replayed_groups=replayed, replay_buffer=len(selection["replay"].entries))
    return out


def latest_checkpoint(run_dir):
    steps = [int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*") if p.name[5:].isdigit()]
    return run_dir / "checkpoints" / f"step_{max(steps)}" if steps else None


def logged_totals(path, last_step):
    """The running totals (generated tokens, training tokens, FLOPs) logged at last_step, so a resumed run
    counts its compute from where the checkpoint was taken, not from zero."""
    totals = dict(generated_tokens=0, training_tokens=0, flops=0.0)
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "generated_tokens" in row and row["step"] <= last_step:
                totals = {k: row[k] for k in totals}
    return totals


def truncate_jsonl(path, last_step):
    """Drop lines logged after the checkpoint we resume from (they will be redone)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
        path.write_text("".join(line + "\n" for line in keep))


def code_version():
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "") if commit else "unknown"
    except OSError:
        return "unknown"


# -----------------------------------------------------------------------------
# The loop


def log_line(path, obj):
    if D.this_rank() != 0:  # rank 0 writes the run's files
        return
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


def evaluate_accuracy(policy, tokenizer, problems, cfg):
    """Greedy accuracy (the one evaluation protocol) and, with --eval-group-by, accuracy per group. With several
    ranks each evaluates its share of the problems and the summary is recomputed from all the records."""
    from evaluate import evaluate, summarize
    records, summary = evaluate(policy, tokenizer, D.rank_share(problems), cfg.eval_max_new_tokens or cfg.max_new_tokens,
                                batch_size=64, template=cfg.template, group_by=cfg.eval_group_by or None,
                                compile=cfg.compile, grader=cfg.grader)
    if D.world_size() > 1:
        summary = summarize(D.gather_lists(records), dict(group_by=cfg.eval_group_by or None))
    return summary["accuracy"], {str(k): v["accuracy"] for k, v in summary.get("per_group", {}).items()}


def check_config(cfg):
    """Refuse settings that cannot run, naming the flag."""
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"--objective {cfg.objective!r} is unknown; choose from {', '.join(OBJECTIVES)}")
    for name in ("steps", "problems_per_step", "group_size", "max_new_tokens", "epochs_per_batch",
                 "micro_batch_tokens", "max_draws"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
    if cfg.template not in P.TEMPLATES:
        raise ValueError(f"--template must be one of {', '.join(P.TEMPLATES)}, got {cfg.template!r}")
    if cfg.grader not in tiny.GRADERS:
        raise ValueError(f"--grader must be one of {', '.join(tiny.GRADERS)}, got {cfg.grader!r}")
    if cfg.kl_estimator not in KL_ESTIMATORS or cfg.kl_in not in KL_PLACES:
        raise ValueError(f"--kl-estimator must be one of {KL_ESTIMATORS} and --kl-in one of {KL_PLACES}, "
                         f"got {cfg.kl_estimator!r} and {cfg.kl_in!r}")
    for name in ("clip_low", "clip_high", "kl_coef", "tis_cap", "overlong_buffer"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    if cfg.overlong_buffer >= cfg.max_new_tokens:
        raise ValueError(f"--overlong-buffer {cfg.overlong_buffer} must be below --max-new-tokens {cfg.max_new_tokens}")
    if cfg.select not in C.SELECTIONS or cfg.reward not in C.REWARDS:
        raise ValueError(f"--select must be one of {', '.join(C.SELECTIONS)} and --reward one of "
                         f"{', '.join(C.REWARDS)}, got {cfg.select!r} and {cfg.reward!r}")
    if not 0 <= cfg.replay_fraction <= 1 or not 0 <= cfg.replay_max_rate <= 1 or not 0 < cfg.pass_rate_floor <= 0.25:
        raise ValueError(f"--replay-fraction and --replay-max-rate must be in [0, 1] and --pass-rate-floor in (0, 0.25], "
                         f"got {cfg.replay_fraction}, {cfg.replay_max_rate} and {cfg.pass_rate_floor}")
    if cfg.replay_size < 1 or cfg.skip_window < 0:
        raise ValueError(f"--replay-size must be >= 1 and --skip-window >= 0, got {cfg.replay_size} and {cfg.skip_window}")
    if cfg.objective == "passk" and not 1 <= cfg.passk_k < cfg.group_size:  # at k = G every advantage is 0
        raise ValueError(f"--passk-k must be in [1, --group-size {cfg.group_size}) (at k = G no group has a "
                         f"gradient), got {cfg.passk_k}")
    if cfg.objective == "rloo" and cfg.group_size < 2:
        raise ValueError("--objective rloo needs --group-size >= 2 (the baseline is the other samples' mean)")
    if cfg.fsdp and "WORLD_SIZE" not in os.environ:
        raise ValueError("--fsdp shards the model over torchrun's processes: start it with torchrun, e.g. "
                         "torchrun --nproc_per_node 8 train_rl.py --fsdp ...")
    if cfg.fsdp and cfg.lora_rank:
        raise ValueError("--fsdp with --lora-rank is not supported: the frozen base is replicated anyway; "
                         "run LoRA without --fsdp")
    if cfg.loop and (cfg.lora_rank or cfg.fsdp):
        raise ValueError("--loop with --lora-rank or --fsdp is not supported (--loop-lora-rank gives per-loop adapters)")
    if (cfg.loop_lora_rank and not cfg.loop) or cfg.loop_lora_rank < 0 or cfg.loop_lr < 0:
        raise ValueError(f"--loop-lora-rank {cfg.loop_lora_rank} needs --loop and must be >= 0; --loop-lr must be >= 0")
    M.parse_loop(cfg.loop, None)  # the syntax now; the layer range once the model's config.json is read


def train(cfg):
    check_config(cfg)
    device = D.setup_distributed(cfg.device or M.default_device())
    run_dir = Path(cfg.out or f"runs/{cfg.objective}-{Path(cfg.model).name}")
    start_step = 0
    if cfg.resume:
        saved = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else None
        if saved is None:
            raise FileNotFoundError(f"--resume: {run_dir}/config.json not found; nothing to resume")
        names = {f.name for f in dataclasses.fields(Config)}  # a field newer than the run takes its default
        saved = dataclasses.asdict(Config(**{k: v for k, v in saved.items() if k in names}))
        diff = {k: (saved[k], v) for k, v in dataclasses.asdict(cfg).items() if k not in RESUMABLE and saved[k] != v}
        if diff:
            raise ValueError(f"--resume: settings differ from {run_dir}/config.json (saved, now): {diff}")
    elif (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    train_set, val_set, test_set = load_pools(cfg)  # bad data or a missing model fail before the run directory is written
    M.parse_loop(cfg.loop, M.Qwen3Config.from_json(M.resolve_model_dir(cfg.model) / "config.json").num_hidden_layers)
    D.barrier()  # every rank has read the run directory before rank 0 writes to it
    if D.this_rank() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(
            json.dumps(dict(dataclasses.asdict(cfg), code_version=code_version()), indent=2))
    print(json.dumps(dataclasses.asdict(cfg)))

    torch.manual_seed(cfg.seed)
    tokenizer = M.load_tokenizer(cfg.model)
    policy = M.load_model(cfg.model, dtype=torch.float32, device=device)  # fp32 master weights
    loop_extra = M.add_loop(policy, cfg.loop, cfg.loop_lora_rank)  # looped depth: still exactly --model here
    policy.gradient_checkpointing = cfg.grad_checkpointing
    reference = copy.deepcopy(policy).requires_grad_(False) if cfg.kl_coef else None
    ckpt = latest_checkpoint(run_dir) if cfg.resume else None
    if ckpt is not None and not cfg.lora_rank:  # with LoRA the base stays frozen; adapters come from the trainer state
        policy.load_state_dict(M.load_model(ckpt, torch.float32, device).state_dict())
    if cfg.lora_rank:
        lora.add_lora(policy, cfg.lora_rank, cfg.lora_alpha)
    if cfg.fsdp:  # whole weights are loaded first; the optimizer then holds the shards
        D.shard_model(policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    loop_ids = {id(policy.loop.gate), id(policy.loop.embed)} if policy.loop is not None else set()
    groups = [dict(params=[p for p in params if id(p) not in loop_ids], lr_scale=1.0)]
    if loop_ids:  # the gates and embeddings at --loop-lr, without weight decay (it would pull the gates shut)
        groups.append(dict(params=[p for p in params if id(p) in loop_ids], weight_decay=0.0,
                           lr_scale=(cfg.loop_lr or cfg.lr) / cfg.lr if cfg.lr else 1.0))
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    selection = new_selection(cfg, train_set)
    if ckpt is not None:
        start_step = load_trainer_state(ckpt, policy, optimizer)
        load_selection(ckpt, selection)
        print(f"resumed from {ckpt} after step {start_step}")
    rollout_model = make_rollout_model(policy, device)
    totals = logged_totals(run_dir / "metrics.jsonl", start_step)
    D.barrier()  # every rank has read the totals before rank 0 truncates the log
    if D.this_rank() == 0:
        truncate_jsonl(run_dir / "metrics.jsonl", start_step)
        truncate_jsonl(run_dir / "samples.jsonl", start_step)
    print(f"training on {len(train_set)} problems ({cfg.dataset}), validation {len(val_set)}, "
          f"{count_params(policy)} trainable parameters, device {device}")
    if loop_extra:
        print(f"looped depth --loop {M.loop_spec(policy.config)}: {policy.config.layer_passes} layer passes per token instead of "
              f"{policy.config.num_hidden_layers}, {loop_extra} extra trainable parameters (gates, loop embeddings"
              f"{', per-loop LoRA' if cfg.loop_lora_rank else ''}) at lr {cfg.loop_lr or cfg.lr:g}")

    if test_set and start_step == 0:
        acc, _ = evaluate_accuracy(rollout_model, tokenizer, test_set, cfg)
        log_line(run_dir / "metrics.jsonl", dict(step=0, test_accuracy=acc))
        print(f"test accuracy before training ({cfg.test_dataset}): {acc:.3f}")
    t_start, step = time.time(), start_step
    try:
        for step in range(start_step, cfg.steps):
            metrics = train_step(policy, rollout_model, reference, optimizer, tokenizer, train_set, cfg, step, device,
                                 run_dir, totals, selection)
            refresh_rollout_model(rollout_model, policy)
            if cfg.eval_every and val_set and (step + 1) % cfg.eval_every == 0:
                metrics["val_accuracy"], metrics["val_accuracy_by_group"] = evaluate_accuracy(
                    rollout_model, tokenizer, val_set, cfg)
            log_line(run_dir / "metrics.jsonl", metrics)
            print_progress(metrics, cfg, time.time() - t_start, step + 1 - start_step)
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
                save_checkpoint(run_dir / "checkpoints" / f"step_{step + 1}", policy, optimizer, tokenizer, step + 1, cfg,
                                selection)
    except KeyboardInterrupt:  # save what is done and stop cleanly; --resume continues from here
        done = step  # the step in progress did not finish
        if cfg.fsdp:  # gathering the shards needs every rank at one point, which an interrupt does not give
            print(f"\ninterrupted: --resume continues from the last periodic checkpoint in {run_dir}")
            return run_dir
        if done > start_step:
            save_checkpoint(run_dir / "checkpoints" / f"step_{done}", policy, optimizer, tokenizer, done, cfg, selection)
        print(f"\ninterrupted: checkpoint after step {done} in {run_dir}; rerun with --resume to continue")
        return run_dir
    save_checkpoint(run_dir / "checkpoints" / f"step_{cfg.steps}", policy, optimizer, tokenizer, cfg.steps, cfg, selection)
    final = run_dir / "final"
    if D.this_rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        shutil.copytree(run_dir / "checkpoints" / f"step_{cfg.steps}", final,
                        ignore=shutil.ignore_patterns("trainer_state.*"))
    if test_set:
        acc, _ = evaluate_accuracy(rollout_model, tokenizer, test_set, cfg)
        log_line(run_dir / "metrics.jsonl", dict(step=cfg.steps, test_accuracy=acc))
        print(f"test accuracy after training ({cfg.test_dataset}): {acc:.3f}")
    print(f"done: {run_dir}")
    return run_dir


def count_params(policy):
    return sum(p.numel() for p in policy.parameters() if p.requires_grad)


def train_step(policy, rollout_model, reference, optimizer, tokenizer, train_set, cfg, step, device, run_dir, totals,
               selection):
    """One step: problems -> rollouts -> rewards -> advantages -> update; returns the step's metrics.
    selection holds the step's data state (curriculum.py): 'pass_rates' and 'replay' when they are on."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg) * group.get("lr_scale", 1.0)  # --loop-lr: the loop's group is scaled
    seconds, unverified = dict(sampling=0.0, verifying=0.0), sum(verify.ERRORS.values())
    drawn, rollouts, replayed = draw_rollouts(rollout_model, tokenizer, train_set, cfg, step, seconds,
                                              selection.get("pass_rates"), selection.get("replay"))  # the batch
    unverified = sum(D.gather_lists([sum(verify.ERRORS.values()) - unverified]))  # checks with no verdict, all ranks
    t2 = time.time()
    if reference is not None and cfg.kl_in == "reward":  # each rank scores its share; all get every result
        share = D.rank_share(rollouts)
        add_reference_kl(reference, share, cfg, device, tokenizer.pad_id)
        for r, (kl, reward) in zip(rollouts, D.gather_lists([(s["kl"], s["reward"]) for s in share])):
            r.update(kl=kl, reward=reward)
    rewards = torch.tensor([r["reward"] for r in rollouts], dtype=torch.float32).view(-1, cfg.group_size)  # (P, G)
    correct = torch.tensor([r["pass"] for r in rollouts], dtype=torch.bool).view(-1, cfg.group_size)  # (P, G)
    advantages = OBJECTIVES[cfg.objective].advantages(rewards, correct, cfg) if rollouts else rewards  # (P, G)
    for r, a in zip(rollouts, advantages.flatten().tolist()):
        r["advantage"] = a
    kl_in_loss = reference is not None and cfg.kl_in == "loss"  # then zero-advantage rows still carry KL gradient
    rows = [r for r in rollouts if r["advantage"] != 0 or kl_in_loss or not cfg.skip_zero_advantage]
    batch_tokens = sum(len(r["tokens"]) for r in rollouts)  # the token-level losses' denominator
    stats = dict(loss=0.0, entropy=float("nan"), clip_fraction=0.0, kl=0.0, grad_norm=0.0, tokens=0, nonfinite=False)
    if rows:
        stats = policy_update(policy, reference, optimizer, D.rank_share(rows), len(rollouts), batch_tokens, cfg,
                              device, tokenizer.pad_id)
    if reference is not None and cfg.kl_in == "reward":
        stats["kl"] = sum(r["kl"] for r in rollouts) / max(1, batch_tokens)
    t3 = time.time()
    if cfg.dispersion_every and (step + 1) % cfg.dispersion_every == 0:
        stats["group_dispersion"] = group_dispersion(rollout_model, drawn, cfg.group_size)
    lengths = [len(r["tokens"]) for r in drawn]
    generated = sum(lengths)
    context = sum(len(r["prompt"]) for r in drawn) / len(drawn) + sum(lengths) / len(lengths) / 2
    totals["generated_tokens"] += generated
    totals["training_tokens"] += stats["tokens"] * cfg.epochs_per_batch
    totals["flops"] += (generated * M.flops_per_token(policy.config, context)
                        + stats["tokens"] * cfg.epochs_per_batch * M.flops_per_token(policy.config, context, training=True))
    for r in drawn[:cfg.samples_per_step]:
        log_line(run_dir / "samples.jsonl", dict(step=step + 1, id=r["problem"]["id"], answer=r["problem"]["answer"],
                                                 response=r["text"], reward=r["reward"], correct=r["correct"]))
    G, n = cfg.group_size, len(drawn)
    mixed = [len({r["reward"] for r in drawn[i:i + G]}) > 1 for i in range(0, n, G)]  # groups with a signal
    return dict(
        step=step + 1, reward_mean=sum(r["reward"] for r in drawn) / n, accuracy=sum(r["correct"] for r in drawn) / n,
        format_failure_rate=sum(not r["boxed"] for r in drawn) / n,
        direct_answer_rate=sum(is_direct_answer(r["text"]) for r in drawn) / n,
        response_tokens_mean=generated / n, response_tokens_max=max(lengths),
        truncation_rate=sum(r["finish_reason"] == "length" for r in drawn) / n,
        mixed_groups=sum(mixed) / len(mixed), draws=n // (G * cfg.problems_per_step),
        batch_groups=len(rollouts) // G, **selection_metrics(selection, replayed), **group_diversity(drawn, G),
        **({"group_dispersion": stats["group_dispersion"]} if "group_dispersion" in stats else {}), entropy=stats["entropy"], clip_fraction=stats["clip_fraction"],
        **({"kl": stats["kl"]} if cfg.kl_coef else {}), loss=stats["loss"], grad_norm=stats["grad_norm"],
        lr=lr_at(step, cfg), skipped_update=stats["nonfinite"] or not rows,
        sampling_seconds=seconds["sampling"], verifying_seconds=seconds["verifying"], training_seconds=t3 - t2,
        tokens_per_second=generated / max(seconds["sampling"], 1e-9), verifier_errors=unverified, **M.loop_metrics(policy), **totals)


def print_progress(m, cfg, elapsed, done):
    eta = elapsed / done * (cfg.steps - m["step"])
    val = f" | val {m['val_accuracy']:.3f}" if "val_accuracy" in m else ""
    if len(m.get("val_accuracy_by_group", {})) > 1:
        val += " (" + ", ".join(f"{cfg.eval_group_by} {k}: {v:.2f}" for k, v in m["val_accuracy_by_group"].items()) + ")"
    print(f"step {m['step']}/{cfg.steps} | reward {m['reward_mean']:.3f} | acc {m['accuracy']:.3f}{val} | "
          f"len {m['response_tokens_mean']:.0f} | direct {m['direct_answer_rate']:.2f} | loss {m['loss']:+.4f} | "
          f"sample {m['sampling_seconds']:.1f}s verify {m['verifying_seconds']:.1f}s train {m['training_seconds']:.1f}s"
          f" | ETA {eta / 60:.1f} min", flush=True)


# -----------------------------------------------------------------------------
# Command line: flags generated from Config (cli.py); --model tiny switches to the tiny world's defaults


def flag_defaults(first):
    """Defaults that depend on other flags: the tiny world's (--model tiny or a model trained from it); flags
    given still win. (The objective's paper defaults are Config's own, so Python gets them too.)"""
    out = dict(TINY_DEFAULTS) if M.is_tiny_world(first.model) else {}
    out.update(LADDER_DEFAULTS if Path(first.dataset).stem == "tiny_ladder_train" else {})
    return out


def parse_args(argv=None):
    return cli.parse_config(Config, argv, __doc__.split("\n\n")[0], defaults=flag_defaults)


def main(argv=None):
    try:
        return train(parse_args(argv))
    finally:
        D.shutdown()


if __name__ == "__main__":
    cli.run_main(main, "train_rl.py")
