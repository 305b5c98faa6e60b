"""The process's garbage-collection policy: a larger young generation, a frozen start-up heap.

Both are process-wide (``gc`` has no per-component knob) and both return their undo.
The server applies them in its lifecycle (:mod:`whip.app`); ``bench/wal.py`` applies the
same policy when it measures the timeline, so its figures are the server's.

Why a larger young generation (``server.gc_young_threshold``, default 10,000 against the
interpreter's 700): the hot paths allocate a few GC-tracked objects each (an append: its
coroutine, future and queue tuple; the writer: the :class:`~registry.events.Event`),
so with 700 a young collection runs every ~100 appends, and the events that stay in the
warm tails are promoted until a full collection scans all of them (~28 ms with 65k warm
events), and a young collection of 10,000 objects stays short. What it is worth is in
``docs/PERFORMANCE.md`` ("Garbage collection"). Cyclic garbage waits a little longer to
be found; nothing else changes.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

DEFAULT_YOUNG_THRESHOLD = 10_000


def set_young_threshold(young: int) -> Callable[[], None]:
    """Collect the young generation after ``young`` net allocations (0: leave the
    interpreter's threshold); returns the undo. The older generations keep theirs."""
    before = gc.get_threshold()
    if young > 0:
        gc.set_threshold(young, *before[1:])

    def undo() -> None:
        gc.set_threshold(*before)

    return undo


def freeze_startup_heap() -> Callable[[], None]:
    """Collect once, then exempt every surviving object from later garbage collections
    (``gc.freeze``, process-wide); returns the undo (``gc.unfreeze``).

    Why: a full collection scans every tracked object and holds the event loop while it
    does (~0.5 us per object here). What start-up allocated (modules: aiortc, PyAV,
    aiohttp; the recovered registry) lives as long as the process; frozen, it is never
    scanned again (the burst figures: ``docs/PERFORMANCE.md``). Objects frozen here that
    later become cyclic garbage are
    reclaimed only after the undo (at cleanup). Blocking (one full collection): called
    before the server listens.
    """
    gc.collect()
    gc.freeze()
    return gc.unfreeze
