"""
Sampler throughput, ours against transformers' `generate`, side by side in one run.

For the Qwen3-0.6B shape with random bf16 weights on the CPU (2 threads): prompts of 128 tokens, 64 new
tokens, batch 1, 8 and 32; new tokens/s for both, the ratio, and our batch-1 decode as a fraction of the
memory-bandwidth limit (weight bytes read per step against a measured copy bandwidth).

    python research/sampler/bench_sample.py            # the full figure set (a few minutes)
    python research/sampler/bench_sample.py --temperature 1   # the same, both samplers drawing from the softmax
    python research/sampler/bench_sample.py --temperature 1 --layers 6 --batches 32   # 6 layers: sampling weighs more
    python research/sampler/bench_sample.py --quick    # a small shape, seconds
    python research/sampler/bench_sample.py --kernels  # the CPU products model_kernels.cpu_linear picks between:
                                             # one bf16 row (torch.mv or F.linear), 8-48 fp32 rows (W @ x.T or F.linear)
    python research/sampler/bench_sample.py --device cuda --compile   # on a GPU, with the compiled decode step too
    python research/sampler/bench_sample.py --ragged   # continuous batching against chunks, ragged output lengths
    python research/sampler/bench_sample.py --sampling # choosing the next token against one decode step, batch 32
    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 python research/sampler/bench_sample.py --sampling
                                             # the same with the memory kept, as a caching allocator does
    python research/sampler/bench_sample.py --device cuda --throughput  # nano-vllm- and RL-shaped workloads, roof
    python research/sampler/bench_sample.py --profile --temperature 1 --batches 1 32 --new-tokens 16
                                             # a decode step op by op, ours against transformers
    python research/sampler/bench_sample.py --memory   # a large tiny-world generate: peak memory, before and now

--ragged is an evaluation-shaped workload: 256 prompts whose outputs stop at lengths drawn from a long tail
(log-normal, median an eighth of the budget) with 10% of the rows running to the budget, through 6 layers of
the 0.6B widths (bf16 on CUDA, fp32 on the CPU as evaluation runs there); the chunked sampler (64 rows a
chunk) against generate(slots=64) and generate(slots=64, static=True) (one shape per step; on CUDA a captured
CUDA graph), same outputs asserted.
"""

import argparse
import contextlib
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the core, and research.*
import batching  # noqa: E402
import checkpoint  # noqa: E402
import model as M  # noqa: E402
import model_kernels as K  # noqa: E402
import sample as S  # noqa: E402
from research.sampler import exact_draw as E  # noqa: E402
from research.sampler.exact_draw import (MASK32, block_sums, hash32, inverse_cdf, kept_tokens, row_keys,  # noqa: E402
                                         sample_next, surely_inside, uniform)
from sample import generate  # noqa: E402


def copy_bandwidth(device="cpu", nbytes=512 * 2**20, repeats=5):
    """Bytes/s of a large tensor copy (read + write counted), the best of a few repeats."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * nbytes / best


def timed(fn):
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    sync()
    t = time.perf_counter()
    fn()
    sync()  # GPU work is asynchronous: the clock stops when it is done, not when it is queued
    return time.perf_counter() - t


def one_row_kernels(threads, repeats=5, total_bytes=600 * 2**20):
    """GB/s of weight read by a one-row bf16 product, torch.mv against F.linear (what model_kernels.cpu_linear
    chooses between), over enough distinct weights that they come from memory, not cache."""
    for n_out, n_in in [(3072, 1024), (1024, 3072)]:
        weights = [torch.randn(n_out, n_in, dtype=torch.bfloat16) for _ in range(total_bytes // (2 * n_out * n_in))]
        v = torch.randn(n_in, dtype=torch.bfloat16)
        x = v[None]
        rates = {"mv": [], "linear": []}
        for _ in range(repeats):  # alternated, medians
            rates["mv"].append(total_bytes / timed(lambda: [torch.mv(w, v) for w in weights]))
            rates["linear"].append(total_bytes / timed(lambda: [torch.nn.functional.linear(x, w) for w in weights]))
        mv, lin = (statistics.median(r) / 1e9 for r in rates.values())
        print(f"one row x ({n_out}, {n_in}) bf16, {threads} threads: torch.mv {mv:.1f} GB/s, F.linear {lin:.1f} GB/s "
              f"({mv / lin:.2f}x); copy bandwidth {copy_bandwidth() / 1e9:.1f} GB/s")


def few_row_kernels(repeats=5, batches=(2, 4, 8, 13, 16, 32, 48, 64)):
    """float32 products of a few rows through model.Linear (model_kernels.cpu_linear), its weight-left product
    (W @ x.T) turned on at every row count against off (F.linear, x @ W.T), alternated, medians; then a whole
    decode step of 6 layers of the 0.6B widths (full vocabulary, 200-token cache) with FP32_ROWS_WEIGHT_LEFT as
    it is against off."""
    on, everywhere, nowhere = K.FP32_ROWS_WEIGHT_LEFT, (2, 64), (0, -1)  # cpu_linear's own choice, toggled
    for n_out, n_in, name in [(151936, 1024, "lm_head"), (3072, 1024, "mlp up"), (1024, 3072, "mlp down")]:
        layers = [torch.nn.utils.skip_init(M.Linear, n_in, n_out, bias=False)
                  for _ in range(max(1, 2**28 // (4 * n_out * n_in)))]  # 256 MB of weights: read from memory
        for layer in layers:
            torch.nn.init.normal_(layer.weight)
        ratios = []
        for b in batches:
            x, t = torch.randn(b, n_in), {everywhere: [], nowhere: []}

            @torch.inference_mode()
            def products(choice):
                K.FP32_ROWS_WEIGHT_LEFT = choice
                return [layer(x) for layer in layers]
            for _ in range(repeats):
                for choice in t:
                    t[choice].append(timed(lambda: products(choice)))
            ratios.append(f"{b}: {statistics.median(t[nowhere]) / statistics.median(t[everywhere]):.2f}x"
                          + ("*" if on[0] <= b <= on[1] else ""))
        K.FP32_ROWS_WEIGHT_LEFT = on
        print(f"({n_out}, {n_in}) float32 {name}, F.linear time / W @ x.T time by rows: " + ", ".join(ratios))
    print(f"  (* rows model_kernels.cpu_linear sends to W @ x.T: FP32_ROWS_WEIGHT_LEFT = {on})")
    config = M.Qwen3Config(num_hidden_layers=6)
    torch.manual_seed(0)
    model, context = M.Qwen3(config).eval(), 200
    for b in batches:
        cache = model.new_cache(b, context + 1)
        token, t, logits = torch.randint(0, 1000, (b, 1)), {on: [], nowhere: []}, {}

        @torch.inference_mode()
        def step(choice):  # the choice on or off, at the same 200-token cache each time
            K.FP32_ROWS_WEIGHT_LEFT, cache.length = choice, context
            logits[choice] = model(token, cache=cache, last_only=True)
        with torch.inference_mode():
            model(torch.randint(0, 1000, (b, context)), cache=cache, last_only=True)
        for _ in range(repeats):
            for choice in t:
                t[choice].append(timed(lambda: step(choice)))
        K.FP32_ROWS_WEIGHT_LEFT = on
        same = bool((logits[on].argmax(-1) == logits[nowhere].argmax(-1)).all())
        print(f"decode step, 6 float32 layers, {b:2d} rows: {statistics.median(t[nowhere]) * 1e3:6.1f} ms F.linear "
              f"everywhere, {statistics.median(t[on]) * 1e3:6.1f} ms as model_kernels.cpu_linear picks "
              f"({statistics.median(t[nowhere]) / statistics.median(t[on]):.2f}x); greedy tokens the same: {same}")


def build_pair(config, dtype):
    """transformers' Qwen3ForCausalLM with random weights, and ours sharing the very same tensors."""
    import transformers
    hc = transformers.Qwen3Config(**{k: v for k, v in config.to_hf_dict().items() if k != "torch_dtype"})
    torch.manual_seed(0)
    ref = transformers.Qwen3ForCausalLM(hc).to(dtype).eval()
    with torch.device("meta"):
        ours = M.Qwen3(config)
    ours.load_state_dict(ref.state_dict(), assign=True)
    if config.tie_word_embeddings:
        ours.lm_head.weight = ours.model.embed_tokens.weight
    return ours.eval(), ref


def run_ours(model, prompts, new_tokens, compile=False, temperature=0.0):
    out = generate(model, prompts, new_tokens, temperature=temperature, compile=compile)
    assert all(len(o.tokens) == new_tokens for o in out)


def run_transformers(ref, prompts, new_tokens, temperature=0.0):
    """Greedy, or at temperature > 0 plain sampling from the whole softmax (top_k=0: transformers' default
    for sampling is 50), as ours samples."""
    sampling = dict(temperature=temperature, top_k=0, top_p=1.0) if temperature else {}
    with torch.inference_mode():
        ids = torch.tensor(prompts, device=ref.device)
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, pad_token_id=0, do_sample=bool(temperature), **sampling)
    assert out.shape[1] == len(prompts[0]) + new_tokens


class ScriptedLengths(torch.nn.Module):
    """The --ragged / --throughput harness: the model's whole forward runs, then its logits are overwritten so
    that the row whose prompt ends in token r repeats r and draws the stop token (0) as its lengths[r]-th token,
    so every sampler sees the same ragged workload at the real model's cost. prompt_lens[r]: row r's prompt."""

    def __init__(self, model, prompt_lens, lengths):
        super().__init__()
        self.model, self.lm_head, self.config, self.new_cache = model, model.lm_head, model.config, model.new_cache
        # indexed by the row's token; on the model's device, so a captured step copies nothing from the host
        device = model.lm_head.weight.device
        self.prompt_lens = torch.tensor([0, *prompt_lens], device=device)
        self.lengths = torch.tensor([0, *lengths], device=device)

    def forward(self, ids, cache, last_only):
        logits = self.model(ids, cache=cache, last_only=last_only)
        row = ids[:, -1]
        filled = cache.lens if isinstance(cache, batching.SlotCache) else cache.length - cache.pad
        made = filled - self.prompt_lens[row]  # tokens each row has generated so far
        forced = torch.where(made + 1 >= self.lengths[row], 0, row)
        return torch.full_like(logits, float("-inf")).scatter_(-1, forced[:, None, None], 0.0)


class StopAtLength:
    """The same scripted lengths for transformers' generate (a logits processor): row i draws token 0, its
    end of sequence, as its lengths[i]-th new token, and repeats its last prompt token before that."""

    def __init__(self, prompt_width, lengths):
        self.width, self.lengths = prompt_width, torch.tensor(lengths)

    def __call__(self, input_ids, scores):
        made = input_ids.shape[1] - self.width
        forced = torch.where(made + 1 >= self.lengths.to(scores.device), 0, input_ids[:, self.width - 1])
        return torch.full_like(scores, float("-inf")).scatter_(-1, forced[:, None], 0.0)


def ragged(args):
    """Chunks (today's default) against continuous batching on the same scripted ragged workload."""
    config = (M.Qwen3Config(num_hidden_layers=2, hidden_size=256, intermediate_size=768, vocab_size=8192) if args.quick
              else M.Qwen3Config(num_hidden_layers=6))
    torch.manual_seed(0)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16  # what evaluation runs in on each
    model = M.Qwen3(config).to(dtype).to(args.device).eval()
    rows, budget, prompt_len, slots = (64, 32, 16, 16) if args.quick else (256, args.ragged_budget, 64, 64)
    g = torch.Generator().manual_seed(0)
    lengths = torch.exp(torch.randn(rows, generator=g) + torch.log(torch.tensor(budget / 8))).ceil().long()
    lengths = lengths.clamp(1, budget).tolist()
    for i in torch.randperm(rows, generator=g)[:rows // 10].tolist():
        lengths[i] = budget + 1  # never stops: runs to the budget
    harness = ScriptedLengths(model, [prompt_len] * rows, lengths)
    prompts = [[r + 1] * prompt_len for r in range(rows)]
    runs = {f"chunks of {slots} rows": lambda progress=None: [c for i in range(0, rows, slots) for c in generate(
                harness, prompts[i:i + slots], budget, temperature=0, stop_token_ids={0}, progress=progress)],
            f"slots={slots}": lambda progress=None: generate(harness, prompts, budget, temperature=0,
                                                             stop_token_ids={0}, slots=slots, progress=progress),
            f"static, slots={slots}": lambda progress=None: generate(harness, prompts, budget, temperature=0,
                                                                     stop_token_ids={0}, slots=slots, static=True,
                                                                     progress=progress)}
    steps = {name: [] for name in runs}  # (tokens so far in this generate call, clock) at every decode step
    prefills = {name: [] for name in runs}  # (clock at its end, seconds) of every prefill
    with timed_prefills() as ends:
        made = {}
        for name, run in runs.items():
            made[name] = [c.tokens for c in run(lambda tokens, *_, name=name: steps[name].append(
                (tokens, time.perf_counter())))]
            prefills[name], ends[:] = list(ends), []
    assert all(m == made[f"chunks of {slots} rows"] for m in made.values()), "the samplers' outputs differ"
    n_tokens = sum(map(len, made[f"chunks of {slots} rows"]))
    print(f"ragged: {rows} prompts of {prompt_len} tokens, budget {budget}, {M.count_parameters(config) / 1e6:.0f}M "
          f"parameters {str(dtype).removeprefix('torch.')}, {args.device}; {n_tokens} tokens generated (mean {n_tokens / rows:.1f}, "
          f"{sum(x > budget for x in lengths)} rows at the budget); outputs identical")
    for name, log in steps.items():  # where each run's time went, by the rows drawing a token in the step
        live = [t - (prev if t > prev else 0) for (prev, _), (t, _) in zip([(0, 0)] + log, log)]
        seconds = [b - a for (_, a), (_, b) in zip(log, log[1:])]  # step i+1's forward, draws and any joins
        bands = [(1, slots // 4), (slots // 4 + 1, 3 * slots // 4), (3 * slots // 4 + 1, slots)]
        where = [(sum(b0 <= r <= b1 for r in live[1:]), sum(s for r, s in zip(live[1:], seconds) if b0 <= r <= b1))
                 for b0, b1 in bands]
        print(f"  {name}: {len(log)} steps, {n_tokens / len(log):.1f} rows a step; steps of "
              + ", ".join(f"{b0}-{b1} rows: {n} taking {s:.1f} s" for (b0, b1), (n, s) in zip(bands, where)))
    times = {name: [] for name in runs}
    for _ in range(args.repeats):  # alternated, medians
        for name, run in runs.items():
            times[name].append(timed(run))
    base = statistics.median(times[f"chunks of {slots} rows"])
    for name, t in times.items():
        print(f"  {name:>18}: {n_tokens / statistics.median(t):7.1f} tok/s, {base / statistics.median(t):.2f}x "
              f"the chunks (median of {args.repeats})")
    fitted = [f"chunks of {slots} rows", f"slots={slots}"]  # the static step pays every slot, whatever is live
    a, b, fit_steps = step_cost_fit([row for name in fitted for row in step_rows(steps[name], prefills[name])])
    prefill = {name: sum(s for _, s in prefills[name]) for name in fitted}
    modelled = {name: prefill[name] + sum(a + b * rows for rows, _ in step_rows(steps[name], [])) for name in fitted}
    fewest = max(-(-n_tokens // slots), budget)  # every step draws at most `slots` tokens; a budget row needs budget
    bound = min(prefill.values()) + fewest * a + n_tokens * b
    print(f"  cost model (least squares over {fit_steps} decode steps of the chunks and slots runs, prefills apart): "
          f"a step costs {a * 1e3:.1f} ms + {b * 1e3:.2f} ms a row drawing; prefills "
          + " / ".join(f"{prefill[name]:.1f}" for name in fitted) + " s; modelled "
          + " / ".join(f"{modelled[name]:.1f}" for name in fitted) + " s against "
          + " / ".join(f"{statistics.median(times[name]):.1f}" for name in fitted) + f" s measured. No {slots}-slot "
          f"schedule takes fewer than {fewest} steps, so none runs this workload in under {bound:.1f} s: at most "
          f"{base / bound:.2f}x the chunks")


@contextlib.contextmanager
def timed_prefills():
    """Clock every sample.prefill call (generate looks it up at each call): yields the list of (end, seconds)."""
    ends, real = [], S.prefill

    def prefill(*args):
        t = time.perf_counter()
        out = real(*args)
        end = time.perf_counter()
        ends.append((end, end - t))
        return out
    S.prefill = prefill
    try:
        yield ends
    finally:
        S.prefill = real


def step_rows(log, prefills):
    """(rows drawing a token, seconds) of every interval between two progress calls that held no prefill: one
    decode step and the draws after it. The token count restarts with each generate call (each chunk)."""
    rows = []
    for (prev, t0), (tokens, t1) in zip(log, log[1:]):
        if tokens > prev and not any(t0 < end <= t1 for end, _ in prefills):
            rows.append((tokens - prev, t1 - t0))
    return rows


def step_cost_fit(rows):
    """Least squares of seconds = a + b x rows over (rows, seconds) pairs: (a, b, how many)."""
    n, x, y = len(rows), [r for r, _ in rows], [s for _, s in rows]
    mx, my = sum(x) / n, sum(y) / n
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sum((xi - mx) ** 2 for xi in x)
    return my - b * mx, b, n


def memory(args):
    """One large sampled generate on the tiny world, as a rounds.py deliberation makes (the first --memory-rows
    tiny_ladder_train problems, 128 new tokens at temperature 1, one chunk): peak resident memory above the
    loaded model, and wall time, now against the sampler before (every row in one prefill forward; finished rows
    compacted by copying the cache). Each run is a fresh process, so its peak is its own; alternated, medians."""
    runs = {"before": [], "now": []}
    for _ in range(args.repeats):
        for arm, results in runs.items():
            out = subprocess.run([sys.executable, __file__, "--memory-arm", arm, "--memory-rows", str(args.memory_rows),
                                  "--threads", str(args.threads)], capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.splitlines()[-1]))
    assert len({r["digest"] for rs in runs.values() for r in rs}) == 1, "the completions differ"
    first = runs["now"][0]
    print(f"memory: {args.memory_rows} tiny_ladder_train prompts (longest {first['longest']} tokens), 128 new tokens "
          f"at T = 1, {args.threads} threads; KV cache {first['cache_gib']:.2f} GiB; {first['tokens']} tokens, "
          f"completions identical")
    for arm, rs in runs.items():
        peak, seconds = statistics.median(r["peak_gib"] for r in rs), statistics.median(r["seconds"] for r in rs)
        print(f"  {arm:>6}: peak {peak:.2f} GiB above the loaded model ({peak / first['cache_gib']:.1f}x the cache), "
              f"{seconds:.1f} s (medians of {args.repeats})")


def memory_arm(args):
    """One --memory run in this process; prints its figures as a JSON line."""
    import problems as P
    model, tokenizer = checkpoint.load_model("tiny"), checkpoint.load_tokenizer("tiny")
    if args.memory_arm == "before":
        S.PREFILL_TOKENS = 2**62  # one forward for every row
        M.KVCache.compact = M.KVCache.select  # the same rows, copied into a new cache
    prompts = [tokenizer.encode(P.format_prompt(p["problem"], "base"))
               for p in P.load_problems("tiny_ladder_train", limit=args.memory_rows)]
    resident = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    t = time.perf_counter()
    out = generate(model, prompts, 128, temperature=1.0, seed=0, pad_id=tokenizer.pad_id,
                   stop_token_ids=tokenizer.stop_token_ids(chat=False))
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    longest = max(map(len, prompts))
    cache = len(prompts) * (longest + 128) * S.kv_bytes_per_token(model)
    print(json.dumps(dict(peak_gib=(peak - resident) / 2**30, seconds=seconds, cache_gib=cache / 2**30, longest=longest,
                          tokens=sum(len(c.tokens) for c in out),
                          digest=hashlib.sha256(repr([c.tokens for c in out]).encode()).hexdigest())))


def throughput(args):
    """The GPU throughput figures, ours beside transformers' generate on the same scripted lengths: a
    nano-vllm-shaped workload (256 sequences, prompt and output lengths uniform in [100, 1024]) and an
    RL-shaped one (16 prompts x 16 samples x 512 tokens), random Qwen3-0.6B weights, bf16 on CUDA. Output
    tokens/s and the fraction of the bandwidth roof: at batch B a decode step must read the weights once and
    each row's keys and values, so B tokens cost (weight bytes + B x mean context x KV bytes per token) /
    bandwidth (the measured copy bandwidth)."""
    quick = args.quick
    config = M.Qwen3Config(num_hidden_layers=2, hidden_size=256, intermediate_size=768, vocab_size=8192) if quick \
        else M.Qwen3Config()
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    ours, ref = build_pair(config, dtype)
    ours, ref = ours.to(args.device), ref.to(args.device)
    g = torch.Generator().manual_seed(0)
    short, long, n_seq = (8, 32, 16) if quick else (100, 1024, 256)
    uniform = lambda n: torch.randint(short, long + 1, (n,), generator=g).tolist()
    rl_prompts, rl_n, rl_len = (2, 4, 16) if quick else (16, 16, 512)
    workloads = {"nano-vllm (256 seqs)" if not quick else "ragged": (uniform(n_seq), uniform(n_seq), 1),
                 f"RL ({rl_prompts} x {rl_n} x {rl_len})": ([128 if not quick else 16] * rl_prompts,
                                                            [rl_len + 1] * rl_prompts, rl_n)}
    bandwidth, weight_bytes = copy_bandwidth(args.device), 2 * (M.flops_per_token(config, 0) // 2)
    kv = M.KVCache(config, 1, 1).k.element_size() * 2 * config.layer_passes * config.num_key_value_heads * config.head_dim
    print(f"throughput: {M.count_parameters(config) / 1e6:.0f}M parameters, {str(dtype).removeprefix('torch.')}, "
          f"{args.device}; copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    for name, (prompt_lens, lengths, n) in workloads.items():
        rows = len(prompt_lens) * n
        budget = max(min(x, long if n == 1 else rl_len) for x in lengths)
        harness = ScriptedLengths(ours, prompt_lens, lengths)
        prompts = [[r + 1] * p for r, p in enumerate(prompt_lens)]
        made_tokens = sum(min(x, budget) for x in lengths) * n
        width = max(prompt_lens)
        padded = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=args.device)
        mask = (padded != 0).long()
        runs = {"ours, slots": lambda: generate(harness, prompts, budget, temperature=0, n=n, stop_token_ids={0},
                                                slots=rows),
                "ours, static": lambda: generate(harness, prompts, budget, temperature=0, n=n, stop_token_ids={0},
                                                 slots=rows, static=True)}
        import transformers
        stop = transformers.LogitsProcessorList([StopAtLength(width, [x for x in lengths for _ in range(n)])])
        runs["transformers"] = lambda: ref.generate(padded.repeat_interleave(n, 0), attention_mask=mask.repeat_interleave(
            n, 0), max_new_tokens=budget, do_sample=False, eos_token_id=0, pad_token_id=0, logits_processor=stop)
        want = [min(x, budget) for x in lengths for _ in range(n)]
        for k in ("ours, slots", "ours, static"):  # the warm-up (a CUDA graph is captured here), checked
            assert [len(c.tokens) for c in runs[k]()] == want, f"{k}: not the scripted lengths"
        new = runs["transformers"]()[:, width:].cpu()
        ends = [int((row == 0).nonzero()[0]) + 1 if (row == 0).any() else len(row) for row in new]
        assert ends == want, "transformers: not the scripted lengths"
        times = {k: [] for k in runs}
        for _ in range(args.repeats):
            for k, run in runs.items():
                times[k].append(timed(run))
        context = sum((p + min(x, budget) / 2) * min(x, budget) for p, x in zip(prompt_lens, lengths)) / \
            sum(min(x, budget) for x in lengths)  # the mean context a generated token attends to
        batch = min(rows, 256)
        roof = batch * bandwidth / (weight_bytes + batch * context * kv)
        print(f"  {name}: {made_tokens} output tokens, mean context {context:.0f}; bandwidth roof {roof:.0f} tok/s "
              f"at batch {batch}")
        base = statistics.median(times["transformers"])
        for k, t in times.items():
            rate = made_tokens / statistics.median(t)
            print(f"    {k:>14}: {rate:9.1f} tok/s, {rate / roof:6.1%} of the roof, {base / statistics.median(t):.2f}x "
                  f"transformers (median of {args.repeats})")


def with_logprob(logits, token):
    """What the samplers before paid for the log-prob: a second pass over the vocabulary (logsumexp)."""
    return token, logits.gather(-1, token[:, None]).squeeze(-1) - logits.logsumexp(-1)


def full_sort_top_p(logits, top_p, keys, step):
    """The textbook nucleus (sort the whole vocabulary), then inverse CDF over it: what the rejection replaces."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)
    return with_logprob(logits, order.gather(-1, inverse_cdf(probs, uniform(keys, step))[:, None]).squeeze(-1))


def float64_cdf_top_p1(logits, keys, step):
    """The inverse CDF before the two levels: one float64 running sum over the whole vocabulary."""
    weights = (logits - logits.amax(-1, keepdim=True)).exp_()
    cdf = weights.cumsum(-1, dtype=torch.float64)
    at = torch.searchsorted(cdf, (uniform(keys, step) * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return with_logprob(logits, at.clamp_(max=weights.shape[-1] - 1))


def gumbel_top_p1(logits, keys, step):
    """The sampler before inverse CDF: Gumbel-max with counter-based noise on every token (float64)."""
    step_key = hash32((keys + (step + 1) * 0x85EBCA6B) & MASK32)
    token = torch.arange(logits.shape[-1]) * 0xC2B2AE35
    u = hash32((step_key[:, None] + token[None, :]).bitwise_and_(MASK32)).double().add_(0.5).div_(2.0**32)
    return with_logprob(logits, u.log_().neg_().log_().neg_().add_(logits).argmax(-1))


def check_every_row(logits, top_p, keys, step):
    """Top-p before the confident rows skipped the nucleus check: every row takes the pass over the vocabulary."""
    margin, E.NUCLEUS_MARGIN = E.NUCLEUS_MARGIN, float("inf")
    try:
        return sample_next(logits, 1.0, top_p, 0, keys, step)
    finally:
        E.NUCLEUS_MARGIN = margin


def own_mass_only(drawn, total, sums, top_p):
    """surely_inside with every block counted (each summing to more than any weight), so the bound never decides
    and only a drawn token holding more than 1 - top_p itself skips the check: top-p before the block sums' bound."""
    return surely_inside(drawn, total, torch.full_like(sums, float("inf")), top_p)


def own_mass_skip(logits, top_p, keys, step):
    """Top-p with sample_next's skip rule swapped for own_mass_only."""
    E.surely_inside = own_mass_only
    try:
        return sample_next(logits, 1.0, top_p, 0, keys, step)
    finally:
        E.surely_inside = surely_inside


def sampling_cost(args):
    """Milliseconds to choose 32 rows' next tokens and their log-probs over the full Qwen3 vocabulary, beside one
    decode step of --layers layers of the 0.6B widths at batch 32 (bf16, 128-token cache), medians of alternated
    repeats."""
    config = M.Qwen3Config(num_hidden_layers=args.layers)
    torch.manual_seed(0)
    model = M.Qwen3(config).to(torch.bfloat16).eval()
    batch, g = 32, torch.Generator().manual_seed(0)
    keys = row_keys(torch.tensor([1, 2]), batch // 2)
    gens = S.row_generators([1, 2], batch // 2, "cpu")  # the core's default draw: a generator per row
    flat = torch.randn(batch, config.vocab_size, generator=g)  # a random-weights model: nucleus ~ the vocabulary
    peaked = flat * 6  # a trained model's shape: a few tokens hold most of the mass
    with torch.inference_mode():
        cache = model.new_cache(batch, 129)
        token = torch.ones(batch, 1, dtype=torch.long)  # no prefill: 32 x 128 tokens through 28 bf16 layers take
        # minutes on this CPU, and the step's cost does not depend on what the cache holds

        def step():
            cache.length = 128  # the same step again: write the 129th slot
            model(token, cache=cache, last_only=True)
        # name -> (the logits it reads, the run); each run reads a fresh copy, written just before it as a decode
        # step's logits are in generation
        runs = {"decode step": (flat, lambda x: step()),
                "greedy": (flat, lambda x: sample_next(x, 0, 1.0, 0, keys, 3)),
                "top-p 1 (every token)": (flat, lambda x: sample_next(x, 1.0, 1.0, 0, keys, 3)),
                "top-p 1, multinomial per row (the default)": (flat, lambda x: S.sample_next(x, 1.0, 1.0, 0, gens)),
                "top-p 0.95, peaked, multinomial (default)": (peaked, lambda x: S.sample_next(x, 1.0, 0.95, 0, gens)),
                "top-p 1, one float64 CDF (before)": (flat, lambda x: float64_cdf_top_p1(x, keys, 3)),
                "top-p 1, Gumbel-max (before that)": (flat, lambda x: gumbel_top_p1(x, keys, 3)),
                "top-k 50": (flat, lambda x: sample_next(x, 1.0, 1.0, 50, keys, 3)),
                "top-p 1, peaked": (peaked, lambda x: sample_next(x, 1.0, 1.0, 0, keys, 3)),
                "top-p 0.95, peaked": (peaked, lambda x: sample_next(x, 1.0, 0.95, 0, keys, 3)),
                "top-p 0.95, peaked, full sort": (peaked, lambda x: full_sort_top_p(x, 0.95, keys, 3)),
                "top-p 0.95, peaked, own-mass skip only": (peaked, lambda x: own_mass_skip(x, 0.95, keys, 3)),
                "top-p 0.95, peaked, every row checked": (peaked, lambda x: check_every_row(x, 0.95, keys, 3)),
                "top-p 0.95, flat": (flat, lambda x: sample_next(x, 1.0, 0.95, 0, keys, 3)),
                "top-p 0.95, flat, full sort": (flat, lambda x: full_sort_top_p(x, 0.95, keys, 3))}
        for logits, run in runs.values():
            run(logits)
        times, names = {name: [] for name in runs}, list(runs)
        for r in range(args.repeats):  # rotated: with glibc's defaults a run's page faults depend on the one before
            for name in names[r % len(names):] + names[:r % len(names)]:
                logits, run = runs[name]
                step()  # each run right after a decode step, as in generation
                fresh = logits.clone()
                times[name].append(timed(lambda: run(fresh)) * 1e3)
    ms = {name: statistics.median(t) for name, t in times.items()}
    print(f"batch {batch}, vocabulary {config.vocab_size}, {args.threads} threads; decode step: {args.layers} layers "
          f"of the 0.6B widths, bf16 (medians of {args.repeats})")
    for name, t in ms.items():
        print(f"  {name:>36}: {t:8.1f} ms, {t / ms['decode step']:6.1%} of the decode step, "
              f"{t / ms['top-p 1 (every token)']:.2f}x top-p 1")
    for name, logits in (("peaked", peaked), ("flat", flat)):
        kept = kept_tokens(logits, 0, 0.95)[0]
        probs = logits.softmax(-1)
        token = sample_next(logits, 1.0, 1.0, 0, keys, 3)[0]
        drawn, ones = probs.gather(-1, token[:, None]).squeeze(-1), torch.ones(batch)
        sums = block_sums(probs)
        skip, own = surely_inside(drawn, ones, sums, 0.95), own_mass_only(drawn, ones, sums, 0.95)
        print(f"  {name}: median nucleus {int(torch.isfinite(kept).sum(-1).median())} tokens, median top token "
              f"{probs.amax(-1).median():.3f} of the mass; {int(skip.sum())} of {batch} first draws skip the check "
              f"({int(own.sum())} by their own mass)")
    for name, base in (("top-p 0.95, peaked", "top-p 1, peaked"), ("top-p 0.95, peaked, own-mass skip only",
                       "top-p 1, peaked"), ("top-p 0.95, flat", "top-p 1 (every token)")):
        ratios = sorted(t / b for t, b in zip(times[name], times[base]))  # paired: the two ran in the same repeat
        print(f"  {name} / top-p 1 on the same logits, paired in each repeat: median {statistics.median(ratios):.2f}x "
              f"(range {ratios[0]:.2f}-{ratios[-1]:.2f})")


def decode_steps(ours, ref, batch, prompt_len, vocab):
    """One decode step at a prompt_len-token cache for each side, repeatable: ours rewinds its KVCache's
    write index, transformers' DynamicCache is cropped back. Returns {name: (step, rewind)}."""
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=g)
    token = torch.randint(0, vocab, (batch, 1), generator=g)
    cache = ours.new_cache(batch, prompt_len + 1)
    ours(ids, cache=cache, last_only=True)
    out = ref(input_ids=ids, use_cache=True)
    past = {"cache": out.cache} if hasattr(out, "cache") else {"past_key_values": out.past_key_values}  # 5.x: cache

    def rewind_ours():
        cache.length = prompt_len
    return {"ours": (lambda: ours(token, cache=cache, last_only=True), rewind_ours),
            "transformers": (lambda: ref(input_ids=token, use_cache=True, **past),
                             lambda: next(iter(past.values())).crop(-1))}  # drop the step's token


def profile_steps(args):
    """Where a decode step's time goes, op by op, ours against transformers' forward on the same weights: each
    aten op's self time per step (torch.profiler), the step's unprofiled wall time, and what is left outside
    the ops (Python, module calls, dispatch). Then the loop around the step: generate's time per new token
    outside the model's forward calls, which holds choosing the token, stopping, and each loop's bookkeeping."""
    from torch.profiler import ProfilerActivity, profile
    config = M.Qwen3Config(num_hidden_layers=args.layers)
    ours, ref = build_pair(config, torch.bfloat16)
    print(f"decode step, {args.layers} layers of the 0.6B widths, bf16, {args.threads} threads, a {args.prompt_len}-"
          f"token cache; ms per step, medians of {args.repeats} alternated repeats")
    for batch in args.batches:
        with torch.inference_mode():
            steps = decode_steps(ours, ref, batch, args.prompt_len, config.vocab_size)
            wall, ops, calls = ({name: [] for name in steps}, {name: {} for name in steps},
                                {name: {} for name in steps})
            for step, rewind in steps.values():
                step(), rewind()  # warm-up
            for _ in range(args.repeats):
                for name, (step, rewind) in steps.items():
                    wall[name].append(timed(step) * 1e3)
                    rewind()
                    with profile(activities=[ProfilerActivity.CPU]) as prof:
                        step()
                    rewind()
                    for e in prof.key_averages():
                        if e.key.startswith("aten::"):
                            ops[name].setdefault(e.key, []).append(e.self_cpu_time_total / 1e3)
                            calls[name][e.key] = e.count
        per_op = {name: {op: statistics.median(t) for op, t in o.items()} for name, o in ops.items()}
        ms = {name: statistics.median(t) for name, t in wall.items()}
        names = sorted(set(per_op["ours"]) | set(per_op["transformers"]),
                       key=lambda op: -max(per_op["ours"].get(op, 0), per_op["transformers"].get(op, 0)))
        print(f"\nbatch {batch}: {'op':<46} {'ours ms (calls)':>18} {'transformers ms (calls)':>24}")
        for op in names[:args.top_ops]:
            cells = [f"{per_op[n].get(op, 0):.2f} ({calls[n].get(op, 0)})" for n in steps]
            print(f"{'':>9}{op.removeprefix('aten::'):<46} {cells[0]:>18} {cells[1]:>24}")
        rest = {n: sum(t for op, t in per_op[n].items() if op not in names[:args.top_ops]) for n in steps}
        every = {n: sum(per_op[n].values()) for n in steps}
        for label, value in (("the other aten ops", rest), ("all aten ops (profiled)", every),
                             ("the step, unprofiled wall time", ms)):
            print(f"{'':>9}{label:<46} {value['ours']:>18.2f} {value['transformers']:>24.2f}")
        prompts = torch.randint(0, config.vocab_size, (batch, args.prompt_len)).tolist()
        runs = {"ours": (ours, lambda: run_ours(ours, prompts, args.new_tokens, temperature=args.temperature)),
                "transformers": (ref, lambda: run_transformers(ref, prompts, args.new_tokens, args.temperature))}
        forward, outside = {name: [] for name in runs}, {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, (module, run) in runs.items():
                spans, wall = forward_spans(module, run)
                forward[name].append(statistics.median(spans[1:]) * 1e3)  # the decode steps; spans[0] is the prefill
                outside[name].append((wall - sum(spans)) / args.new_tokens * 1e3)
        for label, value in (("generate: a decode step's forward", forward),
                             ("generate: outside the forwards, per token", outside)):
            print(f"{'':>9}{label:<46} {statistics.median(value['ours']):>18.2f} "
                  f"{statistics.median(value['transformers']):>24.2f}")
    print("(generate " + (f"sampled at temperature {args.temperature}" if args.temperature else "greedy")
          + f", {args.new_tokens} new tokens; outside the forwards: choosing tokens, stopping, the loop's own work)")


def forward_spans(module, run):
    """Run `run` with a clock on every call of module's forward: (the calls' seconds, the whole run's seconds)."""
    spans = []
    pre = module.register_forward_pre_hook(lambda m, a: spans.append(-time.perf_counter()))
    post = module.register_forward_hook(lambda m, a, o: spans.append(spans.pop() + time.perf_counter()))
    try:
        wall = timed(run)
    finally:
        pre.remove(), post.remove()
    return spans, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small model shape for a fast smoke run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--compile", action="store_true", help="also time ours with generate(compile=True)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: both sample (rollouts do)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per setting, alternating (medians reported)")
    ap.add_argument("--kernels", action="store_true",
                    help="only time the CPU products that model_kernels.cpu_linear picks from")
    ap.add_argument("--ragged", action="store_true", help="only the ragged workload: continuous batching vs chunks")
    ap.add_argument("--ragged-budget", type=int, default=256, help="--ragged: the generation budget")
    ap.add_argument("--throughput", action="store_true", help="only the GPU throughput workloads (nano-vllm, RL)")
    ap.add_argument("--sampling", action="store_true", help="only the cost of choosing tokens against a decode step")
    ap.add_argument("--layers", type=int, default=28, help="layers of the 0.6B widths (also --sampling's step)")
    ap.add_argument("--profile", action="store_true", help="only a decode step op by op, ours against transformers")
    ap.add_argument("--top-ops", type=int, default=12, help="--profile: the ops listed one by one")
    ap.add_argument("--memory", action="store_true", help="only a large tiny-world generate's peak memory and time")
    ap.add_argument("--memory-rows", type=int, default=3000, help="--memory: the prompts (rows) in its one chunk")
    ap.add_argument("--memory-arm", choices=["before", "now"], help=argparse.SUPPRESS)  # one --memory run
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"bench_sample.py: --device {args.device}, but this torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    if args.kernels:
        one_row_kernels(args.threads)
        return few_row_kernels()
    if args.ragged:
        return ragged(args)
    if args.sampling:
        return sampling_cost(args)
    if args.throughput:
        return throughput(args)
    if args.profile:
        return profile_steps(args)
    if args.memory_arm:
        return memory_arm(args)
    if args.memory:
        return memory(args)
    config = M.Qwen3Config(num_hidden_layers=2, hidden_size=256, intermediate_size=768, vocab_size=8192) if args.quick \
        else M.Qwen3Config(num_hidden_layers=args.layers)
    ours, ref = build_pair(config, torch.bfloat16)
    ours, ref = ours.to(args.device), ref.to(args.device)
    where = args.device if args.device != "cpu" else f"cpu, {args.threads} threads"
    print(f"Qwen3 shape: {M.count_parameters(config) / 1e6:.1f}M parameters, bf16, {where}; "
          f"prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, "
          + (f"sampled at temperature {args.temperature}" if args.temperature else "greedy"))
    T = args.temperature
    runs = {"ours": lambda p, k: run_ours(ours, p, k, temperature=T),
            "transformers": lambda p, k: run_transformers(ref, p, k, temperature=T)}
    if args.compile:
        t = timed(lambda: run_ours(ours, [[1] * args.prompt_len], 2, compile=True))
        print(f"ours compiled: first call (compiles) {t:.0f} s")
        runs["ours compiled"] = lambda p, k: run_ours(ours, p, k, compile=True, temperature=T)
    g = torch.Generator().manual_seed(0)
    ours_names = [name for name in runs if name != "transformers"]
    rate_width = {name: max(11, len(name) + 6) for name in runs}
    print(f"{'batch':>5} " + " ".join(f"{name + ' tok/s':>{rate_width[name]}}" for name in runs) + " "
          + " ".join(f"{name} / transformers" for name in ours_names))
    for batch in args.batches:
        prompts = torch.randint(0, config.vocab_size, (batch, args.prompt_len), generator=g).tolist()
        for run in runs.values():
            run(prompts, 2)  # warm-up at this batch size (a compiled step may compile for a new shape)
        times = {name: [] for name in runs}
        for _ in range(args.repeats):  # alternated, so a slow spell of this shared machine hits every side
            for name, run in runs.items():
                times[name].append(timed(lambda: run(prompts, args.new_tokens)))
        rate = {name: batch * args.new_tokens / statistics.median(t) for name, t in times.items()}
        print(f"{batch:>5} " + " ".join(f"{rate[name]:>{rate_width[name]}.1f}" for name in runs) + " "
              + " ".join(f"{rate[name] / rate['transformers']:>{len(name) + 14}.2f}x" for name in ours_names),
              flush=True)

    # batch-1 decode against the bandwidth limit: every step reads every matmul weight once
    matmul_weights = M.flops_per_token(config, 0) // 2  # forward FLOPs are 2 per matmul weight
    weight_bytes = 2 * matmul_weights  # bf16
    prompts = torch.randint(0, config.vocab_size, (1, args.prompt_len), generator=g).tolist()
    rates, limits = [], []
    for _ in range(args.repeats):  # the machine's bandwidth drifts: each repeat measures both, side by side
        t_long = timed(lambda: run_ours(ours, prompts, args.new_tokens + 1, args.compile))
        t_short = timed(lambda: run_ours(ours, prompts, 1, args.compile))  # prefill + first token
        rates.append(args.new_tokens / (t_long - t_short))
        limits.append(copy_bandwidth(args.device) / weight_bytes)
    fraction = statistics.median(r / lim for r, lim in zip(rates, limits))
    print(f"batch-1 decode{' (compiled)' if args.compile else ''}: {statistics.median(rates):.1f} tok/s; limit "
          f"{statistics.median(limits):.1f} tok/s ({weight_bytes / 1e9:.2f} GB of weights per step at the copy "
          f"bandwidth, {statistics.median(limits) * weight_bytes / 1e9:.1f} GB/s); ours at {fraction:.0%} of it "
          f"(median of {args.repeats} side-by-side repeats)")


if __name__ == "__main__":
    main()
