"""batching.py: continuous batching and the static decode step give the chunked sampler's completions; a joined
cache and a SlotCache give each row the logits of its own KVCache."""

import pytest
import torch

import batching
import sample as S
from test_sample import random_prompts, tiny  # noqa: F401 (a fixture)


def test_continuous_batching_gives_the_chunked_completions(tiny, monkeypatch):
    """generate(slots=...) against the chunked sampler on ragged prompts with stops, greedy and sampled, n = 1
    and 3: the same tokens, finish reasons and order whatever the slot count, log-probs equal to rounding; and
    with few slots, prompts really join a running batch (more prefills than one)."""
    model, _ = tiny
    prompts = random_prompts([5, 17, 3, 9, 11, 2, 30, 7])
    stops = {int(t) for t in S.generate(model, prompts[:2], 6, temperature=0)[0].tokens[2:5]}  # rows end early
    prefills = []
    real_prefill = S.prefill
    monkeypatch.setattr(S, "prefill", lambda m, ps, *a: (prefills.append(len(ps)), real_prefill(m, ps, *a))[1])
    for temperature, n in ((0, 1), (0, 3), (1.0, 1), (1.0, 3)):
        ref = S.generate(model, prompts, 20, temperature=temperature, n=n, stop_token_ids=stops, seed=3)
        assert {o.finish_reason for o in ref} == {"stop", "length"}, "the test needs ragged rows"
        for slots in (n, 2 * n + 1, 0):
            prefills.clear()
            out = S.generate(model, prompts, 20, temperature=temperature, n=n, stop_token_ids=stops, seed=3,
                             slots=slots)
            assert [(o.prompt_index, o.tokens, o.finish_reason) for o in out] == \
                [(o.prompt_index, o.tokens, o.finish_reason) for o in ref]
            for o, r in zip(out, ref):
                assert torch.allclose(torch.tensor(o.logprobs), torch.tensor(r.logprobs), atol=1e-5)
            assert sum(prefills) == len(prompts)  # every prompt prefilled once, its n samples share it
            if slots == n:
                assert len(prefills) == len(prompts)  # one prompt at a time: each joins when the last finished
    with pytest.raises(ValueError, match="slots=2 cannot hold the n=3 samples"):
        S.generate(model, prompts, 4, n=3, slots=2)


def test_joined_caches_keep_every_tokens_position(tiny):
    """batching.join of two prefilled caches of different lengths: pads shift with the blocks, and a decode step
    on the joined cache gives each row the logits it gets on its own cache."""
    model, _ = tiny
    a_prompts, b_prompts = random_prompts([4, 9]), random_prompts([13, 2, 6], seed=2)
    with torch.inference_mode():
        a, la = S.prefill(model, a_prompts, 1, 3, 0)
        b, lb = S.prefill(model, b_prompts, 1, 3, 0)
        joined = batching.join([a, b], room=3)
        assert joined.length == 13 and joined.max_len == 16 and joined.pad.tolist() == [9, 4, 0, 11, 7]
        assert torch.equal(joined.positions(1)[:, 0], torch.tensor([4, 9, 13, 2, 6]))  # the next token's position
        token = torch.tensor([[5], [6], [7], [8], [9]])
        together = model(token, cache=joined, last_only=True)[:, -1]
        apart = torch.cat([model(token[:2], cache=a, last_only=True)[:, -1],
                           model(token[2:], cache=b, last_only=True)[:, -1]])
    assert torch.allclose(together, apart, atol=1e-5)


def test_static_step_equals_the_eager_step(tiny):
    """A SlotCache loaded from ragged prefills (rows in another order, one row free): one decode step gives each
    row the eager KVCache step's logits, at the same positions, and only live rows advance."""
    model, _ = tiny
    prompts = random_prompts([4, 13, 2, 9])
    with torch.inference_mode():
        eager, first = S.prefill(model, prompts, 1, 3, 0)
        static = model.new_cache(5, 16, kind=batching.SlotCache)
        for row, i in zip((3, 0, 4, 1), range(4)):  # slot 2 stays free
            static.load(row, eager, i)
        assert static.lens.tolist() == [13, 9, 0, 4, 2] and static.live.tolist() == [True, True, False, True, True]
        token = torch.tensor([[5], [6], [7], [8]])
        want = model(token, cache=eager, last_only=True)[:, -1]
        got = model(torch.tensor([[6], [8], [0], [5], [7]]), cache=static, last_only=True)[:, -1]
    assert torch.allclose(got[[3, 0, 4, 1]], want, atol=1e-5)
    assert static.lens.tolist() == [14, 10, 0, 5, 3]
    with pytest.raises(RuntimeError, match="SlotCache overflow"):
        model.new_cache(1, 8, kind=batching.SlotCache).load(0, eager, 1)


def test_static_generation_gives_the_chunked_completions(tiny):
    """generate(static=True) (one shape per step, what --compile captures on CUDA) against the chunked sampler
    on ragged prompts with stops, greedy and sampled, n = 1 and 3, whatever the slot count."""
    model, _ = tiny
    prompts = random_prompts([5, 17, 3, 9, 11, 2, 30, 7])
    stops = {int(t) for t in S.generate(model, prompts[:2], 6, temperature=0)[0].tokens[2:5]}
    for temperature, n in ((0, 1), (1.0, 3)):
        ref = S.generate(model, prompts, 20, temperature=temperature, n=n, stop_token_ids=stops, seed=3)
        assert {o.finish_reason for o in ref} == {"stop", "length"}, "the test needs ragged rows"
        for slots in (n, 2 * n + 1, 0):
            out = S.generate(model, prompts, 20, temperature=temperature, n=n, stop_token_ids=stops, seed=3,
                             slots=slots, static=True)
            assert [(o.prompt_index, o.tokens, o.finish_reason) for o in out] == \
                [(o.prompt_index, o.tokens, o.finish_reason) for o in ref]
            for o, r in zip(out, ref):
                assert torch.allclose(torch.tensor(o.logprobs), torch.tensor(r.logprobs), atol=1e-5)
