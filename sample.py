"""
Our own batched sampler on the KV cache: token ids -> completions with log-probs.

How a call runs:
1. Prompts are sorted by length (less padding) and split into chunks whose KV cache fits a token budget.
2. Each chunk is left-padded and prefilled once per prompt; the cache is then copied n times, so the n
   samples of one prompt (a GRPO group) share the prefill, and each sample draws its own first token.
3. Decoding feeds one token per live row; finished rows are compacted out of the batch (and the cache),
   so they stop costing compute.
4. Every generated token gets its log-probability under the unmodified policy (softmax at temperature 1,
   before top-k/top-p), which training needs for importance ratios.
Continuous batching (`slots`, what evaluation uses) and the static decode step (`static`, what `compile` means on
CUDA) replace the chunks of steps 1-3 with rows that waiting prompts join: batching.py, the same completions.

Randomness is counter-based: the draw of sample j of prompt i at position t is a pure function of (the
prompt's seed, j, t): a hash gives one uniform, and inverse-CDF sampling turns it into a token, never a
generator's state. So a prompt's samples do not depend on which other prompts share its batch, on chunking,
on compaction or, in training over several processes, on which rank drew it.
"""

import math
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import batching


@dataclass
class Completion:
    prompt_index: int  # which prompt this completion answers
    tokens: list = field(default_factory=list)  # generated ids, the stop token included when one ended it
    logprobs: list = field(default_factory=list)  # log p(token) under the policy at temperature 1
    finish_reason: str = "length"  # "stop" or "length"


def kv_bytes_per_token(model):
    """Keys and values of one cache slot: every layer pass has its own (a looped model's extra loops included)."""
    c, dtype = model.config, model.lm_head.weight.dtype
    if torch.is_autocast_enabled(model.lm_head.weight.device.type):
        dtype = torch.get_autocast_dtype(model.lm_head.weight.device.type)
    return 2 * c.layer_passes * c.num_key_value_heads * c.head_dim * dtype.itemsize


def default_token_budget(model, cache_gib=4.0):
    """How many cache slots fit in `cache_gib` of memory: bounds the cache whatever the request size."""
    return int(cache_gib * 2**30) // kv_bytes_per_token(model)


# -----------------------------------------------------------------------------
# Choosing the next token

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


# -----------------------------------------------------------------------------
# Checking the request


def check_request(model, prompts, max_new_tokens, temperature, top_p, top_k, n, token_budget):
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    context = model.config.max_position_embeddings
    vocab = model.config.vocab_size
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty")
        if len(p) + max_new_tokens > context:
            raise ValueError(f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it "
                             f"exceeds the model's context of {context} tokens")
        if n * (len(p) + max_new_tokens) > token_budget:
            raise ValueError(f"prompts[{i}]: n={n} rows of {len(p)} + {max_new_tokens} tokens exceed "
                             f"token_budget={token_budget}")
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompts[{i}] has token ids outside [0, {vocab})")


def pack_by_length(costs, budget):
    """Indices grouped longest first, so that each group's size x its longest cost stays within budget
    (a padded batch costs rows x its longest row); one item over budget still gets a group of its own."""
    order = sorted(range(len(costs)), key=lambda i: -costs[i])
    groups, current = [], []
    for i in order:
        if current and (len(current) + 1) * costs[current[0]] > budget:
            groups.append(current)
            current = []
        current.append(i)
    return groups + [current] if current else groups


def plan_chunks(prompts, n, max_new_tokens, token_budget):
    """Prompt indices grouped so each chunk's cache (rows x slots) stays within the token budget."""
    return pack_by_length([n * (len(p) + max_new_tokens) for p in prompts], token_budget)


# -----------------------------------------------------------------------------
# Generation


PREFILL_TOKENS = 8192  # prompt tokens per prefill forward: bounds its activations (attention scores grow as rows x L^2)


def prefill(model, prompts, n, room, pad_id):
    """Left-pad and prefill the prompts once each, then repeat each prompt's cache row n times (a group shares
    its prefill); returns (cache with `room` free slots, next-token logits (B * n, vocab)). Rows go through the
    model PREFILL_TOKENS at a time, each piece written into its rows of the one cache."""
    device = model.lm_head.weight.device
    B, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p)
    cache = model.new_cache(B, L + room)
    cache.pad = torch.tensor([L - len(p) for p in prompts], device=device)
    piece = max(1, PREFILL_TOKENS // L)
    logits = torch.cat([model(ids[i:i + piece].to(device), cache=cache.rows(i, i + piece), last_only=True)[:, -1]
                        for i in range(0, B, piece)])  # (B, vocab): one prefill per prompt
    cache.advance(L)
    if n > 1:
        rows = torch.arange(B, device=device).repeat_interleave(n)
        cache.select(rows)
        logits = logits[rows]  # each of the n rows draws its own first token
    return cache, logits


def draw_tokens(logits, temperature, top_p, top_k, keys, positions, stop, results, result_ids):
    """Sample the next token of each live row, append it and its log-probability under the policy (softmax at
    temperature 1) to the row's Completion; returns (tokens, which rows drew a stop token)."""
    token, logp = sample_next(logits.float(), temperature, top_p, top_k, keys, positions)
    done = torch.isin(token, stop)
    logps = logp.tolist()
    if not all(math.isfinite(lp) for lp in logps):  # NaN or inf logits make every log-prob of their row NaN
        raise ValueError("the model's logits are not finite (NaN/inf): its weights or config.json (rope_theta, "
                         "rms_norm_eps) are broken, or training diverged; lower the learning rate or use another model")
    for r, t, lp, d in zip(result_ids.tolist(), token.tolist(), logps, done.tolist()):
        results[r].tokens.append(t)
        results[r].logprobs.append(lp)
        if d:
            results[r].finish_reason = "stop"
    return token, done


def decode_step(decode, cache, live, token, row_result, pad_id):
    """Feed the live rows' tokens (padding elsewhere) and return the next logits; compacts the finished rows
    out of the cache now and then (copying the cache is not free). Returns (logits, row_result)."""
    next_token = torch.full((cache.batch_size,), pad_id, dtype=torch.long, device=token.device)
    next_token[live] = token
    if int((row_result < 0).sum()) >= 0.25 * cache.batch_size:
        keep = (row_result >= 0).nonzero().squeeze(-1)
        cache.compact(keep)
        row_result, next_token = row_result[keep], next_token[keep]
    return decode(next_token[:, None], cache=cache, last_only=True)[:, -1], row_result


@dataclass
class Request:
    """One generate call, checked: what a decode engine reads beside the model. generate_chunk below reads its
    fields; batching.py's engines reach this file's prefill, draw and decode step through its methods (sample.py
    imports batching.py, so batching.py cannot import it back)."""
    prompts: list  # token id lists
    n: int  # samples per prompt (a GRPO group)
    max_new_tokens: int
    sampling: tuple  # (temperature, top_p, top_k)
    seeds: list  # one int per prompt (prompt_seeds)
    stop_token_ids: object  # ids that end a row
    pad_id: int
    progress: object  # progress(live rows, rows finished) after each draw (Progress), or None

    def start(self, prompt_ids, device):
        """Empty Completions of prompts `prompt_ids` (n each, in order), each one's sampling key, the stop ids."""
        results = [Completion(prompt_index=i) for i in prompt_ids for _ in range(self.n)]
        keys = row_keys(torch.tensor([self.seeds[i] for i in prompt_ids], dtype=torch.int64, device=device), self.n)
        return results, keys, torch.tensor(sorted(self.stop_token_ids), dtype=torch.long, device=device)

    def prefill(self, model, prompt_ids, room):
        return prefill(model, [self.prompts[i] for i in prompt_ids], self.n, room, self.pad_id)

    def draw(self, logits, keys, positions, stop, results, result_ids):
        return draw_tokens(logits, *self.sampling, keys, positions, stop, results, result_ids)

    def decode_step(self, decode, cache, live, token, row_result):
        return decode_step(decode, cache, live, token, row_result, self.pad_id)


@torch.inference_mode()
def generate_chunk(model, request, chunk, decode):
    """Complete prompts `chunk` of the request: n rows each, in order chunk[0] sample 0..n-1, chunk[1], ...
    `decode` runs the one-token steps: the model itself, or its torch.compile'd forward."""
    results, keys, stop = request.start(chunk, model.lm_head.weight.device)
    cache, logits = prefill(model, [request.prompts[i] for i in chunk], request.n, request.max_new_tokens,
                            request.pad_id)
    row_result = torch.arange(len(results), device=keys.device)  # result index of each cache row; -1 once finished
    for position in range(request.max_new_tokens):  # the completion's token index (not a training step)
        live = (row_result >= 0).nonzero().squeeze(-1)  # cache rows still generating
        token, done = draw_tokens(logits[live], *request.sampling, keys[row_result[live]], position, stop, results,
                                  row_result[live])
        if request.progress:
            request.progress(len(live), int(done.sum()))
        row_result[live[done]] = -1
        if position == request.max_new_tokens - 1 or not bool((row_result >= 0).any()):
            break
        logits, row_result = decode_step(decode, cache, live, token, row_result, request.pad_id)
    return results


def generate_chunks(model, request, token_budget, decode):
    """Every prompt, in chunks whose cache fits the token budget (plan_chunks), each decoded until its longest row
    ends; the Completions in order prompt 0 sample 0..n-1, prompt 1, ..."""
    n, results = request.n, [None] * (len(request.prompts) * request.n)
    for chunk in plan_chunks(request.prompts, n, request.max_new_tokens, token_budget):
        out = generate_chunk(model, request, chunk, decode)
        for k, i in enumerate(chunk):
            results[i * n:(i + 1) * n] = out[k * n:(k + 1) * n]
        if request.progress:  # rows that ran to the length count too
            request.progress.rows_done = sum(r is not None for r in results)
    return results


def prompt_seeds(seed, count):
    """One int seed per prompt: seed[i], or for an int seed a hash of (seed, i), so nearby seeds share no streams;
    None draws a seed."""
    if seed is None:
        seed = int(torch.randint(2**31, ()))
    if isinstance(seed, int):
        index = torch.arange(count) * 0x27D4EB2F
        seed = hash32((hash32(torch.tensor(seed & MASK32)) + index) & MASK32).tolist()
    seeds = list(seed)
    if len(seeds) != count or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"seed must be an int or a list of {count} ints (one per prompt), got {seed!r}")
    return seeds


class Progress:
    """generate(progress=...): counts drawn tokens and finished rows, and reports them to `progress`: a callable
    progress(tokens_done, rows_done, rows_total, seconds), or True for a line on stderr every 2 seconds."""

    def __init__(self, progress, rows_total):
        self.progress, self.rows_total = progress, rows_total
        self.tokens, self.rows_done, self.t0, self.last = 0, 0, time.time(), 0.0

    def __call__(self, live_rows, rows_finished):
        self.tokens += live_rows
        self.rows_done += rows_finished
        seconds = time.time() - self.t0
        if callable(self.progress):
            self.progress(self.tokens, self.rows_done, self.rows_total, seconds)
        elif seconds - self.last > 2.0:
            self.last = seconds
            print(f"\rgenerate: {self.tokens} tokens, {self.rows_done}/{self.rows_total} rows done, "
                  f"{self.tokens / max(seconds, 1e-9):.1f} tok/s", end="", file=sys.stderr, flush=True)

    def end(self):
        if self.progress is True:
            print(file=sys.stderr)


def generate(model, prompts, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, n=1, stop_token_ids=(),
             seed=None, token_budget=None, pad_id=0, progress=None, compile=False, slots=None, static=None):
    """Complete each prompt (a list of token ids) n times; returns len(prompts) * n Completions, in order
    prompt 0 sample 0..n-1, prompt 1 sample 0..n-1, ...

    temperature=0 is greedy. `seed` (an int, or one int per prompt) makes sampling reproducible: prompt i
    is drawn with a hash of (seed, i), or with seed[i]; a prompt's samples depend on nothing else.
    `token_budget` bounds the KV cache (rows x slots) of one chunk. `progress` is True for a progress line on
    stderr, or a callable progress(tokens_done, rows_done, rows_total, seconds).

    The engine, the completions the same in each: chunks (generate_chunks), unless
    - `slots` (rows): continuous batching (batching.generate_slots): at most that many rows decode together and
      waiting prompts take the places of finished rows, instead of chunks that each run until their longest row.
      0 picks the most rows the token budget holds;
    - `static=True`: continuous batching with one fixed shape per decode step (batching.generate_static, `slots`
      rows), on CUDA captured in a CUDA graph. It is what `compile=True` means on CUDA (static=None: static
      exactly then).
    `compile=True` elsewhere runs the decode steps through torch.compile with dynamic shapes (one graph for every
    cache length and batch size); on a CPU that is slower and its first call compiles for minutes
    (research/sampler/README.md, "Continuous batching, the static step, `--compile`").
    """
    prompts = [list(p) for p in prompts]
    if not prompts:
        return []
    token_budget = token_budget or default_token_budget(model)
    check_request(model, prompts, max_new_tokens, temperature, top_p, top_k, n, token_budget)
    counter = Progress(progress, len(prompts) * n) if progress is not None else None
    request = Request(prompts, n, max_new_tokens, (temperature, top_p, top_k), prompt_seeds(seed, len(prompts)),
                      stop_token_ids, pad_id, counter)
    on_cuda = model.lm_head.weight.device.type == "cuda"
    if static or (static is None and compile and on_cuda):
        results = batching.generate_static(model, request, token_budget, slots, graph=on_cuda)
    else:
        decode = torch.compile(model, dynamic=True) if compile else model  # compiled once per model, then cached
        if slots is not None:
            results = batching.generate_slots(model, request, token_budget, slots, decode)
        else:
            results = generate_chunks(model, request, token_budget, decode)
    if counter:
        counter.end()
    return results
