"""A group of webhook dispatchers on one loop: one feed subscription, one fan-out, and
their close.

Rules (:class:`WebhookGroup`): the subscription is made before any dispatcher reads the
log, every batch taken is offered to every dispatcher in config order, and the group
closes its dispatchers in reverse order, then the attempt child they shared
(:func:`close_deliverers`, which cluster mode's deliverers use too). The group runs in
the webhooks' delivery process (:mod:`whip.webhooks.delivery_process`) over the log that
process follows, or in the server's process over the timeline itself (tests, tools).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from registry.feed import FeedSubscription
from whip.webhooks.attempt_process import AttemptProcess
from whip.webhooks.dispatcher import WebhookDispatcher
from whip.webhooks.followed_log import DeliveredLog

logger = logging.getLogger(__name__)

FEED_GATHER_S = 0.05
"""Seconds the fan-out waits after the feed wakes it before it takes (:class:`WebhookGroup`)."""


class Deliverer(Protocol):
    """What :func:`close_deliverers` closes: a named webhook deliverer."""

    @property
    def name(self) -> str: ...

    async def aclose(self) -> None: ...


async def close_deliverers(
    deliverers: Sequence[Deliverer], attempts: AttemptProcess | None
) -> list[Exception]:
    """Close every deliverer (reverse order), then the attempt child they shared; each
    failure is logged and returned, none stops the rest. Embedded and cluster mode alike."""
    errors: list[Exception] = []
    for deliverer in reversed(deliverers):
        try:
            await deliverer.aclose()
        except Exception as exc:
            logger.error("cleanup: webhook %s did not close cleanly: %r", deliverer.name, exc)
            errors.append(exc)
    if attempts is not None:
        try:
            await attempts.aclose()
        except Exception as exc:
            logger.error("cleanup: the webhook attempt process did not close: %r", exc)
            errors.append(exc)
    return errors


class WebhookGroup:
    """The dispatchers of one delivery loop and their one feed subscription.

    Rules: the subscription is made before any dispatcher reads the snapshot (its
    :meth:`~WebhookDispatcher.start`), and what it accumulates meanwhile is handed over
    once all have started; then every batch taken is offered to every dispatcher, in
    config order, on this loop. The WAL writer so wakes the webhooks at most once per
    batch, however many there are.

    Gathered wake-ups: once woken, the fan-out waits ``gather_s``
    (:data:`FEED_GATHER_S`) before it takes, so every batch made durable meanwhile is
    taken, and offered, at once; the writer does not wake the loop again until then
    (:meth:`~registry.feed.FeedSubscription.take`). Why: the writer wakes the
    producers' loop and this one from the same batch, and both then want the GIL at the
    same instant; a wake-up per batch put this loop's fan-out in front of the appends'
    confirmations (``bench/webhooks.py``: +10 to +20 % median confirm latency with 10
    webhooks, none measurable with the wait). The cost is up to ``gather_s`` more
    delivery latency. :attr:`wakeups` counts the takes.

    Attempts: given an :class:`~whip.webhooks.attempt_process.AttemptProcess`, the group
    hands it to every dispatcher before they start (their attempts are made in that
    child) and closes it after them. Loop-only (the delivery thread's).
    """

    def __init__(
        self,
        dispatchers: list[WebhookDispatcher],
        timeline: DeliveredLog,
        *,
        gather_s: float = FEED_GATHER_S,
        attempts: AttemptProcess | None = None,
    ) -> None:
        self.dispatchers = dispatchers
        self._gather_s = gather_s
        self.attempts = attempts
        for dispatcher in dispatchers:
            dispatcher.sender = attempts
        self._timeline = timeline
        self._subscription: FeedSubscription | None = None
        self._fanout: asyncio.Task[None] | None = None
        self.wakeups = 0
        """Batches of the feed taken (each offered to every dispatcher)."""

    async def start(self) -> None:
        """Subscribe, start every dispatcher together (new cursors are then saved in one
        group write), then fan the feed out. Cancellation: what started is closed."""
        self._subscription = self._timeline.feed.subscribe()
        try:
            if self.attempts is not None:
                await self.attempts.start()
            async with asyncio.TaskGroup() as group:
                for dispatcher in self.dispatchers:
                    group.create_task(dispatcher.start(), name=f"webhook-{dispatcher.name}-start")
        except BaseException:
            await self.aclose()
            raise
        self._fanout = asyncio.create_task(
            self._fan_out(self._subscription), name="webhook-feed-fanout"
        )

    async def _fan_out(self, subscription: FeedSubscription) -> None:
        while True:
            runs, upto = await subscription.take_gathered(self._gather_s)
            self.wakeups += 1
            for dispatcher in self.dispatchers:
                dispatcher.offer(runs, upto)

    async def aclose(self) -> None:
        """Stop the fan-out, unsubscribe, close every dispatcher (reverse order);
        failures are collected and raised together (idempotent)."""
        if self._fanout is not None:
            self._fanout.cancel()
            await asyncio.gather(self._fanout, return_exceptions=True)
            self._fanout = None
        if self._subscription is not None:
            self._timeline.feed.unsubscribe(self._subscription)
            self._subscription = None
        errors = await close_deliverers(self.dispatchers, self.attempts)
        if errors:
            raise ExceptionGroup("webhooks did not close cleanly", errors)
