"""The cluster timeline: the registry's interface over PostgreSQL, for one node of many.

What lives where: runs, events, deletion state, stream-slot reservations and node leases
are rows in the store; this object keeps only the node's connections, its lease
(:mod:`registry.pg.leases`), its group commit (:mod:`registry.pg.committer`), its LISTEN
link (:mod:`registry.pg.listener`) and the long-poll waiters. Nothing here is a cache: every
read asks the store, so every node answers the same.

Rules:

- **Appends**: :meth:`append` (lifecycle, kept until durable) and :meth:`append_nowait`
  (analyzers, bounded, dropped and counted past the bound) go through the group commit;
  a seq is returned only after COMMIT. Both are refused while the node holds no lease.
- **Deletion** (:meth:`delete_run`) is one transaction that locks the run's row: the first
  one to lock it appends ``run_deleted`` and records it on the row; every later one, on
  any node, finds it recorded and gets a synthesized answer (same seq, never persisted).
- **Stream slots** (:meth:`reserve_slot`): one transaction locks the principal's row in
  ``whip_principals``, counts its active runs plus its reservations, and inserts a
  reservation only below the limit. Every node serializes on that row: the limit is exact
  cluster-wide. ``run_created`` consumes its reservation in its own transaction
  (:meth:`append` with ``reservation``): it commits only if the reservation still exists,
  so a reservation released meanwhile (its node's lease ended) can never become a run
  too. Otherwise the reservation is released when the push fails, or with its lease.
- **Expiry** is derived at read time, as on the embedded registry: a starting/live run whose
  ``last_activity_ms`` (its newest event's time, moved forward by every event: stats are
  the keepalive) is older than ``stream_ttl_s`` reads ``expired`` and holds no stream slot;
  nothing writes it, and the next event reverses it. "Now" is the reading node's clock
  (node clocks agree within NTP's error).
- **Retention**: a deletion this node wins asks for a sweep of deleted runs past
  ``deleted_retention`` (:mod:`registry.pg.retention`, one node at a time).
- **Reads** go to the store in ``(run_id, seq)`` order; **long-polls** register, read, wait
  for a NOTIFY (or the listener's reconnect), read again (:mod:`registry.pg.listener`).
- **Control**: :meth:`request_close` NOTIFYs the run's owner; the owner's ``on_control``
  callback closes the session. After a LISTEN reconnect the owner's ``on_recheck`` runs
  (re-read what it owns), so a notification lost in the gap cannot leave a session running.

Cancellation: reads and deletes run in one statement or transaction; a cancelled caller
rolls its transaction back. See :mod:`registry.pg.committer` for appends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple

import asyncpg
import orjson

from registry.deletion import DeleteResult, synthesize_repeat
from registry.errors import NonBlockingDeleteError, UnknownRunError
from registry.events import Event, EventType, NewEvent, now_ms
from registry.histogram import LATENCY_S, Histogram
from registry.pg.batches import (
    FencedError,
    StoreUnavailableError,
    Writer,
    check_lease,
    write_batch,
)
from registry.pg.committer import CONNECTION_ERRORS, DEFAULT_BUFFER_LIMIT, GroupCommitter
from registry.pg.leases import ACTIVE_STATES_SQL, NodeIdentity, NodeInfo, NodeLease
from registry.pg.listener import CONTROL_CHANNEL, StoreListener, control_payload
from registry.pg.retention import DeletedRunRetention
from registry.pg.run_rows import RUN_COLUMNS, RunsPage, holds_slot_sql, run_from_row, state_sql
from registry.pg.schema import migrate
from registry.runs import DEFAULT_DELETED_RETENTION, ClaimKind, RunView
from registry.timeline import check_cursor
from registry.waiters import WaitHub, long_poll

logger = logging.getLogger(__name__)

STORE_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, asyncpg.PostgresError)


class SessionOwner(NamedTuple):
    """Where a session lives: its node, and that node's URL while its lease holds."""

    node_id: str
    advertise_url: str | None


@dataclass(frozen=True, slots=True)
class ClusterTimelineConfig:
    """What a node needs to join the cluster; ARCHITECTURE.md "Cluster mode"."""

    store: str
    node_id: str
    advertise_url: str
    lease_s: float = 10.0
    buffer_limit: int = DEFAULT_BUFFER_LIMIT
    pool_size: int = 8
    deleted_retention: int = DEFAULT_DELETED_RETENTION
    """Deleted runs kept for idempotency (:mod:`registry.pg.retention`)."""
    stream_ttl_s: float = 0.0
    """A starting/live run silent this long reads ``expired`` and holds no slot (0: never)."""


def _event_from_row(row: asyncpg.Record) -> Event:
    return Event(
        row["seq"], row["run_id"], row["type"], row["ts_ms"], row["principal"],
        orjson.loads(row["data"]),
    )  # fmt: skip


class ClusterTimeline:
    """One node's face of the cluster store (see the module rules)."""

    def __init__(self, config: ClusterTimelineConfig, pool: asyncpg.Pool) -> None:
        self.config = config
        self._pool = pool
        self.waiters = WaitHub()
        self.identity = NodeIdentity(config.node_id, config.advertise_url)
        self._on_control: Callable[[str, str], None] | None = None
        self._on_recheck: Callable[[], Awaitable[None]] | None = None
        self.lease = NodeLease(
            pool,
            self._connect,
            self.identity,
            config.lease_s,
            on_durable=self._after_durable,
            on_fenced=self._fenced,
            on_acquired=self._acquired,
        )
        self.committer = GroupCommitter(
            self._connect,
            self.lease.writer,
            self._after_durable,
            node_id=config.node_id,
            buffer_limit=config.buffer_limit,
        )
        self.listener = StoreListener(
            self._connect,
            config.node_id,
            self.waiters,
            on_control=self._control,
            on_reconnect=self._recheck,
        )
        self.retention = DeletedRunRetention(pool, config.deleted_retention, config.node_id)
        self.round_trip = Histogram(LATENCY_S)
        """Seconds of one read round trip to the store."""
        self.interrupted: list[str] = []
        self._fence_hooks: list[Callable[[], Awaitable[None]]] = []
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    @contextlib.asynccontextmanager
    async def _store(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; the store out of reach is :class:`StoreUnavailableError`
        (503), never a bare driver error."""
        try:
            async with self._pool.acquire() as conn:
                yield conn
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError("the cluster store is unreachable") from exc

    async def _connect(self) -> asyncpg.Connection:
        conn: asyncpg.Connection = await asyncpg.connect(self.config.store, timeout=5.0)
        return conn

    @classmethod
    async def open(cls, config: ClusterTimelineConfig) -> ClusterTimeline:
        """Connect, migrate the schema, take the lease (interrupting what an earlier
        incarnation of this node id left live), start committing, listening, renewing.

        Raises :class:`SchemaTooNewError`, or the store's error when it is unreachable.
        """
        pool = await asyncpg.create_pool(
            config.store, min_size=1, max_size=config.pool_size, timeout=5.0
        )
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
            timeline = cls(config, pool)
            await timeline.listener.start()
            interrupted = await timeline.lease.acquire()
        except BaseException:
            await pool.close()
            raise
        timeline.interrupted = [event.run_id for event in interrupted]
        timeline.committer.start()
        timeline.lease.start()
        return timeline

    async def aclose(self) -> None:
        """Drain appends, leave the cluster (delete the lease row), close; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.retention.close()
        await self.committer.close()
        await self.lease.close(leave=True)
        await self.listener.close()
        await self._pool.close()

    def set_owner_hooks(
        self,
        on_control: Callable[[str, str], None],
        on_recheck: Callable[[], Awaitable[None]],
        on_fenced: Callable[[], Awaitable[None]],
        sessions: Callable[[], int] | None = None,
    ) -> None:
        """What the server does as a run owner: close a session on request
        (``on_control(action, run_id)``), re-check owned runs after a reconnect, close
        everything when fenced; ``sessions`` counts its live sessions (the lease row's)."""
        self._on_control = on_control
        self._on_recheck = on_recheck
        self._fence_hooks.append(on_fenced)
        if sessions is not None:
            self.lease.count_sessions = sessions

    def _control(self, action: str, run_id: str) -> None:
        if self._on_control is not None:
            self._on_control(action, run_id)

    async def _recheck(self) -> None:
        if self._on_recheck is not None:
            await self._on_recheck()

    async def _fenced(self) -> None:
        for hook in self._fence_hooks:
            await hook()

    async def _acquired(self) -> None:
        await self._recheck()

    def _expired_before(self) -> int | None:
        """Now minus the stream TTL (this node's clock), or None without a TTL."""
        ttl_ms = int(self.config.stream_ttl_s * 1000)
        return now_ms() - ttl_ms if ttl_ms > 0 else None

    def _after_durable(self, events: list[Event]) -> None:
        self.waiters.notify({event.run_id for event in events})

    @property
    def ready(self) -> bool:
        """Holds a lease and is not closed (``/readyz``)."""
        return self.lease.held and not self._closed

    # ------------------------------------------------------------------ appends

    def append(self, event: NewEvent, reservation: str | None = None) -> asyncio.Future[int]:
        """Lifecycle append: ``seq = await timeline.append(event)`` once committed; with
        ``reservation`` (a ``run_created``), committed only together with consuming it
        (:class:`SlotLostError` when it no longer exists)."""
        return self.committer.append(event, reservation)

    def append_nowait(self, event: NewEvent) -> concurrent.futures.Future[int]:
        """Analyzer append from any thread (see :class:`GroupCommitter`)."""
        if event.type == EventType.RUN_DELETED:
            raise NonBlockingDeleteError("run_deleted must go through delete_run")
        return self.committer.append_nowait(event)

    def _writer_or_fenced(self) -> Writer:
        writer = self.lease.writer()
        if writer is None:
            raise FencedError("this node holds no lease")
        return writer

    async def delete_run(
        self, run_id: str, principal: str, data: dict[str, object] | None = None
    ) -> DeleteResult:
        """Single-winner deletion across nodes (module rules). Raises
        :class:`StoreUnavailableError` (503) when the store cannot be reached."""
        writer = self._writer_or_fenced()
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await check_lease(conn, writer)
                inserted = await conn.fetchval(
                    "INSERT INTO whip_runs (run_id, principal, created_ms, last_activity_ms)"
                    " VALUES ($1, $2, $3, $3) ON CONFLICT (run_id) DO NOTHING RETURNING 1",
                    run_id,
                    principal,
                    now_ms(),
                )
                row = await conn.fetchrow(
                    "SELECT principal, deleted_seq, deleted_ts_ms, deleted_principal,"
                    " deleted_data FROM whip_runs WHERE run_id = $1 FOR UPDATE",
                    run_id,
                )
                if row["deleted_seq"] is not None:
                    original = Event(
                        row["deleted_seq"], run_id, EventType.RUN_DELETED, row["deleted_ts_ms"],
                        row["deleted_principal"], orjson.loads(row["deleted_data"]),
                    )  # fmt: skip
                    return DeleteResult(
                        synthesize_repeat(original, principal), ClaimKind.ALREADY_DELETED
                    )
                event = NewEvent(run_id, EventType.RUN_DELETED, row["principal"], dict(data or {}))
                (durable,) = await write_batch(conn, writer, [event])
                await conn.execute(
                    "UPDATE whip_runs SET deleted_seq = $2, deleted_ts_ms = $3,"
                    " deleted_principal = $4, deleted_data = $5::text::jsonb WHERE run_id = $1",
                    run_id,
                    durable.seq,
                    durable.ts_ms,
                    durable.principal,
                    orjson.dumps(durable.data).decode(),
                )
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError("the cluster store is unreachable") from exc
        self._after_durable([durable])
        self.retention.request()
        return DeleteResult(durable, ClaimKind.MISSING if inserted else ClaimKind.CLAIMED)

    # ------------------------------------------------------------------ stream slots

    async def reserve_slot(self, principal: str, limit: int) -> str | None:
        """A stream-slot reservation id, or None when ``principal`` is at ``limit``."""
        writer = self._writer_or_fenced()
        reservation = uuid.uuid4().hex
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await check_lease(conn, writer)
                await conn.execute(
                    "INSERT INTO whip_principals (principal) VALUES ($1) ON CONFLICT DO NOTHING",
                    principal,
                )
                await conn.execute(
                    "SELECT 1 FROM whip_principals WHERE principal = $1 FOR UPDATE", principal
                )
                held = await conn.fetchval(
                    "SELECT (SELECT count(*) FROM whip_runs WHERE principal = $1"
                    f" AND {holds_slot_sql('$2::bigint')})"
                    " + (SELECT count(*) FROM whip_stream_slots WHERE principal = $1)",
                    principal,
                    self._expired_before(),
                )
                if held >= limit:
                    return None
                await conn.execute(
                    "INSERT INTO whip_stream_slots (reservation_id, principal, node_id, epoch,"
                    " created_ms) VALUES ($1, $2, $3, $4, $5)",
                    reservation,
                    principal,
                    writer.node_id,
                    writer.epoch,
                    now_ms(),
                )
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError("the cluster store is unreachable") from exc
        return reservation

    async def release_slot(self, reservation: str) -> None:
        """Drop a reservation (idempotent). A failure is logged: the node's lease
        releases it in the end."""
        try:
            async with self._pool.acquire() as conn:
                await conn.execute(
                    "DELETE FROM whip_stream_slots WHERE reservation_id = $1", reservation
                )
        except STORE_ERRORS as exc:
            logger.warning("stream slot %s not released yet: %r", reservation, exc)

    async def slots_in_use(self, principal: str | None = None) -> tuple[int, int]:
        """``(active runs, reservations)``, of one principal or of all."""
        async with self._store() as conn:
            row = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM whip_runs WHERE ($1::text IS NULL OR principal = $1)"
                f" AND {holds_slot_sql('$2::bigint')}) AS active,"
                " (SELECT count(*) FROM whip_stream_slots"
                " WHERE ($1::text IS NULL OR principal = $1)) AS reserved",
                principal,
                self._expired_before(),
            )
        return int(row["active"]), int(row["reserved"])

    # ------------------------------------------------------------------ reads

    async def get_run(self, run_id: str) -> RunView | None:
        """One run's metadata (one row read, independent of its history)."""
        started = time.monotonic()
        async with self._store() as conn:
            row = await conn.fetchrow(
                f"SELECT {RUN_COLUMNS} FROM whip_runs WHERE run_id = $1", run_id
            )
        self.round_trip.observe(time.monotonic() - started)
        return None if row is None else run_from_row(row, self._expired_before())

    async def list_runs(self, principal: str | None = None, *, limit: int = 1000) -> list[RunView]:
        """The newest ``limit`` runs of the whole cluster (optionally one principal's),
        newest first (:meth:`runs_page` pages over all of them)."""
        page = await self.runs_page(limit, principal=principal)
        return page.runs

    async def runs_page(
        self,
        limit: int,
        *,
        principal: str | None = None,
        stream: str | None = None,
        state: str | None = None,
        before: tuple[int, str] | None = None,
    ) -> RunsPage:
        """One page of the cluster's runs matching the filters (None: no filter), paged
        in the store; ``before`` is the previous page's last ``(created_ms, run_id)``.

        Keyset order ``(created_ms, run_id)`` descending, ``run_id`` compared bytewise
        (``COLLATE "C"``, the order Python gives the embedded registry's ids), so every run
        is on exactly one page however many there are, and runs created meanwhile never
        shift a page. The state filter is :func:`~registry.pg.run_rows.state_sql`, the SQL
        twin of :func:`~registry.pg.run_rows.run_from_row`. One statement, reading
        ``limit + 1`` rows at most (the extra row only tells whether there is a next page).
        """
        before_ms, before_id = before if before is not None else (None, None)
        expired_before = self._expired_before()
        started = time.monotonic()
        async with self._store() as conn:
            rows = await conn.fetch(
                f"SELECT {RUN_COLUMNS} FROM whip_runs"
                " WHERE ($1::text IS NULL OR principal = $1)"
                " AND ($2::text IS NULL OR stream = $2)"
                f" AND ($3::text IS NULL OR {state_sql('$7::bigint')} = $3)"
                ' AND ($4::bigint IS NULL OR (created_ms, run_id COLLATE "C")'
                ' < ($4, $5::text COLLATE "C"))'
                ' ORDER BY created_ms DESC, run_id COLLATE "C" DESC LIMIT $6',
                principal,
                stream,
                state,
                before_ms,
                before_id,
                limit + 1,
                expired_before,
            )
        self.round_trip.observe(time.monotonic() - started)
        runs = [run_from_row(row, expired_before) for row in rows[:limit]]
        return RunsPage(runs, more=len(rows) > limit)

    async def active_stream_runs(self, principal: str, stream: str) -> list[RunView]:
        """Active runs of ``principal`` on ``stream`` that *other* nodes own (the old
        sessions a reconnect supersedes)."""
        async with self._store() as conn:
            rows = await conn.fetch(
                f"SELECT {RUN_COLUMNS} FROM whip_runs WHERE principal = $1 AND stream = $2"
                f" AND stream_state IN {ACTIVE_STATES_SQL} AND deleted_seq IS NULL"
                " AND node_id <> $3",
                principal,
                stream,
                self.config.node_id,
            )
        return [run_from_row(row, self._expired_before()) for row in rows]

    async def owned_active_runs(self) -> list[RunView]:
        """Active runs this node owns (what it re-checks after a reconnect)."""
        async with self._store() as conn:
            rows = await conn.fetch(
                f"SELECT {RUN_COLUMNS} FROM whip_runs WHERE node_id = $1"
                f" AND stream_state IN {ACTIVE_STATES_SQL}",
                self.config.node_id,
            )
        return [run_from_row(row, self._expired_before()) for row in rows]

    async def read_events(self, run_id: str, after_seq: int = 0, limit: int = 100) -> list[Event]:
        """Events of ``run_id`` with ``seq > after_seq``, oldest first, at most ``limit``.

        Raises :class:`UnknownRunError`, :class:`InvalidCursorError`."""
        after_seq, limit = check_cursor(after_seq, limit)
        started = time.monotonic()
        async with self._store() as conn:
            rows = await conn.fetch(
                "SELECT run_id, seq, type, ts_ms, principal, data::text AS data FROM whip_events"
                " WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                run_id,
                after_seq,
                limit,
            )
            if not rows and not await conn.fetchval(
                "SELECT 1 FROM whip_runs WHERE run_id = $1", run_id
            ):
                raise UnknownRunError(f"unknown run {run_id!r}")
        self.round_trip.observe(time.monotonic() - started)
        return [_event_from_row(row) for row in rows]

    async def wait_for_events(
        self, run_id: str, after_seq: int, limit: int = 100, wait_s: float = 30.0
    ) -> list[Event]:
        """Long-poll on any node: events after ``after_seq``, waiting up to ``wait_s``.

        Cancellation: the waiter is unregistered; nothing else changes."""
        return await long_poll(
            self.waiters, run_id, lambda: self.read_events(run_id, after_seq, limit), wait_s
        )

    async def nodes(self) -> list[NodeInfo]:
        """Live nodes of the cluster."""
        try:
            return await self.lease.nodes()
        except CONNECTION_ERRORS as exc:
            raise StoreUnavailableError("the cluster store is unreachable") from exc

    async def session_owner(self, session_id: str) -> SessionOwner | None:
        """The node that took ``session_id`` (its URL None when its lease is gone), or
        None when no run of the cluster has that session."""
        async with self._store() as conn:
            row = await conn.fetchrow(
                "SELECT r.node_id, n.advertise_url FROM whip_runs r LEFT JOIN whip_nodes n"
                " ON n.node_id = r.node_id AND n.lease_expires_at > clock_timestamp()"
                " WHERE r.session_id = $1 ORDER BY r.created_ms DESC LIMIT 1",
                session_id,
            )
        return None if row is None else SessionOwner(row["node_id"], row["advertise_url"])

    async def node_url(self, node_id: str) -> str | None:
        """``node_id``'s advertise URL while its lease holds (by the store's clock), else
        None (the node is gone or never was)."""
        async with self._store() as conn:
            url: str | None = await conn.fetchval(
                "SELECT advertise_url FROM whip_nodes WHERE node_id = $1"
                " AND lease_expires_at > clock_timestamp()",
                node_id,
            )
        return url

    # ------------------------------------------------------------------ control

    async def request_close(self, run_id: str, action: str = "stop") -> str | None:
        """Tell the run's owner to close its session (NOTIFY); returns the owner, or None
        when the run has no owner or the owner is this node (the caller closes it)."""
        run = await self.get_run(run_id)
        if run is None or not run.node_id or run.node_id == self.config.node_id:
            return None
        async with self._store() as conn:
            await conn.execute(
                "SELECT pg_notify($1, $2)",
                CONTROL_CHANNEL,
                control_payload(run.node_id, action, run_id),
            )
        return run.node_id
