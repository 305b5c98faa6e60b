"""Embedded webhooks delivered by a child process that reads the WAL itself.

Why: everything a delivery costs (reading the run's events, deciding what each webhook
wants, the ledger and the cursor file, the body, the signature, the HTTP attempt) was
Python on a thread of the server's process, holding the GIL that the appends'
confirmations and the media pipeline need (``bench/webhooks.py``: +30 % median confirm
latency with every event wanted by 10 webhooks). Here the server's share of a delivery is
nothing: it tells the child how far the log is durable, one small frame per gathered
wake-up, whatever the number of webhooks or events.

Rules:

- **The server's side** (:class:`DeliveryProcess`, on the server's loop): one feed
  subscription on the timeline (:mod:`registry.feed`), made before the child is told where
  the log ends, so no durable batch falls between. Woken by the feed, it waits
  ``gather_s`` (:data:`whip.webhooks.service.FEED_GATHER_S`; the writer does not wake it
  again meanwhile), takes, and writes ``{"op": "durable", "upto"}``: the durable seq, the
  only thing the child learns from the server after its start.
- **The child** (:func:`serve`, ``python -m whip.webhooks.delivery_process``): a
  :class:`~whip.webhooks.followed_log.FollowedLog` over the data dir's WAL, indexed up to
  the start frame's ``upto`` and then to each ``durable`` frame's; on it the same
  :class:`~whip.webhooks.service.WebhookGroup` of
  :class:`~whip.webhooks.dispatcher.WebhookDispatcher` s as in the server's process, with
  the data dir's :class:`~whip.webhooks.cursor.FileCursorStore` (webhooks no longer
  configured are forgotten first), their HTTP attempts on the child's own loop. Every
  promise of :mod:`whip.webhooks.dispatcher` (at least once from the saved cursor, in
  order per run, runs in parallel up to a bound, 410 disables durably) is the
  dispatchers', unchanged; the child only moves them off the server's interpreter.
- **Frames** both ways, the child started and connected as :mod:`whip.webhooks.
  child_pipes` says (a JSON header, a raw body). To the child: ``start`` (the webhooks,
  with their secrets: the pipe is the server's own; the WAL and cursor directories; the
  cursor file's group-commit window; ``upto``; the log level), then ``durable`` and
  ``status`` requests. From the child: ``ready`` once every dispatcher started, or
  ``failed`` with the error (a cursor file that is not one refuses the server's start,
  as in the server's process: :class:`~whip.webhooks.cursor.CursorFileError`);
  ``status`` with every webhook's ``GET /v1/webhooks`` item as the body (JSON), pushed
  whenever an item changed and answered at once to a request (``id``). The child checks
  its items at most every :data:`STATUS_INTERVAL_S`: on the wake of a ``durable`` frame
  while the log moves (no wake-up of its own), then, once the frames stop, on its own
  timer until :data:`STATUS_QUIET_CHECKS` checks in a row find no change and no webhook
  with events left to deliver (in flight, retrying, or not yet read); then it sleeps
  until the next ``durable`` frame. So an idle child does not wake, and neither it nor
  the server's loop wakes for status more than once a second (it had been 20 times a
  second each, idle or not).
- **What the server shows**: :class:`RemoteWebhook` (one per entry, the
  :class:`~whip.webhooks.status.WebhookStatus` of the routes and the metrics) holds the
  last pushed item, parsed only when read; :meth:`RemoteWebhook.describe` asks the child
  for a fresh one (and so refreshes what the metrics read). Between a child's end and the
  next one's first push, items read ``"state": "starting"``.
- **The child dies with the server**: it exits when its stdin closes (the server closed
  it, exited, or was SIGKILLed), after closing the dispatchers (their cursors saved). It
  ignores SIGINT and SIGTERM, which a terminal or a service manager sends to the whole
  group: the server's shutdown then closes it in order.
- **Its CPU priority** (:mod:`whip.webhooks.child_priority`): every child starts
  :data:`DELIVERY_NICE` below the server's priority; once ready it is told to go
  ``SCHED_IDLE`` (``{"op": "idle"}``) while the governor's level is ``IDLE``. A task
  (:meth:`DeliveryProcess._govern`) samples the child's run-queue wait every window; a
  starved ``SCHED_IDLE`` child is moved back to ``nice`` in place where the kernel allows
  it, else killed at once (a starved child has no CPU to save its cursors with) and the
  supervisor starts a ``nice`` one at once, not counted as a failure; a calm ``nice`` one
  is told to go ``SCHED_IDLE`` again. Each change is logged (WARNING for a starvation)
  and counted (:attr:`DeliveryProcess.governor`).
  **A child that dies under the server** is started again, after
  :data:`RESTART_DELAYS_S` (logged at ERROR): the new child indexes the log anew and
  resumes from the saved cursors; events delivered after the last save are sent again,
  with the same ``webhook-id``. A follower that finds a durable seq missing
  (:class:`registry.log_follower.LogFollowError`) exits its child with status 3 (so it
  is restarted).
- Cancellation: :meth:`DeliveryProcess.aclose` stops the fan-out and the supervisor,
  closes the child's stdin and waits for it to exit (killed after
  :data:`EXIT_DEADLINE_S`). Loop-only: a :class:`DeliveryProcess` is used on the loop
  that started it (the server's).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from registry.feed import FeedSubscription
from registry.log_follower import LogFollowError
from registry.timeline import Timeline
from whip.eventloop import EventLoopKind, new_event_loop
from whip.webhooks.child_pipes import (
    FrameReader,
    answers_out,
    frame,
    requests_in,
    spawn,
    wait_or_kill,
)
from whip.webhooks.child_priority import (
    Level,
    PriorityGovernor,
    PriorityTuning,
    RunQueueWait,
    enter_sched_idle,
    idle_supported,
    leave_sched_idle,
    reset_to_normal_policy,
)
from whip.webhooks.config import WebhookConfig
from whip.webhooks.cursor import (
    FLUSH_INTERVAL_S,
    CursorFileError,
    FileCursorStore,
    forget_unconfigured,
)
from whip.webhooks.delivery import shown_url
from whip.webhooks.dispatcher import WebhookDispatcher
from whip.webhooks.followed_log import FollowedLog
from whip.webhooks.group import WebhookGroup

logger = logging.getLogger(__name__)

START_DEADLINE_S: Final = 120.0
"""Bound on a child's start to its ready frame (it indexes the whole log first)."""
EXIT_DEADLINE_S: Final = 10.0
"""Bound on a child's exit once its stdin closed (its dispatchers save their cursors)."""
STATUS_INTERVAL_S: Final = 1.0
"""At most how often the child checks its items and pushes the changed ones unasked: the
items the server's metrics read are about this old at most (``GET /v1/webhooks`` asks for
fresh ones). Each push wakes the server's loop, which the appends' confirmations share."""
STATUS_TRAILING_S: Final = 0.1
"""How much later than :data:`STATUS_INTERVAL_S` after a check the child's own timer
fires: ``durable`` frames that keep coming (every gather window) carry every check, and
the timer only runs once they stop."""
STATUS_QUIET_CHECKS: Final = 2
"""Checks in a row with no item changed and nothing left to deliver after which the child
stops checking until the log moves again (an idle child does not wake)."""
STATUS_DEADLINE_S: Final = 5.0
"""Bound on a status request; past it the last pushed items are shown."""
RESTART_DELAYS_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits before each restart of a child that died; back to the first after
:data:`STABLE_AFTER_S` of a child running."""
STABLE_AFTER_S: Final = 60.0
FOLLOW_ERROR_EXIT: Final = 3
FORGET_EVERY_S: Final = 30.0
FORGET_IDLE_S: Final = 300.0
"""The child's index keeps a run every active webhook has passed until it has been idle
this long (:meth:`~whip.webhooks.followed_log.FollowedLog.forget_passed`)."""
DELIVERY_NICE: Final = 10
"""How much lower the child's CPU priority is than the server's (``os.nice``): on a host
whose cores are busy, the kernel runs the server's threads (ingest, the WAL writer, the
decoders) before the webhooks' deliveries, which wait a little instead."""


def webhook_to_json(webhook: WebhookConfig) -> dict[str, Any]:
    """An entry as the start frame carries it (its secret key in base64)."""
    return {
        "name": webhook.name,
        "url": webhook.url,
        "secret_key": base64.b64encode(webhook.secret_key).decode(),
        "events": list(webhook.events),
        "principals": list(webhook.principals),
        "timeout_s": webhook.timeout_s,
        "retry_min_s": webhook.retry_min_s,
        "retry_max_s": webhook.retry_max_s,
        "max_parallel_runs": webhook.max_parallel_runs,
    }


def webhook_from_json(entry: dict[str, Any]) -> WebhookConfig:
    """:func:`webhook_to_json` read back."""
    return WebhookConfig(
        name=entry["name"],
        url=entry["url"],
        secret_key=base64.b64decode(entry["secret_key"]),
        events=tuple(entry["events"]),
        principals=tuple(entry["principals"]),
        timeout_s=entry["timeout_s"],
        retry_min_s=entry["retry_min_s"],
        retry_max_s=entry["retry_max_s"],
        max_parallel_runs=entry["max_parallel_runs"],
    )


# ---------------------------------------------------------------------- the server's side


class RemoteWebhook:
    """One webhook delivered by the child, as the server's routes and metrics see it."""

    def __init__(self, owner: DeliveryProcess, webhook: WebhookConfig) -> None:
        self._owner = owner
        self.webhook = webhook

    @property
    def name(self) -> str:
        return self.webhook.name

    def status(self) -> dict[str, object]:
        """The last item the child pushed (module rules; no I/O)."""
        item = self._owner.items().get(self.name)
        if item is not None:
            return item
        return {
            "name": self.name,
            "url": shown_url(self.webhook.url),
            "events": list(self.webhook.events),
            "principals": list(self.webhook.principals),
            "state": "starting",
            "cursor": 0,
            "last_seq": 0,
            "lag_events": 0,
            "lag_seconds": 0.0,
            "pending_runs": 0,
            "in_flight": 0,
            "last_status": None,
            "last_error": None,
            "last_attempt_ms": None,
            "last_success_ms": None,
            "deliveries": {},
            "disabled": None,
        }

    async def describe(self) -> dict[str, object]:
        """A fresh item from the child (the last pushed one if it does not answer)."""
        await self._owner.refresh()
        return self.status()

    @property
    def outcomes(self) -> Counter[str]:
        deliveries = self.status()["deliveries"]
        return Counter(deliveries) if isinstance(deliveries, dict) else Counter()

    @property
    def lag_events(self) -> int:
        lag = self.status()["lag_events"]
        return lag if isinstance(lag, int) else 0


class _Child(asyncio.Protocol):
    """One child's stdout cut into frames; at its end the child is reaped."""

    def __init__(self, owner: DeliveryProcess, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._frames = FrameReader(owner._received, lambda: None)
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self._frames.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        asyncio.get_running_loop().create_task(self._reap(), name="webhook-delivery-reap")

    async def _reap(self) -> None:
        code = await asyncio.to_thread(wait_or_kill, self.proc, EXIT_DEADLINE_S)
        if not self.exited.done():
            self.exited.set_result(code)


class DeliveryProcess:
    """The embedded webhooks, delivered by one child process (module rules)."""

    def __init__(
        self,
        webhooks: Sequence[WebhookConfig],
        timeline: Timeline,
        cursor_dir: Path,
        kind: EventLoopKind,
        *,
        gather_s: float,
        tuning: PriorityTuning | None = None,
        sched_idle: bool = True,
        leave_idle_in_place: bool = True,
        cursor_flush_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        """``sched_idle`` false: the child stays at ``nice`` (what ``bench/webhooks.py``
        compares the governor with). ``leave_idle_in_place`` false: a starved child is
        always replaced, as where the kernel refuses to move it (tests).
        ``cursor_flush_s``: the child's cursor file group-commit window
        (:class:`~whip.webhooks.cursor.FileCursorStore`; ``bench/webhooks.py`` lengthens
        it to tell the cursor file's share of the cost on the WAL)."""
        self._config = [webhook_to_json(webhook) for webhook in webhooks]
        self.webhooks = [RemoteWebhook(self, webhook) for webhook in webhooks]
        self._timeline = timeline
        self._cursor_dir = cursor_dir
        self._kind = kind
        self._gather_s = gather_s
        self._cursor_flush_s = cursor_flush_s
        self._subscription: FeedSubscription | None = None
        self._child: _Child | None = None
        self._writer: asyncio.WriteTransport | None = None
        self._started: asyncio.Future[None] | None = None
        self._items_raw = b""
        self._items: dict[str, dict[str, object]] | None = {}
        self._requests: dict[int, asyncio.Future[None]] = {}
        self._next_request = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._replacing: _Child | None = None
        self._leave_in_place = leave_idle_in_place
        self.governor = PriorityGovernor(
            tuning or PriorityTuning(), available=sched_idle and idle_supported()
        )
        """The child's CPU priority level and its starvations (module rules)."""
        self.pid: int | None = None
        """The child's process id (the last one started)."""
        self.starts = 0
        """Children started (a restart after one died counts one more)."""
        self.wakeups = 0
        """Durable frames sent (one per gathered wake-up of the feed)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Subscribe, start the child and wait for its dispatchers (raises what refused
        them: :class:`~whip.webhooks.cursor.CursorFileError`, :class:`OSError`), then
        follow the feed. Cancellation: the child is killed."""
        self._subscription = self._timeline.feed.subscribe()
        try:
            await self._spawn()
        except BaseException:
            await self.aclose()
            raise
        self._tasks = [
            asyncio.create_task(self._fan_out(self._subscription), name="webhook-durable-fanout"),
            asyncio.create_task(self._supervise(), name="webhook-delivery-supervisor"),
            asyncio.create_task(self._govern(), name="webhook-delivery-priority"),
        ]

    async def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        started = self._started = loop.create_future()
        child, writer = await spawn(
            "whip.webhooks.delivery_process", self._kind, lambda p: _Child(self, p)
        )
        proc = child.proc
        self._child, self._writer = child, writer
        self.pid = proc.pid
        self.starts += 1
        upto = self._timeline.durable_seq  # after the subscription: nothing falls between
        writer.write(
            frame(
                {
                    "op": "start",
                    "webhooks": self._config,
                    "wal_dir": str(self._timeline.config.data_dir / "wal"),
                    "cursor_dir": str(self._cursor_dir),
                    "cursor_flush_s": self._cursor_flush_s,
                    "max_record_bytes": self._timeline.config.max_record_bytes,
                    "upto": upto,
                    "log_level": logging.getLogger().getEffectiveLevel(),
                }
            )
        )
        try:
            async with asyncio.timeout(START_DEADLINE_S):
                await asyncio.wait([started, child.exited], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await self._stop_child()
            raise
        if started.done():
            if started.exception() is None:
                level = self.governor.level
                if level is Level.IDLE:
                    writer.write(frame({"op": "idle"}))
                logger.info(
                    "webhook delivery process %d started: %d webhooks from seq %d, %s",
                    proc.pid,
                    len(self._config),
                    upto,
                    "SCHED_IDLE" if level is Level.IDLE else f"nice +{DELIVERY_NICE}",
                )
            else:
                await self._stop_child()
            started.result()  # raises what refused the start
            return
        await self._stop_child()
        raise OSError(f"the webhook delivery process {proc.pid} exited at start")

    async def _stop_child(self) -> None:
        child, writer = self._child, self._writer
        self._child = self._writer = None
        self._items = {}
        self._items_raw = b""
        if writer is not None:
            writer.close()
        if child is None:
            return
        try:
            async with asyncio.timeout(EXIT_DEADLINE_S):
                await asyncio.shield(child.exited)
        except TimeoutError:
            logger.error("webhook delivery process %d did not exit; killed", child.proc.pid)
        finally:
            if not child.exited.done():
                child.proc.kill()
                await asyncio.shield(child.exited)

    async def _supervise(self) -> None:
        """Start a child again after one died under the server (module rules)."""
        failures = 0
        since = time.monotonic()
        while True:
            child = self._child
            if child is not None:
                code = await asyncio.shield(child.exited)
                if self._closing:
                    return
                if child is self._replacing:  # by the governor: at once, not a failure
                    self._replacing = None
                    await self._stop_child()
                    try:
                        await self._spawn()
                    except (OSError, CursorFileError) as exc:
                        logger.error("webhook delivery process did not start again: %r", exc)
                    continue
                if time.monotonic() - since >= STABLE_AFTER_S:
                    failures = 0
                delay = RESTART_DELAYS_S[min(failures, len(RESTART_DELAYS_S) - 1)]
                logger.error(
                    "webhook delivery process %d exited under the server (status %s); "
                    "a new one starts in %.1f s and resumes from the saved cursors",
                    child.proc.pid,
                    code,
                    delay,
                )
                await self._stop_child()
            else:
                delay = RESTART_DELAYS_S[min(failures, len(RESTART_DELAYS_S) - 1)]
            failures += 1
            await asyncio.sleep(delay)
            since = time.monotonic()
            try:
                await self._spawn()
            except (OSError, CursorFileError) as exc:
                logger.error("webhook delivery process did not start again: %r", exc)

    async def _govern(self) -> None:
        """Sample the child's run-queue wait and apply the governor's changes (module
        rules)."""
        governor = self.governor
        sampler: RunQueueWait | None = None
        sampled_at = 0.0
        while True:
            await asyncio.sleep(governor.tuning.window_s)
            child = self._child
            if child is None or child is self._replacing or child.exited.done():
                sampler = None
                continue
            now = time.monotonic()
            if sampler is None or sampler.pid != child.proc.pid:
                sampler, sampled_at = RunQueueWait(child.proc.pid), now
                continue
            waited = sampler.take()
            elapsed, sampled_at = now - sampled_at, now
            if waited is None:
                continue
            change = governor.observe(waited, elapsed)
            logger.debug(
                "webhook delivery process %d waited %.0f ms for a CPU in %.0f ms (%s)",
                child.proc.pid,
                waited * 1000,
                elapsed * 1000,
                governor.level,
            )
            if change is Level.NICE:
                in_place = self._leave_in_place and leave_sched_idle(child.proc.pid)
                logger.warning(
                    "webhook delivery process %d starved at SCHED_IDLE (waited %.0f ms for a "
                    "CPU in the last %.1f s); %s at nice +%d, SCHED_IDLE again after %.0f s "
                    "calm",
                    child.proc.pid,
                    waited * 1000,
                    elapsed,
                    "moved" if in_place else "killed and replaced by a new one",
                    DELIVERY_NICE,
                    governor.calm_needed_s,
                )
                if not in_place:
                    self._replacing = child  # the supervisor starts the next at once
                    child.proc.kill()
            elif change is Level.IDLE:
                writer = self._writer
                if writer is not None and not writer.is_closing():
                    writer.write(frame({"op": "idle"}))
                logger.info(
                    "webhook delivery process %d calm at nice: SCHED_IDLE again (after "
                    "another starvation, %.0f s calm needed)",
                    child.proc.pid,
                    governor.calm_needed_s,
                )

    async def _fan_out(self, subscription: FeedSubscription) -> None:
        while True:
            _runs, upto = await subscription.take_gathered(self._gather_s)
            self.wakeups += 1
            writer = self._writer
            if writer is not None and not writer.is_closing():
                writer.write(frame({"op": "durable", "upto": upto}))

    async def aclose(self) -> None:
        """Stop following, close the child (its cursors saved) (idempotent).

        Cancellation: the child is killed.
        """
        self._closing = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._subscription is not None:
            self._timeline.feed.unsubscribe(self._subscription)
            self._subscription = None
        await self._stop_child()
        for request in self._requests.values():
            if not request.done():
                request.set_result(None)
        self._requests.clear()

    # ------------------------------------------------------------------ frames

    def _received(self, header: dict[str, Any], body: bytes) -> None:
        op = header.get("op")
        if op == "status":
            self._items_raw = body
            self._items = None  # parsed when read
            request = self._requests.pop(header.get("id", 0), None)
            if request is not None and not request.done():
                request.set_result(None)
        elif op == "ready":
            if self._started is not None and not self._started.done():
                self._started.set_result(None)
        elif op == "failed":
            error: Exception
            message = str(header.get("error", ""))
            if header.get("kind") == "cursor":
                error = CursorFileError(message)
            else:
                error = OSError(f"the webhook delivery process did not start: {message}")
            if self._started is not None and not self._started.done():
                self._started.set_exception(error)

    def items(self) -> dict[str, dict[str, object]]:
        """Every webhook's last pushed item, by name."""
        items = self._items
        if items is None:
            parsed: list[dict[str, object]] = orjson.loads(self._items_raw)
            items = self._items = {str(item["name"]): item for item in parsed}
        return items

    async def refresh(self) -> None:
        """Ask the child for fresh items; returns when they came, or after
        :data:`STATUS_DEADLINE_S`. Cancellation: the answer is ignored."""
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        self._next_request += 1
        request_id = self._next_request
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = answered
        writer.write(frame({"op": "status", "id": request_id}))
        try:
            async with asyncio.timeout(STATUS_DEADLINE_S):
                await answered
        except TimeoutError:
            logger.warning("webhook delivery process: no status within %.0f s", STATUS_DEADLINE_S)
        finally:
            self._requests.pop(request_id, None)


# ---------------------------------------------------------------------- the child


class _Delivery:
    """The child's state: its log, its dispatchers and the frames it answers."""

    def __init__(self, out: asyncio.WriteTransport) -> None:
        self._out = out
        self.started: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.ended = asyncio.Event()
        self.failed: BaseException | None = None
        self._log: FollowedLog | None = None
        self._group: WebhookGroup | None = None
        self._dispatchers: list[WebhookDispatcher] = []
        self._pending_upto = 0
        self._last_items = b""
        self._looking: asyncio.TimerHandle | None = None
        """The next check of its own (module rules), None while it sleeps."""
        self._quiet_checks = 0
        self._checked_at = -STATUS_INTERVAL_S
        """``time.monotonic()`` of the last check of the items."""

    def on_frame(self, header: dict[str, Any], _body: bytes) -> None:
        op = header.get("op")
        if op == "start":
            if not self.started.done():
                self.started.set_result(header)
        elif op == "durable":
            self._pending_upto = max(self._pending_upto, int(header["upto"]))
            if self._log is not None:
                self._advance()
        elif op == "status":
            self.push_items(header.get("id", 0), force=True)
        elif op == "idle":
            moved = enter_sched_idle()
            logger.debug("webhook delivery process: %d threads at SCHED_IDLE", moved)

    def _advance(self) -> None:
        assert self._log is not None
        try:
            self._log.advance(self._pending_upto)
        except (LogFollowError, OSError) as exc:
            logger.error("webhook delivery process: %s; exiting to start afresh", exc)
            self.failed = exc
            self.ended.set()
        if self._group is None or self.failed is not None:
            return
        self._quiet_checks = 0
        if time.monotonic() - self._checked_at >= STATUS_INTERVAL_S:
            self._check()  # on this frame's wake
        elif self._looking is None:
            self._look_later()

    def _check(self) -> None:
        """Push the changed items; count the quiet checks; the next check of its own."""
        self._checked_at = time.monotonic()
        if self.push_items(0, force=False):
            self._quiet_checks = 0
        else:
            self._quiet_checks += 1
        if self._quiet_checks < STATUS_QUIET_CHECKS:
            self._look_later()
        elif self._looking is not None:  # asleep until the next durable frame
            self._looking.cancel()
            self._looking = None

    def _look_later(self) -> None:
        """(Re)arm the check of its own, after the next frame's would be due (module rules)."""
        if self._looking is not None:
            self._looking.cancel()
        self._looking = asyncio.get_running_loop().call_later(
            STATUS_INTERVAL_S + STATUS_TRAILING_S, self._on_timer
        )

    def _on_timer(self) -> None:
        self._looking = None
        self._check()

    async def run(self, start: dict[str, Any]) -> None:
        webhooks = [webhook_from_json(entry) for entry in start["webhooks"]]
        log = FollowedLog(Path(start["wal_dir"]), int(start["max_record_bytes"]))
        await log.start(int(start["upto"]))
        store = FileCursorStore(Path(start["cursor_dir"]), float(start["cursor_flush_s"]))
        await forget_unconfigured(store, {webhook.name for webhook in webhooks})
        dispatchers = [WebhookDispatcher(webhook, log, store) for webhook in webhooks]
        group = WebhookGroup(dispatchers, log, gather_s=0.0)
        await group.start()
        self._log, self._group, self._dispatchers = log, group, dispatchers
        self._advance()  # what became durable while the log was indexed; the first items
        self._out.write(frame({"op": "ready"}))
        forget = asyncio.create_task(self._forget_passed(log), name="webhook-index-forget")
        try:
            await self.ended.wait()
        finally:
            if self._looking is not None:
                self._looking.cancel()
            forget.cancel()
            await asyncio.gather(forget, return_exceptions=True)
            try:
                await group.aclose()
            finally:
                log.close()

    def push_items(self, request_id: int, *, force: bool) -> bool:
        """Push the items if one changed (or ``force``); whether to keep looking: an item
        changed, or a webhook that is not disabled has events left to deliver."""
        if self._group is None:
            if force:  # not started yet: nothing to show but the start's
                self._out.write(frame({"op": "status", "id": request_id}, b"[]"))
            return False
        statuses = [dispatcher.status() for dispatcher in self._dispatchers]
        items = orjson.dumps(statuses)
        changed = items != self._last_items
        if force or changed:
            self._last_items = items
            self._out.write(frame({"op": "status", "id": request_id}, items))
        return changed or any(_owes_events(status) for status in statuses)

    async def _forget_passed(self, log: FollowedLog) -> None:
        """Keep the index to what is still to be delivered (module rules)."""
        while True:
            await asyncio.sleep(FORGET_EVERY_S)
            cursors = [
                d.ledger.upto for d in self._dispatchers if d.ledger is not None and not d.disabled
            ]
            if not cursors:
                continue
            idle_before = time.time_ns() // 1_000_000 - int(FORGET_IDLE_S * 1000)
            forgotten = log.forget_passed(min(cursors), idle_before)
            if forgotten:
                logger.debug("webhook delivery: %d passed runs left the index", forgotten)


def _owes_events(status: dict[str, object]) -> bool:
    """A webhook item with events still to deliver (its lag moves on its own: the
    seconds while one is in flight, the counts as retries land)."""
    return status["state"] != "disabled" and bool(status["in_flight"] or status["lag_events"])


async def serve() -> int:
    """The child (module rules): the exit status."""
    loop = asyncio.get_running_loop()
    out = await answers_out(loop)
    delivery = _Delivery(out)
    await requests_in(loop, FrameReader(delivery.on_frame, delivery.ended.set))
    waiting_end: asyncio.Future[Any] = asyncio.ensure_future(delivery.ended.wait())
    first: list[asyncio.Future[Any]] = [delivery.started, waiting_end]
    await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
    waiting_end.cancel()
    if not delivery.started.done():
        return 0  # the server went away before the start frame
    start = delivery.started.result()
    logging.getLogger().setLevel(int(start.get("log_level", logging.INFO)))
    try:
        await delivery.run(start)
    except CursorFileError as exc:
        out.write(frame({"op": "failed", "kind": "cursor", "error": str(exc)}))
        return 2
    except (OSError, LogFollowError) as exc:
        out.write(frame({"op": "failed", "kind": "os", "error": repr(exc)}))
        return 2
    finally:
        await _close_flushed(out)
    return FOLLOW_ERROR_EXIT if delivery.failed is not None else 0


async def _close_flushed(out: asyncio.WriteTransport) -> None:
    """Close ``out`` once what was written reached the server (at most 1 s)."""
    out.close()
    for _ in range(100):
        if out.get_write_buffer_size() == 0:
            return
        await asyncio.sleep(0.01)


def main(argv: list[str]) -> int:
    # The server's Ctrl-C, and a service manager's SIGTERM to the whole group, are the
    # server's: this child leaves when the server closes its stdin, its cursors saved.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    reset_to_normal_policy()  # not its parent's real-time policy, if it had one
    os.nice(DELIVERY_NICE)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    kind: EventLoopKind = "asyncio" if argv[1:] == ["asyncio"] else "uvloop"
    loop = new_event_loop(kind)
    try:
        return loop.run_until_complete(serve())
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
