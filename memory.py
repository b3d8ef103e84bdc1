"""
The memory plan: what a run will hold on its device, from config.json and the flags alone, before any weight is read.

train_rl.py prints it with its settings and stops before loading when it exceeds the device, naming the largest part
and the flag that shrinks it (--ignore-memory-plan starts anyway); evaluate.py does the same for its cache and batch.
Every part counts what the code allocates (tests/test_memory.py checks the parts by hand for the Qwen3 shapes and
against what PyTorch measures on a CPU; benchmarks/gpu_check.sh records the plan beside a GPU's measured peak):

- weights: the fp32 master copy (model.count_parameters; --lora-rank adds its adapters), 1/N of it per rank under
  --fsdp; gradients (fp32) and AdamW's two moments (fp32) of the trainable parameters, likewise sharded;
- the sampling copy (distributed.sampling_copy): none on a CPU (the policy samples), bf16 on a GPU, whole per rank;
- the KV cache (model.KVCache) of one sampling chunk: rows x (prompt + budget) slots, every layer pass's keys and
  values, in the sampler's dtype; sample.py caps a chunk at 4 GiB of slots (default_token_budget), and a chunk's
  prefilled rows live beside their G copies while those are made (KVCache.select);
- the activations of the largest micro-batch: what backward needs, counted tensor by tensor below
  (saved_bytes_per_token), for model.py's kernels or its plain formulas; --grad-checkpointing keeps only each
  layer's input and recomputes one layer at a time. Under bf16 autocast every matmul also keeps the bf16 cast of its
  weight until backward (a whole bf16 copy of the layers, per rank even under --fsdp);
- the log-prob pass over the vocabulary (model.token_logprobs): the kernels' (chunk x vocab) buffers, or the
  plain formula's fp32 (tokens x vocab) log-softmax, its exp and their product.
GiB = 2^30 bytes throughout. Not counted: CUDA's own context and the allocator's fragmentation (a few hundred MB
to a few GB; the device's total is compared as is), LoRA's and the reference's activations, --loop added to a plain
checkpoint (the plan reads its config.json's layer passes).
"""

import math
import os
import sys
from dataclasses import dataclass

import torch

import checkpoint
import cli
import model
import problems as P
from model import count_parameters

arg = cli.arg_group("memory plan")
GiB = 2**30
SAMPLER_CACHE_GIB = 4.0  # sample.default_token_budget's cap on one chunk's cache
LOGPROB_CHUNK = 256  # model.token_logprobs' chunk_size


@dataclass
class MemoryConfig:
    """The memory plan's flags (train_rl.Config inherits them; evaluate.py has the same two)."""
    device_memory_gb: float = arg(0.0, "the device memory (GiB) the plan is checked against (0: the GPU's, or on a "
                                       "CPU the machine's RAM)", range="[0, inf)")
    ignore_memory_plan: bool = arg(False, "start even when the memory plan exceeds the device (a plan that is wrong)")


@dataclass
class Part:
    name: str  # what it is
    bytes: float  # per rank
    note: str  # how it was counted
    shrink: str  # the flag that shrinks it


# -----------------------------------------------------------------------------
# Parameters


def count(n):
    """A parameter count for the plan's lines: 596M, 1.72B."""
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def lora_parameters(c, rank):
    """LoRA's trainable parameters: r x (in + out) for each of the seven projections of every layer (lora.TARGETS)."""
    q, kv, d, i = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.hidden_size, \
        c.intermediate_size
    return rank * c.num_hidden_layers * ((d + q) * 2 + (d + kv) * 2 + 3 * (d + i))


def layer_matmul_weights(c):
    """Matmul weights a token passes in the decoder layers (q, k, v, o and the MLP; every layer pass)."""
    attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    return c.layer_passes * (attn + 3 * c.hidden_size * c.intermediate_size)


# -----------------------------------------------------------------------------
# Activations: bytes one token of a training micro-batch keeps for backward


def saved_bytes_per_token(c, kernels, autocast):
    """Bytes one token keeps for backward in one decoder layer pass, tensor by tensor (model.py's Block forward).

    f = 4 (the fp32 residual stream and norms), lo = what the matmuls and attention write (2 under bf16 autocast, else
    4). Under autocast each projection casts its input itself, so q, k, v and gate, up each keep a bf16 copy of
    their norm's output; in fp32 the projections share it. Attention (SDPA's flash kernels) keeps q, k, v, its output
    (which o_proj reads as is) and a logsumexp per head; SwiGLU keeps gate, silu(gate), up and their product."""
    d, q, kv, i, h = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, \
        c.intermediate_size, c.num_attention_heads
    f, lo = 4, 2 if autocast else 4
    proj_inputs = 5 * d * lo if autocast else 2 * d * f  # the two norms' outputs as the projections keep them
    attention = (q + kv) * lo + kv * lo + q * lo + h * 4  # q, k (after RoPE), v, the output, the logsumexp
    mlp = 4 * i * lo
    if kernels:  # RMSNormFunction keeps x_hat and rstd; the joint q/k norm keeps its x_hat in the projections' dtype
        norms = 2 * (d + 1) * f + (q + kv) * lo + (h + c.num_key_value_heads) * lo
    else:  # the formula keeps x, x * rstd and rstd per norm; of q and k the projection (an fp32 copy under autocast),
        # x * rstd and under autocast its bf16 cast, and rstd per head
        norms = 2 * (2 * d + 1) * f + (q + kv) * (10 if autocast else 8) + (h + c.num_key_value_heads) * f
    return norms + proj_inputs + attention + mlp


def rope_bytes_per_token(c, autocast):
    """cos and sin (shared by every layer), in the forward's dtype."""
    return 2 * c.head_dim * (2 if autocast else 4)


def final_norm_bytes_per_token(c, kernels, autocast):
    """The final norm and the hidden states the LM head reads (kept for its backward)."""
    d = c.hidden_size
    if kernels:
        return 2 * d * 4 + 4  # x_hat, h, rstd
    return 2 * d * 4 + d * (2 if autocast else 4) + 4  # x, x * rstd, h (cast by autocast for the LM head)


def activation_bytes(c, tokens, kernels, autocast, checkpointing):
    """Bytes a micro-batch of `tokens` positions keeps for backward at its peak (with --grad-checkpointing: every
    layer's input, plus one layer's activations while backward recomputes it)."""
    per_layer = saved_bytes_per_token(c, kernels, autocast) * tokens
    if checkpointing:
        layers = c.layer_passes * c.hidden_size * 4 * tokens + per_layer
        casts = 2 * layer_matmul_weights(c) / c.layer_passes if autocast else 0  # one layer's weight casts
    else:
        layers = c.layer_passes * per_layer
        casts = 2 * layer_matmul_weights(c) if autocast else 0  # every layer's bf16 weight casts, kept for backward
    return layers + casts + (rope_bytes_per_token(c, autocast) + final_norm_bytes_per_token(c, kernels, autocast)) \
        * tokens


def logprob_bytes(c, tokens, kernels, autocast):
    """The log-prob pass over the vocabulary: the kernels' chunk buffers (logits, their fp32 copy and log-softmax,
    backward's logits and probabilities with the LM head's gradient), or the plain formula's fp32 (tokens x vocab)
    log-softmax, its exp and their product at once (the first two kept for backward), after the logits' cast."""
    v = c.vocab_size
    if kernels:
        n = min(LOGPROB_CHUNK, tokens)
        return max(n * v * (4 + 8), n * v * (4 + 4) + v * c.hidden_size * 4)  # h is fp32 after the final norm
    return tokens * v * 12 + (2 * v * c.hidden_size if autocast else 0)  # autocast's bf16 LM head, kept for backward


# -----------------------------------------------------------------------------
# The KV cache


def kv_bytes_per_token(c, itemsize):
    """Keys and values of one cache slot, every layer pass (sample.kv_bytes_per_token from a config alone)."""
    return 2 * c.layer_passes * c.num_key_value_heads * c.head_dim * itemsize


def sampling_cache_bytes(c, prompts, n, row_len, itemsize):
    """The largest chunk's cache in sample.generate_chunks: prompts of n rows each, row_len slots a row, as many
    prompts as fit SAMPLER_CACHE_GIB (at least one); the prefilled rows live beside their n copies (KVCache.select)."""
    slot = kv_bytes_per_token(c, itemsize)
    budget = int(SAMPLER_CACHE_GIB * GiB) // slot
    per_chunk = min(prompts, max(1, budget // (n * row_len)))
    return per_chunk * (n + (1 if n > 1 else 0)) * row_len * slot, per_chunk


# -----------------------------------------------------------------------------
# The plans


def training_plan(cfg, c, prompt_tokens, device, world=1):
    """train_rl.py's parts, per rank: cfg has its flags, c is the model's config (config.json), prompt_tokens the
    longest training prompt, world the ranks (torchrun's WORLD_SIZE)."""
    cuda = str(device).startswith("cuda")
    shard = world if cfg.fsdp else 1
    n = count_parameters(c)
    trainable = lora_parameters(c, cfg.lora_rank) if cfg.lora_rank else n
    weights = n + (trainable if cfg.lora_rank else 0)  # LoRA's adapters beside the frozen base
    kernels, row_len = model.use_kernels, prompt_tokens + cfg.max_new_tokens
    per = f" / {shard} ranks" * (shard > 1)
    parts = [Part("weights (fp32)", 4 * weights / shard, f"{count(weights)} parameters{per}", "--fsdp"),
             Part("gradients (fp32)", 4 * trainable / shard, f"{count(trainable)} trainable{per}",
                  "--fsdp or --lora-rank"),
             Part("AdamW moments (fp32)", 8 * trainable / shard, f"two per trainable parameter{per}",
                  "--fsdp or --lora-rank")]
    if cuda or cfg.fsdp:
        parts.append(Part(f"sampling copy ({'bf16' if cuda else 'fp32'})", (2 if cuda else 4) * n, "whole, every rank",
                          "a smaller --model"))
    if cfg.kl_coef:
        parts.append(Part("reference (fp32)", 4 * n, "--kl-coef's frozen initial policy", "--kl-coef 0"))
    problems = math.ceil(cfg.problems_per_step / world)
    cache, per_chunk = sampling_cache_bytes(c, problems, cfg.group_size, row_len, 2 if cuda else 4)
    parts.append(Part("KV cache", cache, f"{per_chunk * cfg.group_size} rows x ({prompt_tokens} prompt + "
                      f"{cfg.max_new_tokens} budget) slots", "--problems-per-step or --max-new-tokens"))
    rows = math.ceil(cfg.problems_per_step * cfg.group_size / world)
    k = max(1, min(rows, cfg.micro_batch_tokens // row_len))
    tokens = k * (row_len - 1)  # token_logprobs reads ids[:, :-1]
    autocast, gc = cuda, cfg.grad_checkpointing  # train_rl's update runs under bf16 autocast on CUDA
    parts.append(Part("activations", activation_bytes(c, tokens, kernels, autocast, gc),
                      f"{k} rows x {row_len} tokens" + (", checkpointed" if gc else
                      f"; {activation_bytes(c, tokens, kernels, autocast, True) / GiB:.2f} with --grad-checkpointing"),
                      "--micro-batch-tokens" if gc else "--grad-checkpointing or --micro-batch-tokens"))
    parts.append(Part("log-prob pass", logprob_bytes(c, tokens, kernels, autocast),
                      f"vocab {c.vocab_size}, " + ("chunks of 256" if kernels else f"{tokens} tokens at once"),
                      "--micro-batch-tokens"))
    return parts


def evaluation_plan(c, problems, samples, prompt_tokens, max_new_tokens, itemsize, continuous):
    """evaluate.py's parts: the weights in their dtype, the KV cache of one call (continuous batching: problems x
    samples rows of prompt + 2 x budget slots, and a join copies up to 3/4 of them into a new cache; chunks: as in
    training) and the decode step's logits (the model's, an fp32 copy and the softmax weights)."""
    rows = problems * samples
    if continuous:  # batching.generate_slots: room = prompt + 2 x budget; a join keeps the old cache until copied
        row_len = prompt_tokens + 2 * max_new_tokens
        cache = 1.75 * rows * row_len * kv_bytes_per_token(c, itemsize)
        note = f"{rows} rows x ({prompt_tokens} prompt + 2 x {max_new_tokens} budget) slots, x 1.75 at a join"
    else:
        cache, per_chunk = sampling_cache_bytes(c, problems, samples, prompt_tokens + max_new_tokens, itemsize)
        note = f"{per_chunk * samples} rows x ({prompt_tokens} prompt + {max_new_tokens} budget) slots"
    n = count_parameters(c)
    return [Part(f"weights ({'bf16' if itemsize == 2 else 'fp32'})", itemsize * n, f"{count(n)} parameters",
                 "a smaller --model"),
            Part("KV cache", cache, note, "--batch-size or --max-new-tokens"),
            Part("decode logits", rows * c.vocab_size * (itemsize + 8), f"{rows} rows x vocab {c.vocab_size}",
                 "--batch-size")]


# -----------------------------------------------------------------------------
# Against the device


def device_memory(device, stated_gb=0.0):
    """The device's memory in bytes: stated (--device-memory-gb), the GPU's, or the machine's RAM on a CPU."""
    if stated_gb:
        return stated_gb * GiB
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def format_plan(parts, total_memory, where):
    """The plan as lines: each part in GiB with how it was counted, then the total against the device."""
    total = sum(p.bytes for p in parts)
    lines = [f"memory plan ({where}, GiB)"] + [f"  {p.name:<22}{p.bytes / GiB:8.2f}   {p.note}" for p in parts]
    lines.append(f"  {'total':<22}{total / GiB:8.2f}   of {total_memory / GiB:.1f} on the device")
    return "\n".join(lines)


def check_plan(parts, total_memory, ignore):
    """One error line when the plan exceeds the device: the largest part and the flag that shrinks it."""
    total = sum(p.bytes for p in parts)
    if total <= total_memory or ignore:
        return
    big = max(parts, key=lambda p: p.bytes)
    raise ValueError(f"memory plan: {total / GiB:.1f} GiB exceeds the device's {total_memory / GiB:.1f} GiB; the "
                     f"largest part is the {big.name} ({big.bytes / GiB:.1f} GiB): {big.shrink} shrinks it "
                     f"(--ignore-memory-plan starts anyway)")


def plan_training(cfg, c, prompt_tokens, device):
    """train_rl.py's one call: print the plan, and stop (a ValueError) when it exceeds the device."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    parts = training_plan(cfg, c, prompt_tokens, device, world)
    total_memory = device_memory(device, cfg.device_memory_gb)
    where = f"{device}, per rank of {world}" + " under --fsdp" * cfg.fsdp if world > 1 else str(device)
    print(format_plan(parts, total_memory, where), flush=True)
    check_plan(parts, total_memory, cfg.ignore_memory_plan)
    return parts


def plan_evaluation(cfg, problems, tokenizer, device, dtype):
    """evaluate.py's one call before loading: every prompt fits the context (a long or unencodable problem is named),
    and the plan for the weights, the cache and the batch, printed; stops when it cannot fit. cfg: evaluate.EvalConfig;
    dtype: the weights' (torch.bfloat16 on a GPU by default)."""
    c = checkpoint.read_config(checkpoint.resolve_model_dir(cfg.model))
    longest, = P.check_prompts_fit([(cfg.dataset, problems)], tokenizer, cfg.template, cfg.max_new_tokens,
                                   c.max_position_embeddings)
    continuous = str(device).startswith("cuda") if cfg.continuous is None else cfg.continuous
    parts = evaluation_plan(c, min(cfg.batch_size, len(problems)), cfg.samples, longest, cfg.max_new_tokens,
                            dtype.itemsize, continuous)
    total_memory = device_memory(device, cfg.device_memory_gb)
    print(format_plan(parts, total_memory, str(device)), file=sys.stderr, flush=True)  # stdout holds the summary
    check_plan(parts, total_memory, cfg.ignore_memory_plan)
    return parts
