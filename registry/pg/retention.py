"""Deleted-run retention in the cluster store: the embedded registry's FIFO, cluster-wide.

The embedded registry (:mod:`registry.runs`) remembers the newest ``deleted_retention``
deleted runs for idempotency and evicts older ones (state, index, tail: the run reads as
unknown afterwards); a run whose workers can still emit is pinned until they stop. The
store does the same.

Rules:

- **What is kept**: the newest ``deleted_retention`` deleted runs by deletion time (then
  id, bytewise), and every run that is not deleted. An older deleted run is *evicted*: its
  events and its row are deleted in one transaction, so it reads as unknown on every node
  (404), and a later DELETE of it appends a fresh ``run_deleted`` as for an id never seen.
- **Pinned**: a deleted run still ``starting``/``live``/``stopping`` (its session may still
  be closing on its owner and emitting) is never evicted; once it ends or is interrupted,
  a later sweep takes it. It counts among the retained, as a pinned run does in the
  embedded FIFO.
- **Held for webhooks**: a deleted run that a webhook of the store has not finished (its
  cursor for the run, as :mod:`registry.pg.webhook_store` reads it, below the run's
  ``last_seq``) is not evicted either, unless that webhook is disabled (its 410 mark names
  its URL): eviction deletes the events, and a webhook promises every event at least once
  (the embedded WAL keeps every segment, so there nothing is ever out of reach). A receiver
  down for long holds every run deleted meanwhile, past the bound, until it catches up; a
  webhook removed from the configuration stops holding once it is forgotten. The check is
  read in the sweep's statement without locks: a cursor only moves forward, so a run it
  finds behind is at worst kept one sweep too long.
- **One node at a time**: a sweep runs in one transaction holding the transaction-scoped
  advisory lock :data:`RETENTION_LOCK_KEY` (``pg_try_advisory_xact_lock``); a node that
  finds it taken skips its sweep (the holder is sweeping). The rows to evict are locked
  ``FOR UPDATE SKIP LOCKED``: a run a batch is writing to right now is left for the next
  sweep rather than waited on.
- **When**: after each deletion this node wins (:meth:`DeletedRunRetention.request`),
  detached and coalesced (one sweep at a time per node, one more if asked meanwhile). A
  sweep evicts at most :data:`SWEEP_LIMIT` runs and sweeps again while it is full. A sweep
  skipped because another node held the lock, or one whose statement ran before a
  concurrent deletion committed, leaves at most that deletion over the bound until the
  next deletion's sweep.

Cancellation: :meth:`DeletedRunRetention.close` cancels a running sweep; its transaction
rolls back (nothing is half evicted).
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from registry.pg.leases import ACTIVE_STATES_SQL
from registry.pg.webhook_store import cursor_join_sql, done_sql

logger = logging.getLogger(__name__)

RETENTION_LOCK_KEY = 0x5748_4952  # "WHIR"
SWEEP_LIMIT = 1000

WEBHOOK_BEHIND_SQL = (
    f"SELECT 1 FROM whip_webhooks w{cursor_join_sql('w.name')}"
    " WHERE (w.disabled_url IS NULL OR w.disabled_url <> w.url)"
    f" AND {done_sql('w.name')} < r.last_seq"
)
"""A webhook that is not disabled has not finished the run row ``r`` (module rules)."""


async def evict_deleted(conn: asyncpg.Connection, keep: int, limit: int = SWEEP_LIMIT) -> list[str]:
    """One sweep (module rules): the ids evicted, or ``[]`` when another node is sweeping."""
    async with conn.transaction():
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", RETENTION_LOCK_KEY):
            return []
        beyond = await conn.fetch(
            "SELECT run_id FROM whip_runs WHERE deleted_seq IS NOT NULL"
            ' ORDER BY deleted_ts_ms DESC, run_id COLLATE "C" DESC OFFSET $1 LIMIT $2',
            keep,
            limit,
        )
        if not beyond:
            return []
        doomed: list[str] = [
            row["run_id"]
            for row in await conn.fetch(
                "SELECT run_id FROM whip_runs r WHERE run_id = ANY($1::text[])"
                f" AND (stream_state IS NULL OR stream_state NOT IN {ACTIVE_STATES_SQL})"
                f" AND NOT EXISTS ({WEBHOOK_BEHIND_SQL})"
                " ORDER BY run_id FOR UPDATE SKIP LOCKED",
                [row["run_id"] for row in beyond],
            )
        ]
        if len(doomed) < len(beyond):
            logger.debug(
                "retention: %d of %d deleted runs past %d kept (live, locked, or webhooks"
                " behind on them)",
                len(beyond) - len(doomed),
                len(beyond),
                keep,
            )
        if doomed:
            await conn.execute("DELETE FROM whip_events WHERE run_id = ANY($1::text[])", doomed)
            await conn.execute("DELETE FROM whip_runs WHERE run_id = ANY($1::text[])", doomed)
    return doomed


class DeletedRunRetention:
    """This node's sweeps (module rules); ``evicted`` counts the runs it evicted."""

    def __init__(self, pool: asyncpg.Pool, keep: int, node_id: str) -> None:
        self._pool = pool
        self.keep = keep
        self._node_id = node_id
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self.evicted = 0

    def request(self) -> None:
        """Sweep soon (detached; coalesced with a sweep already running)."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(
            self._sweeps(), name=f"whip-pg-retention-{self._node_id}"
        )

    async def sweep(self) -> list[str]:
        """One sweep now, then more while each is full; the ids this node evicted."""
        evicted: list[str] = []
        while True:
            async with self._pool.acquire() as conn:
                batch = await evict_deleted(conn, self.keep)
            evicted += batch
            self.evicted += len(batch)
            if batch:
                logger.info(
                    "node %s: %d deleted runs evicted (retention %d), oldest %s",
                    self._node_id,
                    len(batch),
                    self.keep,
                    batch[0],
                )
            if len(batch) < SWEEP_LIMIT:
                return evicted

    async def _sweeps(self) -> None:
        while True:
            self._again = False
            try:
                await self.sweep()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                logger.warning("node %s: retention sweep failed: %r", self._node_id, exc)
                return  # the next deletion sweeps again
            if not self._again:
                return

    async def close(self) -> None:
        """Cancel a running sweep (rolled back) and wait for it; idempotent."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
