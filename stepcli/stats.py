"""Step-time statistics shared by the run summary, `table` and `compare`, so all three agree."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypedDict

STAT_NAMES = ("count", "mean", "median", "p90", "min", "max")
METRICS = ("median", "mean", "p90", "min", "max")  # the statistics `compare --metric` can decide on


class Stats(TypedDict):
    count: int
    mean: float
    median: float
    p90: float
    min: float
    max: float


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100], of an already sorted
    list."""
    if not sorted_values:
        return math.nan
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def median(values: Iterable[float]) -> float:
    """The median of values in any order (NaN without any)."""
    return percentile(sorted(values), 50)


def describe(values: Iterable[float]) -> Stats | None:
    """count/mean/median/p90/min/max of the values, or None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return Stats(
        count=len(ordered),
        mean=sum(ordered) / len(ordered),
        median=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        min=ordered[0],
        max=ordered[-1],
    )
