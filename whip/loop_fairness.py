"""Loop fairness: CPU-heavy request steps take turns so the event loop stays responsive.

One event-loop iteration runs every callback that was ready when it started, then polls
for I/O. A burst of requests whose heavy steps are all ready at once makes that iteration
as long as all of them together (``docs/PERFORMANCE.md``, "Loop fairness"), and every
other request (``/healthz``) waits for it to end.

- :class:`TurnGate` hands out at most ``per_turn`` turns per iteration, for one heavy
  synchronous step each. A turn starts when :meth:`TurnGate.turn` returns and ends when
  the loop starts its next iteration (the release is a ``call_soon``): the heavy step
  must follow ``turn()`` without an ``await`` in between, or it runs outside its turn.
- :class:`LeaseGate` bounds how many multi-step operations run at once (each step of each
  holder is ready in some iteration), and gives a place back after ``lease_s`` even if
  its holder is still running: a holder that long is waiting (for the network, a timer),
  not computing, and must not keep the others out.
- Both serve waiters in arrival order (``asyncio.Semaphore`` is fair).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class TurnGate:
    """At most ``per_turn`` heavy steps per event-loop iteration (module rules)."""

    def __init__(self, per_turn: int) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self.per_turn = per_turn
        self._permits = asyncio.Semaphore(per_turn)

    async def turn(self) -> None:
        """Wait for a turn in this or a later iteration.

        Cancellation: while waiting, nothing is taken; once it has returned, the turn is
        given back by the loop whatever the caller does.
        """
        await self._permits.acquire()
        asyncio.get_running_loop().call_soon(self._permits.release)


class LeaseGate:
    """At most ``size`` holders at once, each for at most ``lease_s`` (module rules)."""

    def __init__(self, size: int, lease_s: float) -> None:
        if size < 1 or lease_s <= 0:
            raise ValueError("a lease gate needs size >= 1 and lease_s > 0")
        self.size = size
        self.lease_s = lease_s
        self._places = asyncio.Semaphore(size)

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[None]:
        """Hold a place for the block, or until ``lease_s`` has passed if sooner.

        Cancellation: while waiting, nothing is taken; the place is given back when the
        block ends however it ends.
        """
        await self._places.acquire()
        returned = False

        def give_back() -> None:
            nonlocal returned
            if not returned:
                returned = True
                self._places.release()

        expiry = asyncio.get_running_loop().call_later(self.lease_s, give_back)
        try:
            yield
        finally:
            expiry.cancel()
            give_back()
