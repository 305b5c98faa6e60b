"""Bounded waits for a condition: the one way a test waits for state it cannot be told about.

Rules:

- Every wait has a bound (``within``, seconds) and says what it awaited (``awaiting``):
  on timeout it fails with an :class:`AssertionError` naming both, and the condition's
  last value. ``awaiting`` may be a callable, evaluated only then, to show the state
  that did not arrive (counters, a list of events).
- The condition is checked at once, then every ``every`` seconds, and once more at the
  bound. A truthy value ends the wait and is returned; an exception (an ``assert`` in
  the condition) propagates at once: a state that can never arrive fails fast.
- :func:`eventually` may be given an async condition (a long-poll, an HTTP call); each
  call is cut off at the bound, so the whole wait never outlives ``within``.
- :func:`eventually_blocking` is the same for synchronous callers (a test that drives
  subprocesses, a hook on a publisher thread). It refuses to run on a thread running an
  event loop, whose other tasks it would stall.

Prefer an event or a barrier where the code under test offers one (``asyncio.Event``,
a future, a long-poll): this is for state that is only observable by looking.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import overload

Awaiting = str | Callable[[], object]
"""What a wait awaited: a phrase, or a callable that describes the state at timeout."""

DEFAULT_EVERY_S = 0.02


def _failure(awaiting: Awaiting, within: float, last: object) -> AssertionError:
    what = awaiting() if callable(awaiting) else awaiting
    shown = repr(last)
    if len(shown) > 300:
        shown = shown[:300] + "..."
    return AssertionError(f"not within {within} s: {what} (last value: {shown})")


@overload
async def eventually[T](
    condition: Callable[[], Awaitable[T | None]],
    *,
    within: float,
    awaiting: Awaiting,
    every: float = DEFAULT_EVERY_S,
) -> T: ...


@overload
async def eventually[T](
    condition: Callable[[], T | None],
    *,
    within: float,
    awaiting: Awaiting,
    every: float = DEFAULT_EVERY_S,
) -> T: ...


async def eventually(
    condition: Callable[[], object],
    *,
    within: float,
    awaiting: Awaiting,
    every: float = DEFAULT_EVERY_S,
) -> object:
    """The first truthy value of ``condition()`` within ``within`` seconds (module rules).

    Cancellation: the wait (and a condition call in progress) is abandoned; nothing else.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: object = None
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            bound = asyncio.timeout_at(max(deadline, loop.time()))
            try:
                async with bound:
                    outcome = await outcome
            except TimeoutError:
                if bound.expired():
                    raise _failure(awaiting, within, last) from None
                raise
        last = outcome
        if outcome:
            return outcome
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise _failure(awaiting, within, last)
        await asyncio.sleep(min(every, remaining))


def eventually_blocking[T](
    condition: Callable[[], T | None],
    *,
    within: float,
    awaiting: Awaiting,
    every: float = DEFAULT_EVERY_S,
) -> T:
    """:func:`eventually` for a synchronous caller (module rules); blocks the thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("eventually_blocking on an event loop thread: await eventually()")
    deadline = time.monotonic() + within
    while True:
        outcome = condition()
        if outcome:
            return outcome
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _failure(awaiting, within, outcome)
        time.sleep(min(every, remaining))
