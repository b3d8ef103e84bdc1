"""
Reinforcement learning with verifiable rewards (RLVR) on math, in plain PyTorch.

One step of the loop:
    draw P problems -> prompt text -> token ids -> sample G completions each (sample.generate, with the
    sampler's log-probs) -> rewards (verify.reward_batch) -> group advantages -> policy loss of the chosen
    objective over the completion tokens -> optimizer step -> metrics, samples and checkpoints.
With --epochs-per-batch mu > 1 the same rollouts are reused for mu updates with PPO-style ratio clipping
against the log-probs the policy had when the batch was drawn.

Objectives (one small entry each in OBJECTIVES):
- grpo   (Shao et al. 2024, DeepSeekMath, eq. 3): A_i = (r_i - mean r) / (std r + eps) within a group;
         loss = -(1/G) sum_i (1/|o_i|) sum_t min(rho A, clip(rho, 1-e, 1+e) A) [+ beta * KL_k3 to a frozen
         reference with --kl-coef]. Departure: the KL term is off by default, as in most recent RLVR work.
- drgrpo (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.2): A_i = r_i - mean r (no std
         division); token terms are summed and divided by one constant, the generation budget
         (--max-new-tokens), instead of each sequence's own length; no KL.
With one epoch per batch rho = 1, clipping changes nothing, and the gradient is REINFORCE with the group
mean as baseline.

Run: `python train_rl.py --objective drgrpo` (Qwen3-0.6B-Base on the first 50 Algebra problems of the MATH
training pool), or `python train_rl.py --objective drgrpo --model tiny` (the embedded tiny world, CPU).
MATH-500 is held out: the training pool is checked against it, and --eval-every evaluates on a validation
split carved from the training pool.
"""

import argparse
import copy
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import lora
import model as M
import problems as P
import verify
from sample import generate, pack_by_length


def opt(default, help):
    return field(default=default, metadata={"help": help})


@dataclass
class Config:
    # model and data
    model: str = opt(M.DEFAULT_MODEL, "Hugging Face repo id, local checkpoint directory, or 'tiny'")
    dataset: str = opt("math_train", "training pool: a dataset name from problems.py or a .jsonl path")
    subject: str = opt("Algebra", "keep only problems of this subject ('' keeps all)")
    num_problems: int = opt(50, "train on the first N problems of the pool (0: all)")
    val_dataset: str = opt("", "validation set for --eval-every (default: carved from the training pool)")
    val_size: int = opt(100, "validation problems carved from the pool when --val-dataset is not given")
    test_dataset: str = opt("", "evaluated before and after training (never used for choices; '' skips)")
    template: str = opt("base", "prompt template: base, chat, chat_think")
    # the RL objective
    objective: str = opt("drgrpo", "one of OBJECTIVES: grpo, drgrpo")
    steps: int = opt(50, "optimizer updates (one batch of rollouts each)")
    problems_per_step: int = opt(1, "P: problems drawn per step")
    group_size: int = opt(8, "G: completions sampled per problem")
    max_new_tokens: int = opt(512, "generation budget per completion (also Dr. GRPO's loss constant)")
    temperature: float = opt(1.0, "sampling temperature for rollouts")
    top_p: float = opt(1.0, "nucleus sampling for rollouts")
    epochs_per_batch: int = opt(1, "mu: updates per batch of rollouts (> 1 uses the clipped ratio)")
    clip_eps: float = opt(0.2, "PPO clip range e of the ratio")
    kl_coef: float = opt(0.0, "beta of the k3 KL penalty to the frozen initial policy (0: no reference)")
    format_penalty: float = opt(0.0, "reward subtracted when a response has no final \\boxed{} answer")
    skip_uniform_groups: bool = opt(True, "drop groups whose rewards are all equal (zero advantage) from the update")
    # optimization
    lr: float = opt(1e-5, "peak learning rate of AdamW")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    warmup_steps: int = opt(0, "linear warmup steps")
    schedule: str = opt("constant", "after warmup: constant, cosine or linear decay to 0")
    grad_clip: float = opt(1.0, "max gradient norm (0: no clipping)")
    micro_batch_tokens: int = opt(4096, "padded tokens per forward/backward micro-batch (gradient accumulation)")
    grad_checkpointing: bool = opt(False, "recompute activations in backward to save memory")
    lora_rank: int = opt(0, "LoRA rank (0: full fine-tuning)")
    lora_alpha: float = opt(16.0, "LoRA alpha (the update is scaled by alpha / rank)")
    # run
    seed: int = opt(0, "seed for data order, sampling and initialization")
    device: str = opt("", "cuda or cpu (default: cuda when available)")
    out: str = opt("", "run directory (default: runs/<objective>-<model>)")
    resume: bool = opt(False, "continue the run in --out from its last checkpoint")
    save_every: int = opt(25, "checkpoint every N steps (0: only at the end)")
    eval_every: int = opt(0, "evaluate on the validation split every N steps (0: never)")
    eval_max_new_tokens: int = opt(0, "generation budget for evaluation (0: --max-new-tokens)")
    samples_per_step: int = opt(2, "completions per step written to samples.jsonl")


# The embedded tiny world has its own settings (tiny.py): used with --model tiny unless a flag overrides.
TINY_DEFAULTS = dict(dataset="tiny_train", subject="", num_problems=0, val_dataset="tiny_val",
                     test_dataset="tiny_test", steps=60, problems_per_step=16, group_size=8, max_new_tokens=64,
                     lr=1e-4, eval_every=20, save_every=20)
# Settings that may change when a run is resumed; everything else must match the saved config.
RESUMABLE = {"steps", "resume", "save_every", "eval_every", "samples_per_step", "device", "out"}


# -----------------------------------------------------------------------------
# Advantages and losses: pure tensor functions (shapes in comments)


def group_advantages(rewards, scale_by_std, eps=1e-6):
    """rewards (P, G) -> advantages (P, G) relative to the group mean; GRPO also divides by the std."""
    adv = rewards - rewards.mean(dim=1, keepdim=True)
    if scale_by_std:
        adv = adv / (rewards.std(dim=1, keepdim=True) + eps)  # unbiased std, as DeepSeekMath's code
    return adv


def clipped_surrogate(logp, old_logp, adv, clip_eps):
    """PPO (Schulman et al. 2017, eq. 7) per token: min(rho A, clip(rho, 1-e, 1+e) A); all (B, T)."""
    ratio = torch.exp(logp - old_logp)
    return torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)


def kl_k3(logp, ref_logp):
    """Schulman's k3 estimator of KL(pi || pi_ref) per token (DeepSeekMath eq. 4): always >= 0."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def grpo_loss(b, cfg):
    """Per-sequence mean of the token terms, then the mean over the batch's sequences (DeepSeekMath eq. 3)."""
    term = clipped_surrogate(b["logp"], b["old_logp"], b["adv"][:, None], cfg.clip_eps)  # (B, T)
    if cfg.kl_coef:
        term = term - cfg.kl_coef * kl_k3(b["logp"], b["ref_logp"])
    per_sequence = (term * b["mask"]).sum(-1) / b["mask"].sum(-1).clamp(min=1)  # (B,)
    return -per_sequence.sum() / b["n_sequences"]


def drgrpo_loss(b, cfg):
    """Token terms summed and divided by the generation budget, not by |o_i| (Dr. GRPO, sec. 3.2)."""
    term = clipped_surrogate(b["logp"], b["old_logp"], b["adv"][:, None], cfg.clip_eps)  # (B, T)
    if cfg.kl_coef:
        term = term - cfg.kl_coef * kl_k3(b["logp"], b["ref_logp"])
    return -(term * b["mask"]).sum() / (cfg.max_new_tokens * b["n_sequences"])


@dataclass
class Objective:
    advantages: callable  # rewards (P, G) -> advantages (P, G)
    loss: callable  # (micro-batch dict, cfg) -> this micro-batch's share of the batch loss


OBJECTIVES = {
    "grpo": Objective(lambda r: group_advantages(r, scale_by_std=True), grpo_loss),
    "drgrpo": Objective(lambda r: group_advantages(r, scale_by_std=False), drgrpo_loss),
}


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


def collect_rollouts(policy, tokenizer, batch, cfg, step):
    """Sample G completions per problem and grade them: a list of dicts, problem-major."""
    prompts = [tokenizer.encode(P.format_prompt(p["problem"], cfg.template)) for p in batch]
    completions = generate(policy, prompts, cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                           n=cfg.group_size, stop_token_ids=tokenizer.stop_token_ids(chat=cfg.template != "base"),
                           seed=cfg.seed * 1_000_003 + step, pad_id=tokenizer.pad_id)
    return [dict(problem=batch[c.prompt_index], prompt=prompts[c.prompt_index], tokens=c.tokens,
                 sampler_logprobs=c.logprobs, finish_reason=c.finish_reason, text=tokenizer.decode(c.tokens))
            for c in completions]


def score_rollouts(rollouts, cfg):
    texts, refs = [r["text"] for r in rollouts], [r["problem"]["answer"] for r in rollouts]
    correct = verify.grade_batch(texts, refs)
    rewards = verify.reward_batch(texts, refs, format_penalty=cfg.format_penalty)
    for r, c, w in zip(rollouts, correct, rewards):
        r.update(correct=bool(c), reward=float(w), boxed=verify.extract_answer(r["text"]) is not None)
    return torch.tensor(rewards, dtype=torch.float32).view(-1, cfg.group_size)  # (P, G)


# -----------------------------------------------------------------------------
# The policy update


def micro_batches(rows, budget):
    """Pack rollouts (longest first) into micro-batches of at most `budget` padded tokens."""
    groups = pack_by_length([len(r["prompt"]) + len(r["tokens"]) for r in rows], budget)
    return [[rows[i] for i in g] for g in groups]


def to_tensors(rows, pad_id, device):
    """Right-padded prompt+completion ids (B, T) and the completion mask over targets ids[:, 1:] (B, T-1)."""
    T = max(len(r["prompt"]) + len(r["tokens"]) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T - 1)
    for i, r in enumerate(rows):
        seq = r["prompt"] + r["tokens"]
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, len(r["prompt"]) - 1:len(seq) - 1] = 1.0  # targets that are completion tokens
    return ids.to(device), mask.to(device)


def autocast(device):
    """bf16 autocast on CUDA (fp32 master weights), plain fp32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast("cpu", enabled=False)


def policy_update(policy, reference, optimizer, rows, n_sequences, cfg, device, pad_id):
    """mu epochs over the batch, each one optimizer step with gradients accumulated over micro-batches."""
    objective = OBJECTIVES[cfg.objective]
    batches = micro_batches(rows, cfg.micro_batch_tokens)
    stats = dict(loss=0.0, entropy=0.0, clip_fraction=0.0, kl=0.0, grad_norm=0.0, tokens=0, nonfinite=False)
    old = {}  # log-probs of the policy that drew the batch, per micro-batch (for mu > 1)
    params = [p for p in policy.parameters() if p.requires_grad]
    policy.train()
    for epoch in range(cfg.epochs_per_batch):
        optimizer.zero_grad(set_to_none=True)
        epoch_loss, n_tokens, ent, clipped, kl = 0.0, 0, 0.0, 0.0, 0.0
        for j, rb in enumerate(batches):
            ids, mask = to_tensors(rb, pad_id, device)
            with autocast(device):
                logp, entropy = M.token_logprobs(policy, ids)  # (B, T-1) each
                ref_logp = None
                if reference is not None:
                    with torch.no_grad():
                        ref_logp, _ = M.token_logprobs(reference, ids)
            logp = logp.float()
            old_logp = old.setdefault(j, logp.detach())  # epoch 0: the current policy, so rho = 1
            b = dict(logp=logp, old_logp=old_logp, ref_logp=ref_logp, mask=mask, n_sequences=n_sequences,
                     adv=torch.tensor([r["advantage"] for r in rb], device=device))
            loss = objective.loss(b, cfg)
            if not torch.isfinite(loss):
                stats["nonfinite"] = True
                break
            loss.backward()
            epoch_loss += loss.item()
            m = mask.bool()
            n_tokens += int(m.sum())
            ent += float(entropy.float()[m].sum())
            ratio = torch.exp(logp.detach() - old_logp)[m]
            clipped += float(((ratio - 1).abs() > cfg.clip_eps).float().sum())
            if ref_logp is not None:
                kl += float(kl_k3(logp.detach(), ref_logp.float())[m].sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        if stats["nonfinite"] or not torch.isfinite(grad_norm):
            stats["nonfinite"] = True  # skip the update: a NaN/inf step is logged, never applied or saved
            optimizer.zero_grad(set_to_none=True)
            break
        optimizer.step()
        if epoch == 0:
            stats.update(loss=epoch_loss, entropy=ent / max(n_tokens, 1), grad_norm=float(grad_norm),
                         tokens=n_tokens, kl=kl / max(n_tokens, 1))
        stats["clip_fraction"] = clipped / max(n_tokens, 1)  # of the last epoch (0 when mu = 1)
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


def plain_model(policy):
    """The policy as an ordinary Qwen3 (LoRA adapters merged), sharing tensors where it can."""
    with torch.device("meta"):
        plain = M.Qwen3(policy.config)
    state = lora.merged_state_dict(policy) if has_lora(policy) else policy.state_dict()
    plain.load_state_dict(state, assign=True)
    if policy.config.tie_word_embeddings:
        plain.lm_head.weight = plain.model.embed_tokens.weight
    return plain


def make_rollout_model(policy, device):
    """CPU: sample from the fp32 policy itself. GPU: from a bf16 copy, refreshed after every update."""
    return policy if not device.startswith("cuda") else plain_model(policy).to(torch.bfloat16).eval()


def refresh_rollout_model(rollout_model, policy):
    if rollout_model is not policy:
        rollout_model.load_state_dict(plain_model(policy).state_dict())


def save_checkpoint(path, policy, optimizer, tokenizer, step, cfg):
    """HF-layout weights (adapters merged) + optimizer state (safetensors) + trainer state (JSON), atomically."""
    from safetensors.torch import save_file
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    M.save_model(plain_model(policy), tmp, tokenizer)
    opt_state = optimizer.state_dict()
    tensors = {f"state.{i}.{k}": v.contiguous().cpu() for i, s in opt_state["state"].items() for k, v in s.items()}
    if has_lora(policy):
        tensors.update({f"adapter.{k}": v.contiguous().cpu() for k, v in lora.adapter_state_dict(policy).items()})
    save_file(tensors, str(tmp / "trainer_state.safetensors"))
    meta = dict(step=step, param_groups=opt_state["param_groups"], config=dataclasses.asdict(cfg))
    (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=2))
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
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta["step"]


def latest_checkpoint(run_dir):
    steps = [int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*") if p.name[5:].isdigit()]
    return run_dir / "checkpoints" / f"step_{max(steps)}" if steps else None


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
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


def evaluate_accuracy(policy, tokenizer, problems, cfg):
    from evaluate import evaluate
    _, summary = evaluate(policy, tokenizer, problems, cfg.eval_max_new_tokens or cfg.max_new_tokens,
                          batch_size=64, template=cfg.template)
    return summary["accuracy"], summary


def train(cfg):
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"--objective {cfg.objective!r} is unknown; choose from {', '.join(OBJECTIVES)}")
    for name in ("steps", "problems_per_step", "group_size", "max_new_tokens", "epochs_per_batch", "micro_batch_tokens"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(cfg, name)}")
    device = cfg.device or M.default_device()
    run_dir = Path(cfg.out or f"runs/{cfg.objective}-{Path(cfg.model).name}")
    start_step = 0
    if cfg.resume:
        saved = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else None
        if saved is None:
            raise FileNotFoundError(f"--resume: {run_dir}/config.json not found; nothing to resume")
        diff = {k: (saved.get(k), v) for k, v in dataclasses.asdict(cfg).items()
                if k not in RESUMABLE and saved.get(k) != v}
        if diff:
            raise ValueError(f"--resume: settings differ from {run_dir}/config.json (saved, now): {diff}")
    elif (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dict(dataclasses.asdict(cfg), code_version=code_version()), indent=2))
    print(json.dumps(dataclasses.asdict(cfg)))

    torch.manual_seed(cfg.seed)
    train_set, val_set, test_set = load_pools(cfg)
    tokenizer = M.load_tokenizer(cfg.model)
    policy = M.load_model(cfg.model, dtype=torch.float32, device=device)  # fp32 master weights
    policy.gradient_checkpointing = cfg.grad_checkpointing
    reference = copy.deepcopy(policy).requires_grad_(False) if cfg.kl_coef else None
    if cfg.lora_rank:
        lora.add_lora(policy, cfg.lora_rank, cfg.lora_alpha)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    ckpt = latest_checkpoint(run_dir) if cfg.resume else None
    if ckpt is not None:
        if not cfg.lora_rank:  # with LoRA the base stays frozen and the adapters come from the trainer state
            policy.load_state_dict(M.load_model(ckpt, torch.float32, device).state_dict())
        start_step = load_trainer_state(ckpt, policy, optimizer)
        print(f"resumed from {ckpt} after step {start_step}")
    rollout_model = make_rollout_model(policy, device)
    truncate_jsonl(run_dir / "metrics.jsonl", start_step)
    truncate_jsonl(run_dir / "samples.jsonl", start_step)
    print(f"training on {len(train_set)} problems ({cfg.dataset}), validation {len(val_set)}, "
          f"{count_params(policy)} trainable parameters, device {device}")

    if test_set and start_step == 0:
        acc, _ = evaluate_accuracy(rollout_model, tokenizer, test_set, cfg)
        log_line(run_dir / "metrics.jsonl", dict(step=0, test_accuracy=acc))
        print(f"test accuracy before training ({cfg.test_dataset}): {acc:.3f}")
    totals = dict(generated_tokens=0, training_tokens=0, flops=0.0)
    t_start, step = time.time(), start_step
    try:
        for step in range(start_step, cfg.steps):
            metrics = train_step(policy, rollout_model, reference, optimizer, tokenizer, train_set, cfg, step, device,
                                 run_dir, totals)
            refresh_rollout_model(rollout_model, policy)
            if cfg.eval_every and val_set and (step + 1) % cfg.eval_every == 0:
                metrics["val_accuracy"], _ = evaluate_accuracy(rollout_model, tokenizer, val_set, cfg)
            log_line(run_dir / "metrics.jsonl", metrics)
            print_progress(metrics, cfg, time.time() - t_start, step + 1 - start_step)
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
                save_checkpoint(run_dir / "checkpoints" / f"step_{step + 1}", policy, optimizer, tokenizer, step + 1, cfg)
    except KeyboardInterrupt:  # save what is done and stop cleanly; --resume continues from here
        done = step  # the step in progress did not finish
        if done > start_step:
            save_checkpoint(run_dir / "checkpoints" / f"step_{done}", policy, optimizer, tokenizer, done, cfg)
        print(f"\ninterrupted: checkpoint after step {done} in {run_dir}; rerun with --resume to continue")
        return run_dir
    save_checkpoint(run_dir / "checkpoints" / f"step_{cfg.steps}", policy, optimizer, tokenizer, cfg.steps, cfg)
    final = run_dir / "final"
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


def train_step(policy, rollout_model, reference, optimizer, tokenizer, train_set, cfg, step, device, run_dir, totals):
    """One step: problems -> rollouts -> rewards -> advantages -> update; returns the step's metrics."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    batch = [train_set[i] for i in problems_for_step(len(train_set), step, cfg.problems_per_step, cfg.seed)]
    t0 = time.time()
    rollouts = collect_rollouts(rollout_model, tokenizer, batch, cfg, step)
    t1 = time.time()
    rewards = score_rollouts(rollouts, cfg)  # (P, G)
    advantages = OBJECTIVES[cfg.objective].advantages(rewards)  # (P, G)
    for r, a in zip(rollouts, advantages.flatten().tolist()):
        r["advantage"] = a
    mixed = (rewards.max(dim=1).values > rewards.min(dim=1).values)  # (P,) groups with a learning signal
    rows = [r for r, g in zip(rollouts, mixed.repeat_interleave(cfg.group_size).tolist())
            if g or not cfg.skip_uniform_groups]
    t2 = time.time()
    stats = dict(loss=0.0, entropy=float("nan"), clip_fraction=0.0, kl=0.0, grad_norm=0.0, tokens=0, nonfinite=False)
    if rows:
        stats = policy_update(policy, reference, optimizer, rows, len(rollouts), cfg, device, tokenizer.pad_id)
    t3 = time.time()
    lengths = [len(r["tokens"]) for r in rollouts]
    generated = sum(lengths)
    context = sum(len(r["prompt"]) for r in rollouts) / len(rollouts) + sum(lengths) / len(lengths) / 2
    totals["generated_tokens"] += generated
    totals["training_tokens"] += stats["tokens"] * cfg.epochs_per_batch
    totals["flops"] += (generated * M.flops_per_token(policy.config, context)
                        + stats["tokens"] * cfg.epochs_per_batch * M.flops_per_token(policy.config, context, training=True))
    for r in rollouts[:cfg.samples_per_step]:
        log_line(run_dir / "samples.jsonl", dict(step=step + 1, id=r["problem"]["id"], answer=r["problem"]["answer"],
                                                 response=r["text"], reward=r["reward"], correct=r["correct"]))
    return dict(
        step=step + 1, reward_mean=rewards.mean().item(), accuracy=sum(r["correct"] for r in rollouts) / len(rollouts),
        format_failure_rate=sum(not r["boxed"] for r in rollouts) / len(rollouts),
        direct_answer_rate=sum(is_direct_answer(r["text"]) for r in rollouts) / len(rollouts),
        response_tokens_mean=generated / len(rollouts), response_tokens_max=max(lengths),
        truncation_rate=sum(r["finish_reason"] == "length" for r in rollouts) / len(rollouts),
        mixed_groups=mixed.float().mean().item(), entropy=stats["entropy"], clip_fraction=stats["clip_fraction"],
        **({"kl": stats["kl"]} if cfg.kl_coef else {}), loss=stats["loss"], grad_norm=stats["grad_norm"],
        lr=lr_at(step, cfg), skipped_update=stats["nonfinite"] or not rows,
        sampling_seconds=t1 - t0, verifying_seconds=t2 - t1, training_seconds=t3 - t2,
        tokens_per_second=generated / max(t1 - t0, 1e-9), **totals)


def print_progress(m, cfg, elapsed, done):
    eta = elapsed / done * (cfg.steps - m["step"])
    val = f" | val {m['val_accuracy']:.3f}" if "val_accuracy" in m else ""
    print(f"step {m['step']}/{cfg.steps} | reward {m['reward_mean']:.3f} | acc {m['accuracy']:.3f}{val} | "
          f"len {m['response_tokens_mean']:.0f} | direct {m['direct_answer_rate']:.2f} | loss {m['loss']:+.4f} | "
          f"sample {m['sampling_seconds']:.1f}s verify {m['verifying_seconds']:.1f}s train {m['training_seconds']:.1f}s"
          f" | ETA {eta / 60:.1f} min", flush=True)


# -----------------------------------------------------------------------------
# Command line: flags generated from Config; --model tiny switches to the tiny world's defaults


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            kind = {"int": int, "float": float, "str": str}.get(str(f.type), f.type)
            parser.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"])
    first, _ = parser.parse_known_args(argv)
    if first.model == "tiny":
        parser.set_defaults(**TINY_DEFAULTS)
    return Config(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    train(parse_args())
