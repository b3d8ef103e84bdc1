"""
Statistics every result of this repo is reported with: binomial intervals, unbiased pass@k, paired
comparisons over problems, and intervals over seeds.
"""

import math

import numpy as np


def wilson(correct, n, z=1.96):
    """95% Wilson score interval of a binomial proportion (Wilson 1927); (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = correct / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, center - half), min(1.0, center + half)


def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, eq. 1),
    computed as a product of ratios so that large n never overflows."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every draw of k samples holds a correct one
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def bootstrap_paired(a, b, n_boot=10_000, seed=0):
    """Paired difference mean(b) - mean(a) of per-problem 0/1 scores and its 95% percentile bootstrap
    interval over problems (Efron & Tibshirani 1993). Each problem's difference is -1, 0 or 1, so one
    bootstrap resample is exactly a multinomial draw of those three counts."""
    if not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1 (bootstrap resamples), got {n_boot!r}")
    d = np.asarray(b, dtype=int) - np.asarray(a, dtype=int)
    n = len(d)
    counts = np.array([(d == -1).sum(), (d == 0).sum(), (d == 1).sum()])
    draws = np.random.default_rng(seed).multinomial(n, counts / n, size=n_boot)  # (n_boot, 3)
    means = (draws[:, 2] - draws[:, 0]) / n
    return float(d.mean()), (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def mcnemar_exact(only_a, only_b):
    """Two-sided exact McNemar p-value: a binomial test of the discordant pairs against 1/2."""
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


# Two-sided 97.5% quantiles of Student's t by degrees of freedom (any statistics table); beyond 30, 1.96.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df):
    """Student t's 97.5% quantile; between table entries the next smaller degrees of freedom (a wider interval)."""
    return T975[max(d for d in T975 if d <= df)] if df <= 30 else 1.96


def t_interval(values):
    """Mean and its 95% Student t interval over seeds (a seed is one draw of the whole run); None for one seed."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), None
    half = t975(len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), (float(x.mean() - half), float(x.mean() + half))


def t_interval_with_items(values, n_items):
    """t_interval with the test set's own sampling error added, for accuracies of seeds that share one set of
    n_items problems: se^2 = s^2 / seeds + p (1 - p) / n_items, p the mean (p (1 - p) bounds the variance of the
    problems' success rates, so the interval is conservative); None for one seed."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), None
    p = x.mean()
    half = t975(len(x) - 1) * math.sqrt(x.var(ddof=1) / len(x) + p * (1 - p) / n_items)
    return float(p), (float(p - half), float(p + half))
