"""
Guards: the signs of a run going bad, read from each step's metrics, each with its threshold as a flag and on by
default with a warning line; --guard-stop turns a warning into a stop that saves a checkpoint first (train_rl.py's
Ctrl-C / SIGTERM path: the checkpoint of the last finished step, then exit status 3).

- truncation: responses hitting the budget (truncation_rate > --guard-truncation for --guard-steps steps running):
  endless rollouts, or a budget too short for the task;
- answers: the share with a final \\boxed{} answer (1 - format_failure_rate) below --guard-answers x its best so far,
  --guard-steps steps running: the format is collapsing;
- entropy: the policy's token entropy below --guard-entropy x the run's first value, --guard-steps steps running:
  sampling has collapsed onto a few answers (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs");
- accuracy: 0 for --guard-steps steps running after having been above it (reward collapse).
A non-finite loss skips the update and non-finite weights end the run already (update.py, runs.check_finite_weights).
A guard that has fired stays quiet until its condition clears; a resumed run replays its logged steps into the
guards first (quietly), so it warns and stops where the straight run would.
"""

import math
from dataclasses import dataclass

import cli

arg = cli.arg_group("guards")


@dataclass
class GuardConfig:
    """The guards' flags (train_rl.Config inherits them); a threshold of 0 turns its guard off."""
    guard_steps: int = arg(5, "steps running a guard's condition must hold before it fires", range="[1, inf)")
    guard_truncation: float = arg(0.5, "fire when truncation_rate stays above X (0: off)", range="[0, 1]")
    guard_answers: float = arg(0.5, "fire when the share with a final \\boxed{} answer stays below X times its best so "
                                    "far (0: off)", range="[0, 1]")
    guard_entropy: float = arg(0.1, "fire when the token entropy stays below X times the run's first value (0: off)",
                               range="[0, 1]")
    guard_accuracy: bool = arg(True, "fire when accuracy stays at 0 after having been above it")
    guard_stop: bool = arg(False, "a guard that fires stops the run, saving a checkpoint first (default: a warning)")


class Stop(KeyboardInterrupt):
    """--guard-stop: raised where Ctrl-C is, so train_rl.py saves the checkpoint of the last finished step."""
    status = 3


def conditions(m, seen, cfg):
    """{guard: whether its condition holds at this step}, from a step's metrics m and what the run has seen so far
    (the best answer share, the first entropy, whether accuracy was ever above 0; updated here)."""
    answers = 1 - m["format_failure_rate"]
    seen["answers"] = max(seen.get("answers", 0.0), answers)
    if math.isfinite(m["entropy"]):  # a step that trained no row has no entropy
        seen.setdefault("entropy", m["entropy"])
    seen["accurate"] = seen.get("accurate", False) or m["accuracy"] > 0
    out = {}
    if cfg.guard_truncation:
        out["truncation"] = m["truncation_rate"] > cfg.guard_truncation
    if cfg.guard_answers:
        out["answers"] = answers < cfg.guard_answers * seen["answers"]
    if cfg.guard_entropy and "entropy" in seen and math.isfinite(m["entropy"]):
        out["entropy"] = m["entropy"] < cfg.guard_entropy * seen["entropy"]
    if cfg.guard_accuracy:
        out["accuracy"] = seen["accurate"] and m["accuracy"] == 0
    return out


def message(name, m, seen, cfg):
    """The warning line of a guard that fires, with the value, its threshold and the flag that sets it."""
    n = cfg.guard_steps
    answers = 1 - m["format_failure_rate"]
    return {"truncation": f"truncation_rate {m['truncation_rate']:.2f} > {cfg.guard_truncation} for {n} steps: "
                          f"responses hit the budget (raise --max-new-tokens, or see samples.jsonl for endless "
                          f"rollouts)",
            "answers": f"the share with a final answer fell to {answers:.2f} (< {cfg.guard_answers} x its best "
                       f"{seen['answers']:.2f}) for {n} steps: the format is collapsing",
            "entropy": f"entropy {m['entropy']:.3g} < {cfg.guard_entropy} x its first {seen.get('entropy', 0):.3g} for "
                       f"{n} steps: sampling collapsed (lower --lr)",
            "accuracy": f"accuracy 0 for {n} steps after having been above it: reward collapse (lower --lr, check the "
                        f"reward)"}[name]


class Guards:
    """The guards of one run: watch(metrics) after each step warns (or, with --guard-stop, raises Stop)."""

    def __init__(self, cfg, history=()):
        self.cfg, self.seen, self.running, self.fired = cfg, {}, {}, []
        for m in history:  # a resumed run's logged training steps: the state the straight run had, no lines
            self.watch(m, quiet=True)

    def watch(self, m, quiet=False):
        """Count each guard's steps running; warn once when one reaches --guard-steps; returns the guards fired now."""
        now = []
        for name, holds in conditions(m, self.seen, self.cfg).items():
            self.running[name] = self.running.get(name, 0) + 1 if holds else 0
            if self.running[name] == self.cfg.guard_steps and not quiet:
                now.append(name)
                print(f"guard: step {m['step']}: {message(name, m, self.seen, self.cfg)}", flush=True)
        self.fired += now
        if now and self.cfg.guard_stop:
            raise Stop(f"guard {', '.join(now)} fired at step {m['step']} (--guard-stop)")
        return now
