"""ratune.eval.stats against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from ratune.eval.stats import Z95, contingency, mcnemar_exact, paired_bootstrap, rate_intervals, wilson_interval


def test_wilson_44_of_60_by_hand():
    # p = 44/60 = 0.733333, z = 1.959964, z^2 = 3.841459
    # z^2/n = 0.0640243, z^2/(2n) = 0.0320122, 1 + z^2/n = 1.0640243
    # centre = (0.733333 + 0.0320122) / 1.0640243 = 0.765346 / 1.0640243 = 0.719293
    # p(1-p)/n = 0.733333 * 0.266667 / 60 = 0.00325926; z^2/(4n^2) = 3.841459 / 14400 = 0.00026677
    # half = 1.959964 / 1.0640243 * sqrt(0.00352603) = 1.842030 * 0.0593804 = 0.109381
    # -> [0.609912, 0.828674], i.e. 73.3 % [61-83]
    low, high = wilson_interval(44, 60)
    assert low == pytest.approx(0.609912, abs=2e-6)
    assert high == pytest.approx(0.828674, abs=2e-6)
    # The bounds are the roots q of the score equation (p - q)^2 = z^2 q (1 - q) / n.
    for q in (low, high):
        assert (44 / 60 - q) ** 2 == pytest.approx(Z95 ** 2 * q * (1 - q) / 60, rel=1e-9)


def test_wilson_edges():
    # k = 0: centre = half = (z^2/(2n)) / (1 + z^2/n) -> low 0, high = (z^2/n) / (1 + z^2/n)
    # n = 10: 0.3841459 / 1.3841459 = 0.277533
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.277533, abs=1e-6))
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and low == pytest.approx(1 - 0.277533, abs=1e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)  # documented choice: no data, whole range
    # symmetric around 1/2 for k = n/2
    low, high = wilson_interval(30, 60)
    assert low + high == pytest.approx(1.0)
    # z = 1.959964 with a wider z widens the interval
    assert wilson_interval(44, 60, z=2.576)[0] < wilson_interval(44, 60)[0]
    for bad in ((5, 4), (-1, 4), (1.5, 4), (True, 4)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def test_mcnemar_11_vs_5_by_hand():
    # m = 16 discordant pairs, X ~ Bin(16, 1/2), p = 2 P(X <= 5)
    # C(16, 0..5) = 1 + 16 + 120 + 560 + 1820 + 4368 = 6885; 2 * 6885 / 65536 = 0.2101135...
    assert mcnemar_exact(11, 5) == pytest.approx(2 * 6885 / 65536, rel=1e-12)
    assert mcnemar_exact(11, 5) == pytest.approx(0.210114, abs=1e-6)
    assert mcnemar_exact(5, 11) == mcnemar_exact(11, 5)


def test_mcnemar_small_cases():
    assert mcnemar_exact(0, 0) == 1.0  # no discordant pairs: no evidence
    assert mcnemar_exact(1, 0) == 1.0  # 2 * 1/2 capped at 1
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64)  # 2 * (1/2)^6 = 0.03125
    # 8 vs 1: 2 * (1 + 9) / 512 = 0.0390625
    assert mcnemar_exact(8, 1) == pytest.approx(20 / 512)
    assert 0 < mcnemar_exact(500, 300) < 1e-10  # large m stays exact (no float overflow)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_scipy_gives_the_closed_forms_numbers():
    """wilson_interval and mcnemar_exact call scipy.stats.binomtest; its numbers are the closed
    forms of their docstrings (Wilson's centre +- half-width; the exact-integer binomial tail)."""

    def wilson(k, n, z=Z95):
        p, z2 = k / n, z * z
        centre = (p + z2 / (2 * n)) / (1 + z2 / n)
        half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
        return max(0.0, centre - half), min(1.0, centre + half)

    worst = max(abs(a - b) for n in range(1, 81) for k in range(n + 1)
                for a, b in zip(wilson_interval(k, n), wilson(k, n)))
    assert worst < 1e-15
    assert wilson_interval(7, 20, z=2.5758293035489) == pytest.approx(wilson(7, 20, z=2.5758293035489), abs=1e-12)
    for m in range(1, 80):
        for b in range(m + 1):
            tail = sum(math.comb(m, i) for i in range(min(b, m - b) + 1))
            assert mcnemar_exact(b, m - b) == pytest.approx(min(1.0, 2 * tail / 2 ** m), rel=1e-12)


def _split_11_5():
    # 60 questions: 30 both right, 11 only A, 5 only B, 14 neither (A 41/60, B 35/60)
    a = [True] * 30 + [True] * 11 + [False] * 5 + [False] * 14
    b = [True] * 30 + [False] * 11 + [True] * 5 + [False] * 14
    return a, b


def test_contingency():
    a, b = _split_11_5()
    assert contingency(a, b) == {"both": 30, "only_a": 11, "only_b": 5, "neither": 14}
    assert contingency([], []) == {"both": 0, "only_a": 0, "only_b": 0, "neither": 0}
    with pytest.raises(ValueError):
        contingency([True], [True, False])
    with pytest.raises(ValueError):
        contingency(["correct"], [True])


def test_paired_bootstrap_reproducible_and_plausible():
    a, b = _split_11_5()
    first = paired_bootstrap(a, b, resamples=10000, seed=0)
    assert paired_bootstrap(a, b, resamples=10000, seed=0) == first  # bit-identical for a fixed seed
    # With few resamples the seed visibly matters (with 10000 both ends land on the same 1/60 grid points).
    assert paired_bootstrap(a, b, resamples=20, seed=1) != paired_bootstrap(a, b, resamples=20, seed=2)
    assert paired_bootstrap(a, b, resamples=20, seed=1) == paired_bootstrap(a, b, resamples=20, seed=1)
    diff, low, high = first
    assert diff == pytest.approx(6 / 60)  # (41 - 35) / 60
    # d_i in {1 (11x), -1 (5x), 0 (44x)}: mean 0.1, population variance 16/60 - 0.01 = 0.256667,
    # bootstrap s.e. = sqrt(0.256667 / 60) = 0.065405; normal approximation 0.1 +- 0.128190
    # = [-0.0282, 0.2282]. The percentile interval (on a 1/60 grid) must be close to it.
    assert low == pytest.approx(0.1 - 1.959964 * math.sqrt(0.256667 / 60), abs=0.02)
    assert high == pytest.approx(0.1 + 1.959964 * math.sqrt(0.256667 / 60), abs=0.02)
    assert low < 0 < high  # consistent with McNemar p = 0.21: no significant difference


def test_paired_bootstrap_degenerate_and_errors():
    assert paired_bootstrap([True, False, True], [True, False, True], resamples=50) == (0.0, 0.0, 0.0)
    assert paired_bootstrap([True] * 5, [False] * 5, resamples=50) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        paired_bootstrap([], [])
    with pytest.raises(ValueError):
        paired_bootstrap([True], [True, False])
    with pytest.raises(ValueError):
        paired_bootstrap([True], [False], resamples=0)


def test_rate_intervals():
    out = rate_intervals({"correct_n": 44, "hallucination_n": 6, "error_n": 10}, 60)
    assert out["accuracy_ci"] == list(wilson_interval(44, 60))
    assert set(out) == {"accuracy_ci", "hallucination_ci", "error_ci"}
    assert rate_intervals({"correct_n": 1}, 2) == {"accuracy_ci": list(wilson_interval(1, 2))}


def test_holm_by_hand():
    """Holm (1979): sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04, made non-decreasing:
    0.03, 0.06, 0.06, back in the order given; a product over 1 is 1."""
    from ratune.eval.stats import holm

    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([0.2]) == [0.2] and holm([]) == []


def test_mean_bootstrap_by_hand():
    """The mean of 1, 0, 0, 1, -1 is 0.2; its resampled means lie in [-1, 1] around it, the same for
    a seed; fractional differences (shares of seeds) are taken as they are."""
    from ratune.eval.stats import mean_bootstrap

    mean, low, high = mean_bootstrap([1, 0, 0, 1, -1], resamples=500, seed=3)
    assert mean == pytest.approx(0.2) and -1 <= low < 0.2 < high <= 1
    assert mean_bootstrap([1, 0, 0, 1, -1], resamples=500, seed=3) == (mean, low, high)
    assert mean_bootstrap([0.5, 0.5, 0.5], resamples=100) == (0.5, 0.5, 0.5)
    assert mean_bootstrap([1 / 3, -1 / 3], resamples=200)[0] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="at least one question"):
        mean_bootstrap([])
