"""Arrival times taken where a datagram enters aioice, for transport-wide feedback.

aioice puts every non-STUN datagram of a connection on an ``asyncio.Queue``
(``Connection.data_received``), and aiortc's DTLS transport takes them off it in a task of
its own before it unprotects and routes the RTP. Time read at the RTP router therefore
includes the wait in that queue: measured with Chromium pushing 1.7 Mb/s on the shared
2-core host, 0.6 ms at the median, 2.7 ms at p90, 8 ms at p99 and up to 20 ms (the feedback
reports 250 us ticks, and libwebrtc's delay-based estimator reads the spread as queueing
on the path). :class:`StampedQueue` replaces that queue and stamps each item as it is put.

Rules:

- **Who owns what.** One :class:`StampedQueue` per aioice ``Connection``, installed by
  :func:`stamp_arrivals` before any datagram arrives (at negotiation, after
  ``setRemoteDescription``); the event loop thread only, like the queue it replaces.
- **Exactly once.** Every item put is stamped (``_put``), every item taken sets
  :attr:`StampedQueue.last_arrival_us` (``_get``), and :meth:`StampedQueue.take_arrival`
  hands that stamp out once and forgets it. aiortc's DTLS transport is the queue's one
  consumer and routes a datagram's RTP before it takes the next one, so the stamp the
  router takes is that datagram's. A datagram that is not RTP, or RTP without a
  transport-wide sequence number, leaves its stamp to be overwritten by the next take.
- **Fallback.** Nothing to take (the connection's queue was replaced by something else, a
  datagram taken before the stamp was installed): :meth:`take_arrival` is None and the
  caller reads the clock itself, as before.

aioice private names touched (:func:`internals_problems` verifies each):
``Connection._queue`` (an ``asyncio.Queue`` that ``data_received`` puts to with
``put_nowait`` and ``recvfrom`` gets from), and ``asyncio.Queue._put``/``_get`` (the
subclass hooks ``asyncio.PriorityQueue`` uses too); ``RTCIceTransport._connection``
through :func:`whip.rtc.ice_restart.ice_connection`.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

import aioice.ice

from whip.rtc.ice_restart import ice_connection
from whip.rtc.source_text import source_text

Item = tuple[bytes, int] | None
"""What aioice queues: a datagram and its component, or None (the connection ended)."""


def monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class StampedQueue(asyncio.Queue[Item]):
    """aioice's receive queue, with the time each item was put (module doc)."""

    def __init__(self, clock: Callable[[], int] = monotonic_us) -> None:
        super().__init__()
        self._clock = clock
        self._stamps: collections.deque[int] = collections.deque()
        self.last_arrival_us: int | None = None
        """The put time of the item taken last, until :meth:`take_arrival` takes it."""

    def _put(self, item: Item) -> None:
        self._stamps.append(self._clock())
        super()._put(item)

    def _get(self) -> Item:
        self.last_arrival_us = self._stamps.popleft()
        return super()._get()

    def take_arrival(self) -> int | None:
        """The put time of the item taken last, once; None when already taken."""
        arrival, self.last_arrival_us = self.last_arrival_us, None
        return arrival


def stamp_arrivals(dtls_transport: Any) -> StampedQueue:
    """Install a :class:`StampedQueue` on the aioice connection under an aiortc
    ``RTCDtlsTransport`` (its ``RTCIceTransport``'s) and return it; what was queued moves
    over, stamped now. Loop thread, before ICE connects (module doc)."""
    connection = ice_connection(dtls_transport.transport)
    current = connection._queue
    if isinstance(current, StampedQueue):
        return current
    stamped = StampedQueue()
    while not current.empty():
        stamped.put_nowait(current.get_nowait())
    connection._queue = stamped
    return stamped


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    connection = aioice.ice.Connection
    if "self._queue: asyncio.Queue" not in source_text(connection.__init__):
        problems.append("aioice Connection._queue is an asyncio.Queue")
    if "self._queue.put_nowait((data, component))" not in source_text(connection.data_received):
        problems.append("aioice Connection.data_received puts to _queue")
    if "await self._queue.get()" not in source_text(connection.recvfrom):
        problems.append("aioice Connection.recvfrom gets from _queue")
    queue = source_text(asyncio.Queue)
    if "def _put(self, item)" not in queue or "def _get(self)" not in queue:
        problems.append("asyncio.Queue has the _put/_get subclass hooks")
    return problems
