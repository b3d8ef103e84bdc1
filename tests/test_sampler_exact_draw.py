"""research/sampler/exact_draw.py, the exact counter-based inverse-CDF draw the sampler used until issue #66:
against the float64 textbook in numpy, the sorted nucleus, and chi-square tests of its frequencies."""

import numpy as np
import pytest
import torch

from research.sampler import exact_draw as S

def draws(logits, top_p=1.0, top_k=0, rows=4000):
    """rows independent draws from one distribution: every row its own key."""
    keys = S.row_keys(torch.tensor([7]), rows)
    return S.sample_next(logits.expand(rows, -1), 1.0, top_p, top_k, keys, position=0)[0]


def test_sample_next_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert set(draws(logits, top_p=0.7).tolist()) == {0, 1}  # 0.5 < 0.7 needs the second token; 0.8 >= 0.7 stops
    assert set(draws(logits, top_k=3).tolist()) == {0, 1, 2}
    # a tie at the nucleus' edge keeps both tokens, whichever path draws (a sort would keep one, arbitrarily)
    tied = torch.log(torch.tensor([[0.4, 0.2, 0.4]]))
    assert set(draws(tied, top_p=0.3).tolist()) == set(draws(tied, top_p=0.3, top_k=3).tolist()) == {0, 2}
    values, ids = S.kept_tokens(torch.log(torch.tensor([[0.1, 0.5, 0.15, 0.25]])), 0, 0.7)
    assert ids.tolist() == [[1, 3, 2, 0]] and torch.isinf(values[0, 2:]).all()  # 0.5 + 0.25 >= 0.7: two kept


def test_inverse_cdf_by_hand():
    w = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 0.0, 1.0]])  # cumulative: 1 3 6 10 and 0 1 1 2
    for u, want in (((0.05, 0.25), (0, 1)), ((0.1, 0.5), (1, 3)), ((0.95, 0.999), (3, 3)), ((0.3, 0.0001), (2, 1))):
        assert S.inverse_cdf(w, torch.tensor(u, dtype=torch.float64)).tolist() == list(want)
    # float64 sums: a weight of 1e-12 beside 1 is drawn when u lands in its sliver (u * total = 1 + 0.5e-12),
    # which a float32 sum would round away
    tiny = torch.tensor([[1.0, 1e-12, 1.0]])
    assert S.inverse_cdf(tiny, torch.tensor([0.5], dtype=torch.float64)).item() == 1
    assert S.inverse_cdf(tiny, torch.tensor([0.5 - 1e-12], dtype=torch.float64)).item() == 0
    # two levels (2 blocks of 128): the 1e-12 token shares a block with two of weight 1, whose float32 sum rounds
    # it away; still the uniforms that draw it span its share, 1e-12 / 3: 100 of a grid spaced 1e-14 / 3
    w = torch.zeros(1, 256)
    w[0, [3, 130, 131, 132]] = torch.tensor([1.0, 1.0, 1e-12, 1.0])
    grid = (2 - 2e-12 + torch.arange(401, dtype=torch.float64) * 1e-14) / 3
    drawn = [S.inverse_cdf(w, u[None]).item() for u in grid]
    assert drawn == sorted(drawn) and set(drawn) == {130, 131, 132} and 99 <= drawn.count(131) <= 101
    # the smallest and the largest uniform never land on a token of weight 0 (first, last, or between)
    ends = torch.tensor([0.5, 2**52 - 0.5], dtype=torch.float64) / 2**52
    two_blocks = [0.0] * 5 + [1.0] + [0.0] * 194 + [1.0] + [0.0] * 55
    for w, want in (([0.0, 1.0, 0.0, 1.0, 0.0], [1, 3]), (two_blocks, [5, 200])):
        w = torch.tensor(w).reshape(1, -1).expand(2, -1).contiguous()
        assert S.inverse_cdf(w, ends).tolist() == want


def textbook_draw(logits, u):
    """Inverse-CDF sampling written out in numpy, float64: softmax, cumulative sum, first index above u."""
    p = np.exp(logits.double().numpy() - logits.double().numpy().max(-1, keepdims=True))
    cdf = p.cumsum(-1) / p.sum(-1, keepdims=True)
    return [int((c > x).argmax()) for c, x in zip(cdf, u.numpy())]


def textbook_log_softmax(logits, token):
    """log p(token) per row, numpy float64."""
    x = logits.double().numpy()
    top = x.max(-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(x - top).sum(-1))
    return x[np.arange(len(x)), token.numpy()] - lse


def textbook_nucleus(logits, top_p, top_k):
    """The kept token ids of each row, by a full sort: top-k, then the smallest set with mass >= top_p and
    every token tied with its last member."""
    kept = []
    for row in logits.double().tolist():
        order = sorted(range(len(row)), key=lambda i: -row[i])[:top_k or None]
        p = np.exp(np.array([row[i] for i in order]) - row[order[0]])
        before = np.cumsum(p / p.sum()) - p / p.sum()
        last = min(row[i] for i, b in zip(order, before) if b < top_p)
        kept.append({i for i in order if row[i] >= last})
    return kept


def test_draws_are_the_textbook_inverse_cdf_and_stay_in_the_nucleus(monkeypatch):
    """Top-p 1 is one uniform per row through the float64 CDF; with top-k or top-p (rejection, and the sorted
    fallback when NUCLEUS_DRAWS runs out: 1 forces it for most rows) every draw lies in the full sort's
    nucleus, and a row's draw does not depend on the other rows of its batch."""
    g = torch.Generator().manual_seed(0)
    keys = S.row_keys(torch.tensor([1, 2, 3, 4]), 16)
    for vocab, scale in ((97, 3.0), (5000, 1.0), (5000, 0.05)):
        logits = torch.randn(64, vocab, generator=g) * scale
        for step in range(2):
            token, logp = S.sample_next(logits, 1.0, 1.0, 0, keys, step)
            assert token.tolist() == textbook_draw(logits, S.uniform(keys, step))
            assert np.allclose(logp, textbook_log_softmax(logits, token), atol=1e-5)  # from the same softmax
        for top_p, top_k in ((0.95, 0), (0.5, 0), (1.0, 50), (0.9, 200), (0.999, 0)):
            nucleus = textbook_nucleus(logits, top_p, top_k)
            values, ids = S.kept_tokens(logits, top_k, top_p)
            assert [set(i[torch.isfinite(v)].tolist()) for v, i in zip(values, ids)] == nucleus
            for draws_allowed in (8, 1):
                monkeypatch.setattr(S, "NUCLEUS_DRAWS", draws_allowed)
                token, logp = S.sample_next(logits, 1.0, top_p, top_k, keys, 3)
                assert np.allclose(logp, textbook_log_softmax(logits, token), atol=1e-5)  # before top-k / top-p
                one_by_one = [S.sample_next(logits[i:i + 1], 1.0, top_p, top_k, keys[i:i + 1], 3)[0].item()
                              for i in range(0, 64, 9)]
                assert all(t in kept for t, kept in zip(token.tolist(), nucleus)), (vocab, scale, top_p, top_k)
                assert token[::9].tolist() == one_by_one


def test_nucleus_check_skips_the_rows_the_bound_decides_and_equals_the_full_check(monkeypatch):
    """outside_nucleus against the definition in numpy float64 (the tokens more probable than the drawn one hold
    >= top_p of the mass), on rows from confident to flat; only the rows surely_inside leaves undecided take the
    pass over the vocabulary (a spy counts them), no more than a drawn token's own mass alone leaves."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(96, 3000, generator=g) * torch.linspace(0.5, 12, 96)[:, None]
    weights = (logits - logits.amax(-1, keepdim=True)).exp()
    total, sums = weights.sum(-1), S.block_sums(weights)
    token = torch.randint(3000, (96,), generator=g)
    token[::2] = weights[::2].argmax(-1)  # half the rows drew their most probable token
    checked = []
    gt = torch.gt
    monkeypatch.setattr(torch, "gt", lambda w, t, **kw: checked.append(len(w)) or gt(w, t, **kw))
    w64 = weights.double().numpy()
    for top_p in (0.95, 0.5, 0.999):
        checked.clear()
        drawn = w64[np.arange(96), token.numpy()]
        expected = [row[row > d].sum() >= top_p * row.sum() for row, d in zip(w64, drawn)]
        assert S.outside_nucleus(weights, total, sums, token, top_p).tolist() == expected
        undecided = int((~S.surely_inside(weights[torch.arange(96), token], total, sums, top_p)).sum())
        own_mass = int((drawn > (1 - top_p + S.NUCLEUS_MARGIN) * w64.sum(-1)).sum())
        assert checked == ([undecided] if undecided else []) and 0 < 96 - undecided and undecided <= 96 - own_mass
    # at the boundary: the tokens above hold exactly top_p (outside: the nucleus already has its mass); a tie
    # with a kept token is kept (nothing lies strictly above it)
    weights = torch.tensor([[3.0, 1.0], [1.0, 1.0]])
    outside = S.outside_nucleus(weights, weights.sum(-1), S.block_sums(weights), torch.tensor([1, 1]), 0.75)
    assert outside.tolist() == [True, False]


def test_the_block_bound_by_hand_and_never_skips_a_token_outside():
    """surely_inside by hand: 12 blocks of 128 tokens, one token of weight 1 in block 0, the drawn token (0.2)
    alone in block 1, ten tail blocks of 128 x 0.001. Drawing 0.2, only block 0 sums to more (1.0 < 0.9 x 2.48):
    inside by the bound, though 0.2 / 2.48 < 1 - 0.9. Drawing a tail token, every block sums to more: undecided.
    Then on random rows (peaked to flat, bf16 ties, zeros), for every token of a row: surely inside implies the
    float64 definition's inside, and the bound decides every token the own-mass rule does and more (blocks of 8
    tokens here: the vocabulary's size sets how many blocks the tail spreads over)."""
    w = torch.zeros(1, 1536)
    w[0, 0], w[0, 128], w[0, 256:] = 1.0, 0.2, 0.001
    drawn = w[0, [128, 300]]
    total, sums = w.sum(-1).expand(2), S.block_sums(w).expand(2, -1)
    assert S.surely_inside(drawn, total, sums, 0.9).tolist() == [True, False]
    assert S.outside_nucleus(w.expand(2, -1), total, sums, torch.tensor([128, 300]), 0.9).tolist() == [False, False]
    g = torch.Generator().manual_seed(4)
    scales = torch.tensor([0.3, 1.0, 3.0, 6.0, 12.0, 30.0])
    logits = (torch.randn(6, 1544, generator=g) * scales[:, None]).bfloat16().float()  # bf16: many ties; 193 blocks
    logits[:, ::7] = float("-inf")  # weights of exactly 0
    weights = (logits - logits.amax(-1, keepdim=True)).exp()
    w64, decided = weights.double().numpy(), {"bound": 0, "own mass": 0}
    for top_p in (0.5, 0.9, 0.95, 0.999):
        for r in range(6):
            above = np.array([w64[r][w64[r] > d].sum() for d in w64[r]])
            inside = above < top_p * w64[r].sum()
            total, sums = weights[r].sum().expand(1544), S.block_sums(weights[r:r + 1]).expand(1544, -1)
            surely = S.surely_inside(weights[r], total, sums, top_p).numpy()  # every token of row r as the drawn one
            own_mass = w64[r] > (1 - top_p + S.NUCLEUS_MARGIN) * w64[r].sum()
            assert not (surely & ~inside).any() and not (own_mass & ~surely).any(), (r, top_p)
            decided["bound"] += surely.sum()
            decided["own mass"] += own_mass.sum()
    assert decided["bound"] > 1.5 * decided["own mass"], decided  # 848 against 436


def test_uniforms_are_uniform_and_independent():
    keys = S.row_keys(torch.tensor([5]), 20000)
    u = S.uniform(keys, 0)
    assert u.dtype == torch.float64 and 0 < u.min() and u.max() < 1
    counts = torch.histc(u.float(), bins=10, min=0, max=1)
    assert ((counts - 2000) ** 2 / 2000).sum().item() < 27.9  # chi-square, 9 degrees of freedom: p = 0.001
    for other in (S.uniform(keys, 1), S.uniform(keys, 0, draw=1)):  # the next step, a redraw of this one
        assert abs(torch.corrcoef(torch.stack([u, other]))[0, 1].item()) < 0.03
    assert torch.equal(u, S.uniform(keys, torch.zeros(20000, dtype=torch.long)))  # an int step or each row's own


@pytest.mark.parametrize("draws_allowed", [8, 1])
def test_draws_follow_the_softmax(draws_allowed, monkeypatch):
    monkeypatch.setattr(S, "NUCLEUS_DRAWS", draws_allowed)  # 1: most rejected rows take the sorted fallback
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    counts = torch.bincount(draws(torch.log(p)[None], rows=20000), minlength=4).double()
    chi2 = (((counts - 20000 * p) ** 2) / (20000 * p)).sum().item()
    assert chi2 < 16.3  # chi-square, 3 degrees of freedom: p = 0.001
    # with top-p 0.9 (or top-k 3, or both) the kept tokens {0, 1, 2} are drawn in proportion 0.5 : 0.3 : 0.15
    q = torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95
    for top_p, top_k in ((0.9, 0), (1.0, 3), (0.9, 3)):
        kept = torch.bincount(draws(torch.log(p)[None], top_p=top_p, top_k=top_k, rows=20000), minlength=4).double()
        assert kept[3] == 0 and (((kept[:3] - 20000 * q[:3]) ** 2) / (20000 * q[:3])).sum().item() < 13.8  # 2 dof
    # a flatter one at top-p 0.5: the nucleus {0, 1, 2} holds 21/36, so 15/36 of the draws are redrawn, and
    # (15/36)^8 = 0.09% of the rows still miss after 8 draws and take the sorted fallback
    fallback_rows = []
    kept_tokens = S.kept_tokens
    monkeypatch.setattr(S, "kept_tokens",
                        lambda logits, *a: fallback_rows.append(len(logits)) or kept_tokens(logits, *a))
    w = torch.arange(8, 0, -1).double()
    kept = torch.bincount(draws(torch.log(w / w.sum())[None], top_p=0.5, rows=20000), minlength=8).double()
    q = w[:3] / w[:3].sum()
    assert kept[3:].sum() == 0 and (((kept[:3] - 20000 * q) ** 2) / (20000 * q)).sum().item() < 13.8  # 2 dof
    assert 0 < sum(fallback_rows) < 60 if draws_allowed == 8 else 7900 < sum(fallback_rows) < 8760  # 8,333 expected
    # consecutive steps of one row are independent too: pairs (step t, step t+1) are not correlated
    keys = S.row_keys(torch.tensor([3]), 5000)
    x = [S.sample_next(torch.log(p)[None].expand(5000, -1), 1.0, 1.0, 0, keys, position=t)[0].double() for t in (0, 1)]
    assert abs(torch.corrcoef(torch.stack(x))[0, 1].item()) < 0.05


def test_inverse_cdf_of_nan_weights_stays_in_range():
    w = torch.full((3, 64), float("nan"))
    w[1] = 1.0  # a finite row beside them draws as before
    tokens = S.inverse_cdf(w, torch.tensor([0.1, 0.5, 0.999], dtype=torch.float64))
    assert tokens.tolist()[1] == 32 and all(0 <= t < 64 for t in tokens.tolist())
