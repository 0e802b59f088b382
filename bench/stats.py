"""Summary statistics: medians, tail percentiles and ours/baseline ratios.

Kept dependency-free (no numpy) so the numbers are computed the same way in
quick and full runs and are easy to check by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["Summary", "median", "percentile", "ratio", "summarize"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks.

    The same definition as numpy's default ("linear"), so a reader with numpy
    gets the same figure.
    """
    if not values:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    weight = position - low
    return ordered[low] * (1 - weight) + ordered[high] * weight


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def ratio(ours: float, baseline: float) -> float:
    """ours / baseline; infinite when the baseline is zero (never met by chance)."""
    if baseline == 0:
        return math.inf
    return ours / baseline


@dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    """One sample reduced to the figures the table and the JSON carry."""

    n: int
    median: float
    p99: float
    mean: float
    min: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("cannot summarize an empty sample")
    return Summary(
        n=len(values),
        median=median(values),
        p99=percentile(values, 99),
        mean=sum(values) / len(values),
        min=min(values),
        max=max(values),
    )
