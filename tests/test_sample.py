"""sample.generate against uncached greedy decoding, transformers' generate, and full-forward log-probs."""

import copy
import itertools

import pytest
import torch

import model as M
import sample as S
import checkpoint
import coupled
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


def full_forward_logprobs(model, prompt, tokens, temperature=1.0, top_p=1.0, top_k=0):
    """log q(token) of the distribution each token was drawn from, by a full forward (sample.sampling_logprobs
    on its logits: the temperature, top-k and top-p cut, renormalized)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens]))[0, len(prompt) - 1:-1]
        logq = S.sampling_logprobs(logits, temperature, top_p, top_k)
    return logq.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


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


def test_a_coupled_model_samples_as_its_full_forward_reads_and_every_engine_agrees(tiny):
    """With position coupling (coupled.py) each drawn token's log-prob is the full forward's, which
    computes the coupled positions from the whole text; continuous batching falls back to the chunks engine."""
    ids = {"colon": 3, "newline": 4, "digits": list(range(12, 22))}
    model = coupled.CoupledQwen3(coupled.CoupledQwen3Config(**vars(tiny[0].config), position_coupling=ids)).eval()
    model.load_state_dict(tiny[0].state_dict())
    g = torch.Generator().manual_seed(3)
    prompts = [[5, 3, 4, 12, 13, 7, 14, 8, 15, 16, 4, 4, 6, 3], [5, 3, 4, 19, 9, 20, 4, 4, 6, 3, 11]]
    prompts = [torch.randint(22, VOCAB, (k,), generator=g).tolist() + p for k, p in ((3, prompts[0]), (9, prompts[1]))]
    out = S.generate(model, prompts, 40, temperature=2.0, n=3, seed=7)
    assert sum(o.tokens.count(4) for o in out) >= 3  # the completions have lines: coupled positions are exercised
    for o in out:
        expect = full_forward_logprobs(model, prompts[o.prompt_index], o.tokens, temperature=2.0)
        assert torch.allclose(torch.tensor(o.logprobs), expect, atol=1e-4)
    for engine in (dict(slots=2), dict(static=True)):
        again = S.generate(model, prompts, 40, temperature=2.0, n=3, seed=7, **engine)
        assert [o.tokens for o in again] == [o.tokens for o in out]


def test_logprobs_are_the_sampled_distributions(tiny):
    """Each token's log-prob is log q of the distribution it was drawn from (tempered, truncated): what replay's
    and --tis-cap's behaviour log-probs must be. At temperature 1 and no cut it is the trainer's own log-prob."""
    model, _ = tiny
    prompts = random_prompts([4, 11, 7])
    for kwargs in (dict(temperature=0), dict(temperature=1.3, top_p=0.8, top_k=20, n=3, seed=0),
                   dict(temperature=1.0, n=2, seed=1), dict(temperature=0.5, top_p=0.9, n=2, seed=2)):
        cut = dict(temperature=kwargs["temperature"] or 1.0, top_p=kwargs.get("top_p", 1.0) if kwargs["temperature"]
                   else 1.0, top_k=kwargs.get("top_k", 0))
        for o in S.generate(model, prompts, 16, **kwargs):
            p = prompts[o.prompt_index]
            assert torch.allclose(torch.tensor(o.logprobs), full_forward_logprobs(model, p, o.tokens, **cut), atol=1e-4)
            if cut == dict(temperature=1.0, top_p=1.0, top_k=0):
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


def draws(logits, temperature=1.0, top_p=1.0, top_k=0, rows=4000):
    """rows independent draws from one distribution: every row its own generator."""
    generators = S.row_generators([7], rows, "cpu")
    return S.sample_next(logits.expand(rows, -1), temperature, top_p, top_k, generators)


def test_the_sampled_distribution_by_hand():
    """p = (0.5, 0.3, 0.15, 0.05). At temperature 0.5, q is p^2 renormalized: (0.25, 0.09, 0.0225, 0.0025) / 0.365.
    top-p 0.7 keeps tokens 0 (0.685 < 0.7 before token 1) and 1, renormalized: 0.25 / 0.34 and 0.09 / 0.34. The
    log-prob a draw returns is log q of that distribution (what the rollout was sampled from)."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    want = torch.log(torch.tensor([0.25, 0.09, 0.0225, 0.0025]) / 0.365)
    torch.testing.assert_close(S.sampling_logprobs(logits, 0.5, 1.0, 0)[0], want)
    kept = S.sampling_logprobs(logits, 0.5, 0.7, 0)[0]
    torch.testing.assert_close(kept[:2], torch.log(torch.tensor([0.25 / 0.34, 0.09 / 0.34])))
    assert torch.isinf(kept[2:]).all()
    token, logp = draws(logits, temperature=0.5, top_p=0.7)
    assert set(token.tolist()) == {0, 1}
    torch.testing.assert_close(logp, kept[token])
    # top-k 3 then top-p 0.9 at temperature 1: (0.5, 0.3, 0.15) / 0.95 and 0.5/0.95 + 0.3/0.95 = 0.842 < 0.9
    top_k_then_p = S.sampling_logprobs(logits, 1.0, 0.9, 3)[0, :3].exp()
    torch.testing.assert_close(top_k_then_p, torch.tensor([0.5, 0.3, 0.15]) / 0.95)
    assert set(draws(logits, top_k=3)[0].tolist()) == {0, 1, 2}
    assert set(draws(logits, top_p=0.7)[0].tolist()) == {0, 1}  # 0.5 < 0.7 needs the second token; 0.8 >= 0.7 stops
    token, logp = draws(logits, temperature=0, rows=2)  # greedy: the policy's own log-prob
    assert token.tolist() == [0, 0] and torch.allclose(logp, torch.log(torch.tensor(0.5)))


def test_draws_follow_the_softmax_and_a_rows_draws_are_its_own():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    counts = torch.bincount(draws(torch.log(p)[None], rows=20000)[0], minlength=4).double()
    assert (((counts - 20000 * p) ** 2) / (20000 * p)).sum().item() < 16.3  # chi-square, 3 dof: p = 0.001
    q = torch.tensor([0.5, 0.3, 0.15]) / 0.95  # top-p 0.9 or top-k 3: the kept tokens in proportion
    for top_p, top_k in ((0.9, 0), (1.0, 3)):
        kept = torch.bincount(draws(torch.log(p)[None], top_p=top_p, top_k=top_k, rows=20000)[0], minlength=4).double()
        assert kept[3] == 0 and (((kept[:3] - 20000 * q) ** 2) / (20000 * q)).sum().item() < 13.8  # 2 dof
    # consecutive draws of one row are independent: pairs (draw t, draw t+1) are not correlated
    generators = S.row_generators([3], 5000, "cpu")
    x = [S.sample_next(torch.log(p)[None].expand(5000, -1), 1.0, 1.0, 0, generators)[0].double() for _ in range(2)]
    assert abs(torch.corrcoef(torch.stack(x))[0, 1].item()) < 0.05
    # a row's draw depends on its generator only, not on the other rows of the batch
    logits = torch.randn(12, 50, generator=torch.Generator().manual_seed(0))
    together = S.sample_next(logits, 1.0, 0.9, 0, S.row_generators([1, 2], 6, "cpu"))[0]
    gens = S.row_generators([1, 2], 6, "cpu")
    alone = [S.sample_next(logits[i:i + 1], 1.0, 0.9, 0, [gens[i]])[0].item() for i in (11, 3, 0)]
    assert alone == together[[11, 3, 0]].tolist()



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
