"""
model_kernels.py against the formulas model.py writes out (model.use_kernels = False): each kernel on its own, the
whole model's logits, log-probs, entropies and gradients, and generation with every decode engine; the hand-written
backward passes against finite differences, and the CPU products against F.linear.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import model as qwen3
import model_kernels as K
import sample as S
from test_model import grads, ids_for, tiny_ours


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    """This file tests the kernels: on for each test (model.py's default is the formulas)."""
    monkeypatch.setattr(qwen3, "use_kernels", True)


def with_and_without_kernels(monkeypatch, fn):
    """fn() with the kernels, then with the formulas."""
    fast = fn()
    monkeypatch.setattr(qwen3, "use_kernels", False)
    slow = fn()
    monkeypatch.setattr(qwen3, "use_kernels", True)
    return fast, slow


@pytest.mark.parametrize("tie", [True, False])
def test_the_kernels_give_the_formulas_values_and_gradients(tie, monkeypatch):
    """The whole model in fp32, kernels on and off: logits, log-probs, entropies and every parameter's gradient."""
    m, ids = tiny_ours(tie_word_embeddings=tie), ids_for((3, 12))
    weight = torch.randn(3, 11, generator=torch.Generator().manual_seed(9))  # e.g. advantages x mask

    def run():
        m.zero_grad()
        logits = m(ids).detach()
        logp, entropy = qwen3.token_logprobs(m, ids, chunk_size=7)  # 33 positions: 5 chunks, the last one ragged
        (logp * weight).sum().backward()
        return logits, logp.detach(), entropy, grads(m)

    fast, slow = with_and_without_kernels(monkeypatch, run)
    assert not slow[2].requires_grad  # the entropy is a metric in both
    for what, a, b in zip(["logits", "log-probs", "entropy"], fast, slow):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=what)
    for name, g in slow[3].items():
        torch.testing.assert_close(fast[3][name], g, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("engine", [{}, dict(slots=3), dict(static=True, slots=3)], ids=["chunks", "slots", "static"])
def test_generation_with_the_kernels_gives_the_formulas_completions(engine, monkeypatch):
    """Greedy and sampled completions on ragged prompts, kernels on and off: the same tokens, log-probs to rounding
    (the static step's attention is model_kernels.grouped_decode_attention with them, plain SDPA without)."""
    m = tiny_ours()
    prompts = [ids_for((n,), seed=n).tolist() for n in (3, 9, 5)]
    for kw in (dict(temperature=0), dict(temperature=1.0, n=2, seed=4)):
        fast, slow = with_and_without_kernels(monkeypatch, lambda: S.generate(m, prompts, 10, **kw, **engine))
        assert [o.tokens for o in fast] == [o.tokens for o in slow]
        for a, b in zip(fast, slow):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_each_kernel_computes_its_formula(dtype, tol):
    """RMSNorm (Zhang & Sennrich 2019), RoPE (Su et al. 2021) on the two halves of a head, the joint q/k norm and
    RoPE, the chunked log-probs and the folded GQA decode attention, each against the formula written here."""
    g = torch.Generator().manual_seed(3)
    B, T, H, H_kv, D = 2, 5, 4, 2, 16
    x = torch.randn(B, T, H, D, generator=g).to(dtype)
    w = (1 + 0.2 * torch.randn(D, generator=g)).to(dtype)
    close = lambda a, b: torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)
    x32 = x.float()
    close(K.RMSNormFunction.apply(x, w, 1e-6), w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)))

    positions = torch.arange(T)[None].expand(B, T) + 3
    angles = positions[..., None].float() * 10_000.0 ** (-torch.arange(0, D, 2).float() / D)  # (B, T, D/2)
    c, s = angles.cos()[:, :, None], angles.sin()[:, :, None]
    x1, x2 = x32.chunk(2, -1)
    rotated = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    cos, sin = qwen3.rope_cos_sin(positions, D, 10_000.0, dtype)
    close(K.RotaryFunction.apply(x, cos, sin), rotated)

    q_norm, k_norm = qwen3.RMSNorm(D, 1e-6).to(dtype), qwen3.RMSNorm(D, 1e-6).to(dtype)
    with torch.no_grad():
        k_norm.weight.mul_(w)
    k = torch.randn(B, T, H_kv, D, generator=g).to(dtype)
    rope = lambda t: K.RotaryFunction.apply(t, cos, sin).transpose(1, 2)
    q_joint, k_joint = K.norm_rope_qk(x, k, q_norm, k_norm, cos, sin)
    close(q_joint, rope(K.RMSNormFunction.apply(x, q_norm.weight, 1e-6)))
    close(k_joint, rope(K.RMSNormFunction.apply(k, k_norm.weight, 1e-6)))

    h, weight = torch.randn(B, T, D, generator=g).to(dtype), torch.randn(11, D, generator=g).to(dtype)
    targets = torch.randint(11, (B, T), generator=g)
    logp_all = (h.float() @ weight.float().T).log_softmax(-1)
    logp, entropy = K.token_logprobs(h, weight, targets, chunk_size=3)
    close(logp, logp_all.gather(-1, targets[..., None]).squeeze(-1))
    close(entropy, -(logp_all.exp() * logp_all).sum(-1))

    q, keys, values = (torch.randn(B, n, S, D, generator=g).to(dtype) for n, S in ((H, 1), (H_kv, 7), (H_kv, 7)))
    mask = torch.arange(7)[None, :] <= torch.tensor([[3], [6]])  # row 0 sees 4 slots, row 1 all 7
    scores = q.float() @ keys.float().repeat_interleave(H // H_kv, 1).transpose(-1, -2) / math.sqrt(D)
    attended = scores.masked_fill(~mask[:, None, None], float("-inf")).softmax(-1)
    close(K.grouped_decode_attention(q, keys, values, mask[:, None, None]),
          attended @ values.float().repeat_interleave(H // H_kv, 1))


def test_hand_written_backward_passes_pass_gradcheck():
    """model_kernels.py's autograd Functions carry their own backward; check each against finite differences in fp64."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    for w in (torch.randn(8, dtype=torch.float64, generator=g),       # an RMSNorm's (D,) gain
              torch.randn(5, 8, dtype=torch.float64, generator=g)):   # the joint q/k norm's (heads, D) gains
        w = (1 + 0.2 * w).requires_grad_()
        assert torch.autograd.gradcheck(lambda x, w: K.RMSNormFunction.apply(x, w, 1e-6), (x, w))
    cos, sin = qwen3.rope_cos_sin(torch.arange(3)[None].expand(2, 3) + 5, 8, 10_000.0, torch.float64)
    assert torch.autograd.gradcheck(lambda x: K.RotaryFunction.apply(x, cos, sin), (x,))
    h = torch.randn(7, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 8, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(11, (7,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: K.TokenLogProbsFunction.apply(h, w, targets, 3)[0], (h, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("amx", [False, True])
def test_linear_single_row_path_equals_f_linear(dtype, bias, amx, monkeypatch):
    """One row goes through torch.mv (the fast batch-1 decode path; bf16 only with AMX); values and gradients
    are F.linear's."""
    monkeypatch.setattr(K, "BF16_ROW_MV", amx)
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
        y_ref = F.linear(x_ref, layer.weight, layer.bias)
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
    linear = F.linear
    calls = []
    monkeypatch.setattr(F, "linear", lambda *a: calls.append(1) or linear(*a))
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
