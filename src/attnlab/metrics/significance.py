"""How sure a measured difference is: the few statistics the experiments write in their tables.

- :func:`mean_se`: the mean of repeated measurements (seeds, sentences) and its standard error
  s/√n, s the sample standard deviation;
- :func:`wilson_interval`: the Wilson score interval of a binomial proportion k/n;
- :func:`two_proportion_z`: the z-score of p₁ − p₂ for two independent binomial samples, with the
  pooled proportion p = (k₁ + k₂)/(n₁ + n₂): z = (p₁ − p₂) / √(p(1 − p)(1/n₁ + 1/n₂));
- :func:`paired_z`: the z-score of the mean of paired differences (the same items scored by two
  models): mean / standard error.

|z| ≥ 1.96 is a two-sided 95 % confidence that the difference is not zero, |z| ≥ 2.58 is 99 %.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["mean_se", "wilson_interval", "two_proportion_z", "paired_z", "describe_z"]


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, standard error)`` of ``values``; the error is NaN for a single value.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("mean_se needs at least one value")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, statistics.stdev(values) / math.sqrt(len(values))


def wilson_interval(k: int, n: int, *, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of the proportion ``k/n`` (95 % for z = 1.96).

    Raises:
        ValueError: ``n < 1`` or ``k`` outside ``[0, n]``.
    """
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"wilson_interval needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def two_proportion_z(k1: int, n1: int, k2: int, n2: int) -> float:
    """z-score of ``k1/n1 − k2/n2`` (pooled standard error); 0 when both are 0 % or 100 %.

    Raises:
        ValueError: an empty sample or a count outside ``[0, n]``.
    """
    if n1 < 1 or n2 < 1 or not (0 <= k1 <= n1 and 0 <= k2 <= n2):
        raise ValueError(f"two_proportion_z needs counts within samples, got {k1}/{n1}, {k2}/{n2}")
    p = (k1 + k2) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    return 0.0 if se == 0 else (k1 / n1 - k2 / n2) / se


def paired_z(diffs: Sequence[float]) -> float:
    """z-score of the mean of paired differences: mean / (s/√n); ±inf when all are equal and
    non-zero, 0 when all are zero.

    Raises:
        ValueError: fewer than two differences.
    """
    if len(diffs) < 2:
        raise ValueError(f"paired_z needs at least two differences, got {len(diffs)}")
    mean, se = mean_se(diffs)
    if se == 0:
        return 0.0 if mean == 0 else math.copysign(math.inf, mean)
    return mean / se


def describe_z(z: float) -> str:
    """``"z = 2.4, 95 % confident of the sign"`` and the like (two-sided)."""
    if abs(z) >= 2.58:
        level = "99 % confident of the sign"
    elif abs(z) >= 1.96:
        level = "95 % confident of the sign"
    else:
        level = "not significant at 95 %"
    return f"z = {z:.1f}, {level}"
