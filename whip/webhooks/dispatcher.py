"""One webhook's delivery loop: it follows the durable log, in order per run, with runs
in parallel up to a bound.

Rules:

- Driven from the log, never from memory: the log's feed (:mod:`registry.feed`, one
  subscription for every webhook of a :class:`~whip.webhooks.group.WebhookGroup`, handed
  to :meth:`WebhookDispatcher.offer`) only says which runs got events up to which seq;
  events are read with ``read_events`` of the :class:`~whip.webhooks.followed_log.
  DeliveredLog` (in the server: the delivery process's view of the WAL; in tests and
  tools also the timeline itself) from the webhook's cursor (:mod:`whip.webhooks.cursor`,
  whose docstring says what the cursor means). A restart, clean or SIGKILL, resumes from
  the saved cursor.
- At least once: an event is marked done only after a 2xx; the saved cursor never
  passes an event that is not done. Events delivered before a crash but after the last
  save are sent again, with the same ``webhook-id``.
- In order per run: one task per run delivers that run's events one at a time; the
  next waits until the one before got its 2xx (retrying with backoff,
  :func:`whip.webhooks.delivery.retry_delay`, for as long as it takes).
- Parallel across runs, bounded: at most ``max_parallel_runs`` run tasks (and so HTTP
  requests) at once; other pending runs wait in FIFO order for a slot.
- Never slows ingest: in the server the dispatchers run in the delivery process
  (:mod:`whip.webhooks.delivery_process`), whose only input from the server is the
  durable seq; every read and request runs on this webhook's own tasks and its own HTTP
  client, so a slow or dead receiver holds up only this webhook. With an
  :class:`~whip.webhooks.attempt_process.AttemptProcess` (:attr:`WebhookDispatcher.sender`,
  set by :class:`whip.webhooks.group.WebhookGroup`; cluster mode's deliverers, tests), the
  client lives in that child process; without one (None) it runs on this loop.
- 410 Gone disables the webhook durably: the mark (:class:`registry.webhook_mark.
  DisabledMark`, naming the URL that answered) is saved with the cursor, so a restart
  stays disabled (logged at start) while that URL is configured; another URL for the
  name clears the mark and delivers from the cursor, which stayed where it was.
- The cursor is saved by one saver task whenever it changed, paced by the store's group
  commit (:class:`~whip.webhooks.cursor.FileCursorStore`: one write a second for all
  webhooks), and once more at close.
- Exactly one owner of each piece of state: the ledger, the run slots and the status
  fields are written only on the loop the dispatcher was started on (the delivery
  process's), by this object's tasks.
  :meth:`WebhookDispatcher.status` and :attr:`WebhookDispatcher.lag_events` may be
  called from any thread: they read single fields and copy containers in one C call
  each (atomic under the GIL), never iterate them in Python.

Cancellation: :meth:`WebhookDispatcher.aclose` cancels every task, closes the HTTP
client and saves the cursor; an attempt cut by it is sent again after the next start.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import NoReturn

from registry.errors import UnknownRunError
from registry.events import Event
from registry.webhook_mark import DisabledMark
from whip.webhooks.attempt_process import AttemptProcess
from whip.webhooks.config import WebhookConfig
from whip.webhooks.cursor import DEFAULT_MAX_AHEAD, CursorState, CursorStore, DeliveryLedger
from whip.webhooks.delivery import Attempt, attempt, new_http_session, shown_url
from whip.webhooks.followed_log import DeliveredLog
from whip.webhooks.http_client import HttpClient
from whip.webhooks.send_loop import SendLoop

logger = logging.getLogger(__name__)

READ_BATCH = 100
DEFAULT_SAVE_INTERVAL_S = 0.0
"""Extra pause between one webhook's saves; 0: the store's group commit paces them."""


class WebhookDisabledError(Exception):
    """The receiver answered 410 Gone: this webhook delivers nothing more."""


@dataclass(slots=True)
class RunSlot:
    """A run being delivered: its task, and whether the feed named it again meanwhile."""

    task: asyncio.Task[None]
    more: bool = False


class WebhookDispatcher(SendLoop):
    """Delivers one webhook's events (module rules)."""

    def __init__(
        self,
        webhook: WebhookConfig,
        timeline: DeliveredLog,
        store: CursorStore,
        *,
        rng: random.Random | None = None,
        max_ahead: int = DEFAULT_MAX_AHEAD,
        save_interval_s: float = DEFAULT_SAVE_INTERVAL_S,
    ) -> None:
        self.webhook = webhook
        self.timeline = timeline
        self.store = store
        self._rng = rng or random.Random()
        self._max_ahead = max_ahead
        self._save_interval_s = save_interval_s
        self.ledger: DeliveryLedger | None = None
        self._slots: dict[str, RunSlot] = {}
        self._waiting: deque[str] = deque()
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._saved_changes = -1
        self._http: HttpClient | None = None
        self.sender: AttemptProcess | None = None
        """Where the attempts are made (set before :meth:`start`; None: on this loop)."""
        self._started = False
        self.disabled = False
        self._init_send_loop()

    @property
    def name(self) -> str:
        return self.webhook.name

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load (or create, at the log's end) the cursor, then start delivering.

        The caller has subscribed to the timeline's feed *before* this call and hands
        every batch taken from it to :meth:`offer` (:class:`whip.webhooks.group.
        WebhookGroup`): what is durable after the snapshot read here is named there.
        A new webhook starts at the newest durable event: it delivers what comes after
        its first start. Its cursor is saved before anything else happens, so a crash
        right after cannot move its start.
        Cancellation: nothing is left running; a cursor being created may be saved.
        """
        saved = await self.store.load(self.name)
        newest = self.timeline.durable_seq  # read after the caller subscribed
        if saved is None:
            saved = CursorState(newest)
            await self.store.save(self.name, saved)
            logger.info("webhook %s: new cursor at seq %d", self.name, newest)
        ledger = DeliveryLedger(saved, newest, self._max_ahead)
        if saved.disabled is not None and saved.disabled.applies_to(self.webhook.url):
            self.disabled = True
            logger.warning(
                "webhook %s: disabled since %d (%s answered 410 Gone): nothing is delivered "
                "until another url is configured",
                self.name,
                saved.disabled.at_ms,
                shown_url(saved.disabled.url),
            )
        elif saved.disabled is not None:
            ledger.disable(None)
            await self.store.save(self.name, ledger.state())
            logger.info(
                "webhook %s: disabled -> active (the url that answered 410 is no longer "
                "configured)",
                self.name,
            )
        behind = self.timeline.runs_after(saved.upto)
        self.ledger = ledger
        self._saved_changes = ledger.changes
        if self.sender is None:
            self._http = new_http_session(self.webhook.max_parallel_runs)
        self._started = True
        self._schedule(ledger.named(behind, newest))
        logger.info(
            "webhook %s: delivering to %s from seq %d (%d runs behind)",
            self.name,
            shown_url(self.webhook.url),
            saved.upto,
            len(behind),
        )
        self._tasks = [asyncio.create_task(self._saver(), name=f"webhook-{self.name}-saver")]

    async def aclose(self) -> None:
        """Stop every task, close the HTTP client, save the cursor (idempotent).

        Cancellation: the final save may be cut short; the saved file stays whole.
        """
        tasks = [*self._tasks, *(slot.task for slot in self._slots.values())]
        self._tasks = []
        self._slots.clear()
        self._waiting.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._started = False
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.ledger is not None and self.ledger.changes != self._saved_changes:
            await self.store.save(self.name, self.ledger.state())
            self._saved_changes = self.ledger.changes

    # ------------------------------------------------------------------ scheduling

    def _schedule(self, runs: list[str]) -> None:
        if self.disabled:
            return  # nothing more is started; the cursor keeps their place
        self._waiting.extend(runs)
        self._fill()

    def _fill(self) -> None:
        """Start run tasks for waiting runs while there are free slots."""
        while self._waiting and len(self._slots) < self.webhook.max_parallel_runs:
            if self.disabled:
                return
            run_id = self._waiting.popleft()
            task = asyncio.create_task(self._deliver_run(run_id), name=f"webhook-{self.name}-run")
            self._slots[run_id] = RunSlot(task)

    def offer(self, runs: set[str], upto: int) -> None:
        """A batch taken from the feed: mark its runs pending, wake or queue their tasks
        (loop only; after :meth:`start`)."""
        ledger = self.ledger
        if ledger is None:
            return
        for run_id in runs:
            slot = self._slots.get(run_id)
            if slot is not None:
                slot.more = True
        fresh = ledger.named(runs, upto)
        self._schedule([run_id for run_id in fresh if not self._settled_warm(run_id)])
        self._changed.set()

    def _settled_warm(self, run_id: str) -> bool:
        """Settle a newly pending run without a task when the warm snapshot shows that
        none of its new events is to be delivered (a live run's ``stats``, mostly): they
        are passed and the run is caught up. False when a task must read it (a wanted
        event, a cold read, more than one batch).

        Exact for the same reason a task's empty read is: the feed hands a seq over only
        after the snapshot holding it was published, so every event of this run up to
        the feed's ``upto`` is in what the current snapshot answers.
        """
        ledger = self.ledger
        assert ledger is not None
        events = self.timeline.read_warm(run_id, ledger.read_from(run_id), READ_BATCH)
        if events is None or len(events) == READ_BATCH:
            return False
        for event in events:
            if self.webhook.wants(event.type, event.principal) and not (
                ledger.already_delivered(event.seq)
            ):
                return False
        if events:
            ledger.passed(run_id, events[-1].seq)
        ledger.caught_up(run_id)
        return True

    async def _saver(self) -> None:
        """Save the cursor whenever it changed (the store paces the writes)."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            ledger = self.ledger
            assert ledger is not None
            if ledger.changes != self._saved_changes:
                changes = ledger.changes
                try:
                    await self.store.save(self.name, ledger.state())
                except OSError as exc:
                    logger.error("webhook %s: the cursor could not be saved: %r", self.name, exc)
                    self._changed.set()
                else:
                    self._saved_changes = changes
            if self._save_interval_s > 0:
                await asyncio.sleep(self._save_interval_s)

    # ------------------------------------------------------------------ one run

    async def _deliver_run(self, run_id: str) -> None:
        """Deliver the run's events in order until it is read to the end."""
        ledger = self.ledger
        assert ledger is not None
        try:
            while True:
                slot = self._slots[run_id]
                slot.more = False
                try:
                    events = await self.timeline.read_events(
                        run_id, ledger.read_from(run_id), READ_BATCH
                    )
                except UnknownRunError:
                    logger.warning(
                        "webhook %s: run %s is no longer in the log (retention); "
                        "its undelivered events are lost to this webhook",
                        self.name,
                        run_id,
                    )
                    events = []
                if not events:
                    if slot.more:
                        continue
                    ledger.caught_up(run_id)
                    del self._slots[run_id]
                    self._changed.set()
                    self._fill()
                    return
                skipped = 0  # the last seq passed over without a delivery, not yet told
                for event in events:
                    if not self.webhook.wants(
                        event.type, event.principal
                    ) or ledger.already_delivered(event.seq):
                        skipped = event.seq
                        continue
                    if skipped:
                        ledger.passed(run_id, skipped)
                        skipped = 0
                    ledger.holding(run_id, event.seq)
                    await self._deliver(event)
                    ledger.delivered(run_id, event.seq)
                    self._changed.set()
                if skipped:
                    ledger.passed(run_id, skipped)
                self._changed.set()
        except WebhookDisabledError:
            self._slots.pop(run_id, None)
        except Exception:
            # A defect, not a receiver's doing: the run keeps holding the cursor (its lag
            # shows in GET /v1/webhooks) and the restart delivers it.
            logger.exception("webhook %s: run %s delivery stopped", self.name, run_id)
            self._slots.pop(run_id, None)

    async def _deliver(self, event: Event) -> None:
        """Send one event until a 2xx (:mod:`whip.webhooks.send_loop`); raises
        :class:`WebhookDisabledError` on 410 or once stopped.

        Cancellation: the attempt in flight is abandoned (sent again after a restart).
        """

        def may_send() -> None:
            if self.disabled or not self._started:
                raise WebhookDisabledError(self.name)

        async def send_once(body: bytes, signed: dict[str, str]) -> Attempt:
            if self.sender is not None:
                return await self.sender.attempt(self.webhook, body, signed)
            assert self._http is not None
            return await attempt(self._http, self.webhook.url, body, signed, self.webhook.timeout_s)

        async def gone(event: Event, _token: None) -> NoReturn:
            self._disable(event)
            raise WebhookDisabledError(self.name)

        await self._send_until_accepted(event, may_send, send_once, gone)

    def _disable(self, event: Event) -> None:
        if self.disabled:
            return
        self.disabled = True
        self._waiting.clear()
        if self.ledger is not None:
            self.ledger.disable(
                DisabledMark(self.webhook.url, time.time_ns() // 1_000_000, "410 Gone")
            )
            self._changed.set()
        logger.error(
            "webhook %s: active -> disabled: %s answered 410 Gone (run %s seq %d); "
            "durable until another url is configured, the cursor stays at %d",
            self.name,
            shown_url(self.webhook.url),
            event.run_id,
            event.seq,
            self.ledger.upto if self.ledger is not None else 0,
        )

    # ------------------------------------------------------------------ reading

    def status(self) -> dict[str, object]:
        """The ``GET /v1/webhooks`` item: cursor, lag, last status and error."""
        ledger = self.ledger
        newest = self.timeline.durable_seq
        cursor = ledger.upto if ledger is not None else 0
        now_ms = time.time_ns() // 1_000_000
        oldest = min(list(self._in_delivery.values()), default=None)
        mark = ledger.disabled if ledger is not None else None
        return {
            "name": self.name,
            "url": shown_url(self.webhook.url),
            "events": list(self.webhook.events),
            "principals": list(self.webhook.principals),
            "state": "disabled" if self.disabled else ("active" if ledger else "starting"),
            "cursor": cursor,
            "last_seq": newest,
            "lag_events": max(0, newest - cursor),
            "lag_seconds": max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0,
            "pending_runs": ledger.pending if ledger is not None else 0,
            "in_flight": len(self._in_delivery),
            "last_status": self.last_status,
            "last_error": self.last_error,
            "last_attempt_ms": self.last_attempt_ms,
            "last_success_ms": self.last_success_ms,
            "deliveries": dict(self.outcomes),
            "disabled": None if mark is None else mark.to_json(shown_url(mark.url)),
        }

    async def describe(self) -> dict[str, object]:
        """The ``GET /v1/webhooks`` item (:meth:`status`; no I/O)."""
        return self.status()

    @property
    def lag_events(self) -> int:
        cursor = self.ledger.upto if self.ledger is not None else 0
        return max(0, self.timeline.durable_seq - cursor)
