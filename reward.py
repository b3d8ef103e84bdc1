"""
The reward, in one file: what a rollout is paid, as a table of terms summed in table order. `python reward.py`
prints the table; train_rl.py's "reward" flags are RewardConfig's fields.

    reward = correctness + format penalty + overlong penalty [+ KL penalty, once the reference has scored it]

The verifier (verify.py) gives a verdict, right or wrong; what the learner counts as a success (`passed`) is that
verdict, or under the controls --reward random / format (Shao et al. 2025, "Spurious Rewards") a seeded coin or
"has a final \\boxed{}". `correct` always stays the verifier's, for the logged accuracy.

Adding a term is this file and its test: one function (rollout, cfg) -> float, one row in TERMS, and, if it has a
knob, one field in RewardConfig (a term whose knob is 0 is not run). A length penalty, for example (Team Kimi 2025,
k1.5, sec. 2.3.3, simplified; tests/test_forks.py applies it and runs the main command and evaluate.py):

    def length_penalty(r, cfg):
        return -cfg.length_coef * len(r.tokens) / cfg.max_new_tokens
    "length": Term(length_penalty, "Team Kimi 2025, Kimi k1.5, sec. 2.3.3", "-coef x the share of the budget used",
                   knob="length_coef"),
    length_coef: float = arg(0.0, "length penalty: the reward falls by X at the full budget", range="[0, inf)")

The flag, its help and this table follow by themselves.
"""

from dataclasses import dataclass
from types import SimpleNamespace

import torch

import cli
import verify

arg = cli.arg_group("reward")  # the flags below show under "reward" in train_rl.py --help
REWARDS = ("verifier", "random", "format")  # the true reward, and the two controls (--reward)


@dataclass
class RewardConfig:
    """train_rl.py's reward flags (train_rl.Config inherits them). The terms also read kl_coef and kl_in
    (objectives.ObjectiveConfig) and max_new_tokens."""
    grader: str = arg("answer", "reward and validation rule: answer (the final answer, verify.grade) or steps "
                                "(the tiny ladder's: the worked lines must be the problem's chain too)",
                      choices=verify.GRADERS)
    reward: str = arg("verifier", "what the learner is paid for: verifier (the true reward), or the controls "
                                  "random (a seeded fair coin) and format (any final \\boxed{}); accuracy is "
                                  "always the verifier's", choices=REWARDS)
    format_penalty: float = arg(0.0, "reward subtracted when a response has no final \\boxed{} answer",
                                range="[0, inf)")
    overlong_buffer: int = arg(0, "DAPO soft overlong penalty: the last N tokens of the budget ramp the reward to -1 "
                                  "(0: off)", range="[0, inf)")
    prefix_credit: float = arg(0.0, "dense reward (--grader steps): a failed rollout earns X times the share of the "
                                    "worked solution's lines it wrote right before its first error (0: off)",
                               range="[0, 1]")


def check(cfg):
    """Refuse reward settings that cannot train, naming the flag (each flag's own range is on its field)."""
    if cfg.prefix_credit and cfg.grader != "steps":
        raise ValueError(f"--prefix-credit {cfg.prefix_credit} needs --grader steps (it reads the worked lines)")
    if cfg.overlong_buffer >= cfg.max_new_tokens:
        raise ValueError(f"--overlong-buffer {cfg.overlong_buffer} must be below --max-new-tokens {cfg.max_new_tokens}")


# -----------------------------------------------------------------------------
# What counts as a success: the verdict, or a control's (Shao et al. 2025, "Spurious Rewards")


def control_pass(kind, r):
    """The controls' success: a fair coin seeded by the rollout's sampling seed and index in its group (so runs
    repeat), or 'has a final boxed answer' whatever the verifier says."""
    if kind == "format":
        return r.boxed
    gen = torch.Generator().manual_seed((r.seed * 1_000_003 + r.sample) % 2**63)
    return bool(torch.rand((), generator=gen) < 0.5)


# -----------------------------------------------------------------------------
# The terms: (rollout, cfg) -> this term's share of the reward


def correctness(r, cfg):
    """1 for a success, else 0: the verifiable reward."""
    return float(r.passed)


def format_penalty(r, cfg):
    """-format_penalty without a final \\boxed{} answer, under the true reward only (a right answer is boxed:
    verify.grade reads the box, check_steps wants it as the last line)."""
    return -cfg.format_penalty if cfg.reward == "verifier" and not r.boxed else 0.0


def overlong_penalty(r, cfg):
    """DAPO's soft overlong punishment (eq. 13): 0 up to budget - buffer tokens, then linear down to -1 at the
    budget (reached only by truncated answers)."""
    length, budget, buffer = len(r.tokens), cfg.max_new_tokens, cfg.overlong_buffer
    if buffer <= 0 or length <= budget - buffer:
        return 0.0
    return max(-1.0, (budget - buffer - length) / buffer)


def prefix_credit(r, cfg):
    """--prefix-credit X: a failed rollout earns X x (lines right before the first error) / (chain lines + 1), the
    box counted as the last line, so only a pass earns 1: the dense phase of Sun et al. 2025's two-phase schedule."""
    if not cfg.prefix_credit or r.passed:
        return 0.0
    lines, _ = verify.chain(r.problem["problem"])
    right, _ = verify.first_error(r.text, r.problem["problem"])
    return cfg.prefix_credit * right / (len(lines) + 1)


def kl_penalty(r, cfg):
    """--kl-in reward: -beta times the rollout's KL estimate to the reference, summed over its tokens."""
    return -cfg.kl_coef * r.kl if cfg.kl_coef and cfg.kl_in == "reward" else 0.0


@dataclass
class Term:
    pay: callable  # (rollout, cfg) -> its share of the reward, a float
    paper: str  # where it comes from
    what: str  # what it pays, in a line
    needs_kl: bool = False  # paid once the reference model has scored the rollout (add_kl), not at grading
    knob: str = ""  # the setting that turns it on: while it is 0 the term pays nothing and is not run


TERMS = {
    "correctness": Term(correctness, "DeepSeek-AI 2025, DeepSeek-R1, sec. 2.2.2 (accuracy reward)",
                        "1 if the rollout passed (the verifier's verdict, or --reward random / format's), else 0"),
    "format": Term(format_penalty, "DeepSeek-AI 2025, DeepSeek-R1, sec. 2.2.2 (format reward)",
                   "-(--format-penalty) without a final \\boxed{} answer (--reward verifier only)",
                   knob="format_penalty"),
    "overlong": Term(overlong_penalty, "Yu et al. 2025, DAPO, eq. 13",
                     "0, then linear down to -1 over the last --overlong-buffer tokens of the budget",
                     knob="overlong_buffer"),
    "prefix": Term(prefix_credit, "Sun et al. 2025, RL Grokking Recipe (arXiv 2509.21016), the dense-reward phase",
                   "--prefix-credit x the share of the worked lines right before the first error, failed rollouts",
                   knob="prefix_credit"),
    "kl": Term(kl_penalty, "Hu et al. 2025, REINFORCE++; Ouyang et al. 2022, InstructGPT, eq. 2",
               "-(--kl-coef) x the rollout's summed KL to the reference (--kl-in reward)", needs_kl=True,
               knob="kl_coef"),
}


def pay(r, cfg, needs_kl):
    """The sum of the terms paid at grading (needs_kl False) or after the reference's pass (True), in table order."""
    total = 0.0
    for term in TERMS.values():
        if term.needs_kl == needs_kl and (not term.knob or getattr(cfg, term.knob)):
            total += term.pay(r, cfg)
    return total


# -----------------------------------------------------------------------------
# Scoring rollouts


def score(rollouts, cfg):
    """Grade each rollout (objects with problem, text, tokens, seed, sample) and set correct (the verifier's
    verdict), boxed, passed (what the learner counts as a success) and reward (the terms paid at grading)."""
    correct = verify.grade_with(cfg.grader, [r.text for r in rollouts], [r.problem for r in rollouts])
    for r, ok in zip(rollouts, correct, strict=True):
        r.correct, r.boxed = bool(ok), verify.extract_answer(r.text) is not None
        r.passed = r.correct if cfg.reward == "verifier" else control_pass(cfg.reward, r)
        r.reward = pay(r, cfg, needs_kl=False)


def record_reward(correct, boxed):
    """The reward an evaluation record shows for a graded text: the terms paid at grading, at training's defaults
    (RewardConfig's; an unbounded budget, so no overlong term), for the verdict and whether it boxed an answer."""
    cfg = SimpleNamespace(**vars(RewardConfig()), max_new_tokens=float("inf"))
    return pay(SimpleNamespace(passed=correct, boxed=boxed, tokens=()), cfg, needs_kl=False)


def add_kl(rollouts, cfg):
    """--kl-in reward: each rollout's reward pays the KL terms too, once r.kl holds its summed KL estimate."""
    for r in rollouts:
        r.reward = r.reward + pay(r, cfg, needs_kl=True)


def table():
    """The reward terms as a Markdown table, generated from TERMS."""
    rows = [f"| `{name}` | {t.paper} | {t.what} |" for name, t in TERMS.items()]
    return "\n".join(["| term | paper | what it pays |", "| --- | --- | --- |", *rows])


if __name__ == "__main__":
    print(table())
