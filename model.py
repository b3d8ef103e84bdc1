"""
Qwen3, written from scratch in plain PyTorch: the network, its KV cache, token log-probs, and its parameter
and FLOP counts. Loading and saving Hugging Face checkpoints is checkpoint.py; looped depth is looped.py;
position coupling (the tiny world's) is coupled.py.

Architecture (Qwen3 technical report, 2025; the dense models):
    tokens -> embedding -> N x [RMSNorm -> grouped-query attention (per-head q/k RMSNorm, RoPE)
    -> residual -> RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head (tied to the embedding for
    the small models) -> logits.

Module names equal the Hugging Face checkpoint keys (`model.layers.0.self_attn.q_proj.weight`, ...), so
loading a checkpoint is a strict `load_state_dict`, and saving writes files `transformers` loads.

One `forward` serves training (no cache, causal attention), prefill and decoding (a preallocated
`KVCache` that owns the positions, with per-row left padding for ragged batches).

A formula here is what runs, so a fork is an edit in place: RMSNorm without its learned scale, for example, is
RMSNorm.forward's last line without `self.weight * ` (tests/test_forks.py applies it; the logged loss moves).

Each formula is written out below, and it is what runs. `use_kernels = True` (train_rl.py --kernels) sends the same
math through the hand-written kernels of model_kernels.py instead: fewer ops, and log-probs whose (B, T, vocab)
logits never exist whole (README, "When --kernels pays").
"""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import model_kernels

use_kernels = False  # True: model_kernels.py in place of the formulas below (tests/test_model_kernels.py compares)

# -----------------------------------------------------------------------------
# Config: field names are the Hugging Face config.json names.


@dataclass
class Qwen3Config:
    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 151643
    eos_token_id: int | None = 151643
    torch_dtype: str = "bfloat16"  # the dtype the weights are stored in

    MODEL_TYPE, ARCHITECTURE = "qwen3", "Qwen3ForCausalLM"  # what config.json says (class constants, not fields)

    @property
    def layer_passes(self):
        """Decoder-layer passes per token (looped depth runs some layers more than once: looped.py)."""
        return self.num_hidden_layers

    extra_parameters = 0  # trainable parameters beyond the plain model's (looped depth's gates, embeddings, adapters)
    extra_matmul_weights = 0  # matmul weights a token passes beyond the layers' (looped depth's per-loop adapters)
    position_coupling = None  # the token ids coupled positions read (coupled.py); None: each token's own position

    @classmethod
    def from_dict(cls, d, source="config.json"):
        """Build from a config.json dict, in either the transformers 4 or the transformers 5 layout."""
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(d).__name__}")
        arch = d.get("architectures") or []
        if d.get("model_type") != cls.MODEL_TYPE and cls.ARCHITECTURE not in arch:
            raise ValueError(f"{source}: unknown architecture (model_type={d.get('model_type')!r}, "
                             f"architectures={arch}); only dense Qwen3 (model_type 'qwen3') is implemented")
        rope = d.get("rope_parameters") or {}  # transformers 5 nests rope settings here
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if d.get("rope_scaling") or rope_type not in ("default", None):
            raise ValueError(f"{source}: rope scaling ({d.get('rope_scaling') or rope}) is not implemented")
        if d.get("use_sliding_window") or any(t != "full_attention" for t in d.get("layer_types") or []):
            raise ValueError(f"{source}: sliding-window attention is not implemented")
        if d.get("attention_bias"):
            raise ValueError(f"{source}: attention_bias=true is not implemented (Qwen3 has no attention bias)")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act={d['hidden_act']!r} is not implemented (only 'silu')")
        kwargs = {f.name: d[f.name] for f in fields(cls) if d.get(f.name) is not None}
        if "rope_theta" in rope:
            kwargs["rope_theta"] = rope["rope_theta"]
        if "dtype" in d and d["dtype"]:  # transformers 5 renamed torch_dtype -> dtype
            kwargs["torch_dtype"] = str(d["dtype"]).replace("torch.", "")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads") if d.get(k) is None]
        if missing:
            raise ValueError(f"{source}: missing required keys {missing}")
        for f in fields(cls):  # a wrong-typed field (a string where a number belongs) fails here, named
            want = (int, float) if f.type in (float, "float") else (bool,) if f.type in (bool, "bool") else \
                (int,) if f.type in (int, "int", int | None, "int | None") else None
            if f.name in kwargs and want and (not isinstance(kwargs[f.name], want) or
                                              (want != (bool,) and isinstance(kwargs[f.name], bool))):
                raise ValueError(f"{source}: {f.name}={kwargs[f.name]!r} must be {want[0].__name__}"
                                 f"{' or null' if 'None' in str(f.type) else ''}")
        if d.get("head_dim") is None and kwargs["num_attention_heads"] > 0:
            kwargs["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
        config = cls(**kwargs)
        config.check(source)
        return config

    POSITIVE = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta", "rms_norm_eps")

    def check(self, source):
        """Ranges a config must lie in to build a model (types are checked by from_dict): sizes, RoPE base and norm
        epsilon > 0 and finite, heads a multiple of the key/value heads (grouped-query attention)."""
        for name in self.POSITIVE:
            value = getattr(self, name)
            if not (0 < value < float("inf")):  # also NaN
                raise ValueError(f"{source}: {name}={value!r} must be > 0"
                                 f"{' and finite' if name in ('rope_theta', 'rms_norm_eps') else ''}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{source}: num_attention_heads={self.num_attention_heads} is not a multiple "
                             f"of num_key_value_heads={self.num_key_value_heads}")

    @classmethod
    def from_json(cls, path):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: config.json not found")
        try:
            d = json.loads(path.read_text(encoding="utf-8-sig"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(d, source=str(path))

    def to_hf_dict(self):
        """config.json as the published Qwen3 files write it (transformers 4 layout, which 5 also reads)."""
        d = asdict(self)
        d.update(architectures=[self.ARCHITECTURE], model_type=self.MODEL_TYPE, hidden_act="silu",
                 attention_bias=False, attention_dropout=0.0, rope_scaling=None, use_sliding_window=False,
                 sliding_window=None, max_window_layers=self.num_hidden_layers, use_cache=True,
                 initializer_range=0.02)
        return d


def default_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device):
    """bf16 on GPU, fp32 on CPU (where bf16 matmuls may be slow and fp32 keeps tests exact)."""
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


# -----------------------------------------------------------------------------
# The KV cache: preallocated, written in place, and the owner of positions.


class KVCache:
    """Keys and values of every layer pass for a batch of rows, preallocated to `max_len` slots.

    All rows share one write index (`length`); ragged prompts are left-padded, and `pad[b]` counts the
    padding slots of row b, so its token at slot s sits at position s - pad[b] and slots < pad[b] are
    never attended to.
    """

    def __init__(self, config, batch_size, max_len, device=None, dtype=torch.float32):
        # one row per layer pass: with looped depth every (layer, loop) pass keeps its own keys and values
        shape = (config.layer_passes, batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pad = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.length = 0

    @property
    def batch_size(self):
        return self.k.shape[1]

    @property
    def max_len(self):
        return self.k.shape[3]

    def positions(self, T):  # (B, T) rotary positions of the next T slots
        slots = torch.arange(self.length, self.length + T, device=self.pad.device)
        return slots[None, :] - self.pad[:, None]

    def attention_mask(self, T):  # (B, 1, T, S) True where query t may attend key slot s
        q = torch.arange(self.length, self.length + T, device=self.pad.device)[:, None]
        s = torch.arange(self.length + T, device=self.pad.device)[None, :]
        allowed = (s >= self.pad[:, None, None]) & (s <= q)
        # a padding slot attends to itself, so its (unused) output stays finite instead of NaN
        return (allowed | (s == q))[:, None]

    def update(self, layer, k, v):
        """Write the new keys/values (B, H_kv, T, D) at the write index; return all filled slots."""
        T = k.shape[2]
        if self.length + T > self.max_len:
            raise RuntimeError(f"KVCache overflow: {self.length} + {T} tokens > max_len {self.max_len}")
        self.k[layer, :, :, self.length:self.length + T] = k
        self.v[layer, :, :, self.length:self.length + T] = v
        return self.k[layer, :, :, :self.length + T], self.v[layer, :, :, :self.length + T]

    def advance(self, T):  # after a forward: the T tokens are in
        self.length += T

    def rows(self, start, end):
        """The cache of rows [start, end), sharing this one's memory: a large batch can be prefilled in pieces."""
        view = type(self).__new__(type(self))
        view.k, view.v, view.pad = self.k[:, start:end], self.v[:, start:end], self.pad[start:end]
        view.length = self.length
        return view

    def compact(self, keep):
        """Keep rows `keep` (increasing) by moving them to the front in place: a copy would double the cache's
        peak memory. The storage keeps its size; the rows after the kept ones leave the cache."""
        for t in (self.k, self.v):
            for p in range(t.shape[0]):  # keep[i] >= i, and a pass's kept rows are read whole before any write
                t[p, :len(keep)] = t[p, keep]
        self.k, self.v, self.pad = self.k[:, :len(keep)], self.v[:, :len(keep)], self.pad[keep]

    def select(self, rows):
        """Keep (or repeat) rows: compacts finished rows away, or copies a prompt's prefill n times."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.pad.device)
        self.k, self.v, self.pad = self.k[:, rows], self.v[:, rows], self.pad[rows]


# -----------------------------------------------------------------------------
# The model


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # y = w * x / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019), the mean square in fp32
        if use_kernels:
            return model_kernels.RMSNormFunction.apply(x, self.weight, self.eps)
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope_cos_sin(positions, head_dim, theta, dtype):
    """Rotary tables (Su et al. 2021, RoFormer) for positions (B, T) -> cos, sin of shape (B, T, 1, head_dim). Qwen
    rotates the two halves of a head (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), not adjacent pairs; the
    returned sin carries that sign (-sin on the first half) so apply_rope is x * cos + swap_halves(x) * sin."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions[..., None].float() * inv_freq  # (B, T, head_dim/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], -1)[:, :, None].to(dtype), torch.cat([-sin, sin], -1)[:, :, None].to(dtype)


def swap_halves(x):  # (x1, x2) -> (x2, x1) on the last axis: Qwen's RoPE pairs the two halves of a head
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x2, x1], dim=-1)


def apply_rope(x, cos, sin):  # x: (B, T, H, D); cos, sin from rope_cos_sin
    if use_kernels:
        return model_kernels.RotaryFunction.apply(x, cos, sin)
    return x * cos + swap_halves(x) * sin


class Linear(nn.Linear):
    """nn.Linear (same parameters, same checkpoint keys): y = x W^T + b. On a CPU with use_kernels, by the
    product that suits the rows x holds (decoding feeds a few per step: model_kernels.cpu_linear)."""

    def forward(self, x):
        if use_kernels and x.device.type == "cpu":
            return model_kernels.cpu_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)  # Qwen3's per-head q/k norm replaces qkv bias
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin, cache=None, layer=0, mask=None):
        B, T, _ = x.shape
        H, H_kv, D = self.n_heads, self.n_kv, self.head_dim
        q, k = self.q_proj(x).view(B, T, H, D), self.k_proj(x).view(B, T, H_kv, D)
        if use_kernels:  # both norms and both RoPEs as one tensor
            q, k = model_kernels.norm_rope_qk(q, k, self.q_norm, self.k_norm, cos, sin)
        else:  # Qwen3's per-head RMSNorm of q and k, then RoPE; heads before positions, as attention reads them
            q = apply_rope(self.q_norm(q), cos, sin).transpose(1, 2)  # (B, H, T, D)
            k = apply_rope(self.k_norm(k), cos, sin).transpose(1, 2)  # (B, H_kv, T, D)
        v = self.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        # softmax(q k^T / sqrt(D) + mask) v (Vaswani et al. 2017), each key/value head shared by H / H_kv query heads
        if use_kernels and getattr(cache, "grouped_decode", False):  # batching.SlotCache's static decode step
            y = model_kernels.grouped_decode_attention(q, k, v, mask)
        elif mask is None:  # training / no cache: plain causal attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H_kv != H)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=H_kv != H)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):  # SwiGLU (Shazeer 2020)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, cache=None, layer=0, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):  # named `model` inside Qwen3, as in the checkpoint keys
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Qwen3(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.gradient_checkpointing = False  # recompute each block in backward to save activation memory

    def hidden_states(self, input_ids, cache=None, positions=None):
        """Final-normed hidden states (B, T, hidden). With a cache, input_ids are the next T tokens."""
        B, T = input_ids.shape
        x = self.model.embed_tokens(input_ids)
        if positions is None:  # each token's own (a model option may pass others: coupled.py)
            positions = torch.arange(T, device=x.device)[None].expand(B, T) if cache is None else cache.positions(T)
        mask = None if cache is None else cache.attention_mask(T)
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)
        x = self.decoder_layers(x, cos, sin, cache, mask)
        if cache is not None:
            cache.advance(T)
        return self.model.norm(x)

    def decoder_layers(self, x, cos, sin, cache, mask):
        """Every decoder layer once, in order (looped.LoopedQwen3 runs some of them again)."""
        x, _ = self.run_layers(self.model.layers, x, cos, sin, cache, mask, 0)
        return x

    def run_layers(self, blocks, x, cos, sin, cache, mask, slot):
        """Run blocks in order, the first writing cache row `slot`; returns (x, the next free row)."""
        for block in blocks:
            if self.gradient_checkpointing and self.training and cache is None:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin, cache, slot, mask)
            slot += 1
        return x, slot

    def forward(self, input_ids, cache=None, last_only=False):
        """Logits (B, T, vocab), or (B, 1, vocab) for the last position only (what decoding needs)."""
        h = self.hidden_states(input_ids, cache)
        return self.lm_head(h[:, -1:] if last_only else h)

    def new_cache(self, batch_size, max_len, kind=KVCache):
        """An empty KVCache (or a cache `kind` of the same constructor: batching.SlotCache) in forward's dtype."""
        p = self.lm_head.weight
        dtype = torch.get_autocast_dtype(p.device.type) if torch.is_autocast_enabled(p.device.type) else p.dtype
        return kind(self.config, batch_size, max_len, device=p.device, dtype=dtype)


def token_logprobs(model, input_ids, chunk_size=256):
    """log p(x[t+1] | x[:t+1]) for every position, and the policy entropy there: two (B, T-1) fp32 tensors."""
    h = model.hidden_states(input_ids[:, :-1])
    if use_kernels:  # the same, the (B, T-1, vocab) logits never whole (model_kernels.TokenLogProbsFunction)
        return model_kernels.token_logprobs(h, model.lm_head.weight, input_ids[:, 1:], chunk_size)
    logp_all = model.lm_head(h).float().log_softmax(-1)  # (B, T-1, vocab)
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # H = -sum p log p: a metric, not a loss term
    return logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1), entropy.detach()


# -----------------------------------------------------------------------------
# Compute accounting


def count_parameters(config, include_embedding=True):
    """Parameter count from the config alone (the tied LM head is counted once; looped depth's extras included)."""
    c = config
    attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads) + 2 * c.head_dim
    mlp = 3 * c.hidden_size * c.intermediate_size
    layer = attn + mlp + 2 * c.hidden_size
    n = c.num_hidden_layers * layer + c.hidden_size + c.extra_parameters
    embed = c.vocab_size * c.hidden_size
    if include_embedding:
        n += embed if c.tie_word_embeddings else 2 * embed
    elif not c.tie_word_embeddings:
        n += embed  # the untied LM head is a real matmul
    return n


def flops_per_token(config, context_len, training=False):
    """Matmul FLOPs to process one token attending to `context_len` tokens (Kaplan et al. 2020, sec 2.1).

    Forward: 2 per weight of every matmul (the layers and the LM head, tied or not; the embedding lookup
    and the norm gains are not matmuls) plus 2 x 2 x heads x head_dim x context for QK^T and attention x V,
    both once per layer pass: with looped depth the looped layers count once per loop (config.layer_passes),
    and their per-loop adapters in every extra loop (config.extra_matmul_weights). Training is ~3x forward
    (backward computes two matmuls per forward one).
    """
    c = config
    attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)  # q, k, v, o
    mlp = 3 * c.hidden_size * c.intermediate_size
    matmul_weights = c.layer_passes * (attn + mlp) + c.extra_matmul_weights + c.vocab_size * c.hidden_size
    fwd = 2 * matmul_weights + 4 * c.layer_passes * c.num_attention_heads * c.head_dim * context_len
    return 3 * fwd if training else fwd
