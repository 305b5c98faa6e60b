"""A webhook's cursor: what it means with per-run order and parallel runs, and where it is kept.

What the cursor is (:class:`CursorState`):

- ``upto``: every event with ``seq <= upto`` is done for this webhook: delivered (a 2xx
  was received) or not wanted (another type or principal). The log's seqs are global and
  gap-free, so this one number covers every run.
- ``delivered_above``: the seqs above ``upto`` that were already delivered. Runs are
  delivered in parallel, so a fast run gets ahead of a slow one; the global ``upto`` only
  advances past events that are done, and these are the done ones it has not reached.
  On a restart they are skipped instead of sent again. The set is bounded
  (``max_ahead``); a delivery that finds it full is not recorded, which can only cost a
  duplicate after a crash (same ``webhook-id``), never a skipped event.

How ``upto`` advances (:class:`DeliveryLedger`, one per webhook, owned by its
dispatcher on the loop; no locks):

- ``scanned``: the newest seq the timeline's feed has handed over. Every event at or
  below it belongs to a run the ledger was told about (:mod:`registry.feed`).
- A run is *pending* from the moment the feed names it until its delivery task has read
  it to the end. Each pending run has a *floor*: none of its undone events has a seq at
  or below it (its last done seq before it is read; the seq before the event it is
  delivering once it has read that far).
- ``upto = min(scanned, floors of the pending runs)``. A run that is not pending has no
  undone event at or below ``scanned``; a pending run none at or below its floor. So
  every event at or below ``upto`` is done, and ``upto`` never passes an undelivered one.
- Per run, the ledger remembers the last done seq of runs above the cursor (``after``),
  so a run that is named again is read from where it stopped, not from ``upto`` (which
  would resend what was delivered past a full ``delivered_above``); entries at or below
  ``upto`` are dropped (reading from ``upto`` is the same then).

Where it is kept (:class:`CursorStore`): the single-node store is
:class:`FileCursorStore`, one JSON file for every webhook, ``<data_dir>/webhooks/
cursors.json``, written to a temporary file, fsynced and renamed over the old one (the
directory fsynced when the file is first made): a crash leaves the old cursors or the
new ones, never torn ones. Saves are group-committed, at most one write a second for all
webhooks together, so the cursors cost the disk the WAL shares one fsync a second.
Cluster mode keeps its cursors in the store instead, per run (cluster seqs are per run):
:mod:`registry.pg.webhook_store`, driven by :mod:`whip.webhooks.cluster_delivery`.

What is pruned: the file holds one entry per webhook name and nothing per run (``upto`` is
one global seq; ``delivered_above`` is bounded and drops seqs as ``upto`` passes them; the
per-run ``after`` lives in memory only), so a deleted run leaves nothing in it. An entry
whose name is no longer configured is removed at start (:meth:`FileCursorStore.forget`,
before the first save, one write; logged): the same name configured again starts at the
log's end, as a new webhook does. Cluster mode prunes its per-run rows in the store
(:mod:`registry.pg.webhook_store`, "Pruning").

The 410 mark (:class:`registry.webhook_mark.DisabledMark`) is part of the durable state
(``disabled`` in :class:`CursorState`, an optional ``disabled`` object in the file's
entry): a webhook whose receiver answered 410 stays disabled across restarts while its URL
is the one that answered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson

from registry.segments import fsync_dir
from registry.webhook_mark import DisabledMark

logger = logging.getLogger(__name__)

DEFAULT_MAX_AHEAD = 4096
FILE_VERSION = 1


@dataclass(frozen=True, slots=True)
class CursorState:
    """A webhook's durable progress (module doc)."""

    upto: int
    delivered_above: tuple[int, ...] = ()
    disabled: DisabledMark | None = None


class CursorFileError(Exception):
    """A cursor file that is not one this server wrote; the server refuses to start."""


class CursorStore(Protocol):
    """Where cursors are kept. ``load``/``save`` are durable and may block on I/O."""

    async def load(self, name: str) -> CursorState | None:
        """The webhook's saved cursor, or None when it has none yet."""
        ...

    async def save(self, name: str, state: CursorState) -> None:
        """Replace the webhook's cursor; durable when it returns.

        Cancellation: the new cursor may or may not be saved; the old one stays whole.
        """
        ...


def _entry(state: CursorState) -> dict[str, object]:
    entry: dict[str, object] = {"upto": state.upto, "delivered_above": list(state.delivered_above)}
    mark = state.disabled
    if mark is not None:
        entry["disabled"] = {"url": mark.url, "at_ms": mark.at_ms, "reason": mark.reason}
    return entry


def _read_mark(name: str, entry: dict[str, object]) -> DisabledMark | None:
    raw = entry.get("disabled")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: disabled is not an object")
    url, at_ms, reason = raw["url"], raw["at_ms"], raw["reason"]
    if not (isinstance(url, str) and isinstance(reason, str) and isinstance(at_ms, int)):
        raise ValueError(f"{name}: disabled is not a 410 mark")
    return DisabledMark(url, at_ms, reason)


FLUSH_INTERVAL_S = 1.0
"""The cursor file's default group-commit window (:class:`FileCursorStore`)."""


class FileCursorStore:
    """Every webhook's cursor in one file, ``<directory>/cursors.json``, group-committed.

    Saves that arrive within ``flush_interval_s`` of the last write are written together
    (one write, one fsync): the cost on the disk the WAL shares is one fsync per interval,
    however many webhooks. A save returns once its state is on disk. Owned by one event
    loop (the webhooks' delivery thread); the file I/O runs in that loop's executor.
    """

    FILE_NAME = "cursors.json"

    def __init__(self, directory: Path, flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.directory = directory
        self.path = directory / self.FILE_NAME
        self._flush_interval_s = flush_interval_s
        self._saved: dict[str, CursorState] | None = None
        self._pending: dict[str, CursorState] = {}
        self._flush: asyncio.Future[None] | None = None
        self._last_write = -float("inf")
        self._write_lock = threading.Lock()
        """Held by the thread writing the file (a leaf lock): a write whose caller was
        cancelled goes on in its thread and must not race the next on the temporary file."""

    def _read(self) -> dict[str, CursorState]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            doc = orjson.loads(raw)
            if doc.get("version") != FILE_VERSION or not isinstance(doc.get("webhooks"), dict):
                raise ValueError("not a cursor file of this version")
            states = {}
            for name, entry in doc["webhooks"].items():
                upto, above = entry["upto"], entry["delivered_above"]
                if isinstance(upto, bool) or not isinstance(upto, int) or upto < 0:
                    raise ValueError(f"{name}: upto is not a seq")
                if not isinstance(above, list) or not all(
                    isinstance(s, int) and not isinstance(s, bool) and s > upto for s in above
                ):
                    raise ValueError(f"{name}: delivered_above is not a list of seqs above upto")
                states[name] = CursorState(upto, tuple(sorted(above)), _read_mark(name, entry))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CursorFileError(f"{self.path}: not a webhook cursor file ({exc})") from None
        return states

    def _write(self, states: dict[str, CursorState]) -> None:
        with self._write_lock:
            created = not self.path.exists()
            self.directory.mkdir(parents=True, exist_ok=True)
            body = orjson.dumps(
                {
                    "version": FILE_VERSION,
                    "webhooks": {name: _entry(st) for name, st in sorted(states.items())},
                }
            )
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            if created:
                # The first file must survive a crash (a lost one would restart every
                # webhook at the log's end). A later rename that a crash undoes leaves
                # the previous, whole cursors: older, never wrong.
                fsync_dir(self.directory)

    async def load(self, name: str) -> CursorState | None:
        """Raises :class:`CursorFileError` for a file that is not a cursor file."""
        if self._saved is None:
            self._saved = await asyncio.to_thread(self._read)
        pending = self._pending.get(name)
        return pending if pending is not None else self._saved.get(name)

    async def forget(self, configured: Collection[str]) -> list[str]:
        """Remove the entries of webhooks not in ``configured``, durably (one write now,
        none when there is nothing to remove); the names removed. Called at start, before
        the first :meth:`save` (a group write in flight would put them back).
        Raises :class:`CursorFileError` for a file that is not a cursor file.

        Cancellation: the file holds the old entries or the new ones, never torn ones.
        """
        if self._flush is not None or self._pending:
            raise RuntimeError("forget() is for the start, before any save")
        if self._saved is None:
            self._saved = await asyncio.to_thread(self._read)
        gone = sorted(name for name in self._saved if name not in configured)
        if gone:
            kept = {name: st for name, st in self._saved.items() if name in configured}
            await asyncio.to_thread(self._write, kept)
            self._saved = kept
        return gone

    async def save(self, name: str, state: CursorState) -> None:
        """Durable when it returns (the next group write; see the class doc).

        Cancellation: the state is still written with its group; the caller only stops
        waiting for it.
        """
        if self._saved is None:
            self._saved = await asyncio.to_thread(self._read)
        self._pending[name] = state
        if self._flush is None:
            self._flush = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().create_task(self._write_group(), name="webhook-cursors")
        await asyncio.shield(self._flush)

    async def _write_group(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self._last_write + self._flush_interval_s - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)  # the group-commit window
        flush, self._flush = self._flush, None
        batch, self._pending = self._pending, {}
        assert flush is not None and self._saved is not None
        merged = {**self._saved, **batch}
        try:
            await asyncio.to_thread(self._write, merged)
        except Exception as exc:
            self._pending = {**batch, **self._pending}  # kept for the next group
            flush.set_exception(exc)
            flush.exception()  # retrieved: a waiter that gave up must not warn
        else:
            self._saved = merged
            flush.set_result(None)
        finally:
            self._last_write = loop.time()
            if not flush.done():  # this task was cancelled (the loop is closing)
                flush.cancel()


async def forget_unconfigured(store: FileCursorStore, configured: Collection[str]) -> None:
    """:meth:`FileCursorStore.forget`, each removed name logged."""
    for name in await store.forget(configured):
        logger.warning(
            "webhook %s: no longer configured: its cursor is removed (configured again, "
            "it starts at the log's end)",
            name,
        )


class DeliveryLedger:
    """The in-memory cursor of one webhook (module doc). Loop-only, one owner."""

    def __init__(self, state: CursorState, scanned: int, max_ahead: int = DEFAULT_MAX_AHEAD):
        self.upto = state.upto
        self.disabled = state.disabled
        """The 410 mark, saved with the cursor (:meth:`disable`)."""
        self.scanned = max(scanned, state.upto)
        self.max_ahead = max_ahead
        self._above: set[int] = set(state.delivered_above)
        self._floors: dict[str, int] = {}
        self._after: dict[str, int] = {}
        self.unrecorded = 0
        """Deliveries above ``upto`` not recorded because ``delivered_above`` was full."""
        self.changes = 0
        """Bumped whenever the durable state changes (the saver compares it)."""

    # ------------------------------------------------------------------ queries

    @property
    def pending(self) -> int:
        """Runs named by the feed and not yet read to the end."""
        return len(self._floors)

    def is_pending(self, run_id: str) -> bool:
        return run_id in self._floors

    def read_from(self, run_id: str) -> int:
        """The seq after which the run's events are still to be looked at."""
        return max(self._after.get(run_id, 0), self.upto)

    def already_delivered(self, seq: int) -> bool:
        """Delivered before (a restart re-reads it): skip it."""
        return seq <= self.upto or seq in self._above

    def state(self) -> CursorState:
        """The durable form, now."""
        return CursorState(self.upto, tuple(sorted(self._above)), self.disabled)

    # ------------------------------------------------------------------ changes

    def named(self, run_ids: set[str], upto: int) -> list[str]:
        """The feed named these runs, and every event up to ``upto`` is in one of them or
        in a run named before. Returns the runs that became pending."""
        fresh = []
        for run_id in run_ids:
            if run_id not in self._floors:
                self._floors[run_id] = self.read_from(run_id)
                fresh.append(run_id)
        if upto > self.scanned:
            self.scanned = upto
        self._advance()
        return fresh

    def holding(self, run_id: str, seq: int) -> None:
        """The run's next undone event is ``seq`` (everything of it before is done)."""
        self._floors[run_id] = seq - 1
        self._advance()

    def passed(self, run_id: str, seq: int) -> None:
        """The run's events up to ``seq`` are done without a delivery (not wanted, or
        delivered before a restart)."""
        self._after[run_id] = seq
        self._floors[run_id] = seq
        self._advance()

    def delivered(self, run_id: str, seq: int) -> None:
        """The run's event ``seq`` got a 2xx."""
        self._after[run_id] = seq
        self._floors[run_id] = seq
        if seq > self.upto:
            if len(self._above) < self.max_ahead:
                self._above.add(seq)
                self.changes += 1
            else:
                self.unrecorded += 1
        self._advance()

    def disable(self, mark: DisabledMark | None) -> None:
        """Set (410) or clear (another URL configured) the durable 410 mark."""
        if mark != self.disabled:
            self.disabled = mark
            self.changes += 1

    def caught_up(self, run_id: str) -> None:
        """The run was read to the end: it no longer holds the cursor back."""
        self._floors.pop(run_id, None)
        self._advance()

    def _advance(self) -> None:
        upto = min(self._floors.values(), default=self.scanned)
        upto = min(upto, self.scanned)
        if upto <= self.upto:
            return
        self.upto = upto
        self.changes += 1
        if self._above:
            self._above = {s for s in self._above if s > upto}
        self._after = {r: s for r, s in self._after.items() if s > upto}
