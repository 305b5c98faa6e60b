"""The durable-batch feed: "tell me which runs got events, up to which seq".

For consumers that follow the whole log rather than one run (webhooks). A
:class:`FeedSubscription` accumulates the run ids of every durable batch and the newest
seq of those batches; :meth:`FeedSubscription.take` hands both over at once and resets.

Rules:

- Exactly what is taken: after ``runs, upto = take()``, every durable event with
  ``seq <= upto`` belongs to a run in ``runs`` or in a set taken before (since the
  subscription was made). Both are updated under one lock, in the writer's
  :meth:`BatchFeed.publish`, so a taker never sees a seq without its run.
- Readable when taken: the writer publishes the snapshot (and the index) before it
  calls :meth:`BatchFeed.publish`, so an event of a taken run with ``seq <= upto`` is
  found by :meth:`registry.timeline.Timeline.read_events`.
- Cost to the writer: per batch and per subscription, a set update and at most one
  ``call_soon_threadsafe`` (only when the subscription was not already signalled). A
  slow consumer never blocks the writer: its pending set grows to at most the number of
  distinct runs, then stays.
- ``_lock`` (the feed's and each subscription's) is a leaf lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable


class FeedSubscription:
    """One consumer's pending runs and newest seq; its loop is the one that made it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._runs: set[str] = set()
        self._upto = 0
        self._signalled = False
        self.ready = asyncio.Event()
        """Set (on the loop) when something is there to take."""

    def _offer(self, run_ids: Iterable[str], upto: int) -> None:
        """Writer thread: add a batch; wake the consumer if it was not already woken."""
        with self._lock:
            self._runs.update(run_ids)
            if upto > self._upto:
                self._upto = upto
            if self._signalled:
                return
            self._signalled = True
        try:
            self._loop.call_soon_threadsafe(self.ready.set)
        except RuntimeError:  # the loop is closed: nobody is left to wake
            return

    async def take_gathered(self, gather_s: float) -> tuple[set[str], int]:
        """Wait until something is there, then ``gather_s`` more (what becomes durable
        meanwhile is taken with it; the writer does not wake this loop again until then),
        then :meth:`take`. Cancellation: nothing is taken."""
        await self.ready.wait()
        if gather_s > 0:
            await asyncio.sleep(gather_s)
        return self.take()

    def take(self) -> tuple[set[str], int]:
        """The runs offered since the last take and the newest seq ever offered (0 when
        none yet); clears ``ready`` (loop thread)."""
        with self._lock:
            runs, self._runs = self._runs, set()
            self._signalled = False
            self.ready.clear()
            return runs, self._upto


class BatchFeed:
    """Every subscription of one timeline; the WAL writer publishes to all of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: tuple[FeedSubscription, ...] = ()

    def subscribe(self) -> FeedSubscription:
        """A new subscription on the running loop; it sees batches published from now on."""
        subscription = FeedSubscription(asyncio.get_running_loop())
        with self._lock:
            self._subscriptions = (*self._subscriptions, subscription)
        return subscription

    def unsubscribe(self, subscription: FeedSubscription) -> None:
        """Stop feeding ``subscription`` (idempotent)."""
        with self._lock:
            self._subscriptions = tuple(s for s in self._subscriptions if s is not subscription)

    def publish(self, run_ids: Iterable[str], upto: int) -> None:
        """Writer thread, after a batch is readable: offer it to every subscription."""
        subscriptions = self._subscriptions  # one reference read; replaced, never mutated
        if not subscriptions:
            return
        runs = tuple(run_ids)
        for subscription in subscriptions:
            subscription._offer(runs, upto)

    def __len__(self) -> int:
        return len(self._subscriptions)
