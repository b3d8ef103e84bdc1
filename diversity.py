"""
How different a group's completions are: surface signals (length spread, distinct final answers, 4-gram
overlap) and the embedding dispersion (the mean pairwise cosine distance of the completions in the policy's own
representation). train_rl.py logs them per step, evaluate.py per problem with --samples k; the exploration study
(research/exploration/) reads them.
"""

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import cli
import sample
import verify


@dataclass
class DiversityConfig:
    """train_rl.py's diversity flag (train_rl.Config inherits it); the surface signals are logged every step."""
    dispersion_every: int = cli.arg(10, "every N steps log the groups' embedding dispersion (diversity.py; about 0.7x "
                                        "the step's sampling on the tiny world; 0: never)", range="[0, inf)",
                                    group="diversity")


def embedding_dispersion(embeddings):
    """Mean pairwise cosine distance 1 - cos(e_i, e_j) over the G(G-1)/2 pairs of a group's embeddings (G, d):
    0 when all point the same way (identical completions), 1 for orthogonal ones, at most 2. nan for a group
    of one, which has no pair. A zero vector counts as cosine 0 to everything (F.normalize leaves it zero).

    With completion_embeddings this is a diversity signal of a group of completions: 0 means the policy
    represents them all alike. What it cannot show: the embedding is the policy's own (final hidden states),
    so the scale moves as the policy trains, and values from different checkpoints are not on one ruler;
    mean pooling over tokens blurs order (two completions with the same lines in another order come out
    close); and it is not a length spread, nor a count of distinct answers (group_diversity has
    those): two completions of equal length can be far apart, and a short and a long one that say the same
    can be close."""
    e = torch.as_tensor(embeddings, dtype=torch.float64).cpu()
    if e.dim() != 2:
        raise ValueError(f"embedding_dispersion needs a (G, d) tensor of embeddings, got shape {tuple(e.shape)}")
    G = e.shape[0]
    if G < 2:
        return float("nan")
    e = F.normalize(e, dim=1)
    i, j = torch.triu_indices(G, G, 1)  # each unordered pair once
    return float((1.0 - (e[i] * e[j]).sum(1)).clamp(min=0.0).mean())  # clamp: rounding below 0 for equal vectors


@torch.no_grad()
def completion_embeddings(model, prompts, completions, batch_tokens=4096, token_budget=None):
    """(N, hidden) float32 CPU tensor: for completion i, the mean over its own positions of the model's
    final-normed hidden states (model.hidden_states, what the LM head reads) on prompts[i] + completions[i].
    Prompt positions and padding are left out of the mean; the stop token, when the completion has one, is a
    completion token. prompts and completions are lists of token-id lists, completions non-empty.

    Batched as sample.generate batches: the completions of one prompt (a group) share one prefill of it in a
    KV cache, left-padded across prompts, in chunks of whole groups whose cache (rows x slots) stays within
    token_budget (default sample.default_token_budget, as generate's). Then the chunk's completions run
    longest first, right-padded, about batch_tokens padded tokens per forward, each batch on a copy of its
    prompts' cache rows; attention is causal, so no real position sees the padding after it, and an embedding
    is the same up to float rounding whatever else shares its batch. Eval mode (the model's mode is restored
    after), on the model's device and dtype, under the caller's autocast if any. Pass a whole model (under
    FSDP, the sampling copy): hidden_states bypasses the forward hooks that would gather sharded weights."""
    if len(prompts) != len(completions):
        raise ValueError(f"completion_embeddings: {len(prompts)} prompts but {len(completions)} completions")
    empty = [i for i, c in enumerate(completions) if len(c) == 0]
    if empty:
        raise ValueError(f"completion_embeddings: completion {empty[0]} has no tokens to pool")
    token_budget = token_budget or sample.default_token_budget(model)
    groups = {}  # prompt -> the indices of its completions
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    longest = {p: max(len(completions[i]) for i in rows) for p, rows in groups.items()}
    chunks, shape = [], (0, 0, 0)  # the last chunk's rows, longest prompt, longest completion
    for prompt in sorted(groups, key=lambda p: -(len(p) + longest[p])):  # longest first: less padding
        grown = (shape[0] + len(groups[prompt]), max(shape[1], len(prompt)), max(shape[2], longest[prompt]))
        if not chunks or grown[0] * (grown[1] + grown[2]) > token_budget:  # a chunk's cache: rows x slots
            chunks.append([])
            grown = (len(groups[prompt]), len(prompt), longest[prompt])
        chunks[-1].append(prompt)
        shape = grown
    out = torch.empty(len(prompts), model.config.hidden_size)
    was_training = model.training
    model.eval()
    try:
        for chunk in chunks:
            embed_chunk(model, [list(p) for p in chunk], [groups[p] for p in chunk], completions, batch_tokens, out)
    finally:
        model.train(was_training)
    return out


def embed_chunk(model, prompts, groups, completions, batch_tokens, out):
    """completion_embeddings of one chunk into out: distinct prompts, groups[b] the indices of prompt b's
    completions."""
    device = next(model.parameters()).device
    B, L = len(prompts), max(len(p) for p in prompts)
    cache = model.new_cache(B, L + max(len(completions[i]) for g in groups for i in g))
    if L:  # prefill each prompt once, left-padded (KVCache.pad); only its cache is needed
        ids = torch.zeros(B, L, dtype=torch.long)  # the pad id is never attended to
        for b, p in enumerate(prompts):
            ids[b, L - len(p):] = torch.tensor(p)
        cache.pad = torch.tensor([L - len(p) for p in prompts], device=device)
        model.hidden_states(ids.to(device), cache)
    row_of = {i: b for b, g in enumerate(groups) for i in g}  # completion -> its prompt's cache row
    todo = [i for g in groups for i in g]
    for batch in sample.pack_by_length([len(completions[i]) for i in todo], batch_tokens):
        rows = [todo[j] for j in batch]
        C = len(completions[rows[0]])  # the longest: pack_by_length puts it first
        sub = copy.copy(cache)  # select() gives the copy its own tensors: the prefill stays for the next batch
        sub.select([row_of[i] for i in rows])
        ids, weights = torch.zeros(len(rows), C, dtype=torch.long), torch.zeros(len(rows), 1, C)  # (R, C), (R, 1, C)
        for r, i in enumerate(rows):
            ids[r, :len(completions[i])] = torch.tensor(list(completions[i]))
            weights[r, 0, :len(completions[i])] = 1.0 / len(completions[i])  # the mean over the completion, 0 on pads
        h = model.hidden_states(ids.to(device), sub).float()  # (R, C, hidden)
        out[rows] = torch.bmm(weights.to(device), h)[:, 0].cpu()  # (R, hidden)


def ngrams(tokens, n=4):
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def group_diversity(rollouts, G):
    """rollouts: G per group, each with tokens and text (train_rl.Rollout). Simple diversity signals averaged over groups: the std of completion lengths, the number of distinct
    final answers, and the mean pairwise Jaccard overlap of token 4-gram sets (1 = identical samples)."""
    spread, answers, overlap = [], [], []
    for g in (rollouts[i:i + G] for i in range(0, len(rollouts), G)):
        lengths = torch.tensor([float(len(r.tokens)) for r in g])
        spread.append(lengths.std().item() if G > 1 else 0.0)
        answers.append(len({verify.extract_answer(r.text) for r in g}))
        sets = [ngrams(r.tokens) for r in g]
        pairs = [(a, b) for i, a in enumerate(sets) for b in sets[i + 1:]]
        overlap += [len(a & b) / len(a | b) for a, b in pairs if a | b]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    return dict(group_length_std=mean(spread), group_distinct_answers=mean(answers), group_ngram_overlap=mean(overlap))


def group_dispersion(model, rollouts, G):
    """The mean over groups of the mean pairwise cosine distance between the completions' mean-pooled final
    hidden states under the sampling model (embedding_dispersion): diversity of content, as the policy
    itself represents it, where length spread and n-gram overlap see only the surface."""
    if G < 2 or not rollouts or not all(r.tokens for r in rollouts):  # an empty completion has nothing to pool
        return float("nan")
    emb = completion_embeddings(model, [r.prompt for r in rollouts], [r.tokens for r in rollouts])
    return sum(embedding_dispersion(emb[i:i + G]) for i in range(0, len(rollouts), G)) / (len(rollouts) // G)
