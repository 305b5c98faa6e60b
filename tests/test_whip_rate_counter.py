"""The compact bitrate counter answers exactly like aiortc's own.

:class:`whip.rtc.rate_counter.CompactRateCounter` replaces aiortc's ``RateCounter`` in every
receive-side bitrate estimator (fewer objects for the garbage collector to scan). Both run
side by side over the same calls: random arrivals, gaps shorter and longer than the
window, arrivals out of order, resets.
"""

from __future__ import annotations

import gc
import random

import aiortc.rate
import pytest
from aiortc.rate import RemoteBitrateEstimator

from whip.rtc.compat import check_internals
from whip.rtc.rate_counter import CompactRateCounter, compact_rate_counters


def original_class() -> type[aiortc.rate.RateCounter]:
    """aiortc's own class (``aiortc.rate.RateCounter`` may already be ours: the hook is
    process-wide and installed by every server start)."""
    return CompactRateCounter.__mro__[1]


def state(counter: aiortc.rate.RateCounter) -> tuple[object, ...]:
    """What the rest of aiortc can observe (rates) plus the window's bookkeeping."""
    if isinstance(counter, CompactRateCounter):
        total = (counter._total_count, counter._total_value)
    else:
        total = (counter._total.count, counter._total.value)
    return (counter._origin_ms, counter._origin_index, total)


@pytest.mark.parametrize("seed", range(20))
def test_same_rates_as_aiortc_for_the_same_calls(seed: int) -> None:
    rng = random.Random(seed)
    window = rng.choice([1, 2, 7, 100, 1000])
    theirs = original_class()(window, 8000)
    ours = CompactRateCounter(window, 8000)
    now = rng.randrange(0, 1 << 31)
    for _ in range(3000):
        roll = rng.random()
        if roll < 0.02:
            now += rng.randrange(window, 5 * window + 2)  # a gap longer than the window
        elif roll < 0.05:
            now -= rng.randrange(0, 3)  # out of order
        else:
            now += rng.choice([0, 0, 1, 1, 2, 5, 33])
        action = rng.random()
        if action < 0.6:
            size = rng.randrange(0, 1500)
            theirs.add(size, now)
            ours.add(size, now)
        elif action < 0.98:
            assert ours.rate(now) == theirs.rate(now)
        else:
            theirs.reset()
            ours.reset()
        assert state(ours) == state(theirs)


def test_a_long_gap_costs_one_window_not_one_turn_per_millisecond() -> None:
    ours = CompactRateCounter(1000, 8000)
    ours.add(1200, 0)
    ours.add(1200, 10)
    assert ours.rate(10) == round(8000 * 2400 / 11)
    assert ours.rate(10 * 60 * 1000) is None  # ten minutes later: the window is empty
    ours.add(100, 10 * 60 * 1000 + 1)
    assert ours.rate(10 * 60 * 1000 + 1) == round(8000 * 100 / 1000)


def test_the_estimator_allocates_a_handful_of_objects_once_installed() -> None:
    compact_rate_counters()
    compact_rate_counters()  # idempotent
    assert aiortc.rate.RateCounter is CompactRateCounter
    gc.collect()
    before = len(gc.get_objects())
    estimators = [RemoteBitrateEstimator() for _ in range(10)]
    assert all(isinstance(e.incoming_bitrate, CompactRateCounter) for e in estimators)
    per_estimator = (len(gc.get_objects()) - before) / len(estimators)
    assert per_estimator < 50, per_estimator  # aiortc's own: ~1,013


def test_the_internals_it_replaces_are_checked_at_start_up() -> None:
    """``check_internals`` (run by ``whip-ingest serve``) accepts aiortc's estimator with
    either counter installed, since the hook is process-wide."""
    check_internals()
    compact_rate_counters()
    check_internals()
