"""Summary statistics shared by the rules, the checks and the reports."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def increase(series: Sequence[tuple[int, float]]) -> float:
    """Reset-aware increase of a counter: a drop means the counter restarted from 0."""
    total = 0.0
    for (_, a), (_, b) in zip(series, series[1:], strict=False):
        total += b - a if b >= a else b
    return total
