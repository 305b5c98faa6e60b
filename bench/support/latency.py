"""Latency figures the benches share: percentiles in milliseconds of samples in seconds,
the percentage one figure adds to another, and a mean with its 95 % interval."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


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


def fsync_mean_ms(sync_s: float, syncs: int) -> float | None:
    """The mean ``fdatasync`` in milliseconds of ``syncs`` taking ``sync_s`` seconds in all
    (None when there were none)."""
    return round(1e3 * sync_s / syncs, 3) if syncs else None


def disk_share(base: dict[str, Any], other: dict[str, Any]) -> dict[str, float]:
    """What ``other`` adds to ``base`` in milliseconds (both :func:`percentiles_ms` figures
    with a ``fsync_mean_ms``): ``added_mean_ms``, and ``added_fsync_mean_ms``, how much of
    it the disk took (absent when either side had no ``fdatasync``; the rest is CPU)."""
    share = {"added_mean_ms": round(other["mean_ms"] - base["mean_ms"], 4)}
    fsync, fsync_base = other["fsync_mean_ms"], base["fsync_mean_ms"]
    if fsync is not None and fsync_base is not None:
        share["added_fsync_mean_ms"] = round(fsync - fsync_base, 4)
    return share


_T95 = ((1, 12.71), (2, 4.30), (3, 3.18), (4, 2.78), (5, 2.57), (6, 2.45), (7, 2.36),
        (8, 2.31), (9, 2.26), (10, 2.23), (12, 2.18), (15, 2.13), (20, 2.09), (25, 2.06),
        (30, 2.04), (40, 2.02), (60, 2.00), (120, 1.98))  # fmt: skip
"""Student's t for a two-sided 95 % interval, by degrees of freedom (the nearest tabled
value at or below; a wider interval, never a narrower one)."""


def mean_interval(values: list[float]) -> dict[str, Any] | None:
    """The mean of the rounds' values and its 95 % confidence interval (Student's t over
    the rounds, each round one sample): whether an added percentage is told from a
    bound, given how much the rounds move. None under two rounds."""
    if len(values) < 2:
        return None
    t = next(t for df, t in reversed(_T95) if df <= len(values) - 1)
    mean = statistics.fmean(values)
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return {"mean": round(mean, 1), "ci95": [round(mean - half, 1), round(mean + half, 1)]}
