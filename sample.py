"""
Our own batched sampler on the KV cache: token ids -> completions with log-probs.

How a call runs:
1. Prompts are sorted by length (less padding) and split into chunks whose KV cache fits a token budget.
2. Each chunk is left-padded and prefilled once per prompt; the cache is then copied n times, so the n
   samples of one prompt (a GRPO group) share the prefill, and each sample draws its own first token.
3. Decoding feeds one token per live row; finished rows are compacted out of the batch (and the cache),
   so they stop costing compute.
4. Every generated token gets its log-probability under the distribution it was drawn from (the softmax at the
   temperature, cut by top-k/top-p and renormalized), which training's importance ratios need.
Engines, the completions the same in each: chunks (steps 1-3, generate_chunks), unless generate gets
- `slots` (rows): continuous batching (batching.generate_slots, what evaluation uses): at most that many rows decode
  together and waiting prompts take the places of finished rows, instead of chunks that each run until their
  longest row; 0 picks the most rows the token budget holds;
- `static=True`: continuous batching with one fixed shape per decode step (batching.generate_static, `slots` rows),
  on CUDA captured in a CUDA graph. It is what `compile=True` means on CUDA (static=None: static exactly then).
A model with position coupling (coupled.py) always runs on chunks, whose cache keeps the tokens its positions read.
`compile=True` elsewhere runs the decode steps through torch.compile with dynamic shapes (one graph for every cache
length and batch size); on a CPU that is slower and its first call compiles for minutes (research/sampler/README.md,
"Continuous batching, the static step, `--compile`").

Randomness is per row: sample j of prompt i draws with torch.multinomial from its own torch.Generator, seeded by
(the prompt's seed, j). So a prompt's samples do not depend on which other prompts share its batch, on chunking,
on compaction, on continuous batching's joins or, in training over several processes, on which rank drew it.
(The exact counter-based inverse-CDF draw this replaced is research/sampler/exact_draw.py.)
"""

import sys
import time
from dataclasses import dataclass, field

import torch

import batching


@dataclass
class Completion:
    prompt_index: int  # which prompt this completion answers
    tokens: list = field(default_factory=list)  # generated ids, the stop token included when one ended it
    logprobs: list = field(default_factory=list)  # log q(token) of the distribution drawn from (sample_next)
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


def row_generators(seeds, n, device):
    """One torch.Generator per row, sample j of prompt i seeded by (seeds[i], j): a row's draws depend on its own seed
    and the tokens it drew before, never on which other rows share its batch, chunk or process."""
    return [torch.Generator(device).manual_seed((seed * 1_000_003 + j) % 2**63) for seed in seeds for j in range(n)]


NOT_FINITE = ("the model's logits are not finite (NaN/inf): its weights or config.json (rope_theta, rms_norm_eps) "
              "are broken, or training diverged; lower the learning rate or use another model")


def sampling_logprobs(logits, temperature, top_p, top_k):
    """log q (B, vocab) of the distribution a row is drawn from: softmax(logits / temperature), cut to the top_k
    most probable tokens, then to the nucleus (Holtzman et al. 2020: the fewest most probable tokens whose mass
    reaches top_p), each cut renormalized; -inf outside."""
    z = logits / temperature if temperature != 1.0 else logits
    logq = z - z.logsumexp(-1, keepdim=True)
    if not torch.isfinite(logq.amax(-1)).all():  # NaN or inf logits make a row's every log-prob NaN
        raise ValueError(NOT_FINITE)
    if 0 < top_k < logq.shape[-1]:
        kth = logq.topk(top_k, -1).values[:, -1:]
        logq = logq.masked_fill(logq < kth, float("-inf")).log_softmax(-1)
    if top_p < 1.0:
        p, order = logq.exp().sort(-1, descending=True)
        outside = p.cumsum(-1) - p >= top_p  # the tokens before it already hold top_p
        logq = logq.masked_fill(outside.scatter(-1, order, outside), float("-inf")).log_softmax(-1)
    return logq


def sample_next(logits, temperature, top_p, top_k, generators):
    """Next token ids (B,) from logits (B, vocab), and their log-probs under the distribution drawn from (tempered and
    cut as asked), which training's importance ratios divide by: greedy at temperature 0 (the log-prob then the
    policy's own), else one torch.multinomial draw per row from that row's generator."""
    logq = sampling_logprobs(logits, temperature or 1.0, 1.0 if temperature == 0 else top_p, top_k)
    if temperature == 0:
        token = logits.argmax(-1)
    else:
        q = logq.exp()
        token = torch.cat([torch.multinomial(row, 1, generator=g) for row, g in zip(q, generators)])
    return token, logq.gather(-1, token[:, None]).squeeze(-1)


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
    context, vocab = model.config.max_position_embeddings, model.config.vocab_size
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
    """Left-pad and prefill the prompts once each (PREFILL_TOKENS at a time), then repeat each prompt's cache row n
    times (a group shares its prefill); returns (cache with `room` free slots, next-token logits (B * n, vocab))."""
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


def draw_tokens(logits, temperature, top_p, top_k, generators, stop, results, result_ids):
    """Sample the next token of each live row (result_ids: its Completion's index in results and generators), append
    it and its log-probability under the distribution drawn from; returns (tokens, which rows drew a stop token)."""
    rows = [generators[r] for r in result_ids.tolist()]
    token, logp = sample_next(logits.float(), temperature, top_p, top_k, rows)
    done = torch.isin(token, stop)
    for r, t, lp, d in zip(result_ids.tolist(), token.tolist(), logp.tolist(), done.tolist()):
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
    fields; batching.py's engines reach this file's prefill, draw_tokens and decode_step through its methods,
    named apart from them (sample.py imports batching.py, so batching.py cannot import it back)."""
    prompts: list  # token id lists
    n: int  # samples per prompt (a GRPO group)
    max_new_tokens: int
    sampling: tuple  # (temperature, top_p, top_k)
    seeds: list  # one int per prompt (prompt_seeds)
    stop_token_ids: object  # ids that end a row
    pad_id: int
    progress: object  # progress(live rows, rows finished) after each draw (Progress), or None

    def start(self, prompt_ids, device):
        """Empty Completions of prompts `prompt_ids` (n each, in order), each one's generator, the stop ids."""
        results = [Completion(prompt_index=i) for i in prompt_ids for _ in range(self.n)]
        generators = row_generators([self.seeds[i] for i in prompt_ids], self.n, device)
        return results, generators, torch.tensor(sorted(self.stop_token_ids), dtype=torch.long, device=device)

    def prefill_prompts(self, model, prompt_ids, room):
        return prefill(model, [self.prompts[i] for i in prompt_ids], self.n, room, self.pad_id)

    def draw_next(self, logits, generators, stop, results, result_ids):
        return draw_tokens(logits, *self.sampling, generators, stop, results, result_ids)

    def decode_next(self, decode, cache, live, token, row_result):
        return decode_step(decode, cache, live, token, row_result, self.pad_id)


@torch.inference_mode()
def generate_chunk(model, request, chunk, decode):
    """Complete prompts `chunk` of the request: n rows each, in order chunk[0] sample 0..n-1, chunk[1], ...
    `decode` runs the one-token steps: the model itself, or its torch.compile'd forward."""
    results, generators, stop = request.start(chunk, model.lm_head.weight.device)
    cache, logits = prefill(model, [request.prompts[i] for i in chunk], request.n, request.max_new_tokens,
                            request.pad_id)
    row_result = torch.arange(len(results), device=stop.device)  # result index of each cache row; -1 once finished
    for position in range(request.max_new_tokens):  # the completion's token index (not a training step)
        live = (row_result >= 0).nonzero().squeeze(-1)  # cache rows still generating
        token, done = draw_tokens(logits[live], *request.sampling, generators, stop, results, row_result[live])
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
    """One int seed per prompt: seed[i], or for an int seed (seed, i) made one number; None draws a seed."""
    seed = int(torch.randint(2**31, ())) if seed is None else seed
    seeds = [(seed * 100_003 + i) % 2**63 for i in range(count)] if isinstance(seed, int) else list(seed)
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

    temperature=0 is greedy. `seed` (an int, or one int per prompt) makes sampling reproducible: prompt i is drawn
    with (seed, i), or with seed[i]; a prompt's samples depend on nothing else. `token_budget` bounds the KV cache
    (rows x slots) of one chunk. `progress`: True for a line on stderr, or progress(tokens, rows done, rows, seconds).
    The engine (the module docstring's "Engines"): chunks, unless `slots` or `static` (batching.py); `compile`.
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
    slots, static = (None, False) if model.config.position_coupling else (slots, static)  # coupled.py: chunks
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
