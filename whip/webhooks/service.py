"""Every webhook of the app: startup and cleanup, and their metrics.

Rules:

- :func:`webhooks_context` is the app's cleanup context for webhooks: entered after the
  session manager (so the timeline is open and the metrics registry exists), it starts
  the delivery thread (:mod:`whip.webhooks.delivery_thread`; none without webhooks) and
  on it one :class:`~whip.webhooks.dispatcher.WebhookDispatcher` per ``[[webhooks]]``
  entry, all started together and fed by one feed subscription (:class:`WebhookGroup`),
  their HTTP attempts made in one child process
  (:mod:`whip.webhooks.attempt_process`), with the data dir's cursor store
  (``<data_dir>/webhooks/cursors.json``); its exit stops
  them, in reverse order, then the thread, before the sessions close. Events appended
  while the server shuts down (``session_closed`` reason ``shutdown``) are therefore
  delivered after the next start, from the saved cursor.
- In cluster mode the same context runs, on the same thread, one
  :class:`~whip.webhooks.cluster_delivery.ClusterWebhookDeliverer` per entry instead
  (:class:`~whip.webhooks.cluster_service.ClusterWebhooks`: cursors and the delivery
  lease in the store, one node delivering each webhook; the module is imported only
  then), their attempts in the same kind of child process; its exit saves each cursor
  and gives each lease up before the node leaves, then closes the child.
- Webhooks no longer configured are forgotten at start, before anything is delivered:
  embedded, their entries in the cursor file
  (:func:`~whip.webhooks.cursor.forget_unconfigured`); cluster mode, their rows in the store
  when no live node delivers them (:mod:`whip.webhooks.cluster_service`). This holds with
  no webhook configured too (then without a delivery thread; a store that does not answer,
  or a cursor file that is not one, is logged, not fatal: nothing reads them then).
- A start that fails half-way closes the dispatchers it started, then re-raises (a
  cursor file that is not one refuses the start: :class:`~whip.webhooks.cursor.CursorFileError`).
- Metrics are read at scrape time from the deliverers, on the server's loop, through
  what they document as readable from any thread (:class:`WebhookCollector`,
  :class:`~whip.webhooks.status.WebhookStatus`):
  ``whip_webhook_deliveries_total{webhook,outcome}`` (attempts by outcome),
  ``whip_webhook_lag_events{webhook}``, ``whip_webhook_lag_seconds{webhook}``. Series
  are per configured webhook: bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Protocol

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from registry.feed import FeedSubscription
from registry.timeline import Timeline
from whip.appkeys import CLUSTER_KEY, CONFIG_KEY, REGISTRY_KEY, TIMELINE_KEY, WEBHOOKS_KEY
from whip.webhooks.attempt_process import AttemptProcess
from whip.webhooks.cursor import CursorFileError, FileCursorStore, forget_unconfigured
from whip.webhooks.delivery import OUTCOMES
from whip.webhooks.delivery_thread import DeliveryThread
from whip.webhooks.dispatcher import WebhookDispatcher
from whip.webhooks.status import WebhookStatus

logger = logging.getLogger(__name__)

FEED_GATHER_S = 0.05
"""Seconds the fan-out waits after the feed wakes it before it takes (:class:`WebhookGroup`)."""


class WebhookCollector(Collector):
    """The webhooks' figures, read at scrape time."""

    def __init__(self, dispatchers: list[WebhookStatus]) -> None:
        self.dispatchers = dispatchers

    def collect(self) -> Iterator[Metric]:
        deliveries = CounterMetricFamily(
            "whip_webhook_deliveries",
            "webhook delivery attempts by outcome",
            labels=["webhook", "outcome"],
        )
        lag = GaugeMetricFamily(
            "whip_webhook_lag_events",
            "events in the log past the webhook's cursor",
            labels=["webhook"],
        )
        lag_s = GaugeMetricFamily(
            "whip_webhook_lag_seconds",
            "age of the oldest event being delivered (0: none)",
            labels=["webhook"],
        )
        for dispatcher in self.dispatchers:
            for outcome in OUTCOMES:
                deliveries.add_metric([dispatcher.name, outcome], dispatcher.outcomes[outcome])
            status = dispatcher.status()
            lag.add_metric([dispatcher.name], float(dispatcher.lag_events))
            seconds = status["lag_seconds"]
            lag_s.add_metric([dispatcher.name], seconds if isinstance(seconds, float) else 0.0)
        yield deliveries
        yield lag
        yield lag_s


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
        timeline: Timeline,
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
            await subscription.ready.wait()
            if self._gather_s > 0:
                await asyncio.sleep(self._gather_s)
            runs, upto = subscription.take()
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


async def webhooks_context(app: web.Application) -> AsyncIterator[None]:
    """The app's webhooks (module rules). Cancellation: what started is closed."""
    config = app[CONFIG_KEY]
    webhooks: list[WebhookStatus] = []
    app[WEBHOOKS_KEY] = webhooks
    if not config.webhooks:
        await _forget_all(app)
        yield
        return
    if config.cluster.enabled:
        async for _ in _cluster_webhooks(app, webhooks):
            yield
        return
    timeline = app[TIMELINE_KEY]
    store = FileCursorStore(config.server.data_dir / "webhooks")
    names = {webhook.name for webhook in config.webhooks}
    dispatchers = [WebhookDispatcher(webhook, timeline, store) for webhook in config.webhooks]
    webhooks.extend(dispatchers)
    group = WebhookGroup(dispatchers, timeline, attempts=AttemptProcess(config.server.event_loop))
    thread = DeliveryThread(config.server.event_loop)
    await thread.start()
    try:
        await thread.run(forget_unconfigured(store, names))
        await thread.run(group.start())
    except BaseException:
        await thread.stop()
        raise
    app[REGISTRY_KEY].register(WebhookCollector(webhooks))
    yield
    try:
        await thread.run(group.aclose())
    finally:
        await thread.stop()


async def _forget_all(app: web.Application) -> None:
    """No webhook configured: forget those a previous start had (module rules)."""
    config = app[CONFIG_KEY]
    if not config.cluster.enabled:
        try:
            await forget_unconfigured(FileCursorStore(config.server.data_dir / "webhooks"), ())
        except CursorFileError as exc:  # nothing reads it while no webhook is configured
            logger.warning("webhooks: %s; left as it is", exc)
        return
    from whip.webhooks.cluster_service import CLOSE_ERRORS, forget_unconfigured_in_store

    try:
        await forget_unconfigured_in_store(config.cluster.store, ())
    except CLOSE_ERRORS as exc:
        logger.warning("webhooks: the store did not answer; old webhooks stay: %r", exc)


async def _cluster_webhooks(
    app: web.Application, webhooks: list[WebhookStatus]
) -> AsyncIterator[None]:
    from whip.webhooks.cluster_service import ClusterWebhooks, cluster_poll_s

    config = app[CONFIG_KEY]
    cluster = app[CLUSTER_KEY]
    group = ClusterWebhooks(
        config.cluster.store,
        cluster.lease.writer,
        cluster_poll_s(config.cluster.lease_s),
        attempts=AttemptProcess(config.server.event_loop),
    )
    thread = DeliveryThread(config.server.event_loop)
    await thread.start()
    try:
        await thread.run(group.start(config.webhooks))
    except BaseException:
        await thread.stop()
        raise
    webhooks.extend(group.deliverers)
    app[REGISTRY_KEY].register(WebhookCollector(webhooks))
    logger.info(
        "cluster webhooks: %d configured on node %s, one node delivers each",
        len(webhooks),
        cluster.config.node_id,
    )
    yield
    try:
        await thread.run(group.aclose())
    finally:
        await thread.stop()
