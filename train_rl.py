"""
Reinforcement learning with verifiable rewards (RLVR) on math, in plain PyTorch: `python train_rl.py`.

The method, Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"), as a diff from GRPO (Shao et al.
2024, DeepSeekMath, eq. 3): sample a group of G answers per problem, pay each 1 if the verifier accepts its final
answer, and push up the log-probs of answers better than their group's mean. Two lines change:
  1) A_i = r_i - mean(r): no division by the group's std, which up-weights problems that are almost always
     right or almost always wrong.
  2) Each answer's token terms are summed and divided by one constant (the generation budget), not by the
     answer's own length, which favours long wrong answers.
With one update per batch the PPO ratio is 1, so there is no clipping in effect and no KL: the gradient is
REINFORCE with the group mean as baseline. --objective picks another row of objectives.py (GRPO, DAPO, GSPO,
CISPO, RLOO, ...; `python objectives.py` lists them).

One step, in the order the code below runs it:
    draw P problems -> prompt text -> token ids -> sample G completions each with their log-probs (sample.py)
    -> grade them (verify.py): rewards -> group advantages (objectives.py) -> loss over the completion tokens
    -> AdamW step -> metrics, samples and checkpoints (runs.py).

    python train_rl.py --objective drgrpo --model tiny   # the embedded tiny world, CPU, 2 minutes
    python train_rl.py --objective drgrpo                # Qwen3-0.6B-Base, the first 50 Algebra problems of MATH
MATH-500 is held out: the training pool is checked against it; --eval-every evaluates on a validation split
carved from the training pool. Options the loop imports: curriculum.py (problem selection, replay, reward
controls), looped.py (--loop), lora.py (--lora-rank), distributed.py (torchrun, --fsdp). What research/ calls:
train, rl_step, policy_update, sft_update (the distillation step), rollout_tensors, micro_batches, lr_at, set_lr,
flag_defaults, Config.
"""

import copy
import dataclasses
import functools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import checkpoint
import cli
import curriculum
import distributed as D
import evaluate
import looped
import lora
import objectives
import problems
import runs
import verify
from diversity import group_dispersion, group_diversity
from model import flops_per_token, token_logprobs
from curriculum import SelectionConfig
from objectives import OBJECTIVES, ObjectiveConfig
from sample import generate, pack_by_length

data_arg, reward_arg, sampling_arg, optim_arg, run_arg = map(cli.arg_group, (
    "model and data", "reward", "sampling", "optimization", "run"))


@dataclass
class Config(ObjectiveConfig, SelectionConfig):
    """Every setting of a run: the objective's flags are declared in objectives.py, problem selection's and replay's
    in curriculum.py, the rest here."""
    HELP_GROUPS = ("model and data", "reward", "objective", "sampling", "problem selection and replay",
                   "optimization", "run")  # the order --help shows them in
    model: str = data_arg(checkpoint.DEFAULT_MODEL, "Hugging Face repo id, local checkpoint directory, tiny or "
                                                    "tiny-ladder")
    dataset: str = data_arg("math_train", "training pool: a data set name (problems.py) or a .jsonl path")
    subject: str = data_arg("Algebra", "keep only problems of this subject ('' keeps all)")
    num_problems: int = data_arg(50, "train on the first N problems of the pool (0: all)", range="[0, inf)")
    val_dataset: str = data_arg("", "validation set for --eval-every ('': carved from the training pool)")
    val_size: int = data_arg(100, "validation problems carved from the pool when --val-dataset is not given",
                             range="[0, inf)")
    test_dataset: str = data_arg("", "evaluated before and after training, never used for a choice ('': none)")
    template: str = data_arg("base", "prompt template", choices=problems.TEMPLATES)
    grader: str = reward_arg("answer", "reward and validation rule: answer (the final answer, verify.grade) or steps "
                                       "(the tiny ladder's: the worked lines must be the problem's chain too)",
                             choices=verify.GRADERS)
    reward: str = reward_arg("verifier", "what the learner is paid for: verifier (the true reward), or the controls "
                                         "random (a seeded fair coin) and format (any final \\boxed{}); accuracy is "
                                         "always the verifier's", choices=curriculum.REWARDS)
    steps: int = sampling_arg(50, "optimizer updates (one batch of rollouts each)", range="[1, inf)")
    problems_per_step: int = sampling_arg(1, "P: problems drawn per step", range="[1, inf)")
    group_size: int = sampling_arg(8, "G: completions sampled per problem", range="[1, inf)")
    max_new_tokens: int = sampling_arg(512, "generation budget per completion (also Dr. GRPO's loss constant)",
                                       range="[1, inf)")
    temperature: float = sampling_arg(1.0, "sampling temperature for rollouts", range="(0, inf)")
    top_p: float = sampling_arg(1.0, "nucleus sampling mass for rollouts, in (0, 1]", range="(0, 1]")
    compile: bool = sampling_arg(False, "the sampler's static decode step in a CUDA graph (slower on a CPU)")
    lr: float = optim_arg(1e-5, "peak learning rate of AdamW", range="[0, inf)")
    weight_decay: float = optim_arg(0.0, "AdamW weight decay", range="[0, inf)")
    warmup_steps: int = optim_arg(0, "linear warmup steps", range="[0, inf)")
    schedule: str = optim_arg("constant", "after warmup: constant, or cosine / linear decay to 0",
                              choices=("constant", "cosine", "linear"))
    grad_clip: float = optim_arg(1.0, "max gradient norm (0: no clipping)", range="[0, inf)")
    micro_batch_tokens: int = optim_arg(4096, "padded tokens per forward/backward micro-batch (gradient accumulation)",
                                        range="[1, inf)")
    skip_zero_advantage: bool = optim_arg(True, "leave rows with zero advantage out of the backward (same gradient)")
    grad_checkpointing: bool = optim_arg(False, "recompute activations in backward to save memory")
    fsdp: bool = optim_arg(False, "under torchrun: shard parameters, gradients and optimizer state (FSDP2)")
    lora_rank: int = optim_arg(0, "LoRA rank (0: full fine-tuning)", range="[0, inf)")
    lora_alpha: float = optim_arg(16.0, "LoRA alpha (the update is scaled by alpha / rank)")
    loop: str = optim_arg("", "looped depth START:END:N: layers [START, END) run N times, weights shared, gates zero so "
                              "training starts from exactly --model (looped.py; '': plain)")
    loop_lr: float = optim_arg(0.0, "learning rate of the loop's gates and embeddings (0: --lr)", range="[0, inf)")
    loop_lora_rank: int = optim_arg(0, "--loop: a LoRA adapter per extra loop on the looped layers (0: none)",
                                    range="[0, inf)")
    seed: int = run_arg(0, "seed for data order, sampling and initialization", range="[0, 4294967295]")
    device: str = run_arg("", "cuda, cuda:N or cpu ('': cuda when available)")
    threads: int = run_arg(0, "torch CPU threads (0: one per core); on a machine another job keeps busy, 1 is faster "
                              "(benchmarks/bench_threads.py); the count moves float rounding, so a resume keeps it",
                           range="[0, inf)")
    out: str = run_arg("", "run directory ('': runs/<objective>-<model>)")
    resume: bool = run_arg(False, "continue the run in --out from its last checkpoint")
    save_every: int = run_arg(25, "checkpoint every N steps (0: only at the end)", range="[0, inf)")
    keep_checkpoints: int = run_arg(0, "keep only the newest N periodic checkpoints (0: keep all)", range="[0, inf)")
    eval_every: int = run_arg(0, "evaluate on the validation split every N steps (0: never)", range="[0, inf)")
    eval_max_new_tokens: int = run_arg(0, "generation budget for evaluation (0: --max-new-tokens)", range="[0, inf)")
    eval_group_by: str = run_arg("source", "also log validation accuracy per value of this problem field ('': no)")
    samples_per_step: int = run_arg(2, "completions per step written to samples.jsonl", range="[0, inf)")
    dispersion_every: int = run_arg(10, "every N steps log the groups' embedding dispersion (diversity.py; about 0.7x "
                                        "the step's sampling on the tiny world; 0: never)", range="[0, inf)")


# The embedded tiny world (--model tiny, tiny-ladder, or a model trained from them) brings its own defaults, and
# its ladder (--dataset tiny_ladder_train) its rungs, a budget that fits the top rung and the step-checking
# grader; flags given still win (`--model tiny --help` shows them).
TINY_DEFAULTS = dict(dataset="tiny_train", subject="", num_problems=0, val_dataset="tiny_val", test_dataset="tiny_test",
                     steps=60, problems_per_step=16, group_size=8, max_new_tokens=64, lr=1e-4, eval_every=20,
                     save_every=20, eval_group_by="level")
LADDER_DEFAULTS = dict(val_dataset="tiny_ladder_val", test_dataset="tiny_ladder_test", eval_group_by="level",
                       max_new_tokens=128, grader="steps")
# Settings that may change when a run is resumed; everything else must match the saved config.
RESUMABLE = {"steps", "resume", "save_every", "keep_checkpoints", "eval_every", "samples_per_step", "device", "out",
             "fsdp", "compile", "dispersion_every"}


# -----------------------------------------------------------------------------
# 1. Problems: the order a step draws them in (the pools and the validation split: problems.load_pools)


def problems_for_step(n_train, step, per_step, seed):
    """Indices drawn at `step`: a fresh seeded permutation each epoch, so the order is a function of step."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(k, n_train)
        perm = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.append(int(perm[i]))
    return out


# -----------------------------------------------------------------------------
# 2-3. Prompts -> token ids -> G sampled completions per problem


def sampling_seeds(cfg, step, draw, n):
    """One seed per problem of a draw, from (seed, step, draw, position): a group's samples do not depend on
    which other problems share its batch or on which process draws it."""
    return [(((cfg.seed * 1_000_003 + step) * 1_009 + draw) * 100_003 + k) % 2**32 for k in range(n)]


def collect_rollouts(sampler, tokenizer, batch, cfg, seeds):
    """Sample G completions per problem (problem k with seeds[k]): a list of dicts, problem-major."""
    prompts = [tokenizer.encode(problems.format_prompt(p["problem"], cfg.template)) for p in batch]
    completions = generate(sampler, prompts, cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                           n=cfg.group_size, stop_token_ids=tokenizer.stop_token_ids(chat=cfg.template != "base"),
                           seed=seeds, pad_id=tokenizer.pad_id, compile=cfg.compile)
    return [dict(problem=batch[c.prompt_index], prompt=prompts[c.prompt_index], tokens=c.tokens,
                 sampler_logprobs=c.logprobs, finish_reason=c.finish_reason, text=tokenizer.decode(c.tokens),
                 seed=seeds[c.prompt_index], sample=j % cfg.group_size)
            for j, c in enumerate(completions)]


# -----------------------------------------------------------------------------
# 4. Completions -> rewards


def score_rollouts(rollouts, cfg):
    """Grade each rollout and set its reward: correctness, minus the format and overlong penalties. 'pass' is
    what the learner counts as a success: the verifier's verdict, or under --reward random / format the
    control's (whose reward is then 1 or 0); 'correct' stays the verifier's, for the logged accuracy."""
    correct, rewards = verify.grade_with(cfg.grader, [r["text"] for r in rollouts], [r["problem"] for r in rollouts],
                                         cfg.format_penalty)
    for r, ok, paid in zip(rollouts, correct, rewards):
        r.update(correct=bool(ok), boxed=verify.extract_answer(r["text"]) is not None)
        r["pass"] = curriculum.control_pass(cfg.reward, r)
        paid = paid if cfg.reward == "verifier" else float(r["pass"])
        r["reward"] = float(paid + objectives.overlong_penalty(len(r["tokens"]), cfg.max_new_tokens, cfg.overlong_buffer))


def draw_rollouts(sampler, tokenizer, train_set, cfg, step, selection):
    """Steps 1-4 for one step: (every rollout drawn, the batch to learn from, groups given a replayed success,
    seconds spent sampling and verifying). Without dynamic sampling both lists are the G samples of the step's
    P problems, drawn uniformly or by the pass-rate table. With --replay-fraction some groups get a past success in
    place of a fresh wrong sample (curriculum.ReplayBuffer). With dynamic sampling (DAPO sec. 3.2) groups that are
    all right or all wrong are then dropped and more problems drawn, at most --max-draws times, until P groups are
    mixed. Every fresh group updates the pass-rate table and the replay buffer, after the step's choices."""
    pass_rates, replay = selection.get("pass_rates"), selection.get("replay")
    G, drawn, batch_groups, fresh, replayed = cfg.group_size, [], [], [], 0
    seconds = dict(sampling=0.0, verifying=0.0)
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
        rollouts = collect_rollouts(sampler, tokenizer, D.rank_share([train_set[i] for i in idx]), cfg,
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
    return drawn, [r for g in batch_groups for r in g], replayed, seconds


# -----------------------------------------------------------------------------
# 5-6. Advantages -> the objective's loss over the completion tokens -> an AdamW step


def micro_batches(rows, budget):
    """Pack rollouts (longest first) into micro-batches of at most `budget` padded tokens."""
    groups = pack_by_length([len(r["prompt"]) + len(r["tokens"]) for r in rows], budget)
    return [[rows[i] for i in g] for g in groups]


def rollout_tensors(rows, pad_id, device):
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


def autocast(device):
    """bf16 autocast on CUDA (fp32 master weights), plain fp32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast("cpu", enabled=False)


@torch.no_grad()
def add_reference_kl(reference, rows, cfg, device, pad_id):
    """--kl-in reward: r["kl"] = the KL estimate of each rollout summed over its tokens, and the reward pays
    beta times it (the per-sequence form of the KL-in-reward of REINFORCE++ and InstructGPT)."""
    for rb in micro_batches(rows, cfg.micro_batch_tokens):
        ids, mask, sampler_logp = rollout_tensors(rb, pad_id, device)
        with autocast(device):
            ref_logp, _ = token_logprobs(reference, ids)
        kl = (objectives.kl_estimate(sampler_logp, ref_logp.float(), cfg.kl_estimator) * mask).sum(-1)
        for r, k in zip(rb, kl.tolist()):
            r.update(kl=k, reward=r["reward"] - cfg.kl_coef * k)


def policy_update(policy, reference, optimizer, rows, n_sequences, n_tokens, cfg, device, pad_id):
    """mu = --epochs-per-batch epochs over the batch, each one optimizer step with gradients accumulated over
    micro-batches; returns the step's loss, entropy, clip fraction, KL, gradient norm and tokens trained on.
    rows carry 'advantage'; n_sequences and n_tokens count the whole batch (rows may leave out zero-advantage
    ones, and with several ranks hold this rank's share of it), so every micro-batch's loss is its share."""
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
                token_logprobs(policy, torch.full((1, 2), pad_id, device=device))[0].sum().mul(0).backward()
                continue
            ids, mask, sampler_logp = rollout_tensors(rb, pad_id, device)
            with autocast(device):
                logp, entropy = token_logprobs(policy, ids)  # (B, T-1) each
                ref_logp = None
                if reference is not None and cfg.kl_in == "loss":
                    with torch.no_grad():
                        ref_logp = token_logprobs(reference, ids)[0].float()
            logp = logp.float()
            replayed = torch.tensor([r.get("replayed", False) for r in rb], device=device)[:, None]
            # epoch 0: the current policy, so rho = 1; a replayed rollout's ratio is to the policy that sampled it
            old_logp = old.setdefault(j, torch.where(replayed, sampler_logp, logp.detach()))
            tis = objectives.truncated_is_weights(old_logp, sampler_logp, mask, cfg.tis_cap)
            b = dict(logp=logp, old_logp=old_logp, ref_logp=ref_logp, mask=mask, n_sequences=n_sequences,
                     n_tokens=n_tokens, tis=tis, adv=torch.tensor([r["advantage"] for r in rb], device=device))
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
                kl += float(objectives.kl_estimate(logp.detach(), ref_logp, cfg.kl_estimator)[m].sum())
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


def sft_update(policy, optimizer, traces, cfg, device, pad_id):
    """One optimizer step of next-token loss on traces (dicts with prompt, tokens and sampler_logprobs ids), the
    prompt masked: the distillation step of research/rounds. It is policy_update with advantage 1 on every trace
    under the CISPO loss: at ratio 1 its weight is 1, so the loss is the token-mean negative log-likelihood
    -sum(log p) / tokens. cfg: a Config with objective "cispo" and the optimization settings."""
    rows = [dict(t, advantage=1.0) for t in traces]
    return policy_update(policy, None, optimizer, rows, len(rows), sum(len(t["tokens"]) for t in rows), cfg, device,
                         pad_id)


def lr_at(step, cfg):
    """Linear warmup, then constant / cosine / linear decay to zero; a function of the step alone (cfg: anything
    with lr, warmup_steps, steps and schedule)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    if cfg.schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))
    if cfg.schedule == "linear":
        return cfg.lr * (1 - progress)
    return cfg.lr


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # --loop-lr: the loop's group is scaled


# -----------------------------------------------------------------------------
# 7. Metrics and compute


def is_direct_answer(text):
    """The response opens with its boxed answer: no reasoning before it."""
    return text.lstrip().startswith("\\boxed")


def step_metrics(drawn, batch, stats, seconds, replayed, unverified, selection, cfg, step, policy, totals):
    """One line of metrics.jsonl (README, "What a run writes")."""
    G, n = cfg.group_size, len(drawn)
    lengths = [len(r["tokens"]) for r in drawn]
    mixed = [len({r["reward"] for r in drawn[i:i + G]}) > 1 for i in range(0, n, G)]  # groups with a signal
    return dict(
        step=step + 1, reward_mean=sum(r["reward"] for r in drawn) / n, accuracy=sum(r["correct"] for r in drawn) / n,
        format_failure_rate=sum(not r["boxed"] for r in drawn) / n,
        direct_answer_rate=sum(is_direct_answer(r["text"]) for r in drawn) / n,
        response_tokens_mean=sum(lengths) / n, response_tokens_max=max(lengths),
        truncation_rate=sum(r["finish_reason"] == "length" for r in drawn) / n,
        mixed_groups=sum(mixed) / len(mixed), draws=n // (G * cfg.problems_per_step), batch_groups=len(batch) // G,
        **curriculum.selection_metrics(selection, replayed), **group_diversity(drawn, G),
        **({"group_dispersion": stats["group_dispersion"]} if "group_dispersion" in stats else {}),
        entropy=stats["entropy"], clip_fraction=stats["clip_fraction"], **({"kl": stats["kl"]} if cfg.kl_coef else {}),
        loss=stats["loss"], grad_norm=stats["grad_norm"], lr=lr_at(step, cfg),
        skipped_update=stats["skipped"],
        sampling_seconds=seconds["sampling"], verifying_seconds=seconds["verifying"],
        training_seconds=seconds["training"], tokens_per_second=sum(lengths) / max(seconds["sampling"], 1e-9),
        verifier_errors=unverified, **looped.loop_metrics(policy), **totals,
        **({"peak_gpu_memory_gb": torch.cuda.max_memory_allocated() / 2**30} if torch.cuda.is_available() else {}))


def add_compute(totals, drawn, trained_tokens, cfg, config):
    """The running totals after a step: generated tokens, training tokens and FLOPs (model.flops_per_token at the
    step's mean context, each training token counted once per epoch)."""
    lengths = [len(r["tokens"]) for r in drawn]
    context = sum(len(r["prompt"]) for r in drawn) / len(drawn) + sum(lengths) / len(lengths) / 2
    return dict(generated_tokens=totals["generated_tokens"] + sum(lengths),
                training_tokens=totals["training_tokens"] + trained_tokens * cfg.epochs_per_batch,
                flops=totals["flops"] + (sum(lengths) * flops_per_token(config, context) + trained_tokens
                                         * cfg.epochs_per_batch * flops_per_token(config, context, training=True)))


# -----------------------------------------------------------------------------
# One RL step, steps 1-7 in order


def rl_step(policy, sampler, reference, optimizer, tokenizer, train_set, cfg, step, device, selection, totals):
    """Problems -> rollouts -> rewards -> advantages -> loss -> AdamW step; returns (the rollouts drawn, the step's
    metrics with the compute totals so far). selection holds the data state (curriculum.py): 'pass_rates' and
    'replay' when they are on; totals the compute before this step (add_compute)."""
    set_lr(optimizer, lr_at(step, cfg))
    # 1-4. P problems -> prompts -> G samples each -> graded, rewarded (dynamic sampling and replay inside)
    unverified = sum(verify.ERRORS.values())
    drawn, batch, replayed, seconds = draw_rollouts(sampler, tokenizer, train_set, cfg, step, selection)
    unverified = sum(D.gather_lists([sum(verify.ERRORS.values()) - unverified]))  # checks with no verdict, all ranks
    t0 = time.time()
    if reference is not None and cfg.kl_in == "reward":  # each rank scores its share; all get every result
        share = D.rank_share(batch)
        add_reference_kl(reference, share, cfg, device, tokenizer.pad_id)
        for r, (kl, reward) in zip(batch, D.gather_lists([(s["kl"], s["reward"]) for s in share])):
            r.update(kl=kl, reward=reward)
    # 5. advantages, per group of G
    rewards = torch.tensor([r["reward"] for r in batch], dtype=torch.float32).view(-1, cfg.group_size)  # (P, G)
    correct = torch.tensor([r["pass"] for r in batch], dtype=torch.bool).view(-1, cfg.group_size)  # (P, G)
    advantages = OBJECTIVES[cfg.objective].advantages(rewards, correct, cfg) if batch else rewards  # (P, G)
    for r, a in zip(batch, advantages.flatten().tolist()):
        r["advantage"] = a
    # 6. loss and AdamW step; a zero-advantage row adds nothing to the gradient unless a KL loss term needs it
    kl_in_loss = reference is not None and cfg.kl_in == "loss"
    trained = [r for r in batch if r["advantage"] != 0 or kl_in_loss or not cfg.skip_zero_advantage]
    batch_tokens = sum(len(r["tokens"]) for r in batch)  # the token-level losses' denominator
    stats = dict(loss=0.0, entropy=float("nan"), clip_fraction=0.0, kl=0.0, grad_norm=0.0, tokens=0, nonfinite=False)
    if trained:
        stats = policy_update(policy, reference, optimizer, D.rank_share(trained), len(batch), batch_tokens, cfg,
                              device, tokenizer.pad_id)
    if reference is not None and cfg.kl_in == "reward":
        stats["kl"] = sum(r["kl"] for r in batch) / max(1, batch_tokens)
    seconds["training"] = time.time() - t0
    if cfg.dispersion_every and (step + 1) % cfg.dispersion_every == 0:
        stats["group_dispersion"] = group_dispersion(sampler, drawn, cfg.group_size)
    stats["skipped"] = stats["nonfinite"] or not trained
    # 7. metrics
    totals = add_compute(totals, drawn, stats["tokens"], cfg, policy.config)
    return drawn, step_metrics(drawn, batch, stats, seconds, replayed, unverified, selection, cfg, step, policy, totals)


# -----------------------------------------------------------------------------
# The run: check everything, claim --out, load the model, then step, evaluate and checkpoint


def evaluate_accuracy(sampler, tokenizer, problem_set, cfg, label):
    """Greedy accuracy by the one evaluation protocol, and per --eval-group-by value (evaluate.accuracy)."""
    return evaluate.accuracy(sampler, tokenizer, problem_set, cfg.eval_max_new_tokens or cfg.max_new_tokens,
                             cfg.template, cfg.eval_group_by or None, cfg.grader, cfg.compile, label)


def check_config(cfg):
    """Refuse settings that cannot run, naming the flag; nothing has been written yet. Each flag's own range and
    choices are declared on its field (cli.check_fields); here, the checks across flags."""
    cli.check_fields(cfg)
    objectives.check(cfg, cfg.group_size)
    if cfg.overlong_buffer >= cfg.max_new_tokens:
        raise ValueError(f"--overlong-buffer {cfg.overlong_buffer} must be below --max-new-tokens {cfg.max_new_tokens}")
    if cfg.fsdp and "WORLD_SIZE" not in os.environ:
        raise ValueError("--fsdp shards the model over torchrun's processes: start it with torchrun, e.g. "
                         "torchrun --nproc_per_node 8 train_rl.py --fsdp ...")
    if cfg.fsdp and cfg.lora_rank:
        raise ValueError("--fsdp with --lora-rank is not supported: the frozen base is replicated anyway; "
                         "run LoRA without --fsdp")
    if cfg.loop and (cfg.lora_rank or cfg.fsdp):
        raise ValueError("--loop with --lora-rank or --fsdp is not supported (--loop-lora-rank gives per-loop adapters)")
    if cfg.loop_lora_rank and not cfg.loop:
        raise ValueError(f"--loop-lora-rank {cfg.loop_lora_rank} needs --loop")
    looped.parse_loop(cfg.loop, None)  # the syntax now; the layer range once the model's config.json is read
    cli.check_device(cfg.device)


def train(cfg):
    """Run (or, with --resume, continue) the training described by cfg; returns the run directory."""
    check_config(cfg)
    device = D.setup_distributed(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    runs.set_threads(cfg.threads, device)
    run_dir = Path(cfg.out or f"runs/{cfg.objective}-{Path(cfg.model).name}")
    runs.check_out(run_dir, "train", cfg.resume)
    if cfg.resume:
        runs.check_resume(run_dir / "config.json", dataclasses.asdict(cfg), RESUMABLE, Config)
        runs.check_steps_left(run_dir, cfg.steps)
    train_set, val_set, test_set = problems.load_pools(cfg)  # bad data or a missing model fail before anything is written
    model_dir = checkpoint.resolve_model_dir(cfg.model)
    model_config = checkpoint.read_config(model_dir)
    looped.parse_loop(cfg.loop, model_config.num_hidden_layers)
    tokenizer = checkpoint.load_tokenizer(cfg.model)
    problems.check_prompts_fit([(cfg.dataset, train_set), (cfg.val_dataset or "validation", val_set),
                                (cfg.test_dataset, test_set)], tokenizer, cfg.template,
                               max(cfg.max_new_tokens, cfg.eval_max_new_tokens), model_config.max_position_embeddings)
    torch.manual_seed(cfg.seed)
    policy = checkpoint.load_model(cfg.model, dtype=torch.float32, device=device)  # fp32 master weights; bad weights
    policy = looped.add_loop(policy, cfg.loop, cfg.loop_lora_rank)  # fail here, still before anything is written
    D.barrier()  # every rank has read the run directory before rank 0 writes to it
    runs.claim(run_dir, "train", cfg.resume)  # held until this process ends
    if D.this_rank() == 0 and not cfg.resume:
        runs.write_json(run_dir / "config.json", dict(dataclasses.asdict(cfg), code_version=runs.code_version()))

    policy.gradient_checkpointing = cfg.grad_checkpointing
    reference = copy.deepcopy(policy).requires_grad_(False) if cfg.kl_coef else None
    ckpt = runs.readable_checkpoint(run_dir) if cfg.resume else None  # a damaged newest one: the one before it
    if ckpt is not None and not cfg.lora_rank:  # with LoRA the base stays frozen; adapters come from the trainer state
        policy.load_state_dict(checkpoint.load_model(ckpt, torch.float32, device).state_dict())
    if cfg.lora_rank:
        lora.add_lora(policy, cfg.lora_rank, cfg.lora_alpha)
    if cfg.fsdp:  # whole weights are loaded first; the optimizer then holds the shards
        D.shard_model(policy)
    optimizer = torch.optim.AdamW(looped.param_groups(policy, cfg.lr, cfg.loop_lr), lr=cfg.lr,
                                  weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    # from a step's first update until the loop counts it done, Ctrl-C and SIGTERM wait (so done names the weights)
    optimizer.register_step_pre_hook(lambda *_: runs.hold_interrupts())
    selection = curriculum.new_selection(cfg, train_set)
    start_step, pending = 0, None
    if ckpt is not None:
        start_step = runs.load_trainer_state(ckpt, policy, optimizer)
        runs.load_selection(ckpt, selection)
        pending = runs.unlogged(ckpt)  # interrupted after the update, before its step was logged: logged below
        print(f"resumed from {ckpt} after step {start_step}")
    sampler = D.sampling_copy(policy, device)
    logged, totals = runs.resume_logs(run_dir, start_step, pending)  # the last step in the logs; compute so far
    runs.print_config(cfg, run_dir, device, len(train_set), len(val_set),
                 sum(p.numel() for p in policy.parameters() if p.requires_grad))

    eval_seconds = 0.0
    if test_set and start_step == 0:  # the held-out test split, before and after training: never used for a choice
        t0 = time.time()
        acc, _ = evaluate_accuracy(sampler, tokenizer, test_set, cfg, f"test ({cfg.test_dataset}) before training")
        eval_seconds = (time.time() - t0) * len(val_set) / len(test_set)  # a validation pass, estimated
        runs.append_jsonl(run_dir / "metrics.jsonl", dict(step=0, test_accuracy=acc))
        print(f"test accuracy before training ({cfg.test_dataset}): {acc:.3f}")
    validate = functools.partial(evaluate_accuracy, sampler, tokenizer, val_set, cfg) if val_set else None
    # done: updates in the weights (logged: in the logs; saved: in checkpoints/); before: the data state before a step
    t_start, step, done, saved, before = time.time(), start_step, start_step, start_step, None
    try:
        if pending:  # the step the checkpoint holds, logged as the straight run logs it
            eval_seconds = runs.log_step(run_dir, pending, validate, cfg.eval_every) or eval_seconds
        for step in range(start_step, cfg.steps):
            before = runs.selection_state(selection) if selection else None  # put back if this step is cut short
            drawn, metrics = rl_step(policy, sampler, reference, optimizer, tokenizer, train_set, cfg, step, device,
                                     selection, totals)
            pending = dict(metrics=metrics, samples=runs.sample_rows(drawn[:cfg.samples_per_step], step + 1))
            totals = {k: metrics[k] for k in totals}
            done = step + 1  # the step is in the weights and the data state; its lines are pending
            runs.release_interrupts()  # a Ctrl-C held since the update is raised here, with done counting it
            runs.check_finite_weights(policy, done)
            D.refresh_sampling_copy(sampler, policy)
            eval_seconds = runs.log_step(run_dir, pending, validate, cfg.eval_every) or eval_seconds
            logged = done
            runs.print_progress(metrics, cfg, time.time() - t_start, done - start_step, eval_seconds)
            if cfg.save_every and done % cfg.save_every == 0 and done < cfg.steps:
                runs.save_checkpoint(run_dir / "checkpoints" / f"step_{done}", policy, optimizer, tokenizer, done, cfg,
                                     selection)
                saved = done
                runs.keep_last_checkpoints(run_dir, cfg.keep_checkpoints)
        if saved < cfg.steps:  # (a resumed finished run has it already)
            runs.save_checkpoint(run_dir / "checkpoints" / f"step_{cfg.steps}", policy, optimizer, tokenizer, cfg.steps,
                                 cfg, selection)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: save what is done; exit status 130 or 143 (cli.run_main)
        runs.hold_interrupts()  # a second Ctrl-C must not cut the save in two; the exit status stays the first's
        if done == step and before is not None:
            runs.load_selection_state(selection, before)  # the step in progress is redone from its start
        if done > saved and not cfg.fsdp:  # FSDP: gathering shards needs every rank, which an interrupt does not give
            runs.save_checkpoint(run_dir / "checkpoints" / f"step_{done}", policy, optimizer, tokenizer, done, cfg,
                                 selection, unlogged=pending if logged < done else None)
        print(f"\ninterrupted: --resume continues from the last periodic checkpoint in {run_dir}" if cfg.fsdp else
              f"\ninterrupted: checkpoint after step {done} in {run_dir}; rerun with --resume to continue")
        runs.release(run_dir)
        raise
    finally:
        runs.release_interrupts(raise_held=False)
    runs.write_final(run_dir, cfg.steps)
    runs.keep_last_checkpoints(run_dir, cfg.keep_checkpoints)
    if test_set:
        acc, _ = evaluate_accuracy(sampler, tokenizer, test_set, cfg, f"test ({cfg.test_dataset}) after training")
        runs.append_jsonl(run_dir / "metrics.jsonl", dict(step=cfg.steps, test_accuracy=acc))
        print(f"test accuracy after training ({cfg.test_dataset}): {acc:.3f}")
    print(f"done: {run_dir}")
    runs.release(run_dir)
    return run_dir


# -----------------------------------------------------------------------------
# Command line: flags generated from Config (cli.py); --model tiny and the ladder bring their defaults


def flag_defaults(first):
    """Defaults that depend on other flags: the tiny world's (--model tiny or a model trained from it) and its
    ladder's (--dataset tiny_ladder_train, or any tiny_ladder pool); flags given still win. (An objective's paper defaults are
    ObjectiveConfig's own, so Python gets them too.)"""
    out = dict(TINY_DEFAULTS) if checkpoint.is_tiny_world(first.model) else {}
    out.update(LADDER_DEFAULTS if Path(first.dataset).stem.startswith("tiny_ladder") else {})
    return out


EPILOG = cli.world_epilog(TINY_DEFAULTS, LADDER_DEFAULTS, "The objectives: python objectives.py.")


def parse_args(argv=None):
    return cli.parse_config(Config, argv, __doc__.strip().split("\n\n")[0], defaults=flag_defaults, epilog=EPILOG,
                            prog="train_rl.py")


def main(argv=None):
    try:
        return train(parse_args(argv))
    finally:
        D.shutdown()


if __name__ == "__main__":
    cli.run_main(main, "train_rl.py")
