"""
Which problems a step draws, and which rollouts it learns from: a pass-rate curriculum, a replay buffer of the
policy's own rare successes and DAPO's dynamic sampling (train_rl.py --select pass_rate, --replay-fraction F,
--dynamic-sampling). With one of them on, train_rl.draw_with_options calls each by name: choose_problems,
replay, keep_mixed, update_selection. The study that measures them: research/exploration/.

Pass-rate curriculum (--select pass_rate; the default, uniform, draws each epoch's permutation):
- A table of attempts and successes per training problem, updated from every group the step samples.
- Problems are drawn without replacement with weight p (1 - p), the variance of a sample's reward, which
  bounds the expected improvement a group can give (Bae et al. 2025, "Online Difficulty Filtering for
  Reasoning Oriented Reinforcement Learning", sec. 3); p is the Laplace estimate (s + 1) / (n + 2), so a
  problem never drawn has p = 1/2, the highest weight: new problems are explored first.
- A problem whose last --skip-window groups were each all right or each all wrong is skipped (GRESO, Zheng et
  al. 2025, "Act Only When It Pays"): such groups give Dr. GRPO no gradient at all.
- --pass-rate-floor is the least weight any problem has, skipped ones included, so none is starved.

Replay (--replay-fraction F; ExGRPO, Zhan et al. 2025; RePO, Li et al. 2025):
- A bounded buffer (--replay-size, first in first out) of right rollouts, one per group, from groups whose pass
  rate is at most --replay-max-rate (problems the policy solves rarely), with the log-probs they were sampled
  with; a problem's entries leave once a fresh group solves it more often than that.
- Up to round(F * groups) of a step's groups whose problem has an entry get its newest entry in place of one
  fresh wrong sample, groups with no fresh success first: a group that would be all wrong, and give no
  gradient, now has one success to learn from. The replayed rollout's behavior_logprobs are the log-probs it was
  sampled with, so its PPO ratio is taken against them and clipped as every other ratio (update.old_logprobs).
Both are deterministic given the seed, and both are saved with each checkpoint, so --resume is exact.
"""

import dataclasses
from dataclasses import dataclass

import torch

import cli

arg = cli.arg_group("problem selection and replay")  # the flags below show under this in train_rl.py --help
SELECTIONS = ("uniform", "pass_rate")


@dataclass
class SelectionConfig:
    """train_rl.py's problem-selection and replay flags (train_rl.Config inherits them)."""
    select: str = arg("uniform", "uniform (an epoch's permutation) or pass_rate (weights p(1-p), Bae et al. 2025; GRESO "
                                 "skips, Zheng et al. 2025)", choices=SELECTIONS)
    pass_rate_floor: float = arg(0.01, "pass_rate: the least weight of any problem, so none is starved",
                                 range="(0, 0.25]")
    skip_window: int = arg(2, "pass_rate: skip a problem whose last N groups were all right or all wrong (0: never)",
                           range="[0, inf)")
    replay_fraction: float = arg(0.0, "share of a step's groups given one replayed past success in place of a fresh "
                                      "wrong sample (ExGRPO, Zhan et al. 2025; 0: off)", range="[0, 1]")
    replay_size: int = arg(256, "replay: the buffer's capacity in rollouts (first in, first out)", range="[1, inf)")
    replay_max_rate: float = arg(0.25, "replay: keep successes of groups whose pass rate is at most this",
                                 range="[0, 1]")


# -----------------------------------------------------------------------------
# The pass-rate table


class PassRates:
    """Per training problem: attempts and successes over all its groups, and the pass rates of its last groups."""

    def __init__(self, ids, floor=0.01, skip_window=2):
        self.index = {pid: i for i, pid in enumerate(ids)}
        if len(self.index) != len(ids):
            raise ValueError("--select pass_rate keeps a row per problem id, and the training pool repeats ids")
        self.attempts, self.successes = [0] * len(ids), [0] * len(ids)
        self.recent = [[] for _ in ids]  # per problem: successes / attempts of its last skip_window groups
        self.floor, self.skip_window = floor, skip_window

    def update(self, groups):
        """Add each group's outcome: groups are lists of rollouts of one problem (train_rl.Rollout: its `passed`)."""
        for g in groups:
            i, wins = self.index[g[0].problem["id"]], sum(r.passed for r in g)
            self.attempts[i] += len(g)
            self.successes[i] += wins
            self.recent[i] = (self.recent[i] + [wins / len(g)])[-max(1, self.skip_window):]

    def skipped(self, i):
        """GRESO: every one of the last skip_window groups was all right, or every one all wrong."""
        last = self.recent[i]
        return bool(self.skip_window) and len(last) == self.skip_window and (
            all(x == 1.0 for x in last) or all(x == 0.0 for x in last))

    def weights(self):
        """Sampling weights: p (1 - p) with p = (s + 1) / (n + 2), the floor for skipped problems, never below it."""
        out = []
        for i, (n, s) in enumerate(zip(self.attempts, self.successes)):
            p = (s + 1) / (n + 2)
            out.append(self.floor if self.skipped(i) else max(p * (1 - p), self.floor))
        return torch.tensor(out, dtype=torch.float64)

    def draw(self, n, generator, exclude=()):
        """n distinct problem indices not in exclude (fewer if the pool has fewer), drawn in proportion to the
        weights."""
        w = self.weights()
        w[list(exclude)] = 0.0
        n = min(n, int((w > 0).sum()))
        return torch.multinomial(w, n, replacement=False, generator=generator).tolist() if n else []

    def histogram(self):
        """How many problems have each empirical pass rate: never drawn, 0, (0, 1/4], ..., (3/4, 1), 1."""
        bins = dict(unseen=0, zero=0, low=0, mid_low=0, mid_high=0, high=0, one=0)
        for n, s in zip(self.attempts, self.successes):
            rate = s / n if n else None
            key = ("unseen" if rate is None else "zero" if rate == 0 else "one" if rate == 1 else
                   "low" if rate <= 0.25 else "mid_low" if rate <= 0.5 else "mid_high" if rate <= 0.75 else "high")
            bins[key] += 1
        return bins

    def state(self):
        return dict(attempts=self.attempts, successes=self.successes, recent=self.recent)

    def load(self, state):
        if len(state["attempts"]) != len(self.attempts):
            raise ValueError(f"--resume: the saved pass-rate table has {len(state['attempts'])} problems, the pool "
                             f"{len(self.attempts)}")
        self.attempts, self.successes, self.recent = state["attempts"], state["successes"], state["recent"]


# -----------------------------------------------------------------------------
# The replay buffer


class ReplayBuffer:
    """Right rollouts of rarely solved problems, oldest first; each entry keeps what the update needs."""

    # the rollout fields an entry keeps, and their names in selection.json ("pass": as checkpoints always named it)
    KEEP = dict(prompt="prompt", tokens="tokens", sampler_logprobs="sampler_logprobs", text="text",
                finish_reason="finish_reason", reward="reward", correct="correct", passed="pass", boxed="boxed")

    def __init__(self, capacity=256, max_rate=0.25):
        self.capacity, self.max_rate, self.entries = capacity, max_rate, []

    def add(self, groups, step):
        """One right rollout (the first) per group whose pass rate is in (0, max_rate]; a problem solved more
        often than that leaves the buffer. Oldest entries go first once the buffer is full."""
        for g in groups:
            pid, rate = g[0].problem["id"], sum(r.passed for r in g) / len(g)
            if rate > self.max_rate:
                self.entries = [e for e in self.entries if e["id"] != pid]
            elif rate > 0:
                first = next(r for r in g if r.passed)
                self.entries.append(dict(id=pid, step=step, **{k: getattr(first, f) for f, k in self.KEEP.items()}))
        self.entries = self.entries[-self.capacity:] if self.capacity else []

    def newest(self, pid):
        return next((e for e in reversed(self.entries) if e["id"] == pid), None)

    def apply(self, groups, fraction):
        """Put one replayed success in place of a fresh wrong sample in up to round(fraction * len(groups))
        groups whose problem has an entry, the groups with fewest fresh successes first (in place); returns
        how many groups got one. Its behavior_logprobs are those it was sampled with (update.old_logprobs)."""
        budget = round(fraction * len(groups))
        candidates = [(sum(r.passed for r in g), j) for j, g in enumerate(groups)
                      if self.newest(g[0].problem["id"]) is not None and not all(r.passed for r in g)]
        chosen = [j for _, j in sorted(candidates)[:budget]]
        for j in chosen:
            g = groups[j]
            entry = self.newest(g[0].problem["id"])
            last_wrong = max(i for i, r in enumerate(g) if not r.passed)
            g[last_wrong] = dataclasses.replace(g[last_wrong], replayed=True, behavior_logprobs=entry["sampler_logprobs"],
                                                **{f: entry[k] for f, k in self.KEEP.items()})
        return len(chosen)

    def state(self):
        return dict(entries=self.entries)

    def load(self, state):
        self.entries = state["entries"]


# -----------------------------------------------------------------------------
# The options as train_rl.draw_rollouts calls them (each a no-op when its flag is off)


def replay(selection, groups, cfg):
    """--replay-fraction: replayed successes into the step's fresh groups, in place; returns how many got one."""
    return selection["replay"].apply(groups, cfg.replay_fraction) if "replay" in selection else 0


def draws_per_step(cfg):
    """Dynamic sampling (DAPO sec. 3.2) draws P more problems, at most --max-draws times, until P groups are
    mixed; otherwise a step draws once."""
    return cfg.max_draws if cfg.dynamic_sampling else 1


def keep_mixed(groups, cfg):
    """Dynamic sampling keeps the groups that are neither all passed nor all failed (the rest give Dr. GRPO no
    gradient); otherwise every group."""
    if not cfg.dynamic_sampling:
        return groups
    return [g for g in groups if 0 < sum(r.passed for r in g) < len(g)]


def update_selection(selection, fresh, step):
    """After the step's choices, every fresh group updates the pass-rate table and the replay buffer."""
    if "pass_rates" in selection:
        selection["pass_rates"].update(fresh)
    if "replay" in selection:
        selection["replay"].add(fresh, step + 1)


# -----------------------------------------------------------------------------
# The data state a run's steps share, saved with each checkpoint


def new_selection(cfg, train_set):
    """{'pass_rates': PassRates, 'replay': ReplayBuffer}, each only when its flag is on."""
    out = {}
    if cfg.select == "pass_rate":
        out["pass_rates"] = PassRates([p["id"] for p in train_set], cfg.pass_rate_floor, cfg.skip_window)
    if cfg.replay_fraction:
        out["replay"] = ReplayBuffer(cfg.replay_size, cfg.replay_max_rate)
    return out


def selection_metrics(selection, replayed):
    """What a step logs of the data state: the pass-rate histogram and how many problems are skipped; groups given
    a replayed success and the buffer's size."""
    out = {}
    if "pass_rates" in selection:
        table = selection["pass_rates"]
        out.update(pass_rate_histogram=table.histogram(),
                   skipped_problems=sum(table.skipped(i) for i in range(len(table.attempts))))
    if "replay" in selection:
        out.update(replayed_groups=replayed, replay_buffer=len(selection["replay"].entries))
    return out
