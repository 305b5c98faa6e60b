"""A fixed-bucket histogram that any thread can observe into (metrics without a metrics
library: ``registry`` imports nothing of ours and no exporter; ``whip`` exports it).

``_lock`` is a leaf lock held for a few additions per observation.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

LATENCY_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True, slots=True)
class HistogramReading:
    """Cumulative bucket counts (one per upper bound, then +Inf), sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    total: float
    count: int


class Histogram:
    """Counts observations into buckets with the given upper bounds (inclusive)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(bounds) or not bounds:
            raise ValueError("bucket bounds must be a non-empty increasing sequence")
        self._bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        """Record one value."""
        index = bisect_left(self._bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    def observe_many(self, values: Sequence[float]) -> None:
        """Record several values under one lock acquisition (a batch of confirmations)."""
        bounds = self._bounds
        indexes = [bisect_left(bounds, value) for value in values]
        total = sum(values)
        with self._lock:
            counts = self._counts
            for index in indexes:
                counts[index] += 1
            self._sum += total

    def read(self) -> HistogramReading:
        """A consistent reading."""
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        cumulative: list[int] = []
        running = 0
        for count in counts:
            running += count
            cumulative.append(running)
        return HistogramReading(self._bounds, tuple(cumulative), total, running)
