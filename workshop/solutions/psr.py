"""
Exercise 4, reference solution: a new objective, positive sample reinforcement (PSR; Zhu et al. 2025, "The
Surprising Effectiveness of Negative Reinforcement in LLM Reasoning", sec. 3): A = 1 for a right answer, 0 for
a wrong one, no baseline, token-level mean loss. It is the mirror image of `w_reinforce` (which puts its weight
on the wrong answers): PSR learns only from successes, like rejection-sampling fine-tuning.

In a fork this is a few lines of objectives.py (the function, and `"psr": Objective(...)` in OBJECTIVES). Here it
lives beside the repo so that objectives.py stays as it is: run it as train_rl.py with one more objective,

    python workshop/solutions/psr.py --objective psr --model tiny --steps 20 --eval-every 10 --out runs/ws/psr-s0

Importing this file changes nothing; `register()` (called when it runs as a script) adds "psr" to OBJECTIVES.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `import train_rl`

import cli  # noqa: E402
import objectives  # noqa: E402
import train_rl as T  # noqa: E402


def positive_only_advantages(passed):
    """(P, G) bool -> (P, G) float: 1 for a right answer, 0 for a wrong one (from what passed, not the reward)."""
    return passed.float()


PSR = objectives.Objective(lambda r, c, cfg: positive_only_advantages(c), objectives.token_mean_loss,
                           "Zhu et al. 2025, sec. 3", "A = 1 right, 0 wrong, no baseline; token-level mean",
                           needs_group=False)


def register():
    objectives.OBJECTIVES["psr"] = PSR


if __name__ == "__main__":
    register()
    cli.run_main(T.main, "psr.py")
