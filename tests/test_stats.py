"""stats.py against hand-computed values: Wilson intervals, unbiased pass@k, the paired bootstrap and McNemar's
exact test, and the t interval over seeds."""

import math

import pytest

import stats


def test_wilson_hand_checked():
    # 8/10: center (0.8 + 1.96^2/20) / (1 + 1.96^2/10) = 0.71675, half-width 0.22658
    lo, hi = stats.wilson(8, 10)
    assert (lo, hi) == (pytest.approx(0.4902, abs=1e-4), pytest.approx(0.9433, abs=1e-4))
    assert stats.wilson(0, 10) == (0.0, pytest.approx(1.96**2 / (10 + 1.96**2)))
    assert stats.wilson(0, 0) == (0.0, 1.0)


def test_pass_at_k_hand_values():
    assert stats.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert stats.pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2)) == pytest.approx(0.7)
    assert stats.pass_at_k(5, 0, 3) == 0.0 and stats.pass_at_k(5, 4, 2) == 1.0  # n - c < k: some draw must succeed
    # large n stays exact where the binomials themselves would overflow a float
    assert stats.pass_at_k(2000, 3, 500) == pytest.approx(1 - math.comb(1997, 500) / math.comb(2000, 500))


def test_bootstrap_and_mcnemar():
    a = [1, 1, 1, 0, 0, 0, 1, 1, 0, 1]
    b = [1, 0, 1, 1, 1, 1, 1, 1, 0, 1]  # A-only right: 1, B-only right: 3
    # The exact bootstrap distribution of the mean difference (multinomial over counts 1/6/3 of -1/0/+1)
    # has P(<= -0.3) = 0.009, P(<= -0.2) = 0.032, P(<= 0.5) = 0.970, P(<= 0.6) = 0.993: CI [-0.2, 0.6].
    diff, (lo, hi) = stats.bootstrap_paired(a, b, n_boot=100_000, seed=1)
    assert diff == pytest.approx(0.2) and (lo, hi) == (pytest.approx(-0.2), pytest.approx(0.6))
    assert stats.bootstrap_paired(a, a) == (0.0, (0.0, 0.0))
    assert stats.mcnemar_exact(1, 4) == pytest.approx(2 * (1 + 5) / 32)
    assert stats.mcnemar_exact(0, 0) == 1.0


def test_t_interval_over_seeds_hand_computed():
    # 3 seeds 0.2, 0.4, 0.6: mean 0.4, sd 0.2, t(2) = 4.303: half-width 4.303 * 0.2 / sqrt(3) = 0.49687
    mean, (lo, hi) = stats.t_interval([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4) and (lo, hi) == (pytest.approx(0.4 - 0.49687, abs=1e-5),
                                                      pytest.approx(0.4 + 0.49687, abs=1e-5))
    assert stats.t_interval([0.5]) == (0.5, None)  # one seed: no interval
    # 5 seeds take t(4) = 2.776; 13 seeds fall between table rows and take the next smaller df, 12 (wider)
    assert stats.t_interval([0, 1, 0, 1, 0])[1][1] == pytest.approx(0.4 + 2.776 * math.sqrt(0.3) / math.sqrt(5))
    x = [0, 1] * 6 + [0]
    sd = (sum((v - sum(x) / 13) ** 2 for v in x) / 12) ** 0.5
    assert stats.t_interval(x)[1][1] == pytest.approx(sum(x) / 13 + 2.179 * sd / math.sqrt(13))


def test_t_interval_with_items_adds_the_test_sets_binomial_error_by_hand():
    # seeds 0.2, 0.4, 0.6 on one set of 50 problems: s^2 = 0.04, p = 0.4; se^2 = 0.04 / 3 + 0.24 / 50
    mean, (lo, hi) = stats.t_interval_with_items([0.2, 0.4, 0.6], 50)
    half = 4.303 * math.sqrt(0.04 / 3 + 0.4 * 0.6 / 50)
    assert mean == pytest.approx(0.4) and (lo, hi) == pytest.approx((0.4 - half, 0.4 + half))
    assert hi - lo > stats.t_interval([0.2, 0.4, 0.6])[1][1] - stats.t_interval([0.2, 0.4, 0.6])[1][0]  # wider
    same = stats.t_interval_with_items([0.5, 0.5], 200)  # no seed spread: the set's error alone
    assert same[1] == pytest.approx((0.5 - 12.706 * math.sqrt(0.25 / 200), 0.5 + 12.706 * math.sqrt(0.25 / 200)))
    assert stats.t_interval_with_items([0.3], 200) == (0.3, None)
