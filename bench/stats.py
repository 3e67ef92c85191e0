"""Summaries of timings: percentiles of one repetition, and a figure over repetitions (the
median with its range). Standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) by the nearest-rank method; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


@dataclass(frozen=True, slots=True)
class Figure:
    """One reported number: the median over repetitions, their range, and each repetition."""

    name: str
    unit: str
    value: float
    low: float
    high: float
    reps: list[float] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "unit": self.unit,
            "median": _finite(self.value),
            "min": _finite(self.low),
            "max": _finite(self.high),
            "reps": [_finite(rep) for rep in self.reps],
        }


def figure(name: str, unit: str, reps: Sequence[float]) -> Figure:
    finite = [rep for rep in reps if math.isfinite(rep)]
    if not finite:
        return Figure(name, unit, math.nan, math.nan, math.nan, list(reps))
    return Figure(name, unit, median(finite), min(finite), max(finite), list(reps))


def _finite(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None
