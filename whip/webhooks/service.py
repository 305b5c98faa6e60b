"""Every webhook of the app: startup and cleanup, and their metrics.

Rules:

- :func:`webhooks_context` is the app's cleanup context for webhooks: entered after the
  session manager (so the timeline is open and the metrics registry exists). Embedded,
  it starts the delivery process (:mod:`whip.webhooks.delivery_process`; none without
  webhooks): a child that follows the data dir's WAL itself and runs one
  :class:`~whip.webhooks.dispatcher.WebhookDispatcher` per ``[[webhooks]]`` entry, with the
  data dir's cursor store (``<data_dir>/webhooks/cursors.json``), while the server only
  tells it how far the log is durable. Its exit closes the child (the cursors saved)
  before the sessions close. Events appended while the server shuts down
  (``session_closed`` reason ``shutdown``) are therefore delivered after the next start,
  from the saved cursor.
- In cluster mode the events are in the store, not a file a child could follow: the
  deliverers run on the delivery thread (:mod:`whip.webhooks.delivery_thread`), one
  :class:`~whip.webhooks.cluster_delivery.ClusterWebhookDeliverer` per entry
  (:class:`~whip.webhooks.cluster_service.ClusterWebhooks`: cursors and the delivery
  lease in the store, one node delivering each webhook; the module is imported only
  then), their attempts in a child process (:mod:`whip.webhooks.attempt_process`); its
  exit saves each cursor and gives each lease up before the node leaves, then closes the
  child.
- Webhooks no longer configured are forgotten at start, before anything is delivered:
  embedded, their entries in the cursor file
  (:func:`~whip.webhooks.cursor.forget_unconfigured`, by the delivery process); cluster
  mode, their rows in the store when no live node delivers them
  (:mod:`whip.webhooks.cluster_service`). This holds with no webhook configured too (then
  in the server, without a child or a delivery thread; a store that does not answer, or
  a cursor file that is not one, is logged, not fatal: nothing reads them then).
- A start that fails half-way closes what it started, then re-raises (a cursor file that
  is not one refuses the start: :class:`~whip.webhooks.cursor.CursorFileError`).
- Metrics are read at scrape time, on the server's loop, through what the deliverers
  document as readable from any thread (:class:`WebhookCollector`,
  :class:`~whip.webhooks.status.WebhookStatus`; embedded, the items the delivery process
  last pushed): ``whip_webhook_deliveries_total{webhook,outcome}`` (attempts by outcome),
  ``whip_webhook_lag_events{webhook}``, ``whip_webhook_lag_seconds{webhook}``. Series
  are per configured webhook: bounded. Embedded, also the delivery process's CPU priority
  (:mod:`whip.webhooks.child_priority`): ``whip_webhook_delivery_sched_idle`` (1 while it
  runs at ``SCHED_IDLE``) and ``whip_webhook_delivery_starvations_total``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from whip.appkeys import CLUSTER_KEY, CONFIG_KEY, REGISTRY_KEY, TIMELINE_KEY, WEBHOOKS_KEY
from whip.webhooks.attempt_process import AttemptProcess
from whip.webhooks.child_priority import Level, PriorityGovernor
from whip.webhooks.cursor import CursorFileError, FileCursorStore, forget_unconfigured
from whip.webhooks.delivery import OUTCOMES
from whip.webhooks.delivery_process import DeliveryProcess
from whip.webhooks.delivery_thread import DeliveryThread
from whip.webhooks.group import FEED_GATHER_S
from whip.webhooks.status import WebhookStatus

logger = logging.getLogger(__name__)


class WebhookCollector(Collector):
    """The webhooks' figures, read at scrape time."""

    def __init__(
        self, dispatchers: list[WebhookStatus], governor: PriorityGovernor | None = None
    ) -> None:
        self.dispatchers = dispatchers
        self.governor = governor

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
        if self.governor is not None:
            yield GaugeMetricFamily(
                "whip_webhook_delivery_sched_idle",
                "1 while the webhook delivery process runs at SCHED_IDLE, 0 at nice",
                value=float(self.governor.level is Level.IDLE),
            )
            yield CounterMetricFamily(
                "whip_webhook_delivery_starvations",
                "times the delivery process starved at SCHED_IDLE and was replaced at nice",
                value=self.governor.starvations,
            )


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
    delivery = DeliveryProcess(
        config.webhooks,
        app[TIMELINE_KEY],
        config.server.data_dir / "webhooks",
        config.server.event_loop,
        gather_s=FEED_GATHER_S,
    )
    await delivery.start()
    webhooks.extend(delivery.webhooks)
    app[REGISTRY_KEY].register(WebhookCollector(webhooks, delivery.governor))
    yield
    await delivery.aclose()


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
