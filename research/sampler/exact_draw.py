"""
The exact draw the sampler used until issue #66 (commit d8b0967), kept here as the sampler program's artefact:
inverse-CDF sampling with one counter-based uniform per row, in two levels (float32 block sums, then a float64
running sum inside the chosen block), and top-p by rejection from the whole softmax with a bound that skips the
nucleus check on confident rows. The core's sample.py now draws with torch.multinomial from a generator per row
(the textbook, a few lines); bench_sample.py --sampling measures the two side by side, and
tests/test_sampler_exact_draw.py checks this one against the float64 textbook.

The draw of row key k at token index t is a pure function of (k, t): a hash gives one uniform, never a
generator's state.
"""

import math

import torch
import torch.nn.functional as F

MASK32 = 0xFFFFFFFF


def hash32(x):
    """A 32-bit integer mixing function (two multiply-xorshift rounds) on int64 tensors: every input bit
    affects every output bit, so consecutive counters give unrelated values. Products stay below 2^59.
    In place on the fresh x >> 16, never on the input."""
    x = (x >> 16).bitwise_xor_(x).mul_(0x45D9F3B).bitwise_and_(MASK32)
    x = (x >> 16).bitwise_xor_(x).mul_(0x45D9F3B).bitwise_and_(MASK32)
    return (x >> 16).bitwise_xor_(x)


def row_keys(prompt_seeds, n):
    """(B,) prompt seeds -> (B * n,) row seeds: sample j of a prompt gets its own stream."""
    j = torch.arange(n, device=prompt_seeds.device).repeat(len(prompt_seeds))
    return hash32((hash32(prompt_seeds.repeat_interleave(n) & MASK32) + j * 0x9E3779B9) & MASK32)


def uniform(keys, position, draw=0):
    """(B,) uniforms in (0, 1), a pure function of (row key, the row's token index `position`, draw number): 52
    random bits from two hashes (32 would round away every token below 2e-10). `position` is an int or (B,)."""
    base = hash32((keys + (position + 1) * 0x85EBCA6B) & MASK32) + draw * 0xC2B2AE35
    hi, lo = hash32(base & MASK32), hash32((base + 0x27D4EB2F) & MASK32)
    return ((hi >> 12) << 32 | lo).double().add_(0.5).div_(2.0**52)  # exact: integers below 2^52


CDF_BLOCK = 128  # tokens per block of inverse_cdf's first level (Qwen3's 151,936 = 128 x 1,187)


def block_sums(weights):
    """The float32 sums of blocks of gcd(n, CDF_BLOCK) tokens of each row of weights (B, n): (B, blocks). The blocks
    are a view of the row, no copy."""
    B, n = weights.shape
    size = math.gcd(n, CDF_BLOCK)
    return weights.view(B, n // size, size).sum(-1)


def inverse_cdf(weights, u, sums=None):
    """Inverse-CDF sampling: for each row of weights (B, n) >= 0 and uniform u in [0, 1), index i with
    probability weights[i] / total. Two levels, because a float32 running sum over the row rounds a 1e-12 token
    away beside a total near 1, and a float64 one is a temporary twice the weights' size (38 MB at batch 32 over
    Qwen3's vocabulary): the float32 block sums (`sums`, block_sums(weights) unless given) pick a block, then the
    float64 running sum inside it picks the token. Each share is exact up to the float32 rounding of its block's
    sum, as small as the weights' own."""
    sums = block_sums(weights) if sums is None else sums
    B, n = weights.shape
    size = n // sums.shape[1]
    edges = F.pad(sums.double().cumsum(-1), (1, 0))  # mass before each block
    total = edges[:, -1]
    target = u * total  # < total: u <= 1 - 2^-53, and the product never rounds up to the total
    block = torch.searchsorted(edges, target[:, None], right=True).squeeze(-1) - 1  # edges[b] <= target < edges[b+1]
    block.clamp_(0, sums.shape[1] - 1)  # a no-op for finite weights; NaN ones then draw a junk token, not an error
    lo, hi = edges.gather(-1, block[:, None]).squeeze(-1), edges.gather(-1, block[:, None] + 1).squeeze(-1)
    tokens = block[:, None] * size + torch.arange(size, device=weights.device)
    cdf = weights.gather(-1, tokens).cumsum(-1, dtype=torch.float64)  # (B, size): inside the chosen block
    last = cdf[:, -1]  # the block's sum again; rescaling into it must not round up to it
    inside = torch.minimum((target - lo) / (hi - lo) * last, last.nextafter(torch.zeros_like(last)))
    return tokens.gather(-1, torch.searchsorted(cdf, inside[:, None], right=True).clamp_(max=size - 1)).squeeze(-1)


def sample_next(logits, temperature, top_p, top_k, keys, position):
    """Next token ids (B,) from logits (B, vocab), and their log-probabilities under the policy (the softmax at
    temperature 1, before top-k/top-p), which training's importance ratios need. Greedy at temperature 0, else
    inverse-CDF sampling with one counter-based uniform per row: top-k draws within the k largest, top-p from
    the whole softmax by rejection (draw_in_nucleus); both exact, in the section below."""
    if temperature == 0:
        token = logits.argmax(-1)
    elif 0 < top_k < logits.shape[-1]:
        token = draw_kept(*kept_tokens(logits / temperature, top_k, top_p), uniform(keys, position))
    else:
        top = logits.amax(-1)
        weights = logits - top[:, None]
        if temperature != 1.0:  # a pass over the vocabulary that changes nothing at 1
            weights.div_(temperature)
        weights.exp_()  # the softmax, unnormalized
        total, sums = weights.sum(-1), block_sums(weights)
        token = inverse_cdf(weights, uniform(keys, position), sums)
        if top_p < 1.0:  # the block sums also bound the mass above the drawn token (surely_inside)
            token = draw_in_nucleus(logits, temperature, top_p, weights, total, sums, token, keys, position)
        if temperature == 1.0:  # the policy's own softmax: its total gives the log-prob without a second pass
            return token, logits.gather(-1, token[:, None]).squeeze(-1) - top - total.log()
    return token, logits.gather(-1, token[:, None]).squeeze(-1) - logits.logsumexp(-1)


# -----------------------------------------------------------------------------
# Top-k and top-p: sample_next's filters, exact (tests/test_sample.py checks them against the sorted softmax)


def kept_tokens(logits, top_k, top_p):
    """(values, ids), each (B, k), of the tokens top-k and then top-p keep, largest first, -inf past a row's own
    set. Nucleus sampling (Holtzman et al. 2020) keeps the smallest set with mass >= top_p, and here every
    token tied with its last member too (bf16 logits tie often; a sort's order among ties is arbitrary). With
    top-k its k tokens are the candidates, and without it the candidate set (topk) is widened 8x at a time until
    it holds every row's nucleus, past an eighth of the vocabulary the whole of it."""
    vocab = logits.shape[-1]
    cap = top_k if 0 < top_k < vocab else vocab
    if top_p >= 1.0:
        return torch.topk(logits, cap, dim=-1)
    norm = logits.logsumexp(-1, keepdim=True) if cap == vocab else None
    k = cap if norm is None else min(cap, 64)
    while True:
        values, ids = torch.topk(logits, k, dim=-1)
        # the mass is the softmax over the candidates with top-k, over the vocabulary without
        probs = (values - (values.logsumexp(-1, keepdim=True) if norm is None else norm)).exp()
        last = values.masked_fill(probs.cumsum(-1) - probs >= top_p, float("inf")).amin(-1, keepdim=True)
        if k == cap or bool((values[:, -1:] < last).all()):  # every row's nucleus and its ties are inside
            return values.masked_fill(values < last, float("-inf")), ids
        k = 8 * k if 8 * k <= cap // 8 else cap


def draw_kept(values, ids, u):
    """The token of ids (B, k) that inverse-CDF sampling picks from the softmax of values (B, k), largest first."""
    pick = inverse_cdf((values - values[:, :1]).exp_(), u)
    return ids.gather(-1, pick[:, None]).squeeze(-1)


def outside_nucleus(weights, total, sums, token, top_p):
    """Which rows' drawn token lies outside the nucleus: the tokens more probable than it already hold top_p
    of the mass. Rows that a bound from the block sums `sums` puts inside cost nothing (surely_inside): most of
    a reasoning model's tokens are drawn at low entropy (Wang et al. 2025, arXiv 2506.01939). The other rows
    take one pass over the vocabulary, no sort; the mask is float (a bool one is slow to multiply and sum on
    CPUs)."""
    drawn = weights.gather(-1, token[:, None]).squeeze(-1)
    outside = torch.zeros_like(token, dtype=torch.bool)
    rows = (~surely_inside(drawn, total, sums, top_p)).nonzero().squeeze(-1)
    if len(rows):
        w = weights[rows] if len(rows) < len(token) else weights
        above = torch.gt(w, drawn[rows, None], out=torch.empty_like(w))
        outside[rows] = above.mul_(w).sum(-1) >= top_p * total[rows]
    return outside


def surely_inside(drawn, total, sums, top_p):
    """Rows whose drawn token is in the nucleus by a bound, without a pass over the vocabulary. A block whose
    float32 sum is at most the drawn weight holds no token above it (a sum of weights >= 0 is never below one of
    them, in floating point too), so the blocks summing to more hold all the mass above it: when they hold less
    than top_p, it is inside. So is a token holding more than 1 - top_p itself (the rest holds less than top_p).
    Both with a margin far above float32 rounding, so a row skipped here is one the full pass keeps."""
    above = sums.masked_fill(sums <= drawn[:, None], 0).sum(-1, dtype=torch.float64)
    return (drawn > (1 - top_p + NUCLEUS_MARGIN) * total) | (above < (top_p - NUCLEUS_MARGIN) * total)


NUCLEUS_MARGIN = 1e-4  # of the total: float32 sums over 151,936 tokens round by far less (~1e-6)


NUCLEUS_DRAWS = 8  # rejection draws before a row takes the exact sorted nucleus (each accepts with p >= top_p)


def draw_in_nucleus(logits, temperature, top_p, weights, total, sums, token, keys, position):
    """Top-p by rejection: a row whose drawn token lies outside the nucleus draws again from the whole softmax
    (an accepted draw follows the softmax restricted to the nucleus exactly, and a draw is accepted with
    probability >= top_p); a row still outside after NUCLEUS_DRAWS draws samples the sorted nucleus directly,
    which keeps the distribution exact."""
    positions = torch.as_tensor(position, device=logits.device).expand(len(token))
    rows = outside_nucleus(weights, total, sums, token, top_p).nonzero().squeeze(-1)
    for draw in range(1, NUCLEUS_DRAWS):
        if not len(rows):
            return token
        w, t, s = weights[rows], total[rows], sums[rows]
        token[rows] = redrawn = inverse_cdf(w, uniform(keys[rows], positions[rows], draw), s)
        rows = rows[outside_nucleus(w, t, s, redrawn, top_p)]
    if len(rows):
        kept = kept_tokens(logits[rows] / temperature, 0, top_p)
        token[rows] = draw_kept(*kept, uniform(keys[rows], positions[rows], NUCLEUS_DRAWS))
    return token
