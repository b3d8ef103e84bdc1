"""
Continuous batching, beside sample.py's chunks: the same completions, decoded as rows that waiting prompts join.

sample.generate comes here with `slots` (what evaluation uses) or `static` (what `compile` means on CUDA):
- generate_slots: at most `slots` rows decode together; when a quarter of them have finished, waiting prompts
  are prefilled and joined to the running KV cache (join), so a few long rows no longer hold a whole chunk;
- generate_static: the same joins on a SlotCache, whose shapes never change, so its decode step (static_step) can
  be captured once in a CUDA graph and replayed.
A row draws from its own generator, seeded by (its prompt's seed, its sample index), so its draws depend on its
own tokens only and the completions are the chunked sampler's, whatever joins when (tests/test_batching.py).
The prefill, the draw and the decode step are sample.py's, reached through its Request.
"""

import torch

from model import KVCache

JOIN_FRACTION = 0.25  # waiting prompts join once this share of the slots is free: each join copies the cache

# -----------------------------------------------------------------------------
# Caches that rows join


def join(caches, room):
    """One KVCache holding the rows of `caches` in order, with `room` free slots after a common write index: each
    cache's filled slots move as one block so that all end there, and its pads grow by the shift, so every token
    keeps its position. Continuous batching adds prefilled prompts to the running cache this way."""
    caches = [c for c in caches if c.batch_size]
    spans = [(int(c.pad.min()), c.length) for c in caches]  # slots before the smallest pad hold nothing
    length = max(end - start for start, end in spans)
    passes, _, heads, _, dim = caches[0].k.shape
    out = KVCache.__new__(KVCache)
    shape = (passes, sum(c.batch_size for c in caches), heads, length + room, dim)
    out.k, out.v = caches[0].k.new_zeros(shape), caches[0].v.new_zeros(shape)
    out.pad = torch.cat([c.pad + (length - c.length) for c in caches])
    out.length, row = length, 0
    for c, (start, end) in zip(caches, spans):
        rows = slice(row, row + c.batch_size)
        out.k[:, rows, :, length - (end - start):length] = c.k[:, :, :, start:end]
        out.v[:, rows, :, length - (end - start):length] = c.v[:, :, :, start:end]
        row += c.batch_size
    return out


class SlotCache:
    """A cache whose shapes never change, so a decode step on it can be captured in a CUDA graph: `slots` rows
    of `max_len` slots, no padding. Row b holds its tokens at slots [0, lens[b]), so a token's slot is its
    position; a prompt joins by copying its prefill into a free row (`load`), and a step writes each row's new
    key and value at its own lens[b] and attends to slots <= lens[b]. Rows not `live` are written (harmlessly,
    at a slot a later join overwrites) but do not advance."""

    grouped_decode = True  # its decode step folds GQA into the query axis (model_kernels.grouped_decode_attention)

    def __init__(self, config, slots, max_len, device=None, dtype=torch.float32):
        shape = (config.layer_passes, slots, config.num_key_value_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lens = torch.zeros(slots, dtype=torch.long, device=device)
        self.live = torch.zeros(slots, dtype=torch.bool, device=device)
        self.rows = torch.arange(slots, device=device)
        self.slot = torch.arange(max_len, device=device)

    @property
    def max_len(self):
        return self.k.shape[3]

    def positions(self, T):
        return self.lens[:, None]  # one token per row per step (T = 1)

    def attention_mask(self, T):  # (B, 1, 1, S): each row's own tokens and the one written now
        return (self.slot[None, :] <= self.lens[:, None])[:, None, None]

    def update(self, layer, k, v):
        """Write each row's new key/value (B, H_kv, 1, D) at its own length; return the whole (static) rows."""
        assert k.shape[2] == 1, "a SlotCache takes one token per row per step; prefill into a KVCache and load it"
        at = self.lens.clamp(max=self.max_len - 1)  # a free row may sit at the end; a join rewrites it
        self.k[layer, self.rows, :, at] = k[:, :, 0]
        self.v[layer, self.rows, :, at] = v[:, :, 0]
        return self.k[layer], self.v[layer]

    def advance(self, T):
        self.lens += self.live * T

    def load(self, row, cache, i):
        """Row `row` takes row i of a prefilled KVCache (its filled slots, moved to start at slot 0)."""
        start, end = int(cache.pad[i]), cache.length
        if end - start > self.max_len:
            raise RuntimeError(f"SlotCache overflow: a {end - start}-token prefill > max_len {self.max_len}")
        self.k[:, row, :, :end - start] = cache.k[:, i, :, start:end]
        self.v[:, row, :, :end - start] = cache.v[:, i, :, start:end]
        self.lens[row], self.live[row] = end - start, True


# -----------------------------------------------------------------------------
# The engines


def fit_slots(request, slots, token_budget, row_len):
    """Rows decoding together: `slots`, or for 0 or None as many as the token budget holds at `row_len` cache slots
    a row; never more than the request's rows, and refused below one prompt's n samples."""
    slots = min(len(request.prompts) * request.n, slots or max(request.n, token_budget // row_len))
    if slots < request.n:
        raise ValueError(f"slots={slots} cannot hold the n={request.n} samples of one prompt")
    return slots


def wants_join(waiting, free, n_live, n, slots):
    """Waiting prompts join when all n samples of one fit and, unless nothing runs, a JOIN_FRACTION of the slots
    is free: each join costs a prefill (and, with a KVCache, a copy of the cache)."""
    return bool(waiting) and free >= n and (n_live == 0 or free >= max(n, JOIN_FRACTION * slots))


def draw_live(request, logits, row_result, generators, steps, stop, results):
    """The next token of every live row (row_result >= 0), each from its own generator (by result index); rows
    that stop or reach the budget are marked finished (-1). Returns (live rows, tokens)."""
    live = (row_result >= 0).nonzero().squeeze(-1)
    if not len(live):
        return live, None
    ids = row_result[live]
    token, done = request.draw_next(logits[live], generators, stop, results, ids)
    steps[ids] += 1
    finished = done | (steps[ids] >= request.max_new_tokens)
    if request.progress:
        request.progress(len(live), int(finished.sum()))
    row_result[live[finished]] = -1
    return live, token


@torch.inference_mode()
def generate_slots(model, request, token_budget, slots, decode):
    """Continuous batching: at most `slots` rows decode together, and when enough of them have finished the
    waiting prompts take their places (all n samples of a prompt at once, sharing its prefill), joined to the
    running cache at its write index (join). Returns the Completions in order prompt 0 sample 0..n-1, prompt 1, ..."""
    n, max_new_tokens = request.n, request.max_new_tokens
    room = max(len(p) for p in request.prompts) + 2 * max_new_tokens  # a join can leave a row max_new_tokens behind
    slots = fit_slots(request, slots, token_budget, room)
    device = model.lm_head.weight.device
    results, generators, stop = request.start(range(len(request.prompts)), device)  # by result index
    steps = torch.zeros(len(results), dtype=torch.long, device=device)  # tokens drawn so far, by result index
    waiting, cache, logits = list(range(len(request.prompts))), None, None
    row_result = torch.empty(0, dtype=torch.long, device=device)  # result index of each cache row; -1 finished
    while True:
        n_live = int((row_result >= 0).sum())
        free = slots - n_live
        if wants_join(waiting, free, n_live, n, slots):
            keep = (row_result >= 0).nonzero().squeeze(-1)  # finished rows leave the cache here
            old = [cache] if n_live else []
            if n_live:
                cache.select(keep)
                logits = logits[keep]
            row_result = row_result[keep]
            take, waiting = waiting[:free // n], waiting[free // n:]
            new_cache, new_logits = request.prefill_prompts(model, take, room=0)
            cache = join(old + [new_cache], room=max_new_tokens)
            logits = torch.cat([logits, new_logits]) if n_live else new_logits
            new_rows = torch.tensor([i * n + j for i in take for j in range(n)], dtype=torch.long, device=device)
            row_result = torch.cat([row_result, new_rows])
        live, token = draw_live(request, logits, row_result, generators, steps, stop, results)
        if not len(live):
            return results
        if bool((row_result >= 0).any()):
            logits, row_result = request.decode_next(decode, cache, live, token, row_result)


def static_step(model, cache, token, graph):
    """The decode step on a SlotCache: token (slots, 1) -> next-token logits (slots, vocab) of every row. With
    graph=True (CUDA) the step is captured once in a CUDA graph and replayed on the same buffers: one launch
    instead of a few hundred small kernels and their Python. The capture writes each row's slot 0 (no row is
    live yet, so none advances), which every join overwrites."""
    run = lambda: model(token, cache=cache, last_only=True)[:, -1]
    if not graph:
        return run
    side = torch.cuda.Stream()  # warm-up (cuBLAS workspaces, lazy inits) off the capture, as CUDA graphs need
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run()

    def replay():
        g.replay()
        return out
    return replay


@torch.inference_mode()
def generate_static(model, request, token_budget, slots, graph):
    """Continuous batching with a static decode step: generate_slots' joins and draws on a SlotCache of `slots`
    rows, so every step has one shape (free rows decode padding nobody reads) and a join copies only its own
    rows. The completions are generate_slots'. Returns them in order prompt 0 sample 0..n-1, prompt 1, ..."""
    n, pad_id = request.n, request.pad_id
    row_len = max(len(p) for p in request.prompts) + request.max_new_tokens  # a row's slots: it never moves
    slots = fit_slots(request, slots, token_budget, row_len)
    device = model.lm_head.weight.device
    results, generators, stop = request.start(range(len(request.prompts)), device)  # by result index
    steps = torch.zeros(len(results), dtype=torch.long, device=device)  # tokens drawn so far, by result index
    cache = model.new_cache(slots, row_len, kind=SlotCache)
    token = torch.full((slots, 1), pad_id, dtype=torch.long, device=device)  # the step's input buffer
    step = static_step(model, cache, token, graph)
    logits = torch.zeros(slots, model.config.vocab_size, dtype=cache.k.dtype, device=device)
    row_result = torch.full((slots,), -1, dtype=torch.long, device=device)  # result index of each row; -1 free
    waiting = list(range(len(request.prompts)))
    while True:
        free = (row_result < 0).nonzero().squeeze(-1)
        n_live = slots - len(free)
        if wants_join(waiting, len(free), n_live, n, slots):
            take, waiting = waiting[:len(free) // n], waiting[len(free) // n:]
            prefilled, new_logits = request.prefill_prompts(model, take, room=0)
            rows = free[:len(take) * n]
            for i, row in enumerate(rows.tolist()):
                cache.load(row, prefilled, i)
            logits[rows] = new_logits.to(logits.dtype)
            row_result[rows] = torch.tensor([i * n + j for i in take for j in range(n)], device=device)
        live, drawn = draw_live(request, logits, row_result, generators, steps, stop, results)
        if not len(live):
            return results
        if bool((row_result >= 0).any()):
            token.fill_(pad_id)
            token[live, 0] = drawn
            cache.live.copy_(row_result >= 0)
            logits = step()
