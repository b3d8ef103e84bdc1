"""
Hand-written kernels for model.py: the same math as its textbook formulas, in fewer ops and less memory.

model.py calls these while `model.use_kernels` is True (train_rl.py --kernels); by default it runs the formulas as
written. tests/test_model_kernels.py checks each kernel against its formula and its
backward pass against finite differences (benchmarks/bench_model.py times training with them).

- RMSNorm, RoPE and the LM head's log-probs are autograd Functions with hand-written backward passes: fewer
  full-size ops and fewer saved activations than autograd through the formulas.
- Attention's q and k go through their per-head norms and RoPE as one tensor: the same math in half the ops;
  the static decode step (batching.py) folds grouped-query heads into the query axis.
- On a CPU, a linear layer picks its matrix product by the rows it gets (decoding feeds a few rows per step).
"""

import torch
import torch.nn.functional as F


# -----------------------------------------------------------------------------
# RMSNorm, RoPE and attention


class RMSNormFunction(torch.autograd.Function):
    """y = w * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019), with a hand-written backward.

    Autograd through the textbook formula runs ~19 full-size ops and keeps an fp32 copy of x for backward;
    this runs 3 forward and 6-7 backward ops in x's dtype and keeps only x_hat = x * rstd. The mean square
    is accumulated in fp32, then rstd is rounded to x's dtype so no full-size fp32 copy is made: in bf16
    a per-row scale error of at most 2^-9 (one bf16 rounding; the tests check the bf16 path is as
    accurate as transformers'), in fp32 exactly the reference formula.
    `weight` is (D,) or, for the joint q/k norm, (heads, D).
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        acc = torch.promote_types(x.dtype, torch.float32)
        ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=acc).square_().div_(x.shape[-1])
        rstd = ms.add_(eps).rsqrt_().to(x.dtype)  # (..., 1)
        x_hat = x * rstd
        ctx.save_for_backward(x_hat, weight, rstd)
        return x_hat * weight

    @staticmethod
    def backward(ctx, grad_y):
        x_hat, weight, rstd = ctx.saved_tensors
        gy_x_hat = grad_y * x_hat
        grad_w = gy_x_hat.sum(tuple(range(grad_y.dim() - weight.dim())))
        # dL/dx = rstd * (g - x_hat * mean(g * x_hat)) with g = dL/dx_hat = grad_y * w, since
        # d x_hat / dx = rstd * (I - x_hat x_hat^T / D); sum(g * x_hat) is a matrix-vector product for a (D,) w
        dot = gy_x_hat @ weight if weight.dim() == 1 else (gy_x_hat * weight).sum(-1)
        g = grad_y * weight
        return g.addcmul_(x_hat, dot.unsqueeze(-1).div_(-x_hat.shape[-1])).mul_(rstd), grad_w, None


class RotaryFunction(torch.autograd.Function):
    """y = x * cos + swap_halves(x) * sin (model.apply_rope) in 3 ops each way (autograd on the formula takes ~10) and
    no saved activations: swapping halves is its own transpose, so dL/dx = g * cos + swap_halves(g * sin). Here the
    swap is a roll by half the head (the same permutation)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return (x * cos).addcmul_(x.roll(x.shape[-1] // 2, -1), sin)

    @staticmethod
    def backward(ctx, grad_y):
        cos, sin = ctx.saved_tensors
        return (grad_y * sin).roll(grad_y.shape[-1] // 2, -1).addcmul_(grad_y, cos), None, None


def norm_rope_qk(q, k, q_norm, k_norm, cos, sin):
    """Qwen3's per-head RMSNorm and then RoPE of q (B, T, H, D) and k (B, T, H_kv, D), both as one
    (B, T, H + H_kv, D) tensor: the same math as two separate passes, in half the ops. Returns q, k as
    (B, H, T, D), (B, H_kv, T, D)."""
    H, D = q.shape[2], q.shape[3]
    qk = torch.cat([q, k], dim=2)
    norm_w = torch.cat([q_norm.weight.expand(H, D), k_norm.weight.expand(k.shape[2], D)])
    qk = RotaryFunction.apply(RMSNormFunction.apply(qk, norm_w, q_norm.eps), cos, sin).transpose(1, 2)
    return qk.split([H, k.shape[2]], dim=1)


def grouped_decode_attention(q, k, v, mask):
    """One decode step's attention with GQA folded in: the G query heads of a KV group become G query positions
    of one head (they share its keys and the row's mask), so SDPA sees equal head counts, a (B, 1, 1, S) mask
    and no enable_gqa (which can send SDPA on CUDA to its slow math kernel). q (B, H, 1, D), k v (B, H_kv, S, D)."""
    B, H, _, D = q.shape
    y = F.scaled_dot_product_attention(q.reshape(B, k.shape[1], H // k.shape[1], D), k, v, attn_mask=mask)
    return y.reshape(B, H, 1, D)


# -----------------------------------------------------------------------------
# The LM head's log-probs


class TokenLogProbsFunction(torch.autograd.Function):
    """log softmax(h W^T)[target] and the entropy of softmax(h W^T), chunk by chunk over the N positions.

    Only one chunk's (chunk, vocab) logits exist at a time, in buffers reused across chunks (a fresh
    multi-hundred-MB tensor per op costs page faults comparable to the op itself); backward recomputes
    each chunk's logits and forms dL/dlogits = g * (onehot(target) - exp(logits - logZ)) in place. Memory
    is O(chunk x vocab) instead of O(N x vocab), for one extra LM-head matmul.
    """

    @staticmethod
    def forward(ctx, h, weight, targets, chunk_size):  # h (N, D), weight (V, D), targets (N,)
        N, V = h.shape[0], weight.shape[0]
        acc = torch.promote_types(h.dtype, torch.float32)
        n = min(chunk_size, N)
        logits = h.new_empty(n, V)  # the matmul's output, in the model dtype
        z, logp_all = torch.empty(n, V, dtype=acc, device=h.device), torch.empty(n, V, dtype=acc, device=h.device)
        logp, entropy, logz = (torch.empty(N, dtype=acc, device=h.device) for _ in range(3))
        for i in range(0, N, chunk_size):
            j = min(i + chunk_size, N)
            torch.mm(h[i:j], weight.t(), out=logits[:j - i])
            z_c, lp = z[:j - i], logp_all[:j - i]
            torch.log_softmax(z_c.copy_(logits[:j - i]), -1, out=lp)  # log-softmax in fp32
            logp[i:j] = lp.gather(1, targets[i:j, None]).squeeze(1)
            logz[i:j] = z_c[:, 0] - lp[:, 0]
            entropy[i:j] = torch.exp(lp, out=z_c).mul_(lp).sum(-1).neg_()  # H = -sum p log p
        ctx.save_for_backward(h, weight, targets, logz)
        ctx.chunk_size = chunk_size
        ctx.mark_non_differentiable(entropy)  # a metric, not a loss term
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _):
        h, weight, targets, logz = ctx.saved_tensors
        N, V, chunk_size = h.shape[0], weight.shape[0], ctx.chunk_size
        n = min(chunk_size, N)
        logits = h.new_empty(n, V)
        p = torch.empty(n, V, dtype=logz.dtype, device=h.device)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        for i in range(0, N, chunk_size):
            j = min(i + chunk_size, N)
            g = grad_logp[i:j]
            torch.mm(h[i:j], weight.t(), out=logits[:j - i])
            p_c = p[:j - i].copy_(logits[:j - i]).sub_(logz[i:j, None]).exp_()  # softmax, in fp32
            p_c.mul_(-g[:, None])  # dL/dlogits = g * (onehot(target) - p)
            p_c[torch.arange(j - i, device=h.device), targets[i:j]] += g
            grad_logits = logits[:j - i].copy_(p_c)
            if grad_h is not None:
                torch.mm(grad_logits, weight, out=grad_h[i:j])
            if grad_w is not None and i == 0:
                torch.mm(grad_logits.t(), h[i:j], out=grad_w)
            elif grad_w is not None:
                grad_w.addmm_(grad_logits.t(), h[i:j])
        return grad_h, grad_w, None, None


def token_logprobs(h, weight, targets, chunk_size=256):
    """h (B, T, D) -> log p(targets) (B, T) and the entropy there, the (B, T, vocab) logits never whole at once."""
    B, T, D = h.shape
    weight = weight.to(h.dtype)  # a no-op unless autocast made h lower precision
    logp, entropy = TokenLogProbsFunction.apply(h.reshape(B * T, D), weight, targets.reshape(B * T), chunk_size)
    return logp.view(B, T), entropy.view(B, T)


# -----------------------------------------------------------------------------
# The CPU's matrix products

# Where the CPU has AMX tiles, oneDNN's bf16 GEMM runs on them and is slow for one row: there torch.mv reads
# bf16 weights 1.45x faster (17.7 vs 12.2 GB/s, 2 threads); on an AMD EPYC without AMX the GEMM is the faster
# one (23.2 vs 15.6 GB/s). Both from research/sampler/bench_sample.py --kernels.
BF16_ROW_MV = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
# MKL's float32 GEMM (x @ W.T) has a cliff at a few rows against a large weight: on an AMD EPYC 13 rows of
# Qwen3's lm_head took 2.2x the time of 16. The same product with the weight on the left (W @ x.T) has none:
# a decode step of 8-48 rows at the 0.6B widths ran 1.0-2.1x faster; 2 rows are about 2x slower (--kernels).
FP32_ROWS_WEIGHT_LEFT = (8, 48)  # rows, inclusive; for weights of at least 2**20 entries
WEIGHT_LEFT_MIN_SIZE = 2**20


def cpu_linear(x, weight, bias):
    """F.linear(x, weight, bias) on a CPU, by the product that is fastest for the rows x holds: a single row goes to
    torch.mv (bf16 only where BF16_ROW_MV says it is faster: batch-1 decoding is one row per step), and 8-48
    float32 rows against a large weight to W @ x.T (FP32_ROWS_WEIGHT_LEFT: a decode step's tail)."""
    rows = x.numel() // max(x.shape[-1], 1)
    plain = torch.is_autocast_enabled("cpu")  # autocast casts F.linear's inputs, not the others'
    if not plain and rows == 1 and (BF16_ROW_MV or x.dtype != torch.bfloat16):
        y = torch.mv(weight, x.reshape(-1))
    elif (not plain and x.dtype == torch.float32 and FP32_ROWS_WEIGHT_LEFT[0] <= rows <= FP32_ROWS_WEIGHT_LEFT[1]
          and weight.numel() >= WEIGHT_LEFT_MIN_SIZE):
        y = (weight @ x.reshape(rows, -1).T).T.contiguous()  # row-major again for what reads it
    else:
        return F.linear(x, weight, bias)
    return (y if bias is None else y + bias).view(*x.shape[:-1], -1)
