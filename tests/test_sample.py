"""sample.generate against uncached greedy decoding, transformers' generate, and full-forward log-probs."""

import copy
import itertools

import numpy as np
import pytest
import torch

import model as M
import sample as S
import checkpoint
import looped

VOCAB = 97


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Qwen3 written by transformers and loaded by us (the pair the tests compare)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hc = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  tie_word_embeddings=True, max_position_embeddings=256)
    ref = transformers.Qwen3ForCausalLM(hc).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)  # large weights: peaked, prompt-dependent next-token distributions
    d = tmp_path_factory.mktemp("tiny")
    ref.save_pretrained(d)
    return checkpoint.load_model(d, device="cpu"), ref


def random_prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def greedy_no_cache(model, prompt, steps):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def full_forward_logprobs(model, prompt, tokens):
    with torch.no_grad():
        logp = model(torch.tensor([prompt + tokens])).log_softmax(-1)[0, len(prompt) - 1:-1]
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_greedy_ragged_batch_equals_uncached_and_transformers(tiny):
    model, ref = tiny
    prompts = random_prompts([5, 17, 3, 9, 1])
    out = S.generate(model, prompts, 24, temperature=0)
    assert [o.prompt_index for o in out] == list(range(len(prompts)))
    for p, o in zip(prompts, out):
        assert o.tokens == greedy_no_cache(model, p, 24)
        hf = ref.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert o.tokens == hf[0, len(p):].tolist()
        assert o.finish_reason == "length"


def test_logprobs_equal_full_forward(tiny):
    model, _ = tiny
    prompts = random_prompts([4, 11, 7])
    for kwargs in (dict(temperature=0), dict(temperature=1.3, top_p=0.8, top_k=20, n=3, seed=0),
                   dict(temperature=1.0, n=2, seed=1), dict(temperature=1.0, top_p=0.9, n=2, seed=2)):
        for o in S.generate(model, prompts, 16, **kwargs):  # at temperature 1 from the sampling's own softmax
            p = prompts[o.prompt_index]
            expected = full_forward_logprobs(model, p, o.tokens)
            assert torch.allclose(torch.tensor(o.logprobs), expected, atol=1e-4)
            with torch.no_grad():
                trainer = M.token_logprobs(model, torch.tensor([p + o.tokens]))[0][0, len(p) - 1:]
            assert torch.allclose(torch.tensor(o.logprobs), trainer, atol=1e-4)  # what importance ratios divide by


def test_seed_reproduces_and_samples_differ(tiny):
    model, _ = tiny
    prompts = random_prompts([6, 10])
    a = S.generate(model, prompts, 20, temperature=1.0, n=4, seed=123)
    b = S.generate(model, prompts, 20, temperature=1.0, n=4, seed=123)
    c = S.generate(model, prompts, 20, temperature=1.0, n=4, seed=124)
    assert [x.tokens for x in a] == [x.tokens for x in b]
    assert [x.tokens for x in a] != [x.tokens for x in c]
    # the n samples of one prompt are independent draws, including their first token
    first = {tuple(x.tokens[:1]) for x in S.generate(model, prompts[:1], 1, temperature=3.0, n=32, seed=0)}
    assert len(first) > 1
    assert len({tuple(x.tokens) for x in a[:4]}) == 4


def test_n_samples_share_one_prefill(tiny, monkeypatch):
    model, _ = tiny
    prompts = random_prompts([8, 12, 5])
    widths = []
    real_forward = model.forward

    def counting_forward(input_ids, cache=None, last_only=False):
        widths.append(tuple(input_ids.shape))
        return real_forward(input_ids, cache=cache, last_only=last_only)

    monkeypatch.setattr(model, "forward", counting_forward)
    S.generate(model, prompts, 3, temperature=1.0, n=5, seed=0)
    assert widths[0] == (3, 12)  # one prefill row per prompt, left-padded to the longest
    assert widths[1] == (15, 1)  # then n rows per prompt decode from the copied cache


def test_a_large_prefill_runs_in_pieces_with_the_same_completions(tiny, monkeypatch):
    """Past PREFILL_TOKENS prompt tokens a prefill runs in row pieces (each forward at most that many tokens, so
    its activations stay bounded); the cache, logits and completions are the single forward's."""
    model, _ = tiny
    prompts = random_prompts([5, 9, 13, 2, 7])
    whole_cache, whole_logits = S.prefill(model, prompts, 3, 4, 0)
    whole = [S.generate(model, prompts, 12, temperature=t, n=3, seed=5) for t in (0, 1.0)]
    monkeypatch.setattr(S, "PREFILL_TOKENS", 2 * 13)  # two rows of the longest prompt per forward
    widths = []
    real_forward = model.forward
    monkeypatch.setattr(model, "forward", lambda ids, cache=None, last_only=False: (
        widths.append(tuple(ids.shape)), real_forward(ids, cache=cache, last_only=last_only))[1])
    cache, logits = S.prefill(model, prompts, 3, 4, 0)
    assert widths == [(2, 13), (2, 13), (1, 13)]
    assert cache.length == whole_cache.length == 13 and torch.equal(cache.pad, whole_cache.pad)
    assert torch.allclose(logits, whole_logits, atol=1e-5)
    assert torch.allclose(cache.k, whole_cache.k, atol=1e-6) and torch.allclose(cache.v, whole_cache.v, atol=1e-6)
    for t, expect in zip((0, 1.0), whole):
        got = S.generate(model, prompts, 12, temperature=t, n=3, seed=5)
        assert [c.tokens for c in got] == [c.tokens for c in expect]


def test_stop_tokens_end_rows_independently(tiny):
    model, _ = tiny
    prompts = random_prompts([5, 9, 13, 2])
    free = S.generate(model, prompts, 30, temperature=0)
    # stop on the 3rd greedy token of row 0: row 0 must stop there, every other row keeps its own course
    stop = free[0].tokens[2]
    out = S.generate(model, prompts, 30, temperature=0, stop_token_ids=[stop])
    for f, o in zip(free, out):
        if stop in f.tokens:
            cut = f.tokens.index(stop) + 1
            assert o.tokens == f.tokens[:cut] and o.finish_reason == "stop"
        else:
            assert o.tokens == f.tokens and o.finish_reason == "length"
    assert out[0].finish_reason == "stop" and len(out[0].tokens) <= 3


def test_finished_rows_are_compacted_out(tiny, monkeypatch):
    model, _ = tiny
    prompts = random_prompts([5, 9, 13, 2, 7, 4, 6, 8])
    free = S.generate(model, prompts, 20, temperature=0)
    stop = free[0].tokens[1]
    batch_sizes = []
    real_forward = model.forward
    monkeypatch.setattr(model, "forward", lambda ids, cache=None, last_only=False: (
        batch_sizes.append(ids.shape[0]), real_forward(ids, cache=cache, last_only=last_only))[1])
    out = S.generate(model, prompts, 20, temperature=0, stop_token_ids=[stop])
    n_stopped = sum(o.finish_reason == "stop" for o in out)
    assert n_stopped >= 2, "the test needs rows that stop early"
    assert min(batch_sizes) < len(prompts)  # decode batch shrank once rows finished
    monkeypatch.setattr(M.KVCache, "select", None)  # n = 1 never repeats rows: compaction must not copy the cache
    assert [o.tokens for o in S.generate(model, prompts, 20, temperature=0, stop_token_ids=[stop])] == \
        [o.tokens for o in out]
    assert [o.tokens for o in out] == [f.tokens[:f.tokens.index(stop) + 1] if stop in f.tokens else f.tokens
                                        for f in free]


def test_tiny_top_p_is_greedy_and_top_k_1_is_greedy(tiny):
    model, _ = tiny
    prompts = random_prompts([6, 3, 10])
    greedy = [o.tokens for o in S.generate(model, prompts, 15, temperature=0)]
    assert [o.tokens for o in S.generate(model, prompts, 15, temperature=1.0, top_p=1e-6, seed=1)] == greedy
    assert [o.tokens for o in S.generate(model, prompts, 15, temperature=1.0, top_k=1, seed=2)] == greedy


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


def test_a_prompts_samples_do_not_depend_on_its_batch(tiny):
    model, _ = tiny
    prompts = random_prompts([5, 17, 3, 9])
    seeds = [11, 22, 33, 44]
    together = S.generate(model, prompts, 12, temperature=1.0, n=3, seed=seeds)
    split = S.generate(model, prompts, 12, temperature=1.0, n=3, seed=seeds, token_budget=100)
    alone = [c for i in (2, 0) for c in S.generate(model, [prompts[i]], 12, temperature=1.0, n=3, seed=[seeds[i]])]
    assert [o.tokens for o in split] == [o.tokens for o in together]
    assert [o.tokens for o in alone] == [o.tokens for o in together[6:9] + together[0:3]]
    with pytest.raises(ValueError, match="seed"):
        S.generate(model, prompts, 4, seed=[1, 2])


def test_token_budget_splits_without_changing_greedy_output(tiny):
    model, _ = tiny
    prompts = random_prompts([5, 17, 3, 9, 11, 2])
    whole = S.generate(model, prompts, 12, temperature=0)
    chunks = S.plan_chunks(prompts, 1, 12, token_budget=60)
    assert len(chunks) > 1 and sorted(i for c in chunks for i in c) == list(range(6))
    assert all(len(c) * (max(len(prompts[i]) for i in c) + 12) <= 60 for c in chunks)
    split = S.generate(model, prompts, 12, temperature=0, token_budget=60)
    assert [o.tokens for o in split] == [o.tokens for o in whole]


def test_bad_input_errors_name_the_argument(tiny):
    model, _ = tiny
    assert S.generate(model, [], 5) == []
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        S.generate(model, [[1, 2], []], 5)
    with pytest.raises(ValueError, match="context"):
        S.generate(model, [[1] * 250], 10)
    with pytest.raises(ValueError, match="token_budget"):
        S.generate(model, [[1] * 20], 10, n=4, token_budget=50)
    with pytest.raises(ValueError, match="max_new_tokens"):
        S.generate(model, [[1, 2]], 0)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="top_p"):
            S.generate(model, [[1, 2]], 4, top_p=bad)
    with pytest.raises(ValueError, match="temperature"):
        S.generate(model, [[1, 2]], 4, temperature=-1)
    with pytest.raises(ValueError, match="outside"):
        S.generate(model, [[1, VOCAB]], 4)


def test_progress_callback_counts_tokens(tiny):
    model, _ = tiny
    seen = []
    out = S.generate(model, random_prompts([3, 4]), 7, temperature=0, progress=lambda *a: seen.append(a))
    tokens_done, rows_done, rows_total, seconds = seen[-1]
    assert tokens_done == sum(len(o.tokens) for o in out) == 14 and rows_total == 2 and seconds >= 0


def test_compiled_decode_gives_the_eager_completions(tiny):
    """compile=True (torch.compile of the decode step, dynamic shapes) on this CPU: the same greedy tokens
    through ragged prompts, stops and compaction, the same seeded samples, log-probs within rounding."""
    torch._dynamo.reset()
    model, _ = tiny
    prompts = random_prompts([5, 9, 13, 2, 7])
    stop = S.generate(model, prompts, 16, temperature=0)[0].tokens[1]
    for kw in [dict(temperature=0, stop_token_ids=[stop]), dict(temperature=1.0, n=2, seed=3)]:
        eager = S.generate(model, prompts, 16, **kw)
        compiled = S.generate(model, prompts, 16, compile=True, **kw)
        assert [c.tokens for c in compiled] == [e.tokens for e in eager]
        assert [c.finish_reason for c in compiled] == [e.finish_reason for e in eager]
        for c, e in zip(compiled, eager):
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(e.logprobs), atol=1e-4, rtol=0)
        if "stop_token_ids" in kw:
            assert any(e.finish_reason == "stop" for e in eager), "the test needs rows that stop early"


def test_generate_on_gpu_equals_the_cpu(tiny, gpu):
    """fp32 on the GPU, eager and compiled (on CUDA: the static step captured in a CUDA graph): the CPU's greedy
    tokens and seeded samples (the draws are a hash of (seed, row, step, token), whatever the device),
    log-probs equal up to rounding."""
    model, _ = tiny
    on_gpu = copy.deepcopy(model).to(gpu)
    prompts = random_prompts([5, 17, 3, 9])
    for kw in [dict(temperature=0), dict(temperature=1.0, n=2, seed=5)]:
        on_cpu = S.generate(model, prompts, 16, **kw)
        for compile in (False, True):
            out = S.generate(on_gpu, prompts, 16, compile=compile, **kw)
            assert [o.tokens for o in out] == [c.tokens for c in on_cpu], (kw, compile)
            for o, c in zip(out, on_cpu):
                torch.testing.assert_close(torch.tensor(o.logprobs), torch.tensor(c.logprobs), atol=1e-3, rtol=0)


# -----------------------------------------------------------------------------
# Looped depth (looped.add_loop): its own cache rows per (layer, loop) pass, so the sampler's log-probs stay the
# trainer's


def looped_copy(model, spec, lora_rank=0):
    return looped.add_loop(copy.deepcopy(model), spec, lora_rank)


def test_looped_generation_at_initialisation_equals_the_plain_model(tiny):
    model, _ = tiny
    deep = looped_copy(model, "1:2:3")
    prompts = random_prompts([5, 17, 3, 9])
    for kwargs in (dict(temperature=0), dict(temperature=1.0, n=3, seed=0)):
        plain, loop = S.generate(model, prompts, 16, **kwargs), S.generate(deep, prompts, 16, **kwargs)
        assert [o.tokens for o in loop] == [o.tokens for o in plain]
        assert [o.logprobs for o in loop] == [o.logprobs for o in plain]  # exactly, not within a tolerance


@pytest.mark.parametrize("spec,rank", [("0:2:2", 0), ("1:2:3", 2)])
def test_looped_sampler_logprobs_equal_the_trainers_after_updates(tiny, spec, rank):
    model, _ = tiny
    m = looped_copy(model, spec, rank)
    loop = {id(p) for p in m.loop.parameters()}
    opt = torch.optim.AdamW([dict(params=[p for p in m.parameters() if id(p) not in loop], lr=1e-3),
                             dict(params=list(m.loop.parameters()), lr=3e-2)])
    g = torch.Generator().manual_seed(5)
    for _ in range(3):  # a few updates open the gates and move the shared weights
        M.token_logprobs(m, torch.randint(1, VOCAB, (4, 12), generator=g))[0].mean().neg().backward()
        opt.step()
        opt.zero_grad()
    assert all(a > 0 for a in looped.loop_metrics(m)["loop_gate_abs"])
    prompts = random_prompts([4, 11, 7])
    chunked, static = (S.generate(m, prompts, 16, temperature=1.0, n=3, seed=7, static=s) for s in (False, True))
    assert [o.tokens for o in static] == [o.tokens for o in chunked]  # the static step keeps every pass's row
    for o in chunked + static:
        p = prompts[o.prompt_index]
        with torch.no_grad():
            trainer = M.token_logprobs(m, torch.tensor([p + o.tokens]))[0][0, len(p) - 1:]
        assert torch.allclose(torch.tensor(o.logprobs), trainer, atol=1e-5)


def test_the_token_budget_counts_every_layer_pass(tiny):
    model, _ = tiny
    deep = looped_copy(model, "1:2:3")  # 2 layers + 2 extra passes of layer 1
    assert S.kv_bytes_per_token(deep) == 2 * S.kv_bytes_per_token(model)
    assert S.default_token_budget(deep) == S.default_token_budget(model) // 2
    assert deep.new_cache(2, 10).k.shape[0] == 4


def test_looped_generate_on_gpu_equals_the_cpu(tiny, gpu):
    """A looped model with open gates and per-loop adapters, on the GPU in fp32, eager and compiled: the CPU's
    greedy tokens and seeded samples, log-probs equal up to rounding."""
    model, _ = tiny
    deep = looped_copy(model, "1:2:3", lora_rank=2)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in deep.loop.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.03 if ".lora_" in name else 0.3))
    on_gpu, prompts = copy.deepcopy(deep).to(gpu), random_prompts([5, 17, 3, 9])
    for kw, compile in itertools.product([dict(temperature=0), dict(temperature=1.0, n=2, seed=5)], (False, True)):
        want, got = S.generate(deep, prompts, 16, **kw), S.generate(on_gpu, prompts, 16, compile=compile, **kw)
        assert [o.tokens for o in got] == [o.tokens for o in want], (kw, compile)
        flat = lambda out: torch.tensor([lp for o in out for lp in o.logprobs])  # noqa: E731
        torch.testing.assert_close(flat(got), flat(want), atol=1e-3, rtol=0)


def poisoned(model, value, token=None):
    """A copy of the model whose final norm weight holds `value`: every logit becomes non-finite (NaN weights, as
    a diverged run or a broken config.json gives), or, with token, only that token's row of the head does."""
    bad = copy.deepcopy(model)
    with torch.no_grad():
        if token is None:
            bad.model.norm.weight[0] = value
        else:
            bad.lm_head.weight[token] = value
    return bad


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("kw", [dict(temperature=0), dict(temperature=1.0), dict(temperature=0.7),
                                dict(temperature=1.0, top_k=5), dict(temperature=1.0, top_p=0.9),
                                dict(temperature=1.0, slots=2), dict(temperature=1.0, static=True, slots=2)],
                         ids=["greedy", "t1", "t0.7", "top_k", "top_p", "slots", "static"])
def test_non_finite_logits_are_a_clear_error(tiny, kw, value):
    # before: `index 2 is out of bounds` from the inverse-CDF's gather (or, greedy, junk tokens with NaN log-probs)
    bad = poisoned(tiny[0], value)
    with pytest.raises(ValueError, match=r"^the model's logits are not finite \(NaN/inf\)"):
        S.generate(bad, random_prompts([4, 6]), 5, seed=0, **kw)


def test_inverse_cdf_of_nan_weights_stays_in_range():
    w = torch.full((3, 64), float("nan"))
    w[1] = 1.0  # a finite row beside them draws as before
    tokens = S.inverse_cdf(w, torch.tensor([0.1, 0.5, 0.999], dtype=torch.float64))
    assert tokens.tolist()[1] == 32 and all(0 <= t < 64 for t in tokens.tolist())
