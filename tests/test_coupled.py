"""Tests of coupled.py (position coupling, tiny.py --couple): the positions by hand and causal, decoding through the
cache (prefilled in pieces, rows repeated and compacted) equal to the full forward, the prompt's logits the plain
model's, and a coupled checkpoint that round-trips, that transformers would refuse, and whose bad ids fail named.
The sampler's side is in tests/test_sample.py, pretraining's in tests/test_tiny.py."""

import json

import pytest
import torch

import checkpoint
import coupled
from model import Qwen3
from test_model import assert_logits_close, left_padded, randomize_, tiny_config

CHARS = "PS:\n +*-=()0123456789Bx"  # a character vocabulary: id = index + 1 (0 is padding)
COUPLING = {"colon": 3, "newline": 4, "digits": list(range(12, 22))}


def char_ids(text):
    return [CHARS.index(ch) + 1 for ch in text]


def coupled_model(seed=0):
    config = coupled.CoupledQwen3Config(**vars(tiny_config(vocab_size=32)), position_coupling=COUPLING)
    return randomize_(coupled.CoupledQwen3(config), seed).eval()


def test_coupled_positions_by_hand():
    """Line k of the completion sits at the position of the chain's (k + 1)-th number, plus its own offset; past the
    last number at the completion's first position; the prompt keeps its own positions, left padding excluded."""
    prompt, completion = "P:\n(12 + 3) * 45\n\nS:", "\n12 + 3 = 15\n15 * 45 = 75\nBx"
    text = prompt + completion
    pad = 2
    ids = torch.tensor([[0] * pad + char_ids(text)])
    got = coupled.coupled_positions(ids, torch.tensor([pad]), COUPLING)[0, pad:].tolist()
    p3, p45, end = prompt.index("3"), prompt.index("45"), len(prompt)  # numbers 2 and 3, and the completion start
    expect = list(range(len(prompt)))
    for anchor, line in zip((p3, p45, end), completion.split("\n")[1:]):
        expect += [anchor + c for c in range(len(line) + 1)]  # the newline is c = 0
    assert got == expect
    assert got[len(prompt) + 5] == p3 + 5  # line 1's "3" five after the prompt's "3"
    # causal: a prefix's positions are the whole text's, cut; a later colon, digit or newline changes none of them
    for cut in range(1, len(text)):
        prefix = torch.tensor([char_ids(text[:cut])])
        assert coupled.coupled_positions(prefix, torch.tensor([0]), COUPLING)[0].tolist() == got[:cut]


def test_coupled_decoding_through_the_cache_matches_the_full_forward():
    """A coupled model decodes through a left-padded cache (prefilled in pieces, rows repeated, then compacted) with
    the logits of a full forward of each row alone: the cache keeps the tokens coupling reads."""
    m = coupled_model()
    prompts = [char_ids("P:\n(12 + 3) * 45\n\nS:"), char_ids("P:\n7 - 2\n\nS:")]
    completions = [char_ids("\n12 + 3 = 15\n15 * 45 = 75\nBx"), char_ids("\n7 - 2 = 5\nB")]
    prompt, pad = left_padded(prompts, pad_id=0)
    with torch.no_grad():
        cache = m.new_cache(2, prompt.shape[1] + 30)
        assert isinstance(cache, coupled.CoupledCache)
        cache.pad = pad
        m(prompt[:1], cache.rows(0, 1)), m(prompt[1:], cache.rows(1, 2))
        cache.advance(prompt.shape[1])
        cache.select([1, 1, 0])  # prompt 1 twice, then prompt 0
        rows, steps = [1, 1, 0], []
        for t in range(len(completions[1])):
            steps.append(m(torch.tensor([[completions[r][t]] for r in rows]), cache)[:, 0])
        cache.compact(torch.tensor([2]))  # prompt 1's rows finish: prompt 0's row moves to the front
        for t in range(len(completions[1]), len(completions[0])):
            steps.append(m(torch.tensor([[completions[0][t]]]), cache)[:, 0])
        for b, r in enumerate(rows):
            alone = m(torch.tensor([prompts[r] + completions[r]]))[0, len(prompts[r]):]
            got = torch.stack([step[b if len(step) == 3 else 0] for step in steps[:len(completions[r])]])
            assert_logits_close(got, alone, atol=1e-5)


def test_the_prompt_reads_as_the_plain_model_and_the_completion_does_not():
    m = coupled_model()
    plain = Qwen3(tiny_config(vocab_size=32)).eval()
    plain.load_state_dict(m.state_dict())
    prompt, completion = char_ids("P:\n(12 + 3) * 45\n\nS:"), char_ids("\n12 + 3 = 15\n15 * 45 = 75\nBx")
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        ours, theirs = m(ids)[0], plain(ids)[0]
    assert torch.equal(ours[:len(prompt)], theirs[:len(prompt)])
    assert (ours[len(prompt):] - theirs[len(prompt):]).abs().max() > 1e-2


def test_a_coupled_checkpoint_round_trips_and_is_no_plain_qwen3(tmp_path):
    m = coupled_model()
    checkpoint.save_model(m, tmp_path / "coupled")
    d = json.loads((tmp_path / "coupled" / "config.json").read_text())
    assert d["position_coupling"] == COUPLING and d["model_type"] == "coupled_qwen3"  # transformers refuses it
    back = checkpoint.load_model(tmp_path / "coupled", device="cpu", dtype=torch.float32)
    assert type(back) is coupled.CoupledQwen3 and back.config.position_coupling == COUPLING
    ids = torch.tensor([char_ids("P:\n7 - 2\n\nS:\n7 - 2 = 5\nB")])
    with torch.no_grad():
        assert torch.equal(back(ids), m(ids))
    plain = dict(d, model_type="qwen3", architectures=["Qwen3ForCausalLM"])  # a mislabelled one: refused, named
    (tmp_path / "coupled" / "config.json").write_text(json.dumps(plain))
    with pytest.raises(ValueError, match="position_coupling=.* in a plain Qwen3 config.json .*'coupled_qwen3'"):
        checkpoint.load_model(tmp_path / "coupled", device="cpu")


@pytest.mark.parametrize("bad", [{"colon": 3}, {"colon": 3, "newline": 4, "digits": [1, 2]},
                                 {"colon": 3, "newline": 99, "digits": list(range(12, 22))},
                                 {"colon": 3, "newline": 4, "digits": 5}, None])
def test_bad_coupling_ids_fail_naming_the_file_and_key(tmp_path, bad):
    m = coupled_model()
    checkpoint.save_model(m, tmp_path / "coupled")
    path = tmp_path / "coupled" / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), position_coupling=bad)))
    with pytest.raises(ValueError, match=r"config.json: position_coupling=.* must be"):
        checkpoint.load_model(tmp_path / "coupled", device="cpu")
