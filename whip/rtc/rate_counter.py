"""A compact receive-side bitrate counter for aiortc's estimators.

Every video receiver's bitrate estimator keeps a 1000-bucket window as 1000 small
objects (allocated twice: at creation and on the first packet). Under a burst of POSTs
they are most of what the garbage collector scans. :class:`CompactRateCounter` is the
same counter over two lists of ints (2 objects); :func:`compact_rate_counters` installs
it process-wide.

aiortc internals touched: ``aiortc.rate.RateCounter`` (looked up at call time by
``RemoteBitrateEstimator.__init__``) and its ``_origin_index``, ``_origin_ms``,
``_scale``, ``_window_size``.
"""

from __future__ import annotations

import inspect

import aiortc.rate


class CompactRateCounter(aiortc.rate.RateCounter):
    """aiortc's ``RateCounter`` (amounts in 1 ms buckets over a window) with the buckets
    kept in two lists of ints instead of one ``RateBucket`` object each.

    Same answers for the same calls (``tests/test_whip_rate_counter.py`` runs both side by
    side). One difference in cost only: a gap longer than the window clears the buckets
    at once instead of stepping through every millisecond of the gap (aiortc's does: a
    minute of silence costs 60,000 passes of a Python loop, on the event loop).
    """

    def __init__(self, window_size: int, scale: int = 8000) -> None:
        self._counts: list[int] = []
        self._values: list[int] = []
        self._total_count = 0
        self._total_value = 0
        super().__init__(window_size, scale)

    def add(self, value: int, now_ms: int) -> None:
        if self._origin_ms is None:
            self._origin_ms = now_ms
        else:
            self._erase_old(now_ms)
        index = (self._origin_index + now_ms - self._origin_ms) % self._window_size
        self._counts[index] += 1
        self._values[index] += value
        self._total_count += 1
        self._total_value += value

    def rate(self, now_ms: int) -> int | None:
        if self._origin_ms is not None:
            self._erase_old(now_ms)
            active_window_size = now_ms - self._origin_ms + 1
            if self._total_count > 0 and active_window_size > 1:
                return round(self._scale * self._total_value / active_window_size)
        return None

    def reset(self) -> None:
        self._counts = [0] * self._window_size
        self._values = [0] * self._window_size
        self._origin_index = 0
        self._origin_ms = None
        self._total_count = 0
        self._total_value = 0

    def _erase_old(self, now_ms: int) -> None:
        assert self._origin_ms is not None
        steps = now_ms - self._window_size + 1 - self._origin_ms
        if steps <= 0:
            return
        window = self._window_size
        if steps >= window:
            # Every bucket leaves the window; the totals are the buckets' sums.
            self._counts = [0] * window
            self._values = [0] * window
            self._total_count = 0
            self._total_value = 0
        else:
            counts, values = self._counts, self._values
            index = self._origin_index
            for _ in range(steps):
                self._total_count -= counts[index]
                self._total_value -= values[index]
                counts[index] = 0
                values[index] = 0
                index = (index + 1) % window
        self._origin_index = (self._origin_index + steps) % window
        self._origin_ms += steps


def compact_rate_counters() -> None:
    """Make aiortc's receive-side bitrate estimators use :class:`CompactRateCounter`
    (process-wide, idempotent).

    Touches ``aiortc.rate.RateCounter`` (looked up at call time by
    ``RemoteBitrateEstimator.__init__``).
    """
    aiortc.rate.RateCounter = CompactRateCounter  # type: ignore[misc]


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    rate = aiortc.rate
    if "RateCounter(1000, 8000)" not in inspect.getsource(rate.RemoteBitrateEstimator.__init__):
        problems.append("aiortc.rate.RemoteBitrateEstimator.incoming_bitrate")
    # aiortc's own class, also once compact_rate_counters replaced it
    aiortc_counter = next(c for c in rate.RateCounter.__mro__ if c.__module__ == rate.__name__)
    counter_src = inspect.getsource(aiortc_counter)
    for name in ("_origin_index", "_origin_ms", "_scale", "_window_size"):
        if f"self.{name} =" not in counter_src:
            problems.append(f"aiortc.rate.RateCounter.{name}")
    return problems
