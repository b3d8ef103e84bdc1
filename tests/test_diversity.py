"""diversity.py: the surface signals of a group (length spread, distinct answers, 4-gram overlap) and the embedding
dispersion, by hand on made-up vectors and through a tiny random model against its own hidden states."""

import math
from types import SimpleNamespace as Row

import pytest
import torch

import checkpoint
import diversity


def test_group_diversity_hand_computed():
    rows = [Row(tokens=[1, 2, 3, 4, 5], text="\\boxed{1}"), Row(tokens=[1, 2, 3, 4, 6], text="\\boxed{2}"),
            Row(tokens=[1, 2, 3, 4], text="so \\boxed{7}"), Row(tokens=[1, 2, 3], text="\\boxed{7}")]  # as Rollouts
    d = diversity.group_diversity(rows, G=2)
    # group 1: lengths 5, 5 (std 0), answers {1, 2}, 4-grams share 1 of 3 -> 1/3
    # group 2: lengths 4, 3 (std 0.7071), one answer, 4-gram sets {(1,2,3,4)} and {} -> 0
    assert d["group_length_std"] == pytest.approx(math.sqrt(0.5) / 2)
    assert d["group_distinct_answers"] == 1.5
    assert d["group_ngram_overlap"] == pytest.approx((1 / 3 + 0) / 2)
    single = diversity.group_diversity(rows, G=1)  # groups of one: no spread, one answer each, no pairs to overlap
    assert single["group_length_std"] == 0.0 and single["group_distinct_answers"] == 1.0
    assert math.isnan(single["group_ngram_overlap"])


def test_embedding_dispersion_hand_values():
    d = lambda *rows: diversity.embedding_dispersion(torch.tensor(rows, dtype=torch.float32))  # noqa: E731
    assert d([1, 0], [0, 1]) == pytest.approx(1.0)  # orthogonal
    assert d([1, 0], [1, 0]) == 0.0 and d([2, 0], [0.5, 0]) == pytest.approx(0.0)  # same direction, any length
    assert d([1, 0], [1, 1]) == pytest.approx(1 - 1 / math.sqrt(2))  # cos 45 degrees
    assert d([1, 0], [-1, 0]) == pytest.approx(2.0)  # opposite: the largest distance
    # three vectors, three pairs: 1 ([1,0],[0,1]) and 1 - 1/sqrt(2) twice (each with [1,1])
    assert d([1, 0], [0, 1], [1, 1]) == pytest.approx((1 + 2 * (1 - 1 / math.sqrt(2))) / 3)
    assert d([1, 0], [0, 0]) == pytest.approx(1.0)  # a zero vector: cosine 0 with everything
    assert math.isnan(d([1, 0]))  # a group of one has no pair
    with pytest.raises(ValueError, match=r"needs a \(G, d\) tensor of embeddings, got shape \(3,\)"):
        diversity.embedding_dispersion(torch.ones(3))


def test_completion_embeddings_pool_the_completion_only(char_model_dir):
    net, tok = checkpoint.load_model(char_model_dir, device="cpu"), checkpoint.load_tokenizer(char_model_dir)
    prompt, other_prompt = tok.encode("Problem: 2+2\nSolution:"), tok.encode("Q: 3*3?")
    short, long = tok.encode(" 4"), tok.encode(" 2+2 = 4, so the answer is 4.")
    net.train()  # the function runs in eval mode and gives the mode back
    e = diversity.completion_embeddings(net, [prompt, other_prompt, prompt, prompt], [short, long, short, long])
    assert e.shape == (4, net.config.hidden_size) and e.dtype == torch.float32 and net.training
    with torch.no_grad():  # by hand: the final hidden states of prompt + completion, averaged over the completion
        h = net.hidden_states(torch.tensor([prompt + short]))[0]
    assert torch.allclose(e[0], h[len(prompt):].mean(0), atol=1e-6)
    assert not torch.allclose(e[0], h.mean(0), atol=1e-3)  # the prompt positions are left out
    # padding: `short` padded to the longest sequence of its batch is the same as alone
    alone = diversity.completion_embeddings(net, [prompt], [short])
    assert torch.allclose(alone[0], e[0], atol=1e-6) and torch.allclose(e[0], e[2], atol=1e-6)
    one_by_one = diversity.completion_embeddings(net, [prompt, other_prompt], [short, long], token_budget=1)  # a chunk each
    assert torch.allclose(one_by_one, e[:2], atol=1e-6)
    # through the cache of a prompt prefilled once and left-padded: the same as the plain forward by hand
    with torch.no_grad():
        h_long = net.hidden_states(torch.tensor([other_prompt + long]))[0]
    assert torch.allclose(e[1], h_long[len(other_prompt):].mean(0), atol=1e-5)
    # identical completions: dispersion ~0; different ones: above 0
    assert diversity.embedding_dispersion(e[[0, 2]]) == pytest.approx(0.0, abs=1e-6)
    assert diversity.embedding_dispersion(e[[0, 3]]) > 1e-3
    for prompts, completions, message in [([prompt], [short, long], "1 prompts but 2 completions"),
                                          ([prompt, prompt], [short, []], "completion 1 has no tokens")]:
        with pytest.raises(ValueError, match=message):
            diversity.completion_embeddings(net, prompts, completions)
