"""One group commit into the cluster store: a batch of events in one transaction.

Rules, in the order the transaction applies them (:func:`write_batch`):

1. **Fence.** The writing node's lease row is read ``FOR KEY SHARE`` and must carry the
   node's epoch and an unexpired lease (by the store's clock). Otherwise nothing is written
   and :class:`FencedError` is raised: a node that was paused past its lease, or whose runs
   a survivor already reaped (which deletes the lease row), cannot write as owner. ``FOR KEY
   SHARE`` orders the batch against a reaper's ``FOR UPDATE`` and ``DELETE`` of the row, and
   not against the renewals' plain ``UPDATE`` (a busy node must still renew).
2. **Run rows.** A ``run_created`` inserts its run (owner = the writing node and epoch); any
   other event of a run never seen inserts a minimal row, as the embedded registry keeps one.
3. **Per-run order.** The batch's runs are locked ``FOR UPDATE`` in ``run_id`` order (one
   global lock order, so two nodes' batches cannot deadlock), then each event takes
   ``last_seq + 1`` of its run. The row lock is held until COMMIT, so a later transaction
   touching the same run takes its seqs only after this one committed: for every run,
   **commit order and seq order agree**, and a reader's cursor (the last seq it saw) can
   never be passed by an event that commits later with a smaller seq.
4. **State.** Stream states move by :func:`registry.runs.next_stream_state` (the one table);
   a move that is not allowed keeps the state and the event, as the embedded registry does.
5. **Events, batch row, NOTIFY.** The events, the node's ``whip_batches`` row (this
   batch's id and seqs, :func:`record_batch`) and
   one ``pg_notify('whip_events', run_id)`` per run; PostgreSQL delivers the notifications
   at COMMIT, never before, so a woken long-poller finds the events.

Exactly once: a batch whose COMMIT answer was lost (the connection dropped) is looked up by
its id (:func:`committed_seqs`) before it is written again.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import orjson

from registry.errors import RegistryError
from registry.events import Event, EventType, NewEvent
from registry.runs import InvalidTransitionError, StreamState, next_stream_state

EVENTS_CHANNEL = "whip_events"


class FencedError(RegistryError):
    """This node holds no valid lease (or an older epoch): it may not write as owner."""

    http_status = 503
    code = "node_fenced"


class StoreUnavailableError(RegistryError):
    """The cluster store cannot be reached right now; the cause is chained."""

    http_status = 503
    code = "store_unavailable"


@dataclass(frozen=True, slots=True)
class Writer:
    """Who writes a batch: the node and the lease epoch it holds."""

    node_id: str
    epoch: int


async def check_lease(conn: asyncpg.Connection, writer: Writer) -> None:
    """Rule 1 (inside the caller's transaction)."""
    held = await conn.fetchval(
        "SELECT 1 FROM whip_nodes WHERE node_id = $1 AND epoch = $2"
        " AND lease_expires_at > clock_timestamp() FOR KEY SHARE",
        writer.node_id,
        writer.epoch,
    )
    if held is None:
        raise FencedError(f"node {writer.node_id} epoch {writer.epoch} holds no valid lease")


async def committed_seqs(
    conn: asyncpg.Connection, node_id: str, batch_id: uuid.UUID
) -> list[int] | None:
    """The seqs the node's last batch assigned if that batch is ``batch_id``, else None
    (it never committed)."""
    seqs = await conn.fetchval(
        "SELECT seqs FROM whip_batches WHERE node_id = $1 AND batch_id = $2",
        node_id,
        batch_id,
    )
    return None if seqs is None else list(seqs)


def _dumps(data: object) -> str:
    return orjson.dumps(data).decode()


async def write_batch(
    conn: asyncpg.Connection,
    writer: Writer,
    events: Sequence[NewEvent],
) -> list[Event]:
    """Rules 2-5 for ``events`` (in order); the caller opened the transaction and ran
    :func:`check_lease`. Returns the durable events once the caller commits."""
    run_ids = sorted({ev.run_id for ev in events})
    created = {ev.run_id: ev for ev in events if ev.type == EventType.RUN_CREATED}
    first: dict[str, NewEvent] = {}
    for ev in events:
        first.setdefault(ev.run_id, ev)
    rows = [created.get(run_id) or first[run_id] for run_id in run_ids]
    await conn.execute(
        "INSERT INTO whip_runs (run_id, principal, stream, session_id, node_id, node_epoch,"
        " created_ms, last_activity_ms)"
        " SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],"
        " $6::bigint[], $7::bigint[], $7::bigint[]) ON CONFLICT (run_id) DO NOTHING",
        [ev.run_id for ev in rows],
        [ev.principal for ev in rows],
        [str(ev.data.get("stream", "")) if ev.type == EventType.RUN_CREATED else "" for ev in rows],
        [
            str(ev.data.get("session_id", "")) if ev.type == EventType.RUN_CREATED else ""
            for ev in rows
        ],
        [writer.node_id if ev.type == EventType.RUN_CREATED else "" for ev in rows],
        [writer.epoch if ev.type == EventType.RUN_CREATED else 0 for ev in rows],
        [ev.ts_ms for ev in rows],
    )
    locked = await conn.fetch(
        "SELECT run_id, last_seq, last_activity_ms, stream_state FROM whip_runs"
        " WHERE run_id = ANY($1::text[]) ORDER BY run_id FOR UPDATE",
        run_ids,
    )
    last_seq = {row["run_id"]: int(row["last_seq"]) for row in locked}
    activity = {row["run_id"]: int(row["last_activity_ms"]) for row in locked}
    state: dict[str, StreamState | None] = {
        row["run_id"]: None if row["stream_state"] is None else StreamState(row["stream_state"])
        for row in locked
    }
    durable: list[Event] = []
    for ev in events:
        seq = last_seq[ev.run_id] + 1
        last_seq[ev.run_id] = seq
        activity[ev.run_id] = max(activity[ev.run_id], ev.ts_ms)
        # A move that is not allowed: the event is kept, the state unchanged (rule 4).
        with contextlib.suppress(InvalidTransitionError):
            state[ev.run_id] = next_stream_state(state[ev.run_id], ev.type)
        durable.append(Event(seq, ev.run_id, ev.type, ev.ts_ms, ev.principal, ev.data))
    await conn.execute(
        "UPDATE whip_runs r SET last_seq = u.last_seq, last_activity_ms = u.activity,"
        " stream_state = u.state"
        " FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[])"
        " AS u(run_id, last_seq, activity, state) WHERE r.run_id = u.run_id",
        run_ids,
        [last_seq[r] for r in run_ids],
        [activity[r] for r in run_ids],
        [None if state[r] is None else str(state[r]) for r in run_ids],
    )
    await conn.execute(
        "INSERT INTO whip_events (run_id, seq, type, ts_ms, principal, data)"
        " SELECT r, s, t, ts, p, d::jsonb FROM unnest($1::text[], $2::bigint[], $3::text[],"
        " $4::bigint[], $5::text[], $6::text[]) AS e(r, s, t, ts, p, d)",
        [ev.run_id for ev in durable],
        [ev.seq for ev in durable],
        [ev.type for ev in durable],
        [ev.ts_ms for ev in durable],
        [ev.principal for ev in durable],
        [_dumps(ev.data) for ev in durable],
    )
    await conn.execute(
        "SELECT pg_notify($1, r) FROM unnest($2::text[]) AS r", EVENTS_CHANNEL, run_ids
    )
    return durable


async def record_batch(
    conn: asyncpg.Connection, batch_id: uuid.UUID, writer: Writer, seqs: Sequence[int]
) -> None:
    """The batch row of rule 5 (``seqs``: one per item, -1 for one not written)."""
    await conn.execute(
        "INSERT INTO whip_batches (batch_id, node_id, seqs) VALUES ($1, $2, $3)"
        " ON CONFLICT (node_id) DO UPDATE SET batch_id = EXCLUDED.batch_id, seqs = EXCLUDED.seqs",
        batch_id,
        writer.node_id,
        list(seqs),
    )


def rebuild(events: Sequence[NewEvent], seqs: Sequence[int]) -> list[Event]:
    """The durable events of a batch found committed by :func:`committed_seqs`."""
    return [
        Event(seq, ev.run_id, ev.type, ev.ts_ms, ev.principal, ev.data)
        for ev, seq in zip(events, seqs, strict=True)
    ]
