"""Node leases: who is alive, who owns which runs, and who interrupts a dead node's runs.

Rules:

- **A lease** is a ``whip_nodes`` row (node id, host, pid, start time, advertise URL, live
  session count) whose ``lease_expires_at`` is set by the *store's* clock to now +
  ``lease_s``; node clocks never meet. Each acquisition takes a new ``epoch`` from the
  ``whip_node_epochs`` sequence; every write of the node carries it
  (:func:`registry.pg.batches.check_lease`).
- **Renewal** (task ``whip-pg-lease``) is sent ``lease_s / 6`` after the last successful
  one was sent; each attempt is bounded by ``lease_s / 6`` and a failed one is retried
  ``lease_s / 24`` later, so three attempts (two of them on a fresh connection) fit in
  the ``lease_s / 2`` before the fence below: one or two slow or lost renewals never
  fence a node by themselves. A renewal sent at local time *t* that
  succeeds proves the lease lasts until at least *t* + ``lease_s`` in real time (the
  store set the expiry after *t*).
- **Self-fencing**: a timer is armed at *t* + ``2 * lease_s / 3`` after each successful
  renewal sent at *t*. If it fires (every attempt in that window failed, or the loop was
  paused),
  the node stops owning *before* its lease can expire: :meth:`writer` answers None (every
  append is refused), then ``on_fenced`` runs (the server closes its sessions with reason
  ``fenced`` and answers pushes with 503). The renew loop then tries to acquire a new lease;
  on success ``on_acquired`` runs.
- **Reaping** (after each renewal, by a node that holds a lease, on a pooled connection
  and bounded by ``lease_s / 6`` on its own: a slow or failed reap is logged and never
  counts against the lease, whose connection does renewals only): one transaction per dead
  node locks its row ``FOR UPDATE SKIP LOCKED``, appends one ``run_interrupted``
  ``{"reason": "node_lost", "node": id}`` to each of its active runs, releases its stream
  slot reservations and deletes the row. The row lock and its deletion make the survivor
  that does it the only one: exactly one ``run_interrupted`` per run.
- **Acquisition** interrupts what an earlier epoch of the same node id still owns (a
  restarted process: ``server_restart``; a re-acquire after fencing: ``node_lost``) and
  releases the reservations of those epochs, in the same transaction that writes the new
  lease (a push admitted under an old epoch then fails at ``run_created``, see
  :mod:`registry.pg.committer`). A run a
  survivor already interrupted is no longer active: nothing is interrupted twice.
  A *re-acquire* (after this process was fenced) takes the row only if its lease expired
  or the row is still this process's own (same host, pid and start time): a process whose
  id a newer incarnation took over (a restart while this one was paused) never takes it
  back while that one's lease holds (:class:`LeaseTakenError`, retried like a failed
  renewal), so it cannot interrupt the newer incarnation's live runs.
- **Leaving**: :meth:`close` deletes the row only after the server closed its sessions
  (the caller's order), so a clean stop reaps nothing.

Cancellation: :meth:`close` cancels the renew task; a transaction in flight rolls back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from registry.errors import RegistryError
from registry.events import Event, EventType, NewEvent
from registry.pg.batches import FencedError, Writer, check_lease, write_batch
from registry.pg.committer import CONNECTION_ERRORS

logger = logging.getLogger(__name__)

ACTIVE_STATES_SQL = "('starting', 'live', 'stopping')"


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What a lease row says about its node."""

    node_id: str
    advertise_url: str
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    started_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One live node, as ``GET /v1/nodes`` shows it."""

    node_id: str
    advertise_url: str
    host: str
    pid: int
    started_ms: int
    lease_expires_ms: int
    sessions: int
    epoch: int

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.node_id,
            "advertise_url": self.advertise_url,
            "host": self.host,
            "pid": self.pid,
            "started_ms": self.started_ms,
            "lease_expires_ms": self.lease_expires_ms,
            "sessions": self.sessions,
        }


def _interrupt(run_id: str, principal: str, reason: str, node_id: str) -> NewEvent:
    return NewEvent(
        run_id, EventType.RUN_INTERRUPTED, principal, {"reason": reason, "node": node_id}
    )


class LeaseTakenError(RegistryError):
    """A re-acquire found this node id held by another live incarnation (module rules)."""

    http_status = 503
    code = "node_fenced"


class NodeLease:
    """This node's lease, its renewal, self-fencing, and the reaping of dead nodes."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        identity: NodeIdentity,
        lease_s: float,
        *,
        on_durable: Callable[[list[Event]], None],
        on_fenced: Callable[[], Coroutine[Any, Any, None]] | None = None,
        on_acquired: Callable[[], Awaitable[None]] | None = None,
        sessions: Callable[[], int] | None = None,
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self._pool = pool
        self._connect = connect
        self._conn: asyncpg.Connection | None = None
        self.identity = identity
        self.lease_s = lease_s
        self._on_durable = on_durable
        self._on_fenced = on_fenced
        self._on_acquired = on_acquired
        self.count_sessions: Callable[[], int] = sessions or (lambda: 0)
        """Live sessions of this node (written into the lease row at each renewal)."""
        self._writer: Writer | None = None
        self._fence_timer: asyncio.TimerHandle | None = None
        self._renewed_at: float | None = None
        """Monotonic send time of the last successful acquisition or renewal."""
        self._task: asyncio.Task[None] | None = None
        self._acquired_before = False
        self.renewals = 0
        self.renewal_failures = 0
        self.reap_failures = 0
        self.fenced_count = 0
        self.reaped_runs = 0
        self.live_nodes = 0

    def writer(self) -> Writer | None:
        """The epoch this node may write under now, or None while it holds no lease."""
        return self._writer

    @property
    def held(self) -> bool:
        return self._writer is not None

    async def _connection(self) -> asyncpg.Connection:
        """The lease's own connection: renewals never queue behind the pool's users."""
        if self._conn is None or self._conn.is_closed():
            self._conn = await self._connect()
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    # ------------------------------------------------------------------ acquire

    async def acquire(self) -> list[Event]:
        """Take a new lease (new epoch); returns the ``run_interrupted`` it appended for the
        runs an earlier epoch of this node id left active. Raises on a store error."""
        ident = self.identity
        reason = "node_lost" if self._acquired_before else "server_restart"
        sent = time.monotonic()
        conn = await self._connection()
        async with conn.transaction():
            epoch = int(await conn.fetchval("SELECT nextval('whip_node_epochs')"))
            taken = await conn.fetchval(
                "INSERT INTO whip_nodes (node_id, epoch, host, pid, started_ms, advertise_url,"
                " lease_expires_at, sessions) VALUES ($1, $2, $3, $4, $5, $6,"
                " clock_timestamp() + make_interval(secs => $7), $8)"
                " ON CONFLICT (node_id) DO UPDATE SET epoch = EXCLUDED.epoch,"
                " host = EXCLUDED.host, pid = EXCLUDED.pid, started_ms = EXCLUDED.started_ms,"
                " advertise_url = EXCLUDED.advertise_url,"
                " lease_expires_at = EXCLUDED.lease_expires_at, sessions = EXCLUDED.sessions"
                # A re-acquire never takes the id from another live incarnation (rules).
                " WHERE NOT $9::bool OR whip_nodes.lease_expires_at <= clock_timestamp()"
                " OR (whip_nodes.host, whip_nodes.pid, whip_nodes.started_ms)"
                " = (EXCLUDED.host, EXCLUDED.pid, EXCLUDED.started_ms)"
                " RETURNING 1",
                ident.node_id,
                epoch,
                ident.host,
                ident.pid,
                ident.started_ms,
                ident.advertise_url,
                self.lease_s,
                self.count_sessions(),
                self._acquired_before,
            )
            if taken is None:
                holder = await conn.fetchrow(
                    "SELECT host, pid, epoch FROM whip_nodes WHERE node_id = $1", ident.node_id
                )
                raise LeaseTakenError(
                    f"node id {ident.node_id} is held by a newer live incarnation"
                    f" (host {holder['host'] if holder else '?'},"
                    f" pid {holder['pid'] if holder else '?'}): not taken back until its"
                    " lease expires"
                )
            writer = Writer(ident.node_id, epoch)
            left = await conn.fetch(
                "SELECT run_id, principal FROM whip_runs WHERE node_id = $1 AND node_epoch < $2"
                f" AND stream_state IN {ACTIVE_STATES_SQL} ORDER BY run_id FOR UPDATE",
                ident.node_id,
                epoch,
            )
            durable: list[Event] = []
            if left:
                events = [
                    _interrupt(r["run_id"], r["principal"], reason, ident.node_id) for r in left
                ]
                durable = await write_batch(conn, writer, events)
            await conn.execute(
                "DELETE FROM whip_stream_slots WHERE node_id = $1 AND epoch < $2",
                ident.node_id,
                epoch,
            )
        self._acquired_before = True
        self._writer = writer
        self._arm_fence(sent)
        logger.info(
            "node %s: lease acquired, epoch %d (%d runs of an earlier epoch interrupted)",
            ident.node_id,
            epoch,
            len(durable),
        )
        if durable:
            self._on_durable(durable)
        return durable

    # ------------------------------------------------------------------ fencing

    def _arm_fence(self, sent: float) -> None:
        self._renewed_at = sent
        loop = asyncio.get_running_loop()
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        fence_at = loop.time() - (time.monotonic() - sent) + 2 * self.lease_s / 3
        self._fence_timer = loop.call_at(fence_at, self._fence, "renewal overdue")

    def _fence(self, why: str) -> None:
        if self._writer is None:
            return
        logger.error(
            "node %s: fenced (%s): epoch %d ends, sessions close, pushes refused",
            self.identity.node_id,
            why,
            self._writer.epoch,
        )
        self._writer = None
        self.fenced_count += 1
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None
        if self._on_fenced is not None:
            asyncio.get_running_loop().create_task(self._on_fenced(), name="whip-pg-fenced")

    # ------------------------------------------------------------------ renew loop

    def start(self) -> None:
        """Start renewing (after :meth:`acquire`)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="whip-pg-lease")

    def next_attempt_in(self, failed: bool) -> float:
        """Seconds until the next renewal attempt (module doc, "Renewal")."""
        if self._writer is None:  # fenced: a new lease is tried at the renewal pace
            return self.lease_s / 3
        if failed or self._renewed_at is None:
            return self.lease_s / 24
        return max(0.0, self._renewed_at + self.lease_s / 6 - time.monotonic())

    async def _run(self) -> None:
        failed = False
        while True:
            await asyncio.sleep(self.next_attempt_in(failed))
            try:
                async with asyncio.timeout(self.lease_s / 6):
                    await self._tick()
                failed = False
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, LeaseTakenError) as exc:
                failed = True
                self.renewal_failures += 1
                self._drop_connection()
                logger.warning("node %s: lease renewal failed: %r", self.identity.node_id, exc)
                continue
            try:
                async with asyncio.timeout(self.lease_s / 6):
                    await self.reap()
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, FencedError) as exc:
                self.reap_failures += 1
                logger.warning("node %s: reaping dead nodes failed: %r", self.identity.node_id, exc)

    async def _tick(self) -> None:
        if self._writer is None:
            await self.acquire()
            if self._on_acquired is not None:
                await self._on_acquired()
        else:
            await self.renew()

    async def renew(self) -> bool:
        """One renewal; False (and fenced) when the store says the lease is gone."""
        writer = self._writer
        if writer is None:
            return False
        sent = time.monotonic()
        conn = await self._connection()
        renewed = await conn.fetchval(
            "UPDATE whip_nodes SET lease_expires_at = clock_timestamp()"
            " + make_interval(secs => $3), sessions = $4"
            " WHERE node_id = $1 AND epoch = $2 AND lease_expires_at > clock_timestamp()"
            " RETURNING 1",
            writer.node_id,
            writer.epoch,
            self.lease_s,
            self.count_sessions(),
        )
        if renewed is None:
            self._fence("the store no longer holds this epoch's lease")
            return False
        took = time.monotonic() - sent
        if took > self.lease_s / 12:
            logger.warning(
                "node %s: lease renewal took %.2f s (lease %g s)",
                writer.node_id,
                took,
                self.lease_s,
            )
        if self._writer == writer:
            self.renewals += 1
            self._arm_fence(sent)
        return True

    async def reap(self) -> list[Event]:
        """Interrupt the runs of every dead node this node can claim; returns the events."""
        writer = self._writer
        if writer is None:
            return []
        reaped: list[Event] = []
        async with self._pool.acquire() as conn:
            return await self._reap_on(conn, writer, reaped)

    async def _reap_on(
        self, conn: asyncpg.Connection, writer: Writer, reaped: list[Event]
    ) -> list[Event]:
        while True:
            async with conn.transaction():
                await check_lease(conn, writer)
                dead = await conn.fetchval(
                    "SELECT node_id FROM whip_nodes WHERE lease_expires_at < clock_timestamp()"
                    " AND node_id <> $1 LIMIT 1 FOR UPDATE SKIP LOCKED",
                    writer.node_id,
                )
                if dead is None:
                    self.live_nodes = int(await conn.fetchval("SELECT count(*) FROM whip_nodes"))
                    break
                runs = await conn.fetch(
                    "SELECT run_id, principal FROM whip_runs WHERE node_id = $1"
                    f" AND stream_state IN {ACTIVE_STATES_SQL} ORDER BY run_id FOR UPDATE",
                    dead,
                )
                events = [_interrupt(r["run_id"], r["principal"], "node_lost", dead) for r in runs]
                durable = await write_batch(conn, writer, events) if events else []
                await conn.execute("DELETE FROM whip_stream_slots WHERE node_id = $1", dead)
                await conn.execute("DELETE FROM whip_nodes WHERE node_id = $1", dead)
            logger.warning(
                "node %s: node %s lost its lease: %d runs interrupted",
                writer.node_id,
                dead,
                len(durable),
            )
            self.reaped_runs += len(durable)
            if durable:
                self._on_durable(durable)
            reaped.extend(durable)
        return reaped

    async def nodes(self) -> list[NodeInfo]:
        """Live nodes (unexpired leases), by id (a store error propagates)."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT node_id, advertise_url, host, pid, started_ms, sessions, epoch,"
                " (extract(epoch FROM lease_expires_at) * 1000)::bigint AS expires_ms"
                " FROM whip_nodes WHERE lease_expires_at > clock_timestamp() ORDER BY node_id"
            )
        return [
            NodeInfo(
                r["node_id"],
                r["advertise_url"],
                r["host"],
                r["pid"],
                r["started_ms"],
                r["expires_ms"],
                r["sessions"],
                r["epoch"],
            )
            for r in rows
        ]

    async def close(self, leave: bool = True) -> None:
        """Stop renewing; with ``leave``, delete this node's lease row (clean stop)."""
        if self._fence_timer is not None:
            self._fence_timer.cancel()
            self._fence_timer = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        writer, self._writer = self._writer, None
        if leave and writer is not None:
            try:
                async with self._pool.acquire() as conn:
                    await conn.execute(
                        "DELETE FROM whip_nodes WHERE node_id = $1 AND epoch = $2",
                        writer.node_id,
                        writer.epoch,
                    )
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                logger.warning("node %s: could not leave cleanly: %r", writer.node_id, exc)
        self._drop_connection()
