"""One webhook's delivery in cluster mode: one node at a time, from the cursor in the store.

Rules (the store's side, the cursor rule and the lease, are in
:mod:`registry.pg.webhook_store`):

- Every node configured with the webhook runs a :class:`ClusterWebhookDeliverer`; exactly
  one of them holds the webhook's delivery lease and delivers, the others stand by. The
  lead task (``webhook-<name>-lead``) ticks every ``poll_s``: a standby node tries to claim
  the lease (it succeeds once the owner's node lease is gone: a dead node hands over within
  about ``lease_s + poll_s``); the owner saves its cursors, then asks the store which runs
  are behind and starts a task per run, at most ``max_parallel_runs`` at once.
- In order per run: a run's task reads its events after the run's cursor (oldest first)
  and delivers them one at a time, each until a 2xx (retries with backoff, as embedded);
  events the webhook does not want move the cursor without a request. Different runs run
  in parallel.
- At least once: a run's cursor moves (in memory, ``_done``) only after a 2xx; the lead
  saves the moved cursors every tick, under the lease (a node that lost it cannot save).
  A crash or a hand-over resumes from the last save: what was delivered after it is sent
  again with the same ``webhook-id`` (``run_id:seq``, the same on every node).
- Runs are keyed by :class:`~registry.pg.webhook_store.RunKey` (id and incarnation), in
  memory and in the store: a run id that retention evicted and a later DELETE made again
  is another run, delivered from its first event (the store's "Incarnations"). Its one
  event, ``run_deleted`` at seq 1, has the ``webhook-id`` ``run_id:1.<incarnation>``
  (:func:`~whip.webhooks.signing.message_id`): ``run_id:1`` was the first run's.
- One deliverer at a time: before every attempt the task checks that the node still holds
  the lease epoch it claimed under (``writer()``, the node lease's current writer, a plain
  attribute read that is safe from any thread); the lead drops the delivery lease and
  cancels every run task as soon as it sees the node fenced or a save refused.
- Attempts: in the node's attempt child (:attr:`ClusterWebhookDeliverer.sender`, set by
  :mod:`whip.webhooks.cluster_service` before the start), else on this loop with its own
  HTTP client (:mod:`whip.webhooks.http_client`).
- 410 Gone: the webhook is disabled durably (the mark in the store names the URL; every
  node then stands by, across restarts, until another URL is configured), logged.
- Owned by one loop (the webhooks' delivery thread in the server): every field is written
  there by this object's tasks. :meth:`status` and :attr:`lag_events` read single fields
  from any thread; :meth:`describe` may be awaited from any loop (it runs the store query on
  the owner loop).

- Pruned as it goes: the owner calls :meth:`~registry.pg.webhook_store.WebhookStore.prune`
  after a save, right after it takes the lease and then at most every ``prune_s``
  (:data:`DEFAULT_PRUNE_S`), so the cursor rows of deleted runs that are fully delivered
  (and of runs retention evicted) do not stay forever; the rule is the store's.

- Woken early by :meth:`ClusterWebhookDeliverer.wake` (a NOTIFY of new events, from
  :mod:`whip.webhooks.cluster_service`), at most once per ``MIN_TICK_S``; the poll is the
  fallback (and how a standby node notices a dead owner). Imported only in cluster mode
  (it imports asyncpg).

Cancellation: :meth:`aclose` cancels every task, saves what is delivered and gives the lease
up (another node takes over at once); :meth:`abandon` is what a crash leaves (nothing saved,
the lease kept until the node lease expires).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import NoReturn

import asyncpg

from registry.events import Event
from registry.pg.batches import FencedError, StoreUnavailableError, Writer
from registry.pg.committer import CONNECTION_ERRORS
from registry.pg.webhook_store import (
    PRUNE_BATCH,
    DeliveryLease,
    DeliveryLeaseLostError,
    DisabledMark,
    Outcome,
    RunKey,
    WebhookRow,
    WebhookStore,
)
from whip.webhooks.attempt_process import AttemptProcess
from whip.webhooks.config import WebhookConfig
from whip.webhooks.delivery import Attempt, attempt, new_http_session, shown_url
from whip.webhooks.http_client import HttpClient
from whip.webhooks.send_loop import SendLoop
from whip.webhooks.signing import message_id

logger = logging.getLogger(__name__)

READ_BATCH = 100
DEFAULT_POLL_S = 1.0
DEFAULT_PRUNE_S = 30.0
"""How often the owner prunes the webhook's cursor rows (module rules)."""
MIN_TICK_S = 0.1
"""The shortest time between two ticks however often new events wake the lead."""
STATUS_REFRESH_S = 5.0
"""How often the lead re-reads the store's view (:meth:`ClusterWebhookDeliverer.status`,
the metrics); ``GET /v1/webhooks`` always reads it afresh."""
STORE_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, asyncpg.PostgresError)
LEAD_ERRORS: tuple[type[BaseException], ...] = (*STORE_ERRORS, StoreUnavailableError)
RELEASE_ERRORS: tuple[type[BaseException], ...] = (
    *STORE_ERRORS,
    DeliveryLeaseLostError,
    FencedError,
)


class LeaseEndedError(Exception):
    """This node no longer delivers the webhook (fenced, or the lease was handed over)."""


class ClusterWebhookDeliverer(SendLoop):
    """Delivers one webhook from one node while it holds the webhook's lease (module rules)."""

    def __init__(
        self,
        webhook: WebhookConfig,
        store: WebhookStore,
        writer: Callable[[], Writer | None],
        *,
        poll_s: float = DEFAULT_POLL_S,
        prune_s: float = DEFAULT_PRUNE_S,
        rng: random.Random | None = None,
    ) -> None:
        self.webhook = webhook
        self.store = store
        self._writer = writer
        self.poll_s = poll_s
        self.prune_s = prune_s
        self._pruned_at = -float("inf")
        self.pruned = 0
        """Cursor rows this node pruned."""
        self._rng = rng or random.Random()
        self.lease: DeliveryLease | None = None
        self.disabled: DisabledMark | None = None
        self._unsaved_mark = False
        self._done: dict[RunKey, int] = {}
        """Run -> cursor moved by this node under the current lease, not yet known saved."""
        self._slots: dict[RunKey, asyncio.Task[None]] = {}
        self._lead: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: HttpClient | None = None
        self.sender: AttemptProcess | None = None
        """Where the attempts are made (set before :meth:`start`; None: on this loop)."""
        self._open = False
        """Between :meth:`start` and the stop of its tasks: attempts may be made."""
        self._row: WebhookRow | None = None
        self._row_read_at = -float("inf")
        self._woken = asyncio.Event()
        self._saved_done: dict[RunKey, int] | None = None
        self._saved_outcome: Outcome | None = None
        self._store_failing = False
        self.handovers = 0
        """Times this node took the lease."""
        self._init_send_loop()

    @property
    def name(self) -> str:
        return self.webhook.name

    @property
    def delivering(self) -> bool:
        """This node holds the lease under its current node epoch."""
        lease = self.lease
        return lease is not None and self._writer() == lease.writer

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Register the webhook in the store (its cursors at the cluster's end when it is
        new), then start the lead task. Raises the store's error when it is unreachable.
        Cancellation: nothing is left running."""
        self._loop = asyncio.get_running_loop()
        self.disabled = await self.store.register(self.name, self.webhook.url)
        if self.disabled is not None:
            logger.warning(
                "webhook %s: disabled since %d (%s answered 410 Gone): nothing is delivered "
                "until another url is configured",
                self.name,
                self.disabled.at_ms,
                shown_url(self.disabled.url),
            )
        if self.sender is None:
            self._http = new_http_session(self.webhook.max_parallel_runs)
        self._open = True
        self._lead = asyncio.create_task(self._lead_loop(), name=f"webhook-{self.name}-lead")

    async def _stop_tasks(self) -> None:
        tasks = [t for t in (self._lead, *self._slots.values()) if t is not None]
        self._open = False
        self._lead = None
        self._slots.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def aclose(self) -> None:
        """Stop, save what was delivered, give the lease up (idempotent). A store error
        is logged: the node lease's end hands the webhook over anyway."""
        await self._stop_tasks()
        lease, self.lease = self.lease, None
        if lease is None:
            return
        try:
            if self.disabled is not None and self._unsaved_mark:
                await self._persist_mark(lease, self.disabled)  # a 410 cut by the stop
                return
            await self._save(lease)
            await self.store.release(self.name, lease)
            logger.info("webhook %s: delivering -> released (clean stop)", self.name)
        except RELEASE_ERRORS as exc:
            logger.warning("webhook %s: lease not released cleanly: %r", self.name, exc)

    async def abandon(self) -> None:
        """Stop without saving or releasing: what SIGKILL leaves (tests)."""
        await self._stop_tasks()
        self.lease = None

    # ------------------------------------------------------------------ lead

    async def _lead_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._tick()
                if loop.time() - self._row_read_at >= STATUS_REFRESH_S:
                    await self._describe()
                if self._store_failing:
                    self._store_failing = False
                    logger.info("webhook %s: the store answers again", self.name)
            except LEAD_ERRORS as exc:
                if not self._store_failing:
                    logger.warning("webhook %s: the store did not answer: %r", self.name, exc)
                self._store_failing = True
            except Exception:
                # A defect, not the store's doing: logged, and the next tick tries again
                # (the lead must outlive it, or the webhook would stop on every node).
                logger.exception("webhook %s: delivery tick failed", self.name)
            await self._pause(loop)

    def wake(self) -> None:
        """New events were committed somewhere: tick soon (owner loop only)."""
        if self.delivering:
            self._woken.set()

    async def _pause(self, loop: asyncio.AbstractEventLoop) -> None:
        """Until a wake (but at least ``MIN_TICK_S``) or ``poll_s``, whichever is first."""
        started = loop.time()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.poll_s):
                await self._woken.wait()
        self._woken.clear()
        rest = MIN_TICK_S - (loop.time() - started)
        if rest > 0:
            await asyncio.sleep(min(rest, self.poll_s))

    async def _tick(self) -> None:
        lease = self.lease
        if lease is not None and not self.delivering:
            self._lose("the node lease ended")
            lease = None
        if self.disabled is not None:
            if self._unsaved_mark and lease is not None:
                await self._persist_mark(lease, self.disabled)
            return
        if lease is None:
            writer = self._writer()
            if writer is None:
                return
            try:
                lease = await self.store.claim(self.name, writer)
            except FencedError:
                return
            if lease is None:
                return
            self.lease = lease
            self._done.clear()
            self._saved_done = self._saved_outcome = None
            self._pruned_at = -float("inf")  # what the last owner left, pruned now
            self.handovers += 1
            logger.info(
                "webhook %s: standby -> delivering on node %s (delivery epoch %d)",
                self.name,
                writer.node_id,
                lease.delivery_epoch,
            )
        try:
            await self._save(lease)
            await self._prune(lease)
        except (DeliveryLeaseLostError, FencedError) as exc:
            self._lose(str(exc))
            return
        free = self.webhook.max_parallel_runs - len(self._slots)
        if free <= 0:
            return
        behind = await self.store.behind(self.name, free + len(self._slots))
        for run, saved in behind.items():
            if run in self._slots or len(self._slots) >= self.webhook.max_parallel_runs:
                continue
            after = max(saved, self._done.get(run, 0))
            self._slots[run] = asyncio.create_task(
                self._deliver_run(run, after), name=f"webhook-{self.name}-run"
            )

    def _lose(self, why: str) -> None:
        """Stop delivering now (lead task only): run tasks are cancelled, unsaved progress
        is dropped (the next owner sends it again)."""
        if self.lease is None:
            return
        logger.warning("webhook %s: delivering -> standby: %s", self.name, why)
        self.lease = None
        for task in self._slots.values():
            task.cancel()
        self._slots.clear()
        self._done.clear()

    async def _save(self, lease: DeliveryLease) -> None:
        """Save the moved cursors and the last outcome (nothing when neither changed)."""
        done = dict(self._done)
        outcome = Outcome(
            self.last_status, self.last_error, self.last_attempt_ms, self.last_success_ms
        )
        if done == self._saved_done and outcome == self._saved_outcome:
            return
        await self.store.save(self.name, lease, done, outcome)
        for run, seq in done.items():
            if self._done.get(run) == seq and run not in self._slots:
                del self._done[run]
        self._saved_outcome = outcome
        self._saved_done = {r: q for r, q in self._done.items() if done.get(r) == q}

    async def _prune(self, lease: DeliveryLease) -> None:
        """Prune the webhook's cursor rows when ``prune_s`` passed since the last time
        (batch after batch while they are full)."""
        now = time.monotonic()
        if now - self._pruned_at < self.prune_s:
            return
        self._pruned_at = now
        removed = 0
        while True:
            batch = await self.store.prune(self.name, lease, PRUNE_BATCH)
            removed += batch
            if batch < PRUNE_BATCH:
                break
        if removed:
            self.pruned += removed
            logger.info("webhook %s: %d cursor rows pruned", self.name, removed)

    # ------------------------------------------------------------------ one run

    async def _deliver_run(self, run: RunKey, after: int) -> None:
        """Deliver the run's events after ``after``, in order, until it is read to the end."""
        run_id = run.run_id
        try:
            while True:
                events = await self.store.read_events(run_id, after, READ_BATCH)
                if not events:
                    return
                for event in events:
                    if self.webhook.wants(event.type, event.principal):
                        await self._deliver(event, run.incarnation)
                    after = event.seq
                    self._done[run] = after
        except LeaseEndedError:
            return
        except STORE_ERRORS as exc:
            logger.warning(
                "webhook %s: run %s: the store did not answer: %r", self.name, run_id, exc
            )
        except Exception:
            logger.exception("webhook %s: run %s delivery stopped", self.name, run_id)
        finally:
            if self._slots.get(run) is asyncio.current_task():
                del self._slots[run]

    async def _deliver(self, event: Event, incarnation: int) -> None:
        """Send one event until a 2xx (:mod:`whip.webhooks.send_loop`); raises
        :class:`LeaseEndedError` when this node stops delivering (410 included).
        Cancellation: the attempt in flight is abandoned."""

        def may_send() -> DeliveryLease:
            lease = self.lease
            if lease is None or not self.delivering or not self._open:
                raise LeaseEndedError(self.name)
            return lease

        async def send_once(body: bytes, signed: dict[str, str]) -> Attempt:
            if self.sender is not None:
                return await self.sender.attempt(self.webhook, body, signed)
            assert self._http is not None
            return await attempt(self._http, self.webhook.url, body, signed, self.webhook.timeout_s)

        async def gone(event: Event, lease: DeliveryLease) -> NoReturn:
            await self._disable(lease, event)
            raise LeaseEndedError(self.name)

        await self._send_until_accepted(
            event, may_send, send_once, gone, message_id(event, incarnation)
        )

    async def _disable(self, lease: DeliveryLease, event: Event) -> None:
        if self.disabled is not None:
            return
        mark = DisabledMark(self.webhook.url, time.time_ns() // 1_000_000, "410 Gone")
        self.disabled = mark
        logger.error(
            "webhook %s: delivering -> disabled: %s answered 410 Gone (run %s seq %d); "
            "durable on every node until another url is configured",
            self.name,
            shown_url(self.webhook.url),
            event.run_id,
            event.seq,
        )
        for run, task in list(self._slots.items()):
            if task is not asyncio.current_task():
                task.cancel()
                del self._slots[run]
        self._unsaved_mark = True
        with contextlib.suppress(*STORE_ERRORS):
            await self._persist_mark(lease, mark)

    async def _persist_mark(self, lease: DeliveryLease, mark: DisabledMark) -> None:
        try:
            await self._save(lease)
            await self.store.disable(self.name, lease, mark)
        except (DeliveryLeaseLostError, FencedError) as exc:
            logger.warning("webhook %s: the 410 mark could not be saved: %s", self.name, exc)
        self._unsaved_mark = False
        self.lease = None

    # ------------------------------------------------------------------ reading

    def status(self) -> dict[str, object]:
        """The last item :meth:`describe` built (a minimal one before the first)."""
        row = self._row
        if row is None:
            return self._item(None)
        return self._item(row)

    @property
    def lag_events(self) -> int:
        row = self._row
        return 0 if row is None else max(0, row.total_events - row.done_events)

    async def describe(self) -> dict[str, object]:
        """The ``GET /v1/webhooks`` item from the store, awaitable from any loop."""
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop():
            return await self._describe()
        future = asyncio.run_coroutine_threadsafe(self._describe(), loop)
        return await asyncio.wrap_future(future)

    async def _describe(self) -> dict[str, object]:
        """Raises :class:`~registry.pg.batches.StoreUnavailableError` (503) when the store
        does not answer."""
        try:
            self._row = await self.store.describe(self.name)
        except STORE_ERRORS as exc:
            raise StoreUnavailableError("the cluster store is unreachable") from exc
        self._row_read_at = asyncio.get_running_loop().time()
        return self._item(self._row)

    def _item(self, row: WebhookRow | None) -> dict[str, object]:
        disabled = (row.disabled if row is not None else None) or self.disabled
        oldest = min(list(self._in_delivery.values()), default=None)
        now = time.time_ns() // 1_000_000
        if disabled is not None:
            state = "disabled"
        elif self.delivering:
            state = "delivering"
        else:
            state = "standby" if self._lead is not None else "starting"
        done = row.done_events if row is not None else 0
        total = row.total_events if row is not None else 0
        return {
            "name": self.name,
            "url": shown_url(self.webhook.url),
            "events": list(self.webhook.events),
            "principals": list(self.webhook.principals),
            "state": state,
            "cursor": done,
            "last_seq": total,
            "lag_events": max(0, total - done),
            "lag_seconds": max(0.0, (now - oldest) / 1000) if oldest is not None else 0.0,
            "pending_runs": row.runs_behind if row is not None else 0,
            "in_flight": len(self._in_delivery),
            "deliverer": (row.owner_node or None) if row is not None else None,
            "delivery_epoch": row.delivery_epoch if row is not None else 0,
            "last_status": row.last_status if row is not None else self.last_status,
            "last_error": row.last_error if row is not None else self.last_error,
            "last_attempt_ms": row.last_attempt_ms if row is not None else self.last_attempt_ms,
            "last_success_ms": row.last_success_ms if row is not None else self.last_success_ms,
            "deliveries": dict(self.outcomes),
            "disabled": None if disabled is None else disabled.to_json(shown_url(disabled.url)),
        }
