"""
Tests of model.py: parity with transformers' Qwen3ForCausalLM (the oracle) on tiny random configs, with the
kernels and with the formulas, config parsing, parameter/FLOP counts, the KV cache, and the token log-probs.
The kernels against the formulas are test_model_kernels.py, checkpoint I/O test_checkpoint.py, looped depth
test_looped.py.
"""

import copy
import dataclasses
import json

import pytest
import torch
import transformers  # the parity oracle: CI installs it, so a missing one fails loudly instead of skipping

import checkpoint
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
@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "formulas"])
def test_logits_match_transformers(tmp_path, tie, heads, kv_heads, head_dim, kernels, monkeypatch):
    monkeypatch.setattr(qwen3, "use_kernels", kernels)
    shape = dict(tie_word_embeddings=tie, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)
    hf = save_hf(tmp_path, **shape)
    ours = checkpoint.load_model(tmp_path, device="cpu")
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
        assert_logits_close(checkpoint.load_model(tmp_path, device="cpu")(ids), hf_logits(hf, ids))


@pytest.mark.parametrize("tie", [True, False])
def test_save_model_loads_in_transformers_and_back(tmp_path, tie):
    ours = tiny_ours(tie_word_embeddings=tie, rope_theta=1_000_000.0)
    checkpoint.save_model(ours, tmp_path / "ckpt", tokenizer=checkpoint.load_tokenizer(checkpoint.QWEN3_TOKENIZER))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors",
                                                                     "tokenizer.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp dir left behind
    ids = ids_for((2, 20))
    with torch.no_grad():
        expected = ours(ids)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert hf.config.tie_word_embeddings == tie
    assert_logits_close(hf_logits(hf, ids), expected)
    again = checkpoint.load_model(tmp_path / "ckpt", device="cpu")
    assert again.config == dataclasses.replace(ours.config, torch_dtype="float32")  # the dtype actually saved
    with torch.no_grad():
        assert torch.equal(again(ids), expected)
    checkpoint.save_model(again, tmp_path / "ckpt")  # overwriting an existing checkpoint is atomic too
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
        checkpoint.load_model(tmp_path, device="cpu")  # through the loader, so the error names the real file
    assert str(path) in str(e.value)


@pytest.mark.parametrize("key, value, words", [
    ("num_key_value_heads", 0, "num_key_value_heads=0 must be > 0"),  # was ZeroDivisionError
    ("num_attention_heads", 0, "num_attention_heads=0 must be > 0"),  # was ZeroDivisionError (head_dim's default)
    ("hidden_size", -1024, "hidden_size=-1024 must be > 0"),  # was a torch error
    ("head_dim", -32, "head_dim=-32 must be > 0"),
    ("intermediate_size", 0, "intermediate_size=0 must be > 0"),
    ("num_hidden_layers", 0, "num_hidden_layers=0 must be > 0"),
    ("vocab_size", -1, "vocab_size=-1 must be > 0"),
    ("max_position_embeddings", 0, "max_position_embeddings=0 must be > 0"),
    ("rope_theta", 0, "rope_theta=0 must be > 0 and finite"),  # was non-finite logits
    ("rope_theta", float("nan"), "rope_theta=nan must be > 0 and finite"),
    ("rms_norm_eps", -1, "rms_norm_eps=-1 must be > 0 and finite"),
    ("bos_token_id", "zero", "bos_token_id='zero' must be int or null"),  # was accepted
    ("eos_token_id", 1.5, "eos_token_id=1.5 must be int or null"),
    ("num_key_value_heads", True, "num_key_value_heads=True must be int"),
])
def test_config_values_out_of_range_name_the_file_and_key(tmp_path, key, value, words):
    path = write_config(tmp_path, {**QWEN3_0P6B_BASE_CONFIG, key: value})
    with pytest.raises(ValueError) as e:
        checkpoint.load_model(tmp_path, device="cpu")
    assert str(e.value) == f"{path}: {words}"
    with pytest.raises(ValueError, match="must be"):
        checkpoint.read_config(tmp_path)


def test_config_null_token_ids_and_a_huge_rope_base_are_accepted(tmp_path):
    d = {**QWEN3_0P6B_BASE_CONFIG, "bos_token_id": None, "rope_theta": 1e300}
    assert Qwen3Config.from_json(write_config(tmp_path, d)).rope_theta == 1e300


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

    truth = run_ours(checkpoint.load_model(tmp_path, device="cpu"))
    ours = run_ours(checkpoint.load_model(tmp_path, device=device, dtype=torch.bfloat16))
    ref = run_hf(hf.to(device, torch.bfloat16))
    for what, a, b, t in zip(["logits", "log-probs", "embedding grad"], ours, ref, truth):
        err_ours, err_ref = ((a - t).norm() / t.norm()).item(), ((b - t).norm() / t.norm()).item()
        assert err_ours <= 1.5 * err_ref, f"bf16 {what}: relative error {err_ours:.2e}, transformers' {err_ref:.2e}"


def test_bf16_is_as_close_to_fp32_as_transformers_in_bf16(tmp_path):
    bf16_against_transformers(tmp_path, "cpu")


def test_bf16_on_gpu_is_as_close_to_fp32_as_transformers_in_bf16(tmp_path, gpu):
    bf16_against_transformers(tmp_path, gpu)


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
