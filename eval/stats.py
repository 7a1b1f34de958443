"""Uncertainty for reported figures: Wilson intervals, exact McNemar, paired bootstrap
(how to read them: docs/pipeline.md#reading-intervals-and-comparisons).

Sources: Wilson (1927), JASA 22(158):209-212; Agresti & Coull (1998), Am. Stat. 52(2):119-126;
McNemar (1947), Psychometrika 12(2):153-157, exact form: Agresti, "Categorical Data Analysis"
(3rd ed.), §11.1; Efron & Tibshirani (1993), "An Introduction to the Bootstrap", ch. 13; Holm (1979), Scand. J. Stat.
6(2):65-70.
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
    """The Wilson score interval (Wilson 1927) for ``k`` successes in ``n`` trials, computed by
    scipy's ``binomtest(k, n).proportion_ci(method="wilson")``. Example: 44 of 60 -> [0.6099, 0.8287].

    ``z`` is the normal quantile (default: two-sided 95 %). ``n == 0`` returns ``(0.0, 1.0)``
    (nothing known: a report shows "[0-100]"). Returns ``(low, high)`` as fractions.

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
    """Two-sided exact McNemar p (McNemar 1947; Agresti §11.1): ``b`` questions right only under
    A, ``c`` only under B; p = min(1, 2 P(X <= min(b, c))), X ~ Bin(b + c, 1/2), by scipy's
    ``binomtest``. ``b + c == 0`` gives 1.0. Example: b = 11, c = 5 -> 0.2101.

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
    """The paired 2x2 table of two per-question correctness lists in the same question order:
    ``{"both", "only_a", "only_b", "neither"}`` counts (``only_a``/``only_b`` are McNemar's b, c).

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
    """The accuracy difference A - B with a paired percentile-bootstrap 95 % interval (Efron &
    Tibshirani 1993, ch. 13): ``resamples`` draws of question indices with replacement from
    ``numpy.random.default_rng(seed)``, so a seed always gives the same interval.

    Returns ``(diff, low, high)`` as fractions (positive: A is more accurate).

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
    return mean_bootstrap(np.asarray(a, dtype=np.int64) - np.asarray(b, dtype=np.int64), resamples=resamples,
                          seed=seed)


def mean_bootstrap(differences, *, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
                   ) -> tuple[float, float, float]:
    """The mean of paired ``differences`` (one per question) with its percentile-bootstrap 95 %
    interval, drawn as :func:`paired_bootstrap` draws; returns ``(mean, low, high)``.

    Raises:
        ValueError: no differences, resamples < 1.
    """
    import numpy as np

    d = np.asarray(differences)
    if not len(d):
        raise ValueError("mean_bootstrap needs at least one question")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")
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


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given: the i-th smallest (from
    1) times m - i + 1, made non-decreasing in that order, at most 1. Example: 0.01, 0.04, 0.03 ->
    0.03, 0.06, 0.06."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted


def rate_intervals(counts: dict, n: int, z: float = Z95) -> dict:
    """``{"accuracy_ci", "hallucination_ci", "error_ci"}`` (Wilson, fractions) for the counts
    ``correct_n``, ``hallucination_n``, ``error_n`` present in ``counts``, over ``n`` questions."""
    out = {}
    for outcome, field in RATE_FIELDS:
        k = counts.get(f"{outcome}_n")
        if k is not None:
            out[f"{field}_ci"] = list(wilson_interval(int(k), int(n), z))
    return out


def count_rates(counts: dict[str, int], n: int, z: float = Z95) -> dict:
    """For each ``key`` of ``counts``: ``key`` (fraction of ``n``; 0.0 when n is 0), ``key_n`` and
    ``key_ci`` (95 % Wilson interval, None when n is 0)."""
    out = {}
    for key, k in counts.items():
        out[key] = k / n if n else 0.0
        out[f"{key}_n"] = k
        out[f"{key}_ci"] = list(wilson_interval(k, n, z)) if n else None
    return out
