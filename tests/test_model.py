"""
Tests of model.py: parity with transformers' Qwen3ForCausalLM (the oracle) on tiny random configs,
checkpoint I/O in both directions, config parsing, parameter/FLOP counts, the KV cache, the chunked
log-prob path, the tokenizer, clear errors on bad inputs, and a real download over loopback HTTP.
"""

import copy
import dataclasses
import http.server
import json
import socket
import threading
from functools import partial

import pytest
import torch
import transformers  # the parity oracle: CI installs it, so a missing one fails loudly instead of skipping
from safetensors.torch import load_file, save_file

import model as qwen3
from model import Qwen3, Qwen3Config, count_parameters, flops_per_token, token_logprobs

VOCAB = 257


def tiny_config(**overrides):
    """Our config for a tiny random Qwen3 (hidden 64, 2 layers)."""
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=10_000.0,
              tie_word_embeddings=True)
    return Qwen3Config(**{**kw, **overrides})


def randomize_(module, seed=0):
    """Weights ~ N(0, 0.2) (norm gains 1 + N(0, 0.2)), so a wrong wire changes the logits visibly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.2
            p.copy_(1 + noise if "norm" in name else noise)
    return module


def tiny_ours(seed=0, **overrides):
    return randomize_(Qwen3(tiny_config(**overrides)), seed).eval()


def hf_config(config):
    """The transformers config with the same shape as ours."""
    return transformers.Qwen3Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_word_embeddings)


def save_hf(path, seed=0, max_shard_size=None, **shape):
    """A random transformers Qwen3 written by save_pretrained; returns that (eval) transformers model."""
    hf = randomize_(transformers.Qwen3ForCausalLM(hf_config(tiny_config(**shape))), seed)
    shards = {"max_shard_size": max_shard_size} if max_shard_size else {}
    hf.save_pretrained(path, safe_serialization=True, **shards)
    return hf.eval()


def hf_logits(hf, ids):
    with torch.no_grad():
        return hf(input_ids=ids).logits


def ids_for(shape, seed=1):
    return torch.randint(VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def assert_logits_close(a, b, atol=1e-4):
    diff = (a - b).abs().max().item()
    assert diff <= atol, f"max abs logit difference {diff:.3g} > {atol}"


# -----------------------------------------------------------------------------
# Parity with transformers


@pytest.mark.parametrize("tie,heads,kv_heads,head_dim", [
    (True, 4, 1, 8),     # GQA 4:1
    (False, 4, 2, 16),   # GQA 2:1, untied head
    (True, 2, 2, 32),    # MHA 1:1
    (False, 8, 2, 8),    # GQA 4:1, head_dim * heads != hidden
])
def test_logits_match_transformers(tmp_path, tie, heads, kv_heads, head_dim):
    shape = dict(tie_word_embeddings=tie, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)
    hf = save_hf(tmp_path, **shape)
    ours = qwen3.load_model(tmp_path, device="cpu")
    assert ours.config == tiny_config(**shape, torch_dtype="float32")
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tie
    ids = ids_for((2, 24))
    with torch.no_grad():
        logits = ours(ids)
    assert logits.std() > 1  # the random weights make the test sensitive, not near-uniform logits
    assert_logits_close(logits, hf_logits(hf, ids))


def test_sharded_checkpoint_loads(tmp_path):
    hf = save_hf(tmp_path, max_shard_size="20KB")
    shards = list(tmp_path.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3 and (tmp_path / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "model.safetensors").exists()
    ids = ids_for((2, 16))
    with torch.no_grad():
        assert_logits_close(qwen3.load_model(tmp_path, device="cpu")(ids), hf_logits(hf, ids))


@pytest.mark.parametrize("tie", [True, False])
def test_save_model_loads_in_transformers_and_back(tmp_path, tie):
    ours = tiny_ours(tie_word_embeddings=tie, rope_theta=1_000_000.0)
    qwen3.save_model(ours, tmp_path / "ckpt", tokenizer=qwen3.load_tokenizer(qwen3.QWEN3_TOKENIZER))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors",
                                                                     "tokenizer.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp dir left behind
    ids = ids_for((2, 20))
    with torch.no_grad():
        expected = ours(ids)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert hf.config.tie_word_embeddings == tie
    assert_logits_close(hf_logits(hf, ids), expected)
    again = qwen3.load_model(tmp_path / "ckpt", device="cpu")
    assert again.config == dataclasses.replace(ours.config, torch_dtype="float32")  # the dtype actually saved
    with torch.no_grad():
        assert torch.equal(again(ids), expected)
    qwen3.save_model(again, tmp_path / "ckpt")  # overwriting an existing checkpoint is atomic too
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


# -----------------------------------------------------------------------------
# Config parsing

QWEN3_0P6B_BASE_CONFIG = {  # the published config.json (transformers 4 layout)
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 32768,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def write_config(tmp_path, d):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    return path


def test_config_transformers4_layout(tmp_path):
    d = {**QWEN3_0P6B_BASE_CONFIG, "some_future_key": {"x": 1}}
    assert Qwen3Config.from_json(write_config(tmp_path, d)) == Qwen3Config()
    d.update(rope_theta=5e5, torch_dtype="float32", tie_word_embeddings=False)
    c = Qwen3Config.from_json(write_config(tmp_path, d))
    assert (c.rope_theta, c.torch_dtype, c.tie_word_embeddings) == (5e5, "float32", False)


def test_config_transformers5_layout(tmp_path):
    d = {k: v for k, v in QWEN3_0P6B_BASE_CONFIG.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    d.update(rope_parameters={"rope_theta": 250_000.0, "rope_type": "default"}, dtype="float32",
             layer_types=["full_attention"] * 28, pad_token_id=None, unknown_new_field=[1, 2])
    c = Qwen3Config.from_json(write_config(tmp_path, d))
    assert c == Qwen3Config(rope_theta=250_000.0, torch_dtype="float32")


def test_config_head_dim_defaults_to_hidden_over_heads(tmp_path):
    d = {k: v for k, v in QWEN3_0P6B_BASE_CONFIG.items() if k != "head_dim"}
    assert Qwen3Config.from_json(write_config(tmp_path, d)).head_dim == 1024 // 16


@pytest.mark.parametrize("change,message", [
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope scaling"),
    ({"rope_theta": None, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "rope scaling"),
    ({"use_sliding_window": True, "sliding_window": 4096}, "sliding-window"),
    ({"layer_types": ["sliding_attention"] * 28}, "sliding-window"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "unknown architecture"),
    ({"hidden_size": None}, "missing required keys"),
    ({"num_key_value_heads": 3}, "num_attention_heads=16 is not a multiple"),
], ids=["rope_scaling-v4", "rope_parameters-v5", "use_sliding_window", "layer_types", "attention_bias", "hidden_act",
        "llama", "no-hidden_size", "heads-not-multiple-of-kv-heads"])
def test_config_refuses_what_is_not_implemented(tmp_path, change, message):
    d = {k: v for k, v in {**QWEN3_0P6B_BASE_CONFIG, **change}.items() if v is not None}
    path = write_config(tmp_path, d)
    with pytest.raises(ValueError, match=message) as e:
        qwen3.load_model(tmp_path, device="cpu")  # through the loader, so the error names the real file
    assert str(path) in str(e.value)


# -----------------------------------------------------------------------------
# Parameter and FLOP counts


def test_qwen3_0p6b_parameter_count():
    c = Qwen3Config()
    assert count_parameters(c) == 596_049_920  # published: 0.6B, tied embeddings
    with torch.device("meta"):
        m = Qwen3(c)
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert sum(p.numel() for p in m.parameters()) == 596_049_920  # parameters() yields the tied weight once
    assert count_parameters(c, include_embedding=False) == 596_049_920 - 151936 * 1024
    untied = Qwen3Config(tie_word_embeddings=False)
    with torch.device("meta"):
        m = Qwen3(untied)
    assert count_parameters(untied) == sum(p.numel() for p in m.parameters()) == 596_049_920 + 151936 * 1024


def test_flops_per_token_by_hand():
    c = tiny_config(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    # matmul weights per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 + MLP 3*64*96 = 30,720; 2 layers;
    # LM head 257*64 = 16,448 (a matmul even when tied). Norm gains and the embedding lookup are not matmuls.
    matmul_weights = 2 * 30_720 + 16_448
    attention = 4 * 2 * 4 * 16  # QK^T and AV: 2 matmuls x 2 FLOPs x layers x heads x head_dim, per context token
    assert flops_per_token(c, context_len=10) == 2 * matmul_weights + attention * 10 == 160_896
    assert flops_per_token(c, context_len=10, training=True) == 3 * 160_896
    assert flops_per_token(tiny_config(tie_word_embeddings=False), context_len=10) == 160_896


def test_flops_per_token_matches_flop_counter():
    """torch's FlopCounterMode counts every matmul of a real forward + backward over T tokens."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    m, T = tiny_ours(), 16
    ids = ids_for((1, T))
    # the math backend spells attention as matmuls the counter sees, over the full T x T score matrix
    # (causal masking saves nothing there), i.e. context_len = T for every token
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        m(ids).sum().backward()
    assert counter.get_total_flops() == T * flops_per_token(m.config, context_len=T, training=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("amx", [False, True])
def test_linear_single_row_path_equals_f_linear(dtype, bias, amx, monkeypatch):
    """One row goes through torch.mv (the fast batch-1 decode path; bf16 only with AMX); values and gradients
    are F.linear's."""
    monkeypatch.setattr(qwen3, "BF16_ROW_MV", amx)
    calls = []
    mv = torch.mv
    monkeypatch.setattr(torch, "mv", lambda *a: calls.append(1) or mv(*a))
    torch.manual_seed(0)
    layer = qwen3.Linear(64, 48, bias=bias).to(dtype)
    for shape in [(64,), (1, 64), (1, 1, 64)]:
        x = torch.randn(shape, dtype=dtype, requires_grad=True)
        calls.clear()
        y = layer(x)
        assert y.shape == (*shape[:-1], 48)
        assert len(calls) == (1 if amx or dtype == torch.float32 else 0)
        x_ref = x.detach().clone().requires_grad_()
        y_ref = torch.nn.functional.linear(x_ref, layer.weight, layer.bias)
        tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: both accumulate in fp32, then round once
        torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
        y.float().square().sum().backward()
        y_ref.float().square().sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad, atol=10 * tol, rtol=10 * tol)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts linear, not mv: the path steps aside
        assert layer.float()(torch.randn(1, 64)).dtype == torch.bfloat16


@pytest.mark.parametrize("bias", [False, True])
def test_linear_few_float32_rows_take_the_weight_left_product(bias, monkeypatch):
    """8-48 float32 rows against a weight of 2**20 entries or more go to W @ x.T (FP32_ROWS_WEIGHT_LEFT);
    fewer or more rows, a smaller weight, bf16 or autocast take F.linear. Values and gradients are F.linear's,
    and the output is row-major like F.linear's."""
    linear = torch.nn.functional.linear
    calls = []
    monkeypatch.setattr(qwen3.F, "linear", lambda *a: calls.append(1) or linear(*a))
    torch.manual_seed(0)
    big, small = qwen3.Linear(1024, 1024, bias=bias), qwen3.Linear(1024, 1023, bias=bias)  # 2**20: the bound
    cases = [(big, (8, 1024), False), (big, (13, 1, 1024), False), (big, (2, 24, 1024), False),
             (big, (48, 1024), False), (big, (7, 1024), True), (big, (49, 1, 1024), True),
             (small, (13, 1024), True)]
    for layer, shape, takes_f_linear in cases:
        x = torch.randn(shape, requires_grad=True)
        calls.clear()
        y = layer(x)
        assert len(calls) == takes_f_linear, (layer.weight.shape, shape)
        assert y.shape == (*shape[:-1], layer.out_features) and y.is_contiguous()
        x_ref = x.detach().clone().requires_grad_()
        y_ref = linear(x_ref, layer.weight, layer.bias)
        torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)  # sums of 1,024 products in another order
        y.square().sum().backward()
        y_ref.square().sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-3, rtol=1e-4)
    calls.clear()
    big.to(torch.bfloat16)(torch.randn(13, 1024, dtype=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        big.float()(torch.randn(13, 1024))
    assert len(calls) == 2


# -----------------------------------------------------------------------------
# KV cache


def test_kv_cache_incremental_decoding_matches_full_forward():
    m, ids = tiny_ours(), ids_for((2, 14))
    with torch.no_grad():
        full = m(ids)
        cache = m.new_cache(batch_size=2, max_len=16)
        steps = [m(ids[:, :6], cache)] + [m(ids[:, t:t + 1], cache) for t in range(6, 14)]
    assert cache.length == 14
    assert_logits_close(torch.cat(steps, dim=1), full, atol=1e-5)
    with torch.no_grad():
        last = m(ids[:, :6], m.new_cache(2, 6), last_only=True)
    assert last.shape == (2, 1, VOCAB)
    assert_logits_close(last, full[:, 5:6], atol=1e-5)
    with pytest.raises(RuntimeError, match="overflow"):
        m(ids[:, :3], cache)


def left_padded(rows, pad_id=7):
    T = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (T - len(r)) + r for r in rows])
    return ids, torch.tensor([T - len(r) for r in rows])


def test_kv_cache_left_padded_ragged_batch_matches_each_row_alone():
    m = tiny_ours()
    rows = [ids_for((9,), seed=s).tolist() for s in (2, 3, 4)]
    rows = [rows[0][:6], rows[1][:3], rows[2]]  # lengths 6, 3, 9
    nxt = ids_for((3, 4), seed=5)  # four decoded tokens per row
    prompt, pad = left_padded(rows)
    with torch.no_grad():
        cache = m.new_cache(3, 13)
        cache.pad = pad
        prefill = m(prompt, cache)
        decode = torch.cat([m(nxt[:, t:t + 1], cache) for t in range(4)], dim=1)
        for b, row in enumerate(rows):
            alone = m(torch.tensor([row + nxt[b].tolist()]))[0]
            assert_logits_close(prefill[b, pad[b]:], alone[:len(row)], atol=1e-5)
            assert_logits_close(decode[b], alone[len(row):], atol=1e-5)


def test_kv_cache_compact_moves_the_kept_rows_in_place():
    """compact(keep) leaves the rows select(keep) would, in the same storage (no second copy of the cache), and
    the next step's logits are select's."""
    m = tiny_ours()
    rows = [ids_for((n,), seed=s).tolist() for n, s in ((5, 11), (2, 12), (7, 13), (4, 14))]
    prompt, pad = left_padded(rows)
    nxt = ids_for((4, 1), seed=15)
    with torch.no_grad():
        cache = m.new_cache(4, 10)
        cache.pad = pad
        m(prompt, cache)
        copied = copy.deepcopy(cache)
        storage = cache.k.untyped_storage().data_ptr(), cache.v.untyped_storage().data_ptr()
        keep = torch.tensor([1, 2, 3])
        copied.select(keep)
        cache.compact(keep)
        assert (cache.k.untyped_storage().data_ptr(), cache.v.untyped_storage().data_ptr()) == storage
        assert torch.equal(cache.k, copied.k) and torch.equal(cache.v, copied.v)
        assert cache.pad.tolist() == [5, 0, 3] and cache.batch_size == 3 and cache.length == 7
        assert torch.equal(m(nxt[keep], cache), m(nxt[keep], copied))
        assert cache.length == 8 and torch.equal(cache.k, copied.k)


def test_kv_cache_rows_is_a_view_a_prefill_fills_in_pieces():
    """Prefilling rows [0, 2) and [2, 3) through cache.rows writes the one cache a single forward writes."""
    m = tiny_ours()
    rows = [ids_for((n,), seed=s).tolist() for n, s in ((6, 21), (3, 22), (5, 23))]
    prompt, pad = left_padded(rows)
    with torch.no_grad():
        whole, pieces = m.new_cache(3, 8), m.new_cache(3, 8)
        whole.pad, pieces.pad = pad, pad.clone()
        expect = m(prompt, whole)
        got = torch.cat([m(prompt[:2], pieces.rows(0, 2)), m(prompt[2:], pieces.rows(2, 3))])
        pieces.advance(prompt.shape[1])
    assert_logits_close(got, expect, atol=1e-5)
    assert pieces.length == whole.length == 6
    assert torch.allclose(pieces.k, whole.k, atol=1e-6) and torch.allclose(pieces.v, whole.v, atol=1e-6)


def test_kv_cache_select_repeats_and_compacts_rows():
    m = tiny_ours()
    rows = [ids_for((5,), seed=6).tolist(), ids_for((2,), seed=7).tolist()]
    prompt, pad = left_padded(rows)
    with torch.no_grad():
        cache = m.new_cache(2, 10)
        cache.pad = pad
        m(prompt, cache)
        k, v = cache.k.clone(), cache.v.clone()
        cache.select([1, 1, 0])  # three samples: two of prompt 1, one of prompt 0
        assert cache.batch_size == 3 and cache.pad.tolist() == [3, 3, 0] and cache.length == 5
        assert torch.equal(cache.k, k[:, [1, 1, 0]]) and torch.equal(cache.v, v[:, [1, 1, 0]])
        nxt = ids_for((3, 3), seed=8)
        out = [m(nxt[:, :1], cache)]
        cache.select(torch.tensor([2, 0]))  # sample 1 finished: compact it away
        assert cache.pad.tolist() == [0, 3]
        out.append(m(nxt[[2, 0], 1:3], cache))
        for b, src in enumerate([1, 1, 0]):
            alone = m(torch.tensor([rows[src] + nxt[b].tolist()]))[0]
            assert_logits_close(out[0][b, 0], alone[len(rows[src])], atol=1e-5)
        for b, (sample, src) in enumerate([(2, 0), (0, 1)]):
            alone = m(torch.tensor([rows[src] + nxt[sample].tolist()]))[0]
            assert_logits_close(out[1][b], alone[len(rows[src]) + 1:], atol=1e-5)


# -----------------------------------------------------------------------------
# Chunked log-probs and gradient checkpointing


def naive_logprobs(m, ids):  # m: ids -> logits
    logp_all = m(ids[:, :-1]).float().log_softmax(-1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("tie", [True, False])
def test_token_logprobs_equals_naive_log_softmax(tie):
    m, ids = tiny_ours(tie_word_embeddings=tie), ids_for((3, 12))
    weight = torch.randn(3, 11, generator=torch.Generator().manual_seed(9))  # e.g. advantages x mask
    logp, entropy = token_logprobs(m, ids, chunk_size=7)  # 33 positions: 5 chunks, the last one ragged
    ref_logp, ref_entropy = naive_logprobs(m, ids)
    assert logp.shape == entropy.shape == (3, 11)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy.detach(), atol=1e-5, rtol=0)
    (logp * weight).sum().backward()
    ours = grads(m)
    m.zero_grad()
    (ref_logp * weight).sum().backward()
    for name, g in grads(m).items():
        torch.testing.assert_close(ours[name], g, atol=1e-5, rtol=1e-4, msg=name)
    with torch.no_grad():
        no_grad_logp, _ = token_logprobs(m, ids, chunk_size=7)
    torch.testing.assert_close(no_grad_logp, ref_logp.detach(), atol=1e-5, rtol=0)


def test_gradient_checkpointing_gives_the_same_gradients():
    m, ids = tiny_ours(), ids_for((2, 16))
    weight = torch.randn(2, 15, generator=torch.Generator().manual_seed(10))
    m.train()
    (token_logprobs(m, ids)[0] * weight).sum().backward()
    plain = grads(m)
    m.zero_grad()
    calls = []  # a pre-hook: non-reentrant checkpointing stops the recompute early, before forward hooks
    m.model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    m.gradient_checkpointing = True
    (token_logprobs(m, ids)[0] * weight).sum().backward()
    assert len(calls) == 2  # the block really ran again in backward
    for name, g in grads(m).items():
        torch.testing.assert_close(g, plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_hand_written_backward_passes_pass_gradcheck():
    """model.py's fused ops carry their own backward; check each against finite differences in fp64."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    for w in (torch.randn(8, dtype=torch.float64, generator=g),       # an RMSNorm's (D,) gain
              torch.randn(5, 8, dtype=torch.float64, generator=g)):   # the joint q/k norm's (heads, D) gains
        w = (1 + 0.2 * w).requires_grad_()
        assert torch.autograd.gradcheck(lambda x, w: qwen3.RMSNormFunction.apply(x, w, 1e-6), (x, w))
    cos, sin = qwen3.rope_cos_sin(torch.arange(3)[None].expand(2, 3) + 5, 8, 10_000.0, torch.float64)
    assert torch.autograd.gradcheck(lambda x: qwen3.apply_rope(x, cos, sin), (x,))
    h = torch.randn(7, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 8, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(11, (7,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: qwen3.TokenLogProbsFunction.apply(h, w, targets, 3)[0], (h, w))


def bf16_against_transformers(tmp_path, device):
    """Our bf16 path (fused norm with rstd rounded to bf16, fused RoPE, chunked LM head) loses no more
    accuracy than transformers' bf16 path on `device`: relative errors against the fp32 CPU result, logits to
    gradient."""
    hf = save_hf(tmp_path)
    ids = ids_for((4, 32))
    weight = torch.randn(4, 31, generator=torch.Generator().manual_seed(12))

    def run(m, logits_fn, logprobs_fn):  # -> logits, log-probs, gradient of the tied embedding (on the CPU)
        device_ids = ids.to(m.lm_head.weight.device)
        logits = logits_fn(device_ids).detach().float()
        logp = logprobs_fn(device_ids)
        (logp * weight.to(logp.device)).sum().backward()
        return logits.cpu(), logp.detach().cpu(), m.model.embed_tokens.weight.grad.float().cpu()

    def run_ours(m):
        return run(m, m, lambda ids: token_logprobs(m, ids)[0])

    def run_hf(m):
        return run(m, lambda ids: m(input_ids=ids).logits,
                   lambda ids: naive_logprobs(lambda i: m(input_ids=i).logits, ids)[0])

    truth = run_ours(qwen3.load_model(tmp_path, device="cpu"))
    ours = run_ours(qwen3.load_model(tmp_path, device=device, dtype=torch.bfloat16))
    ref = run_hf(hf.to(device, torch.bfloat16))
    for what, a, b, t in zip(["logits", "log-probs", "embedding grad"], ours, ref, truth):
        err_ours, err_ref = ((a - t).norm() / t.norm()).item(), ((b - t).norm() / t.norm()).item()
        assert err_ours <= 1.5 * err_ref, f"bf16 {what}: relative error {err_ours:.2e}, transformers' {err_ref:.2e}"


def test_bf16_is_as_close_to_fp32_as_transformers_in_bf16(tmp_path):
    bf16_against_transformers(tmp_path, "cpu")


def test_bf16_on_gpu_is_as_close_to_fp32_as_transformers_in_bf16(tmp_path, gpu):
    bf16_against_transformers(tmp_path, gpu)


# -----------------------------------------------------------------------------
# Tokenizer


def test_tokenizer_falls_back_to_bundled_qwen3_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    tok = qwen3.load_tokenizer("Qwen/Qwen3-0.6B-Base")
    assert tok.path == qwen3.QWEN3_TOKENIZER
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert (tok.eos_id, tok.im_start_id, tok.im_end_id) == (151643, 151644, 151645)
    assert tok.stop_token_ids(chat=False) == [151643]
    assert tok.stop_token_ids(chat=True) == [151643, 151645]
    text = "Find $x$ such that $x^2 - 5x + 6 = 0$. Answer: \\boxed{2}, ∑ é 中文"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([151644, 872, 151645]) == "user"
    assert tok.decode([151644, 872, 151645], skip_special_tokens=False) == "<|im_start|>user<|im_end|>"
    assert tok.vocab_size >= 151669


# -----------------------------------------------------------------------------
# Bad inputs: each a clear error that names the file (and tensor)


def test_missing_config_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json not found") as e:
        qwen3.load_model(tmp_path, device="cpu")
    assert str(tmp_path / "config.json") in str(e.value)


def rewrite_checkpoint(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor(tmp_path):
    save_hf(tmp_path)
    rewrite_checkpoint(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor.*model\.layers\.1\.mlp\.up_proj\.weight") as e:
        qwen3.load_model(tmp_path, device="cpu")
    assert str(tmp_path) in str(e.value)


def test_tensor_of_the_wrong_shape(tmp_path):
    save_hf(tmp_path)
    rewrite_checkpoint(tmp_path, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(16, 64)}))
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \(16, 64\), "
                                         r"expected \(32, 64\)") as e:
        qwen3.load_model(tmp_path, device="cpu")
    assert str(tmp_path / "model.safetensors") in str(e.value)


def test_unexpected_tensor(tmp_path):
    save_hf(tmp_path)
    rewrite_checkpoint(tmp_path, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}))
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'") as e:
        qwen3.load_model(tmp_path, device="cpu")
    assert str(tmp_path / "model.safetensors") in str(e.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_truncated_or_corrupt_safetensors(tmp_path, damage):
    save_hf(tmp_path)
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:len(data) // 2] if damage == "truncated" else bytes(range(256)) * 64)
    with pytest.raises(ValueError, match="corrupt or truncated safetensors") as e:
        qwen3.load_model(tmp_path, device="cpu")
    assert str(f) in str(e.value)


def test_pickled_checkpoint_is_refused_never_unpickled(tmp_path, monkeypatch):
    save_hf(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")

    def forbidden(*args, **kwargs):
        raise AssertionError("a pickled checkpoint was unpickled")
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr("pickle.load", forbidden)
    monkeypatch.setattr("pickle.loads", forbidden)
    refused = r"no model\.safetensors.*pickled \.bin checkpoints are not loaded"
    with pytest.raises(FileNotFoundError, match=refused) as e:
        qwen3.load_model(tmp_path, device="cpu")
    assert str(tmp_path) in str(e.value)


def test_shard_listed_in_index_but_missing(tmp_path):
    save_hf(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*-of-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match="shard listed in model.safetensors.index.json is missing") as e:
        qwen3.load_model(tmp_path, device="cpu")
    assert str(shard) in str(e.value)


@pytest.fixture
def empty_hf_home(tmp_path, monkeypatch):
    """An empty Hugging Face cache, no offline flag, and no proxy between us and loopback."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN", "HF_ENDPOINT", "http_proxy", "HTTP_PROXY",
                "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    return home


def test_offline_and_uncached_repo_id_says_how_to_provide_weights(empty_hf_home, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as e:
        qwen3.load_model("Qwen/Qwen3-0.6B-Base", device="cpu")  # a dot in the repo name is still a repo id
    msg = str(e.value)
    assert "Qwen/Qwen3-0.6B-Base" in msg and "HF_HUB_OFFLINE=1" in msg and str(empty_hf_home / "hub") in msg
    assert "download_model('Qwen/Qwen3-0.6B-Base')" in msg and "local directory" in msg


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_uncached_repo_id_whose_download_fails(empty_hf_home, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(FileNotFoundError) as e:
        qwen3.load_model("org/name", device="cpu")
    msg = str(e.value)
    assert "org/name" in msg and "downloading it failed" in msg and "local directory" in msg


# -----------------------------------------------------------------------------
# Download over loopback HTTP, into the Hugging Face cache layout

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub(http.server.BaseHTTPRequestHandler):
    """Serves files[name] at /{org}/{name}/resolve/main/<file>, like huggingface.co; 404 otherwise. Files named
    in `cut` are sent half-way with the full Content-Length, as a dropped connection leaves them."""

    def __init__(self, *args, files, requests, cut=(), **kwargs):
        self.files, self.requests, self.cut = files, requests, cut
        super().__init__(*args, **kwargs)

    def do_GET(self):
        self.requests.append(self.path)
        prefix = "/org/name/resolve/main/"
        body = self.files.get(self.path[len(prefix):]) if self.path.startswith(prefix) else None
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        self.wfile.write(body[:len(body) // 2] if self.path.endswith(tuple(self.cut)) else body)

    def log_message(self, *args):
        pass


def test_download_into_hf_cache_then_load_from_cache(tmp_path, empty_hf_home, monkeypatch):
    hf = save_hf(tmp_path / "repo")
    files = {name: (tmp_path / "repo" / name).read_bytes() for name in ("config.json", "model.safetensors")}
    requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(FakeHub, files=files, requests=requests))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        m = qwen3.load_model("org/name", device="cpu")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert "/org/name/resolve/main/model.safetensors.index.json" in requests  # tried, 404 -> single file
    ids = ids_for((2, 16))
    with torch.no_grad():
        assert_logits_close(m(ids), hf_logits(hf, ids))
    repo = empty_hf_home / "hub" / "models--org--name"
    assert (repo / "refs" / "main").read_text() == COMMIT
    snap = repo / "snapshots" / COMMIT
    for name, body in files.items():
        assert (snap / name).read_bytes() == body
    leftovers = [p for p in empty_hf_home.rglob("*") if p.name.endswith((".incomplete", ".partial"))]
    assert leftovers == []
    assert qwen3.resolve_model_dir("org/name") == snap
    again = qwen3.load_model("org/name", device="cpu")  # the server is gone: this must come from the cache
    with torch.no_grad():
        assert torch.equal(again(ids), m(ids))


def serve(files, cut=()):
    """A FakeHub on a loopback port: (server, thread, requests); stop it with stop(server, thread)."""
    requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(FakeHub, files=files, requests=requests, cut=cut))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread, requests


def stop(server, thread):
    server.shutdown()
    server.server_close()
    thread.join()


def test_sharded_download_follows_the_index(tmp_path, empty_hf_home, monkeypatch):
    hf = save_hf(tmp_path / "repo", max_shard_size="20KB")
    files = {p.name: p.read_bytes() for p in (tmp_path / "repo").iterdir() if p.suffix in (".json", ".safetensors")}
    shards = sorted(n for n in files if n.startswith("model-"))
    assert len(shards) >= 3
    server, thread, requests = serve(files)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        m = qwen3.load_model("org/name", device="cpu")
    finally:
        stop(server, thread)
    assert [r for r in requests if "/model-" in r] == [f"/org/name/resolve/main/{n}" for n in shards]
    assert not any(r.endswith("/model.safetensors") for r in requests)  # the index says where the weights are
    snap = empty_hf_home / "hub" / "models--org--name" / "snapshots" / COMMIT
    assert all((snap / n).read_bytes() == files[n] for n in shards)
    ids = ids_for((2, 16))
    with torch.no_grad():
        assert_logits_close(m(ids), hf_logits(hf, ids))


def test_truncated_download_is_never_taken_for_a_checkpoint(tmp_path, empty_hf_home, monkeypatch):
    save_hf(tmp_path / "repo")
    files = {name: (tmp_path / "repo" / name).read_bytes() for name in ("config.json", "model.safetensors")}
    server, thread, _ = serve(files, cut=("model.safetensors",))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        with pytest.raises(FileNotFoundError, match="org/name: .*downloading it failed .*truncated"):
            qwen3.load_model("org/name", device="cpu")
    finally:
        stop(server, thread)
    assert qwen3._cached_snapshot("org/name", "main") is None  # nothing that looks complete was left
    assert not list(empty_hf_home.rglob("model.safetensors"))


@pytest.mark.parametrize("name", ["a/b/c", "./org/name", "/abs/path", "org/name.json", "org/weights.bin", "tiny2"])
def test_names_that_are_neither_a_directory_nor_a_repo_id_are_refused(name, empty_hf_home):
    with pytest.raises(FileNotFoundError, match="no such model directory.*not a Hugging Face repo id"):
        qwen3.resolve_model_dir(name)


def test_invalid_json_and_tokenizer_files_name_the_file(tmp_path):
    save_hf(tmp_path / "m", max_shard_size="20KB")
    (tmp_path / "m" / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(ValueError, match="model.safetensors.index.json: not a valid safetensors index"):
        qwen3.load_model(tmp_path / "m", device="cpu")
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        qwen3.load_model(tmp_path / "m", device="cpu")
    (tmp_path / "tokenizer.json").write_text('{"model": "half a file"')
    with pytest.raises(ValueError, match="tokenizer.json: not a valid tokenizer.json"):
        qwen3.load_tokenizer(tmp_path / "tokenizer.json")


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, None)])
def test_rmsnorm_forward_and_backward_match_transformers(dtype, tol):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    g = torch.Generator().manual_seed(0)
    x64, w64, dy64 = torch.randn(4, 7, 96, generator=g, dtype=torch.float64) * 3, 1 + torch.randn(96, generator=g,
                     dtype=torch.float64) * 0.2, torch.randn(4, 7, 96, generator=g, dtype=torch.float64)

    def run(norm):
        x = x64.to(dtype).requires_grad_()
        norm.weight.data = w64.to(dtype)
        y = norm(x)
        y.backward(dy64.to(dtype))
        return y.double(), x.grad.double(), norm.weight.grad.double()
    ours, theirs = run(qwen3.RMSNorm(96, 1e-6)), run(Qwen3RMSNorm(96, 1e-6))
    if tol is not None:  # fp32: the same values and gradients as transformers
        for a, b in zip(ours, theirs):
            assert (a - b).abs().max() <= tol * b.abs().max()
        return
    # bf16: against the fp64 truth, ours is at most as far off as transformers' bf16 (plus one rounding)
    x = x64.clone().requires_grad_()
    w = w64.clone().requires_grad_()
    y = w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    y.backward(dy64)
    for mine, ref, truth in zip(ours, theirs, (y.detach(), x.grad, w.grad)):
        scale = truth.abs().max()
        assert (mine - truth).abs().max() / scale <= 2 * (ref - truth).abs().max() / scale + 2 ** -8


# -----------------------------------------------------------------------------
# Looped depth (--loop START:END:N): layers [START, END) run N times with shared weights


def looped_pair(spec="1:3:2", seed=0, lora_rank=0):
    """A tiny random 4-layer Qwen3 and a deep copy of it looped by `spec`."""
    import copy
    plain = tiny_ours(seed, num_hidden_layers=4)
    loop = copy.deepcopy(plain)
    qwen3.add_loop(loop, spec, lora_rank)
    return plain, loop


def open_loops_(model, seed=3, scale=0.3):
    """Non-zero gates, embeddings and adapters (smaller: LoRA scales them by alpha / rank), as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.loop.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (scale / 10 if ".lora_" in name else scale))
    return model


def cached_logits(m, ids, split=5):
    """Logits of a prefill of ids[:, :split] and then one decode step per remaining token."""
    cache = m.new_cache(ids.shape[0], ids.shape[1])
    with torch.no_grad():
        out = [m(ids[:, :split], cache=cache)]
        out += [m(ids[:, t:t + 1], cache=cache) for t in range(split, ids.shape[1])]
    return torch.cat(out, 1)


LOOP_SPECS = [("1:3:2", 0), ("1:3:3", 0), ("0:4:2", 0), ("2:3:4", 0), ("1:3:3", 2)]


@pytest.mark.parametrize("spec,rank", LOOP_SPECS, ids=[f"{s}-lora{r}" for s, r in LOOP_SPECS])
def test_looped_model_at_initialisation_is_exactly_the_plain_model(spec, rank):
    plain, loop = looped_pair(spec, lora_rank=rank)
    ids = ids_for((2, 12))
    with torch.no_grad():
        assert torch.equal(loop(ids), plain(ids))
        for a, b in zip(token_logprobs(loop, ids), token_logprobs(plain, ids)):
            assert torch.equal(a, b)
    assert torch.equal(cached_logits(loop, ids), cached_logits(plain, ids))
    s, e, n = map(int, spec.split(":"))
    assert loop.config.layer_passes == 4 + (n - 1) * (e - s)
    assert qwen3.KVCache(loop.config, 1, 8).k.shape[0] == loop.config.layer_passes  # a row per (layer, loop) pass


def test_loop_n_1_and_empty_spec_are_the_plain_code_path():
    m = tiny_ours(num_hidden_layers=4)
    config = m.config
    assert qwen3.add_loop(m, "1:3:1") == 0 and qwen3.add_loop(m, "") == 0
    assert m.loop is None and m.config is config and m.config.layer_passes == 4
    assert qwen3.parse_loop("1:3:1", 4) == (1, 3, 1) and qwen3.loop_spec(config) == ""


def test_looped_forward_is_the_formula_by_hand():
    """h <- h + a_k * D(h + s_k) with D(x) = R(x) - x, R the looped layers, for each loop k > 1."""
    _, m = looped_pair("1:3:3")
    open_loops_(m)
    ids = ids_for((2, 9))
    layers, T = m.model.layers, ids.shape[1]
    cos, sin = qwen3.rope_cos_sin(torch.arange(T)[None].expand(2, T), 16, m.config.rope_theta, torch.float32)
    R = lambda x: layers[2](layers[1](x, cos, sin), cos, sin)  # noqa: E731
    with torch.no_grad():
        h = R(layers[0](m.model.embed_tokens(ids), cos, sin))
        for k in range(2):
            x = h + m.loop.embed[k]
            h = h + m.loop.gate[k] * (R(x) - x)
        expected = m.lm_head(m.model.norm(layers[3](h, cos, sin)))
        assert_logits_close(m(ids), expected, atol=1e-5)
        assert (m(ids) - tiny_ours(num_hidden_layers=4)(ids)).abs().max() > 1e-2  # the open loops do change it


@pytest.mark.parametrize("rank", [0, 2])
def test_looped_cached_decoding_matches_full_forward_with_open_loops(rank):
    """Every (layer, loop) pass has its own cache row: incremental decoding equals the full forward pass."""
    _, m = looped_pair("1:3:3", lora_rank=rank)
    open_loops_(m)
    ids = ids_for((3, 14))
    with torch.no_grad():
        assert_logits_close(cached_logits(m, ids), m(ids), atol=1e-5)


def test_loop_gradients_at_initialisation():
    """At a_k = 0: the gate's gradient is D(h + s_k), non-zero; the embedding's is exactly zero (it enters only
    through a_k * D); the shared weights get exactly the plain model's gradients."""
    plain, loop = looped_pair("1:3:3")
    ids = ids_for((2, 10))
    for m in (plain, loop):
        token_logprobs(m, ids)[0].sum().backward()
    assert loop.loop.gate.grad.abs().min(-1).values.gt(0).all()
    assert torch.equal(loop.loop.embed.grad, torch.zeros_like(loop.loop.embed))
    plain_grads = dict(plain.named_parameters())
    for name, p in loop.named_parameters():
        if not name.startswith("loop."):
            assert torch.equal(p.grad, plain_grads[name].grad), name


def test_looped_gradient_checkpointing_gives_the_same_gradients():
    _, m = looped_pair("1:3:3", lora_rank=2)
    open_loops_(m)
    ids = ids_for((2, 10))
    m.train()
    token_logprobs(m, ids)[0].sum().backward()
    g1 = grads(m)
    m.zero_grad(set_to_none=True)
    m.gradient_checkpointing = True
    token_logprobs(m, ids)[0].sum().backward()
    assert set(g1) == set(grads(m)) and any(".lora_" in n for n in g1)
    for name, g in grads(m).items():
        torch.testing.assert_close(g, g1[name], atol=1e-6, rtol=1e-5, msg=name)


def test_looped_flops_per_token_by_hand():
    c = qwen3.dataclasses.replace(tiny_config(num_hidden_layers=4), loop_start=1, loop_end=3, loop_count=3)
    # 4 layers + 2 extra loops x 2 layers = 8 layer passes of 30,720 matmul weights each; LM head 16,448;
    # attention 2 matmuls x 2 FLOPs x heads 4 x head_dim 16 = 256 per pass and context token
    assert c.layer_passes == 8
    assert flops_per_token(c, context_len=10) == 2 * (8 * 30_720 + 16_448) + 8 * 256 * 10 == 544_896
    assert flops_per_token(c, context_len=10, training=True) == 3 * 544_896
    # per-loop LoRA of rank 2: rank x (in + out) per projection, q 128 + k 96 + v 96 + o 128 + gate 160 + up 160
    # + down 160 = 928, on 2 layers x 2 extra loops
    lora_c = qwen3.dataclasses.replace(c, loop_lora_rank=2)
    assert flops_per_token(lora_c, context_len=10) == 544_896 + 2 * (2 * 928 * 4) == 559_744
    # the extra trainable parameters: a gate and an embedding (hidden 64) per extra loop, plus the adapters
    assert qwen3.loop_parameters(c) == 2 * 2 * 64 and qwen3.loop_parameters(lora_c) == 256 + 2 * 928 * 4
    assert count_parameters(c) == count_parameters(tiny_config(num_hidden_layers=4)) + 256


@pytest.mark.parametrize("rank", [0, 2])
def test_looped_flops_per_token_matches_flop_counter(rank):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    _, m = looped_pair("1:3:3", lora_rank=rank)
    T = 16
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        m(ids_for((1, T))).sum().backward()
    assert counter.get_total_flops() == T * flops_per_token(m.config, context_len=T, training=True)
    assert sum(p.numel() for p in m.loop.parameters()) == qwen3.loop_parameters(m.config)


@pytest.mark.parametrize("rank", [0, 2])
def test_looped_checkpoint_round_trip_and_transformers_refuses_it(tmp_path, rank):
    _, m = looped_pair("1:3:3", lora_rank=rank)
    open_loops_(m)
    qwen3.save_model(m, tmp_path / "looped")
    config = json.loads((tmp_path / "looped" / "config.json").read_text())
    assert config["model_type"] == "looped_qwen3" and config["architectures"] == ["LoopedQwen3ForCausalLM"]
    assert (config["loop_start"], config["loop_end"], config["loop_count"], config["loop_lora_rank"]) == (1, 3, 3, rank)
    assert all(k.startswith("loop.") for k in load_file(tmp_path / "looped" / "loop.safetensors"))
    assert not any(k.startswith("loop.") for k in load_file(tmp_path / "looped" / "model.safetensors"))
    back = qwen3.load_model(tmp_path / "looped", device="cpu")
    assert back.config == qwen3.dataclasses.replace(m.config, torch_dtype="float32")
    ids = ids_for((2, 12))
    with torch.no_grad():
        assert torch.equal(back(ids), m(ids))
    with pytest.raises(ValueError, match="looped_qwen3"):  # transformers does not know the architecture
        transformers.AutoConfig.from_pretrained(tmp_path / "looped")
    with pytest.raises(ValueError, match="looped_qwen3"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "looped")


def test_export_plain_writes_the_shared_weights_and_says_what_it_drops(tmp_path, capsys):
    plain, m = looped_pair("1:3:2")
    ids = ids_for((2, 12))
    _, gate = qwen3.export_plain(m, tmp_path / "at_init")  # zero gates: the export is the same function
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "at_init").eval()
    with torch.no_grad():
        assert gate == 0.0 and torch.equal(qwen3.load_model(tmp_path / "at_init", device="cpu")(ids), m(ids))
        assert_logits_close(hf_logits(hf, ids), m(ids))
    open_loops_(m)
    qwen3.save_model(m, tmp_path / "looped")
    _, gate = qwen3.export_plain(tmp_path / "looped", tmp_path / "trained")
    assert gate > 0 and "extra loops are dropped" in capsys.readouterr().err
    with torch.no_grad():  # the export is the plain model with the shared weights, no longer the looped one
        assert torch.equal(qwen3.load_model(tmp_path / "trained", device="cpu")(ids), plain(ids))


def test_a_looped_checkpoint_is_never_taken_for_a_plain_one(tmp_path):
    _, m = looped_pair("1:3:2")
    qwen3.save_model(m, tmp_path / "looped")
    d = tmp_path / "looped"
    config = json.loads((d / "config.json").read_text())
    plain_type = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    (d / "config.json").write_text(json.dumps({**config, **plain_type}))
    with pytest.raises(ValueError, match="loop_count=2 in a plain Qwen3 config.json"):
        qwen3.load_model(d, device="cpu")
    plain_config = {k: v for k, v in config.items() if not k.startswith("loop_")}
    (d / "config.json").write_text(json.dumps({**plain_config, **plain_type}))
    with pytest.raises(ValueError, match="loop.safetensors: a looped checkpoint's tensors beside a plain"):
        qwen3.load_model(d, device="cpu")
    (d / "config.json").write_text(json.dumps(config))
    (d / "loop.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="loop.safetensors: missing; config.json says this is a looped"):
        qwen3.load_model(d, device="cpu")


@pytest.mark.parametrize("spec,message", [
    ("3:1:2", "--loop 3:1:2: END must be > START"),
    ("2:2:2", "--loop 2:2:2: END must be > START"),
    ("1:5:2", "--loop 1:5:2: the looped layers .* within the model's 4 layers"),
    ("-1:2:2", "--loop -1:2:2: START must be >= 0"),
    ("1:3:0", "--loop 1:3:0: N must be >= 1"),
    ("1:3", "--loop 1:3: expected START:END:N"),
    ("a:b:c", "--loop a:b:c: expected START:END:N"),
])
def test_bad_loop_values_are_refused_naming_the_flag(spec, message):
    m = tiny_ours(num_hidden_layers=4)
    with pytest.raises(ValueError, match=message):
        qwen3.add_loop(m, spec)
    assert m.loop is None


def test_a_looped_model_keeps_its_loop():
    _, m = looped_pair("1:3:2")
    assert qwen3.add_loop(m, "") == qwen3.add_loop(m, "1:3:2") == 2 * 64  # one extra loop: a gate and an embedding
    with pytest.raises(ValueError, match="already looped \\(1:3:2"):
        qwen3.add_loop(m, "0:2:2")
