"""Uncertainty for reported figures: Wilson intervals, exact McNemar, paired bootstrap.

Every accuracy, hallucination and error fraction ratune reports is a proportion k / n over the
eval questions of one cell, so it carries n and a 95 % Wilson score interval
(:func:`wilson_interval`). Two cells scored on the same questions are compared pairwise
(:func:`contingency`, :func:`mcnemar_exact`, :func:`paired_bootstrap`): the per-question outcomes
of two models are correlated, so an unpaired two-proportion test would be wrong (too
conservative) and is never used.

Sources:
    E. B. Wilson (1927), "Probable inference, the law of succession, and statistical inference",
    JASA 22(158):209-212; A. Agresti & B. A. Coull (1998), "Approximate is better than 'exact'
    for interval estimation of binomial proportions", The American Statistician 52(2):119-126.
    Q. McNemar (1947), "Note on the sampling error of the difference between correlated
    proportions or percentages", Psychometrika 12(2):153-157; the exact (binomial) form is the
    sign test on the discordant pairs, A. Agresti, "Categorical Data Analysis" (3rd ed.), §11.1.
    B. Efron & R. J. Tibshirani (1993), "An Introduction to the Bootstrap", ch. 13 (percentile
    intervals).
"""

from __future__ import annotations

from typing import Sequence

from scipy.stats import binomtest, norm

#: The 0.975 quantile of the standard normal distribution (two-sided 95 %).
Z95 = 1.959963984540054

#: Default number of bootstrap resamples and seed (stated in every compare output).
DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0

#: Outcome names whose fractions carry intervals (the scorer's OUTCOMES) and their field names.
RATE_FIELDS = (("correct", "accuracy"), ("hallucination", "hallucination"), ("error", "error"))


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a proportion of ``k`` successes in ``n`` trials.

    With p = k / n::

        centre    = (p + z^2 / (2n)) / (1 + z^2 / n)
        halfwidth = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / (4 n^2))
        interval  = [centre - halfwidth, centre + halfwidth]

    i.e. the set of true proportions q for which |p - q| <= z sqrt(q (1 - q) / n) (inverting
    the score test; Wilson 1927). Unlike the Wald interval p +- z sqrt(p (1 - p) / n) it stays
    inside [0, 1] and does not collapse to a point at k = 0 or k = n (Agresti & Coull 1998).
    Example: 44 of 60 -> [0.6099, 0.8287] (73.3 % [61-83]). Computed by scipy's
    ``binomtest(k, n).proportion_ci(method="wilson")``, which is this formula (equal to the closed
    form above within 1e-15 for every k <= n <= 80, tests/test_stats.py).

    Args:
        k: successes, 0 <= k <= n.
        n: trials. ``n == 0`` returns ``(0.0, 1.0)``: with no questions nothing is known about
            the proportion, and the whole range is the honest interval (a report with an empty
            cell then shows "[0-100]" instead of failing).
        z: the normal quantile; the default gives a two-sided 95 % interval.

    Returns:
        ``(low, high)`` as fractions in [0, 1].

    Raises:
        ValueError: k or n not a non-negative integer, or k > n.
    """
    _check_count("k", k)
    _check_count("n", n)
    if k > n:
        raise ValueError(f"k = {k} exceeds n = {n}")
    if n == 0:
        return 0.0, 1.0
    confidence = 0.95 if z == Z95 else 2.0 * float(norm.cdf(z)) - 1.0
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    # Exact at the ends (rounding can leave 1e-17 below 0 or above 1).
    return (0.0 if k == 0 else max(0.0, float(ci.low))), (1.0 if k == n else min(1.0, float(ci.high)))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar test (the sign test on the discordant pairs).

    ``b`` questions are right only under A, ``c`` only under B. Under the null hypothesis that
    A and B are equally accurate, each of the m = b + c discordant questions is equally likely
    to fall either way, so min(b, c) ~ Bin(m, 1/2) and::

        p = min(1, 2 * P(X <= min(b, c))),  X ~ Bin(b + c, 1/2)
          = min(1, 2 * sum_{i=0}^{min(b,c)} C(m, i) / 2^m)

    (McNemar 1947; Agresti, Categorical Data Analysis, §11.1.) Questions both get right or
    both get wrong carry no information about the difference and do not enter. Computed by
    scipy's two-sided ``binomtest(min(b, c), b + c, 0.5)``, which for p = 1/2 is this sum (equal to
    the exact-integer sum within 1e-12 relative for every b + c < 80, tests/test_stats.py).
    Example: b = 11, c = 5 -> 2 * 6885 / 65536 = 0.2101.

    Args:
        b, c: the discordant counts (non-negative integers).

    Returns:
        The p-value in (0, 1]; ``b + c == 0`` gives 1.0 (no evidence of any difference).

    Raises:
        ValueError: b or c not a non-negative integer.
    """
    _check_count("b", b)
    _check_count("c", c)
    m = b + c
    if m == 0:
        return 1.0
    return min(1.0, float(binomtest(min(b, c), m, 0.5).pvalue))


def _as_bools(name: str, values: Sequence) -> list[bool]:
    out = []
    for i, v in enumerate(values):
        if hasattr(v, "item"):  # numpy scalars
            v = v.item()
        if not isinstance(v, (bool, int)) or v not in (0, 1):
            raise ValueError(f"{name}[{i}] must be a bool, got {v!r}")
        out.append(bool(v))
    return out


def contingency(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """The paired 2x2 table of two outcome lists (True = correct) over the same questions.

    Args:
        a, b: per-question correctness of A and B, in the same question order.

    Returns:
        ``{"both": , "only_a": , "only_b": , "neither": }`` counts (they sum to ``len(a)``;
        ``only_a`` and ``only_b`` are McNemar's b and c).

    Raises:
        ValueError: different lengths or non-boolean entries.
    """
    a, b = _as_bools("a", a), _as_bools("b", b)
    if len(a) != len(b):
        raise ValueError(f"unpaired outcome lists: {len(a)} vs {len(b)} entries")
    table = {"both": 0, "only_a": 0, "only_b": 0, "neither": 0}
    for x, y in zip(a, b):
        table["both" if x and y else "only_a" if x else "only_b" if y else "neither"] += 1
    return table


def paired_bootstrap(a: Sequence[bool], b: Sequence[bool], *, resamples: int = DEFAULT_RESAMPLES,
                     seed: int = DEFAULT_SEED) -> tuple[float, float, float]:
    """The accuracy difference A - B with a paired percentile-bootstrap 95 % interval.

    With d_i = a_i - b_i in {-1, 0, 1} for the n questions, the difference is mean(d). Each of
    ``resamples`` replicates draws n question indices with replacement (the pairs stay
    together, so the correlation between A and B is kept) and computes mean(d) over them; the
    interval is the 2.5th and 97.5th percentiles of the replicates (numpy's default linear
    interpolation; Efron & Tibshirani 1993, ch. 13). Indices come from
    ``numpy.random.default_rng(seed)`` in a fixed order, so a seed always gives the same
    interval on the same data.

    Args:
        a, b: per-question correctness of A and B, same length and question order.
        resamples: number of bootstrap replicates (>= 1).
        seed: the generator seed.

    Returns:
        ``(diff, low, high)`` as fractions (positive: A is more accurate).

    Raises:
        ValueError: empty or different-length lists, non-boolean entries, resamples < 1.
    """
    import numpy as np

    a, b = _as_bools("a", a), _as_bools("b", b)
    if len(a) != len(b):
        raise ValueError(f"unpaired outcome lists: {len(a)} vs {len(b)} entries")
    if not a:
        raise ValueError("paired_bootstrap needs at least one question")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
    d = np.asarray(a, dtype=np.int64) - np.asarray(b, dtype=np.int64)
    n = len(d)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    chunk = max(1, min(resamples, 2_000_000 // n))  # bounded memory for large n
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = d[idx].sum(axis=1) / n
    low, high = np.percentile(means, [2.5, 97.5])
    return float(d.sum() / n), float(low), float(high)


def rate_intervals(counts: dict, n: int, z: float = Z95) -> dict:
    """Interval fields for a metrics block of counts.

    Args:
        counts: a dict with ``correct_n``, ``hallucination_n``, ``error_n`` (as in the blocks
            of :meth:`ratune.eval.scoring.Scorer.score`); missing counts are skipped.
        n: the number of questions.

    Returns:
        ``{"accuracy_ci": [low, high], "hallucination_ci": [...], "error_ci": [...]}`` (Wilson,
        fractions), only for the counts present.
    """
    out = {}
    for outcome, field in RATE_FIELDS:
        k = counts.get(f"{outcome}_n")
        if k is not None:
            out[f"{field}_ci"] = list(wilson_interval(int(k), int(n), z))
    return out


def count_rates(counts: dict[str, int], n: int, z: float = Z95) -> dict:
    """Rates of named counts over ``n``: for each ``key``, ``key`` (fraction; 0.0 when n is 0),
    ``key_n`` (the count) and ``key_ci`` (95 % Wilson interval, None when n is 0).

    Used by the experiment metrics (document swap, constraints) so every rate carries its n and
    interval the same way.
    """
    out = {}
    for key, k in counts.items():
        out[key] = k / n if n else 0.0
        out[f"{key}_n"] = k
        out[f"{key}_ci"] = list(wilson_interval(k, n, z)) if n else None
    return out
