"""
The policy update, step 6 of train_rl.py: rollouts -> padded tensors -> the objective's loss over the completion
tokens (objectives.py) -> gradients accumulated over micro-batches -> one AdamW step (policy_update); and the
distillation step research/rounds uses (sft_update, the token-mean negative log-likelihood).

The PPO ratio's pi_old is taken one way (old_logprobs): a rollout's behavior_logprobs when it has them (replay),
else the policy at the update's start. Several processes (distributed.py): each rank runs its share of the rows,
the losses divide by batch-wide counts, and the gradients are summed before the step.
"""

from dataclasses import dataclass

import torch

import distributed as D
import objectives
from model import token_logprobs
from objectives import OBJECTIVES, MicroBatch
from sample import pack_by_length


def micro_batches(rows, budget):
    """Pack rows (anything with prompt and tokens ids; longest first) into micro-batches of at most `budget`
    padded tokens."""
    groups = pack_by_length([len(r.prompt) + len(r.tokens) for r in rows], budget)
    return [[rows[i] for i in g] for g in groups]


def completion_values(rows, values, T):
    """(B, T-1) over the targets ids[:, 1:]: each row's per-completion-token values at its completion's places."""
    out = torch.zeros(len(rows), T - 1)
    for i, (r, v) in enumerate(zip(rows, values)):
        start = len(r.prompt) - 1
        out[i, start:start + len(v)] = torch.tensor(v, dtype=torch.float32)
    return out


def sequence_tensors(rows, pad_id, device):
    """Right-padded prompt+completion ids (B, T), and over the targets ids[:, 1:] the completion mask (B, T-1)."""
    T = max(len(r.prompt) + len(r.tokens) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r.prompt) + len(r.tokens)] = torch.tensor(r.prompt + r.tokens)
    return ids.to(device), completion_values(rows, [[1.0] * len(r.tokens) for r in rows], T).to(device)


def rollout_tensors(rows, pad_id, device):
    """sequence_tensors' ids and mask, and the sampler's log-probs (B, T-1)."""
    ids, mask = sequence_tensors(rows, pad_id, device)
    return ids, mask, completion_values(rows, [r.sampler_logprobs for r in rows], ids.shape[1]).to(device)


def autocast(device):
    """bf16 autocast on CUDA (fp32 master weights), plain fp32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast("cpu", enabled=False)


def old_logprobs(rows, logp, T, device):
    """pi_old of the PPO ratio, one rule: a rollout's behavior_logprobs when it has them (replay: the policy that
    sampled it), else this update's policy at its start, logp detached (so rho = 1 in the first epoch)."""
    has = torch.tensor([r.behavior_logprobs is not None for r in rows], device=device)[:, None]
    behavior = completion_values(rows, [r.behavior_logprobs or [] for r in rows], T).to(device)
    return torch.where(has, behavior, logp.detach())


@torch.no_grad()
def reference_logprobs(run, ids):
    """--kl-in loss: the frozen reference policy's log-probs of ids' targets (B, T-1), fp32."""
    with autocast(run.device):
        return token_logprobs(run.reference, ids)[0].float()


def micro_batch(run, rows, old, j, n_sequences, n_tokens):
    """The loss's input for micro-batch j (objectives.MicroBatch) and the policy's entropy per token. old holds
    each micro-batch's pi_old from the first epoch on (for mu > 1)."""
    cfg, device = run.cfg, run.device
    ids, mask, sampler_logp = rollout_tensors(rows, run.tokenizer.pad_id, device)
    with autocast(device):
        logp, entropy = token_logprobs(run.policy, ids)  # (B, T-1) each
    ref_logp = reference_logprobs(run, ids) if run.reference is not None and cfg.kl_in == "loss" else None
    logp = logp.float()
    old_logp = old.setdefault(j, old_logprobs(rows, logp, ids.shape[1], device))
    tis = objectives.truncated_is_weights(old_logp, sampler_logp, mask, cfg.tis_cap)
    adv = torch.tensor([r.advantage for r in rows], device=device)
    return MicroBatch(logp, old_logp, ref_logp, mask, tis, adv, n_sequences, n_tokens), entropy


def add_token_stats(sums, loss, b, entropy, cfg):
    """Add a micro-batch's loss, completion tokens, entropy, clipped ratios and KL to the epoch's sums."""
    m = b.mask.bool()
    sums["loss"] += loss.item()
    sums["tokens"] += int(m.sum())
    sums["entropy"] += float(entropy.float()[m].sum())
    ratio = torch.exp(b.logp.detach() - b.old_logp)[m]
    sums["clipped"] += float(((ratio < 1 - cfg.clip_low) | (ratio > 1 + cfg.clip_high)).float().sum())
    if b.ref_logp is not None:
        sums["kl"] += float(objectives.kl_estimate(b.logp.detach(), b.ref_logp, cfg.kl_estimator)[m].sum())


def nonfinite_loss(logp, policy):
    """What to backpropagate in place of a NaN/inf loss: None, which stops the epoch (the update is then skipped on
    every rank); under FSDP a zero loss instead, so this pass still joins the other ranks' collectives."""
    return logp.sum() * 0 if D.is_sharded(policy) else None


def apply_gradients(policy, optimizer, grad_clip, nonfinite):
    """Clip the gradients' norm and take the AdamW step; returns the norm, or None when the update is skipped (a
    non-finite loss on any rank, or gradient): logged, never applied or saved."""
    params = [p for p in policy.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
    if nonfinite or not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    return float(grad_norm)


def policy_update(run, rows, n_sequences, n_tokens):
    """mu = --epochs-per-batch epochs over the batch, each one AdamW step on gradients accumulated over micro-batches;
    returns the step's loss, entropy, clip fraction, KL, gradient norm and tokens trained on. n_sequences and n_tokens
    count the whole batch (rows may leave out zero-advantage ones), so every micro-batch's loss is its share."""
    cfg, policy = run.cfg, run.policy
    if run.world > 1:  # several processes: this rank trains its share of the rows (distributed.py)
        rows = D.rank_share(rows)
    batches = micro_batches(rows, cfg.micro_batch_tokens)
    if cfg.fsdp:  # every rank runs as many passes as the others (distributed.py)
        batches = D.pad_micro_batches(batches, policy)
    stats = dict(loss=0.0, entropy=0.0, clip_fraction=0.0, kl=0.0, grad_norm=0.0, tokens=0, nonfinite=False)
    old = {}
    policy.train()
    for epoch in range(cfg.epochs_per_batch):
        run.optimizer.zero_grad(set_to_none=True)
        sums = dict(loss=0.0, tokens=0, entropy=0.0, clipped=0.0, kl=0.0)
        for j, rb in enumerate(batches):
            if not rb:  # FSDP padding: a pass with zero gradient that joins the other ranks' collectives
                D.padding_pass(policy, run.tokenizer.pad_id, run.device)
                continue
            b, entropy = micro_batch(run, rb, old, j, n_sequences, n_tokens)
            loss = OBJECTIVES[cfg.objective].loss(b, cfg)
            if not torch.isfinite(loss):
                stats["nonfinite"] = True
                if (loss := nonfinite_loss(b.logp, policy)) is None:
                    break
            loss.backward()
            add_token_stats(sums, loss, b, entropy, cfg)
        if run.world > 1:  # each rank saw its share of the batch: add up the shares and the gradients
            sums, stats["nonfinite"] = D.sum_over_ranks(policy, sums, stats["nonfinite"])
        grad_norm = apply_gradients(policy, run.optimizer, cfg.grad_clip, stats["nonfinite"])
        if grad_norm is None:
            stats["nonfinite"] = True
            break
        seen = max(sums["tokens"], 1)
        if epoch == 0:
            stats.update(loss=sums["loss"], entropy=sums["entropy"] / seen, grad_norm=grad_norm,
                         tokens=sums["tokens"], kl=sums["kl"] / seen)
        stats["clip_fraction"] = sums["clipped"] / seen  # of the last epoch (0 when mu = 1)
    run.optimizer.zero_grad(set_to_none=True)
    policy.eval()
    return stats


@dataclass
class Example:
    """A completion to imitate after its prompt: sft_update's row (research/rounds' distillation)."""
    prompt: list  # the prompt's token ids
    tokens: list  # the completion's token ids, its stop token last


def sft_update(policy, optimizer, examples, cfg, device, pad_id):
    """One AdamW step of next-token loss on examples (Examples, or Rollouts), the prompt masked:
    the distillation step of research/rounds. The loss is the token-mean negative log-likelihood
    -sum(log p) / tokens over the completion tokens, micro-batched and stepped as policy_update does.
    cfg: anything with micro_batch_tokens and grad_clip. Returns the loss and the tokens trained on."""
    n_tokens, total, seen, nonfinite = sum(len(e.tokens) for e in examples), 0.0, 0, False
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    for rb in D.pad_micro_batches(micro_batches(examples, cfg.micro_batch_tokens), policy):
        if not rb:  # FSDP padding, as in policy_update
            D.padding_pass(policy, pad_id, device)
            continue
        ids, mask = sequence_tensors(rb, pad_id, device)
        with autocast(device):
            logp, _ = token_logprobs(policy, ids)
        loss = -(logp.float() * mask).sum() / n_tokens
        if not torch.isfinite(loss):
            nonfinite = True
            if (loss := nonfinite_loss(logp, policy)) is None:
                break
        loss.backward()
        total, seen = total + loss.item(), seen + int(mask.sum())
    total, seen, nonfinite = D.reduce_numbers([total, seen, nonfinite])
    D.all_reduce_gradients(policy)  # (this line and the one above do nothing in one process)
    grad_norm = apply_gradients(policy, optimizer, cfg.grad_clip, nonfinite)
    optimizer.zero_grad(set_to_none=True)
    policy.eval()
    return dict(loss=total, tokens=seen, grad_norm=grad_norm or 0.0, nonfinite=grad_norm is None)
