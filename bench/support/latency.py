"""Latency figures the benches share: percentiles in milliseconds of samples in seconds,
and the percentage one figure adds to another."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentiles_ms(samples_s: Sequence[float], *, with_max: bool = False) -> dict[str, float]:
    """``p50_ms``, ``p90_ms``, ``p99_ms`` (nearest rank below), ``mean_ms`` and, with
    ``with_max``, ``max_ms`` of ``samples_s`` (seconds), rounded to the microsecond."""
    ordered = sorted(samples_s)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    out = {"p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99)}
    if with_max:
        out["max_ms"] = round(ordered[-1] * 1000, 3)
    out["mean_ms"] = round(statistics.fmean(ordered) * 1000, 3)
    return out


def added_percent(base: float, other: float) -> float:
    """What ``other`` adds to ``base``, in percent, one decimal."""
    return round(100 * (other / base - 1), 1)
