"""Webhooks in the cluster store: each webhook's cursor, its delivery lease and its 410 mark.

The cursor rule (why no committed event is ever skipped):

- Cluster seqs are per run (``whip_events`` is keyed by ``(run_id, seq)``, and
  :mod:`registry.pg.batches` rule 3 makes commit order and seq order agree per run: the
  run's row lock is held from the seq's assignment to COMMIT). There is no whole-cluster
  order to follow, so the cursor is per run: ``whip_webhook_cursors(webhook, run_id,
  done_seq)`` says every event of that run with ``seq <= done_seq`` is done for that
  webhook (delivered with a 2xx, or not wanted). A run without a row has ``done_seq`` 0.
- A run's events are delivered one at a time, in seq order, so "done" is always a prefix
  of the run: one number per run is the whole truth, and the embedded cursor's bounded set
  of seqs delivered ahead (which exists because one global seq is shared by runs delivered
  in parallel) has no counterpart here.
- The runs to look at (:meth:`WebhookStore.behind`) are those whose ``whip_runs.last_seq``
  is above their ``done_seq``. ``last_seq`` is written in the transaction that inserts the
  events, so a run seen with ``last_seq = n`` has every event ``<= n`` readable; an event
  committed later has a larger seq and moves ``last_seq`` again. Reading ``seq > done_seq
  ORDER BY seq`` therefore never passes an event that commits later, and ``done_seq`` only
  ever moves to a seq that was read (``GREATEST`` on write: it never goes back).
- A new webhook starts at the cluster's end (as a new embedded webhook starts at the log's
  end): :meth:`WebhookStore.register` inserts its row and, in the same transaction, a cursor
  at ``last_seq`` for every run that exists; runs created after (or not yet committed) have
  no row and are delivered from their first event.

Incarnations (a run id made again):

- Retention evicts a deleted run's row and events; a later DELETE of the same id makes a
  new row whose ``run_deleted`` is seq 1 again (:mod:`registry.pg.retention`). Every run row
  has an ``incarnation`` no row ever had (a sequence), and every cursor row the incarnation
  it was saved for. A cursor row counts only for the run row of its incarnation: left over
  from an evicted run (not yet pruned), it does not mark the new row's events done. Without
  that, the new ``run_deleted`` would be read as delivered and never sent.
- A cursor row without an incarnation (NULL) was written by a node still on schema
  version 4 during a rolling upgrade (its SQL does not name the column): it counts for the
  run row whatever its incarnation, as every row did before. Counting it for none would make
  such a node's new webhook (its cursors at the cluster's end) send the whole history.
- The deliverer keys what it moved by :class:`RunKey` (id and incarnation), as
  :meth:`WebhookStore.behind` gives them. A save for an older incarnation than the row's
  changes nothing, one for a newer incarnation replaces the row (a row never counts for two
  runs). A save for an evicted incarnation makes an orphan, which the prune deletes; its
  events come again under the new row's cursor: duplicates, never a skip.

Pruning (the cursor rows do not grow with every run ever deleted):

- A run's cursor for a webhook is ``GREATEST(done_seq of its row, whip_runs.webhook_done
  ->> webhook, 0)``. :meth:`WebhookStore.prune` takes the rows of *deleted* runs whose
  ``done_seq`` reached the run's ``last_seq`` (every event done, its ``run_deleted``
  included: delivered if the webhook wants it), writes each ``done_seq`` into the run row's
  ``webhook_done`` (webhook name -> seq) and deletes the cursor row, in one transaction: the
  cursor it stood for never goes back, so a restart after a prune delivers nothing again.
  Without the fold, a deleted run without a row would read as "nothing done" and be sent
  again. An event appended to the run later (a session still closing) is above the folded
  seq and is delivered; its row is made again and pruned again.
- The fold lives in the run row, so it is bounded as the deleted runs are: retention
  (:mod:`registry.pg.retention`) evicts the row and the fold with it. Retention does not
  evict a deleted run a webhook that is not disabled has not finished (its "Held for
  webhooks"), so a run row leaves before a webhook's cursor reaches its end only for a
  webhook disabled or forgotten. Cursor rows whose run row is gone, or of another
  incarnation than the row's, are deleted by the same prune: nothing is behind for them.
- Only the deliverer prunes, under its delivery lease (checked in the prune's transaction,
  as a save is), so a prune never races a save of the same webhook. Run rows are locked
  ``FOR UPDATE SKIP LOCKED``: a run a batch is writing right now is left for the next prune.
- A webhook no longer configured (:meth:`WebhookStore.forget`, at a node's start, for the
  names the node does not configure): its row is deleted, its cursor rows with it (ON
  DELETE CASCADE), only when no live node holds its delivery lease, decided under the row
  lock a claim takes (``FOR UPDATE``). It cannot race a deliverer: a live owner keeps the
  row; a dead or fenced owner's next save finds no row (:class:`DeliveryLeaseLostError`);
  a claim waits for the row lock and then finds no row. Its folds in ``webhook_done`` stay
  until their runs are evicted (harmless: a seq that is done stays done; the same name
  configured again starts at the cluster's end, at or above them). A name configured on
  some nodes only is forgotten by a node without it whenever no live node delivers it, and
  re-registered, at the cluster's end, by the next node that starts with it: configure the
  same webhooks on every node.

The delivery lease (exactly one node delivers a webhook at a time):

- ``whip_webhooks`` has one row per webhook (keyed by its name; the URL is kept beside it)
  with ``owner_node``, ``owner_epoch`` (the owner's *node* lease epoch) and
  ``delivery_epoch`` (bumped on every hand-over). The lease is tied to the node lease:
  it holds exactly as long as the ``whip_nodes`` row with that node id and epoch is
  unexpired, so there is nothing extra to renew, and a node that dies (or fences itself
  and re-acquires under a new epoch) loses every webhook it delivered.
- :meth:`WebhookStore.claim` locks the webhook row ``FOR UPDATE``, checks the claimer's own
  node lease (:func:`registry.pg.batches.check_lease`), and takes the row only when its
  owner's node lease is gone: two claimers serialize on the row lock and the second finds
  the first's live lease.
- Every write of the deliverer (:meth:`WebhookStore.save`, :meth:`WebhookStore.disable`)
  checks, in its transaction, the node lease and that the row still names this node, epoch
  and delivery epoch (:class:`DeliveryLeaseLostError` otherwise): a node that lost the
  webhook cannot move its cursor. The survivor reads the cursor after its claim committed,
  so it resumes from the last cursor the old owner saved: events delivered after that save
  are sent again (same ``webhook-id``), none is skipped.
- A node that fences itself does so ``lease_s / 3`` before its node lease can expire
  (:mod:`registry.pg.leases`), and its deliverer stops when it sees the fence, so two
  nodes' attempts overlap only if an attempt outlives that margin.

The 410 mark (:class:`registry.webhook_mark.DisabledMark`): :meth:`WebhookStore.disable`
records the URL that answered 410, when and why; a webhook whose configured URL is that
URL stays disabled on every node, across restarts. Configuring another URL for the name
re-enables it (the mark is cleared by the first node that registers the new URL).

Lock order: a transaction here locks at most the writer's ``whip_nodes`` row (``FOR KEY
SHARE``), then one ``whip_webhooks`` row, then (a prune only) ``whip_runs`` rows with
``SKIP LOCKED``, which never waits; no other transaction of the cluster locks
``whip_webhooks``, so these cannot deadlock with the group commit.

Cancellation: every call is one statement or one transaction; a cancelled caller rolls it
back and nothing changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import asyncpg
import orjson

from registry.errors import RegistryError
from registry.events import Event, now_ms
from registry.pg.batches import Writer, check_lease
from registry.webhook_mark import DisabledMark

__all__ = [
    "DeliveryLease",
    "DeliveryLeaseLostError",
    "DisabledMark",
    "Outcome",
    "RunKey",
    "WebhookRow",
    "WebhookStore",
    "cursor_join_sql",
    "done_sql",
]

PRUNE_BATCH = 1000
"""Cursor rows one prune removes at most (it is called again while it finds a full batch)."""


SAME_RUN_SQL = "(c.incarnation IS NULL OR c.incarnation = r.incarnation)"
"""The cursor row ``c`` counts for the run row ``r`` (module doc, "Incarnations")."""


def done_sql(name: str) -> str:
    """The SQL of a run's cursor for the webhook named by parameter ``name`` (module doc),
    with ``r`` the run row and ``c`` the cursor row joined by :func:`cursor_join_sql` (or NULLs)."""
    return f"GREATEST(COALESCE(c.done_seq, 0), COALESCE((r.webhook_done ->> {name})::bigint, 0))"


def cursor_join_sql(name: str) -> str:
    """The SQL join of the run row ``r`` to its cursor row ``c`` for the webhook named by
    ``name``: the row of the same run id *and* incarnation (module doc, "Incarnations")."""
    return (
        f" LEFT JOIN whip_webhook_cursors c ON c.webhook = {name} AND c.run_id = r.run_id"
        f" AND {SAME_RUN_SQL}"
    )


class RunKey(NamedTuple):
    """One run row: its id and its incarnation (module doc, "Incarnations")."""

    run_id: str
    incarnation: int


class DeliveryLeaseLostError(RegistryError):
    """The webhook's row no longer names this node, epoch and delivery epoch."""

    http_status = 503
    code = "webhook_lease_lost"


@dataclass(frozen=True, slots=True)
class DeliveryLease:
    """This node delivers the webhook under ``delivery_epoch`` while ``writer`` holds."""

    writer: Writer
    delivery_epoch: int


@dataclass(frozen=True, slots=True)
class WebhookRow:
    """What the store says of one webhook (``GET /v1/webhooks`` on any node)."""

    name: str
    url: str
    owner_node: str
    owner_live: bool
    delivery_epoch: int
    owned_since_ms: int | None
    disabled: DisabledMark | None
    last_status: int | None
    last_error: str | None
    last_attempt_ms: int | None
    last_success_ms: int | None
    done_events: int
    total_events: int
    runs_behind: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """The last attempt's outcome, saved with the cursor."""

    status: int | None
    error: str | None
    attempt_ms: int | None
    success_ms: int | None


def _mark(row: asyncpg.Record) -> DisabledMark | None:
    if row["disabled_url"] is None:
        return None
    return DisabledMark(row["disabled_url"], row["disabled_ms"], row["disabled_reason"] or "")


_LIVE_OWNER = (
    "EXISTS (SELECT 1 FROM whip_nodes n WHERE n.node_id = w.owner_node"
    " AND n.epoch = w.owner_epoch AND n.lease_expires_at > clock_timestamp())"
)


class WebhookStore:
    """The webhook rows of one store, through a pool the caller owns (module rules)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def register(self, name: str, url: str) -> DisabledMark | None:
        """Make the webhook's row if there is none (its cursors at the cluster's end, in
        the same transaction); clear a 410 mark left by another URL. Returns the mark
        that still applies to ``url``, or None."""
        async with self._pool.acquire() as conn, conn.transaction():
            made = await conn.fetchval(
                "INSERT INTO whip_webhooks (name, url, created_ms) VALUES ($1, $2, $3)"
                " ON CONFLICT (name) DO NOTHING RETURNING 1",
                name,
                url,
                now_ms(),
            )
            if made:
                await conn.execute(
                    "INSERT INTO whip_webhook_cursors (webhook, run_id, done_seq, incarnation)"
                    " SELECT $1, run_id, last_seq, incarnation FROM whip_runs WHERE last_seq > 0",
                    name,
                )
                return None
            row = await conn.fetchrow(
                "SELECT url, disabled_url, disabled_ms, disabled_reason FROM whip_webhooks"
                " WHERE name = $1 FOR UPDATE",
                name,
            )
            mark = _mark(row)
            if row["url"] != url or (mark is not None and not mark.applies_to(url)):
                await conn.execute(
                    "UPDATE whip_webhooks SET url = $2, disabled_url = NULL, disabled_ms = NULL,"
                    " disabled_reason = NULL WHERE name = $1",
                    name,
                    url,
                )
                return None
            return mark

    async def claim(self, name: str, writer: Writer) -> DeliveryLease | None:
        """Take the webhook's delivery lease if its owner's node lease is gone (or it is
        already this node's under ``writer``); None while another live node holds it or
        the webhook is disabled. Raises :class:`~registry.pg.batches.FencedError` when
        ``writer``'s own lease is gone."""
        async with self._pool.acquire() as conn, conn.transaction():
            await check_lease(conn, writer)
            row = await conn.fetchrow(
                "SELECT owner_node, owner_epoch, delivery_epoch, disabled_url, url,"
                f" {_LIVE_OWNER} AS live FROM whip_webhooks w WHERE name = $1 FOR UPDATE",
                name,
            )
            if row is None or row["disabled_url"] == row["url"]:
                return None
            if (row["owner_node"], row["owner_epoch"]) == (writer.node_id, writer.epoch):
                return DeliveryLease(writer, int(row["delivery_epoch"]))
            if row["live"]:
                return None
            epoch = await conn.fetchval(
                "UPDATE whip_webhooks SET owner_node = $2, owner_epoch = $3,"
                " delivery_epoch = delivery_epoch + 1, owned_since_ms = $4"
                " WHERE name = $1 RETURNING delivery_epoch",
                name,
                writer.node_id,
                writer.epoch,
                now_ms(),
            )
        return DeliveryLease(writer, int(epoch))

    async def _check_held(self, conn: asyncpg.Connection, name: str, lease: DeliveryLease) -> None:
        await check_lease(conn, lease.writer)
        held = await conn.fetchval(
            "SELECT 1 FROM whip_webhooks WHERE name = $1 AND owner_node = $2"
            " AND owner_epoch = $3 AND delivery_epoch = $4 FOR SHARE",
            name,
            lease.writer.node_id,
            lease.writer.epoch,
            lease.delivery_epoch,
        )
        if held is None:
            raise DeliveryLeaseLostError(
                f"webhook {name}: node {lease.writer.node_id} no longer delivers it"
            )

    async def release(self, name: str, lease: DeliveryLease) -> None:
        """Give the webhook up (clean stop): another node may claim it at once."""
        async with self._pool.acquire() as conn:
            await conn.execute(
                "UPDATE whip_webhooks SET owner_node = '', owner_epoch = 0"
                " WHERE name = $1 AND owner_node = $2 AND owner_epoch = $3"
                " AND delivery_epoch = $4",
                name,
                lease.writer.node_id,
                lease.writer.epoch,
                lease.delivery_epoch,
            )

    async def behind(self, name: str, limit: int) -> dict[RunKey, int]:
        """Up to ``limit`` runs with events past their cursor, least recently active first:
        the run -> ``done_seq``."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                f"SELECT r.run_id, r.incarnation, {done_sql('$1')} AS done FROM whip_runs r"
                f"{cursor_join_sql('$1')} WHERE r.last_seq > {done_sql('$1')}"
                " ORDER BY r.last_activity_ms, r.run_id LIMIT $2",
                name,
                limit,
            )
        return {RunKey(row["run_id"], int(row["incarnation"])): int(row["done"]) for row in rows}

    async def read_events(self, run_id: str, after_seq: int, limit: int) -> list[Event]:
        """The run's events with ``seq > after_seq``, oldest first."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT run_id, seq, type, ts_ms, principal, data::text AS data FROM whip_events"
                " WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                run_id,
                after_seq,
                limit,
            )
        return [
            Event(r["seq"], r["run_id"], r["type"], r["ts_ms"], r["principal"],
                  orjson.loads(r["data"]))
            for r in rows
        ]  # fmt: skip

    async def save(
        self, name: str, lease: DeliveryLease, done: Mapping[RunKey, int], outcome: Outcome
    ) -> None:
        """Move the cursors of ``done`` (never back; module doc, "Incarnations", for a
        save of another incarnation) and record the last outcome, under the delivery
        lease. Raises :class:`DeliveryLeaseLostError`, ``FencedError``."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self._check_held(conn, name, lease)
            if done:
                await conn.execute(
                    "INSERT INTO whip_webhook_cursors (webhook, run_id, incarnation, done_seq)"
                    " SELECT $1, * FROM unnest($2::text[], $3::bigint[], $4::bigint[])"
                    " ON CONFLICT (webhook, run_id) DO UPDATE"
                    " SET done_seq = CASE"
                    "  WHEN whip_webhook_cursors.incarnation IS NULL"
                    "  OR whip_webhook_cursors.incarnation = EXCLUDED.incarnation"
                    "  THEN GREATEST(whip_webhook_cursors.done_seq, EXCLUDED.done_seq)"
                    "  ELSE EXCLUDED.done_seq END,"
                    " incarnation = EXCLUDED.incarnation"
                    " WHERE whip_webhook_cursors.incarnation IS NULL"
                    " OR whip_webhook_cursors.incarnation <= EXCLUDED.incarnation",
                    name,
                    [key.run_id for key in done],
                    [key.incarnation for key in done],
                    list(done.values()),
                )
            await conn.execute(
                "UPDATE whip_webhooks SET last_status = $2, last_error = $3,"
                " last_attempt_ms = $4, last_success_ms = $5 WHERE name = $1",
                name,
                outcome.status,
                outcome.error,
                outcome.attempt_ms,
                outcome.success_ms,
            )

    async def prune(self, name: str, lease: DeliveryLease, limit: int = PRUNE_BATCH) -> int:
        """Fold the cursor rows of fully delivered deleted runs into their run rows and
        delete them, and delete the rows whose run is gone (module doc), at most ``limit``
        of each, under the delivery lease; the rows removed. Raises
        :class:`DeliveryLeaseLostError`, ``FencedError``."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self._check_held(conn, name, lease)
            folded = await conn.fetchval(
                "WITH done AS ("
                "  SELECT c.run_id, c.done_seq FROM whip_webhook_cursors c"
                f"  JOIN whip_runs r ON r.run_id = c.run_id AND {SAME_RUN_SQL}"
                "  WHERE c.webhook = $1 AND r.deleted_seq IS NOT NULL"
                "  AND GREATEST(c.done_seq, COALESCE((r.webhook_done ->> $1)::bigint, 0))"
                "  >= r.last_seq"
                "  ORDER BY c.run_id LIMIT $2 FOR UPDATE OF r SKIP LOCKED"
                "), folded AS ("
                "  UPDATE whip_runs r SET webhook_done = r.webhook_done"
                "  || jsonb_build_object($1::text, GREATEST(d.done_seq,"
                "     COALESCE((r.webhook_done ->> $1)::bigint, 0)))"
                "  FROM done d WHERE r.run_id = d.run_id RETURNING r.run_id"
                "), gone AS ("
                "  DELETE FROM whip_webhook_cursors c USING folded f"
                "  WHERE c.webhook = $1 AND c.run_id = f.run_id RETURNING 1"
                ") SELECT count(*) FROM gone",
                name,
                limit,
            )
            orphans = await conn.fetchval(
                "WITH gone AS (DELETE FROM whip_webhook_cursors WHERE webhook = $1"
                " AND run_id IN (SELECT c.run_id FROM whip_webhook_cursors c"
                "  WHERE c.webhook = $1 AND NOT EXISTS (SELECT 1 FROM whip_runs r"
                f"   WHERE r.run_id = c.run_id AND {SAME_RUN_SQL}) LIMIT $2)"
                " RETURNING 1) SELECT count(*) FROM gone",
                name,
                limit,
            )
        return int(folded) + int(orphans)

    async def forget(self, configured: list[str]) -> list[str]:
        """Delete the webhooks not in ``configured`` that no live node delivers, their
        cursor rows with them (module doc); the names forgotten."""
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT name FROM whip_webhooks w WHERE NOT (name = ANY($1::text[]))"
                " ORDER BY name FOR UPDATE",
                configured,
            )
            if not rows:
                return []
            gone = await conn.fetch(
                "DELETE FROM whip_webhooks w WHERE name = ANY($1::text[])"
                f" AND NOT {_LIVE_OWNER} RETURNING name",
                [row["name"] for row in rows],
            )
        return sorted(row["name"] for row in gone)

    async def row_counts(self) -> dict[str, int]:
        """Cursor rows per webhook (operators, tests)."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT webhook, count(*) AS n FROM whip_webhook_cursors GROUP BY webhook"
            )
        return {row["webhook"]: int(row["n"]) for row in rows}

    async def disable(self, name: str, lease: DeliveryLease, mark: DisabledMark) -> None:
        """Record the 410 mark under the delivery lease and give the lease up."""
        async with self._pool.acquire() as conn, conn.transaction():
            await self._check_held(conn, name, lease)
            await conn.execute(
                "UPDATE whip_webhooks SET disabled_url = $2, disabled_ms = $3,"
                " disabled_reason = $4, owner_node = '', owner_epoch = 0 WHERE name = $1",
                name,
                mark.url,
                mark.at_ms,
                mark.reason,
            )

    async def describe(self, name: str) -> WebhookRow | None:
        """The webhook's row, its owner's liveness and its cursor totals: ``done_events``
        is the sum of the per-run cursors (the events at or below them), ``total_events``
        the events of the cluster."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                f"SELECT w.*, {_LIVE_OWNER} AS live,"
                " (SELECT COALESCE(sum(last_seq), 0) FROM whip_runs) AS total,"
                f" (SELECT COALESCE(sum(LEAST({done_sql('w.name')}, r.last_seq)), 0)"
                f"  FROM whip_runs r{cursor_join_sql('w.name')}) AS done,"
                f" (SELECT count(*) FROM whip_runs r{cursor_join_sql('w.name')}"
                f"  WHERE r.last_seq > {done_sql('w.name')}) AS behind"
                " FROM whip_webhooks w WHERE w.name = $1",
                name,
            )
        if row is None:
            return None
        return WebhookRow(
            name=row["name"],
            url=row["url"],
            owner_node=row["owner_node"] if row["live"] else "",
            owner_live=bool(row["live"]),
            delivery_epoch=int(row["delivery_epoch"]),
            owned_since_ms=row["owned_since_ms"],
            disabled=_mark(row) if row["disabled_url"] == row["url"] else None,
            last_status=row["last_status"],
            last_error=row["last_error"],
            last_attempt_ms=row["last_attempt_ms"],
            last_success_ms=row["last_success_ms"],
            done_events=int(row["done"]),
            total_events=int(row["total"]),
            runs_behind=int(row["behind"]),
        )
