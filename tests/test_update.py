"""update.py: the PPO ratio's pi_old rule by hand, and the distillation step against an independent NLL."""

import pytest
import torch

import checkpoint
import train_rl as T
import update as U


def test_old_logprobs_are_the_behavior_policys_when_given_else_the_current_detached():
    rows = [U.Example(prompt=[1, 2], tokens=[3, 4]), U.Example(prompt=[1], tokens=[5, 6, 7])]
    rows[0].behavior_logprobs, rows[1].behavior_logprobs = [-0.5, -0.25], None  # a replayed one, a fresh one
    logp = torch.full((2, 3), -1.0, requires_grad=True)  # targets ids[:, 1:] of T = 4 tokens
    old = U.old_logprobs(rows, logp, 4, "cpu")
    # row 0: its completion targets are positions 1 and 2 (the prompt's last token predicts the first)
    assert old.tolist() == [[0.0, -0.5, -0.25], [-1.0, -1.0, -1.0]] and not old.requires_grad


def test_sft_update_is_the_token_mean_nll_of_the_completion(char_model_dir):
    policy = checkpoint.load_model(char_model_dir, device="cpu")
    examples = [U.Example(prompt=[5, 6, 7], tokens=[8, 9]), U.Example(prompt=[5], tokens=[10, 11, 12, 13])]
    with torch.no_grad():  # independently: log-softmax of each completion token after its prefix
        total = 0.0
        for e in examples:
            seq = torch.tensor([e.prompt + e.tokens])
            logits = policy(seq)[0, len(e.prompt) - 1:-1].log_softmax(-1)
            total += logits.gather(-1, torch.tensor(e.tokens)[:, None]).sum().item()
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    stats = U.sft_update(policy, opt, examples, T.Config(micro_batch_tokens=8), "cpu", 0)  # one row per micro-batch
    assert stats["loss"] == pytest.approx(-total / 6, abs=1e-5) and stats["tokens"] == 6 and not stats["nonfinite"]
