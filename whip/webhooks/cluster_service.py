"""Cluster mode's webhooks in the server: the deliverers, their pool and their wake-ups.

Rules:

- :class:`ClusterWebhooks` runs on the webhooks' delivery thread
  (:mod:`whip.webhooks.delivery_thread`, never the server's loop): one
  :class:`~whip.webhooks.cluster_delivery.ClusterWebhookDeliverer` per ``[[webhooks]]``
  entry, one pool they share (made on that loop: an asyncpg pool belongs to one loop),
  and one LISTEN connection on the events channel (``whip_events``,
  :mod:`registry.pg.batches` rule 5: one NOTIFY per run per committed batch, sent at
  COMMIT). A notification wakes every deliverer that delivers on this node; the poll
  (:func:`cluster_poll_s`) is the fallback, so a lost LISTEN connection only delays
  deliveries (it is re-made at the next check, every ``LISTEN_CHECK_S``).
- At start, the webhooks this node does not configure are forgotten in the store (their
  rows and cursors deleted) unless a live node delivers them
  (:meth:`~registry.pg.webhook_store.WebhookStore.forget`, whose rule cannot race a
  deliverer); :func:`forget_unconfigured_in_store` does the same for a node with no webhooks.
- Each deliverer reads the node lease's current writer (an attribute read, safe from
  this thread): a fenced node delivers nothing.
- Given an :class:`~whip.webhooks.attempt_process.AttemptProcess`, it is started before
  the first deliverer and handed to each (their HTTP attempts are made in that child).
- Exit order: the listener task and connection, then every deliverer (reverse order;
  each saves its cursors and gives its lease up), then the attempt child, then the pool;
  failures are collected and raised together.

Imported only in cluster mode (it imports asyncpg).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import asyncpg

from registry.pg.batches import EVENTS_CHANNEL, Writer
from registry.pg.webhook_store import WebhookStore
from whip.webhooks.attempt_process import AttemptProcess
from whip.webhooks.cluster_delivery import STORE_ERRORS, ClusterWebhookDeliverer
from whip.webhooks.config import WebhookConfig
from whip.webhooks.group import close_deliverers

logger = logging.getLogger(__name__)

LISTEN_CHECK_S = 5.0
CLOSE_ERRORS: tuple[type[BaseException], ...] = (*STORE_ERRORS, TimeoutError)


def cluster_poll_s(lease_s: float) -> float:
    """How often a cluster deliverer looks at the store: every second, or a quarter of
    the node lease when that is shorter (a hand-over then takes about ``1.25 * lease_s``)."""
    return min(1.0, lease_s / 4)


async def _forget(store: WebhookStore, webhooks: tuple[WebhookConfig, ...]) -> None:
    for name in await store.forget([webhook.name for webhook in webhooks]):
        logger.warning(
            "webhook %s: no longer configured: its delivery lease and cursors are removed "
            "from the store (configured again, it starts at the cluster's end)",
            name,
        )


async def forget_unconfigured_in_store(store_url: str, webhooks: tuple[WebhookConfig, ...]) -> None:
    """Forget the webhooks not in ``webhooks`` (module rules) over one short connection:
    for a node that runs no deliverer. Raises the store's error."""
    pool = await asyncpg.create_pool(store_url, min_size=1, max_size=1, timeout=5.0)
    try:
        await _forget(WebhookStore(pool), webhooks)
    finally:
        await pool.close()


class ClusterWebhooks:
    """Cluster mode's deliverers on the delivery loop (module rules). Loop-only."""

    def __init__(
        self,
        store_url: str,
        writer: Callable[[], Writer | None],
        poll_s: float,
        *,
        attempts: AttemptProcess | None = None,
    ) -> None:
        self._store_url = store_url
        self.attempts = attempts
        """The child the deliverers make their attempts in (started first, closed last)."""
        self._writer = writer
        self._poll_s = poll_s
        self._pool: asyncpg.Pool | None = None
        self._listen: asyncpg.Connection | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._listen_failing = False
        self.deliverers: list[ClusterWebhookDeliverer] = []

    async def start(self, webhooks: tuple[WebhookConfig, ...]) -> None:
        """Open the pool, register and start every deliverer. Cancellation: what
        started is closed."""
        pool_size = 2 + sum(webhook.max_parallel_runs for webhook in webhooks)
        try:
            self._pool = await asyncpg.create_pool(
                self._store_url, min_size=1, max_size=min(pool_size, 16), timeout=5.0
            )
            store = WebhookStore(self._pool)
            if self.attempts is not None:
                await self.attempts.start()
            for webhook in webhooks:
                deliverer = ClusterWebhookDeliverer(
                    webhook, store, self._writer, poll_s=self._poll_s
                )
                deliverer.sender = self.attempts
                await deliverer.start()
                self.deliverers.append(deliverer)
            await _forget(store, webhooks)
            await self._ensure_listening()
            self._listen_task = asyncio.create_task(
                self._keep_listening(), name="webhook-cluster-listen"
            )
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Close every deliverer (reverse order; each saves and gives its lease up),
        then the attempt child, then the pool; failures are collected and raised together
        (idempotent)."""
        errors: list[Exception] = []
        task, self._listen_task = self._listen_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        conn, self._listen = self._listen, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=5.0)
            except CLOSE_ERRORS as exc:
                conn.terminate()
                logger.warning("cleanup: webhook listener closed abruptly: %r", exc)
        errors.extend(await close_deliverers(self.deliverers, self.attempts))
        self.deliverers.clear()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await pool.close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise ExceptionGroup("cluster webhooks did not close cleanly", errors)

    def _notified(self, conn: asyncpg.Connection, pid: int, channel: str, payload: str) -> None:
        for deliverer in self.deliverers:
            deliverer.wake()

    async def _ensure_listening(self) -> None:
        """(Re)make the LISTEN connection if it is gone. Raises the store's error."""
        if self._listen is not None and not self._listen.is_closed():
            return
        conn: asyncpg.Connection = await asyncpg.connect(self._store_url, timeout=5.0)
        try:
            await conn.add_listener(EVENTS_CHANNEL, self._notified)
        except BaseException:
            conn.terminate()
            raise
        self._listen = conn
        for deliverer in self.deliverers:  # what committed while it was gone
            deliverer.wake()

    async def _keep_listening(self) -> None:
        while True:
            await asyncio.sleep(LISTEN_CHECK_S)
            try:
                await self._ensure_listening()
            except STORE_ERRORS as exc:
                if not self._listen_failing:
                    logger.warning("webhooks: no LISTEN connection (polling only): %r", exc)
                self._listen_failing = True
            else:
                if self._listen_failing:
                    logger.info("webhooks: LISTEN connection back")
                self._listen_failing = False
