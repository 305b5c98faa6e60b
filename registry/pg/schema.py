"""The cluster store's schema: created on first start, versioned, migrated forward only.

Rules:

- ``whip_schema_version`` holds one row, the version the database is at. A node whose code
  knows fewer migrations than the database has applied refuses to start
  (:class:`SchemaTooNewError`): it would write rows a newer node cannot trust.
- :data:`MIGRATIONS` is append-only: migration *n* (1-based) moves version *n-1* to *n*.
  Each runs in its own transaction, together with the version bump, so a crash leaves the
  database at a version boundary.
- Concurrent first starts (three nodes at once) are serialized by a transaction-scoped
  advisory lock (:data:`SCHEMA_LOCK_KEY`); the loser finds the work done.

Tables (version 1):

- ``whip_nodes``: one lease row per live node; ``epoch`` comes from ``whip_node_epochs``, a
  sequence, so an epoch is never reused, even by a restarted node with the same id.
- ``whip_runs``: a run's few fields, its owner (``node_id``, ``node_epoch``), ``last_seq``
  (its per-run event counter) and its single deletion (``deleted_*``).
- ``whip_events``: ``(run_id, seq)`` is the key; ``seq`` is per run (see
  :mod:`registry.pg.batches` for why commit order and cursor order agree).
- ``whip_principals``: one row per principal, the row lock that serializes its stream-slot
  reservations; ``whip_stream_slots``: the reservations, each with the node and the lease
  epoch that hold it.
- ``whip_batches``: one row per node, overwritten by each of its group commits: the last
  batch's id and the seqs it assigned, so a batch whose COMMIT answer was lost is
  confirmed from the row instead of written twice (a node's committer has one batch in
  flight at a time, so the last one is the only one it can be unsure of).

Version 2 adds indexes only: the runs listing's keyset order (with and without a
principal) and the deleted runs in deletion order (retention, :mod:`registry.pg.retention`).
Version 3, tables: ``whip_webhooks`` (a webhook's delivery lease, durable 410 mark and
last outcome) and ``whip_webhook_cursors`` (its cursor, one row per run), described in
:mod:`registry.pg.webhook_store`. Version 4 adds ``whip_runs.webhook_done``: the cursors of
a deleted run pruned from ``whip_webhook_cursors`` (same module). Version 5 adds
``whip_runs.incarnation`` (from the ``whip_run_incarnations`` sequence: no two run rows ever
share one, even for one run id made again after retention evicted it) and
``whip_webhook_cursors.incarnation`` (the run row a cursor was saved for).
"""

from __future__ import annotations

import logging

import asyncpg

from registry.errors import RegistryError

logger = logging.getLogger(__name__)

SCHEMA_LOCK_KEY = 0x5748_4950  # "WHIP"

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE SEQUENCE whip_node_epochs;
    CREATE TABLE whip_nodes (
        node_id text PRIMARY KEY,
        epoch bigint NOT NULL,
        host text NOT NULL,
        pid integer NOT NULL,
        started_ms bigint NOT NULL,
        advertise_url text NOT NULL,
        lease_expires_at timestamptz NOT NULL,
        sessions integer NOT NULL DEFAULT 0
    );
    CREATE TABLE whip_runs (
        run_id text PRIMARY KEY,
        principal text NOT NULL,
        stream text NOT NULL DEFAULT '',
        session_id text NOT NULL DEFAULT '',
        node_id text NOT NULL DEFAULT '',
        node_epoch bigint NOT NULL DEFAULT 0,
        created_ms bigint NOT NULL,
        last_activity_ms bigint NOT NULL,
        last_seq bigint NOT NULL DEFAULT 0,
        stream_state text,
        deleted_seq bigint,
        deleted_ts_ms bigint,
        deleted_principal text,
        deleted_data jsonb
    );
    CREATE INDEX whip_runs_principal ON whip_runs (principal);
    CREATE INDEX whip_runs_active_owner ON whip_runs (node_id)
        WHERE stream_state IN ('starting', 'live', 'stopping');
    CREATE TABLE whip_events (
        run_id text NOT NULL,
        seq bigint NOT NULL,
        type text NOT NULL,
        ts_ms bigint NOT NULL,
        principal text NOT NULL,
        data jsonb NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE whip_principals (principal text PRIMARY KEY);
    CREATE TABLE whip_stream_slots (
        reservation_id text PRIMARY KEY,
        principal text NOT NULL,
        node_id text NOT NULL,
        epoch bigint NOT NULL,
        created_ms bigint NOT NULL
    );
    CREATE INDEX whip_stream_slots_principal ON whip_stream_slots (principal);
    CREATE INDEX whip_stream_slots_node ON whip_stream_slots (node_id);
    CREATE TABLE whip_batches (
        node_id text PRIMARY KEY,
        batch_id uuid NOT NULL,
        seqs bigint[] NOT NULL
    );
    """,
    # 2: the runs listing pages in the store (keyset on created_ms, run_id in bytewise
    # order, with and without a principal), and deleted-run retention finds the oldest
    # deletions without a scan.
    """
    CREATE INDEX whip_runs_listing ON whip_runs (created_ms DESC, run_id COLLATE "C" DESC);
    CREATE INDEX whip_runs_principal_listing
        ON whip_runs (principal, created_ms DESC, run_id COLLATE "C" DESC);
    CREATE INDEX whip_runs_deletions ON whip_runs (deleted_ts_ms, run_id COLLATE "C")
        WHERE deleted_seq IS NOT NULL;
    """,
    # 3: webhooks in cluster mode (registry/pg/webhook_store.py): one row per webhook
    # (its delivery lease, tied to the owner's node lease, its durable 410 mark and last
    # outcome) and one cursor row per webhook and run.
    """
    CREATE TABLE whip_webhooks (
        name text PRIMARY KEY,
        url text NOT NULL,
        created_ms bigint NOT NULL,
        owner_node text NOT NULL DEFAULT '',
        owner_epoch bigint NOT NULL DEFAULT 0,
        delivery_epoch bigint NOT NULL DEFAULT 0,
        owned_since_ms bigint,
        disabled_url text,
        disabled_ms bigint,
        disabled_reason text,
        last_status integer,
        last_error text,
        last_attempt_ms bigint,
        last_success_ms bigint
    );
    CREATE TABLE whip_webhook_cursors (
        webhook text NOT NULL REFERENCES whip_webhooks (name) ON DELETE CASCADE,
        run_id text NOT NULL,
        done_seq bigint NOT NULL,
        PRIMARY KEY (webhook, run_id)
    );
    """,
    # 4: pruned webhook cursors (registry/pg/webhook_store.py): a deleted run's cursor row,
    # once fully delivered, is folded into the run row (webhook name -> done seq) and
    # removed; the fold goes with the run row when retention evicts it.
    """
    ALTER TABLE whip_runs ADD COLUMN webhook_done jsonb NOT NULL DEFAULT '{}'::jsonb;
    """,
    # 5: run incarnations (registry/pg/webhook_store.py): a run id the retention evicted and
    # a later DELETE made again is a new run row whose seqs start at 1 again. Each run row
    # gets a number no row ever had (existing rows one each, here), and each cursor row the
    # number of the row it was saved for, so a cursor of the evicted run cannot count for
    # the new one. Existing cursor rows take their run row's number; a row whose run is gone
    # gets 0 (an orphan, pruned). The cursor column has no default: a row that a node still
    # on version 4 writes during a rolling upgrade is NULL and counts for its run as before.
    """
    CREATE SEQUENCE whip_run_incarnations;
    ALTER TABLE whip_runs
        ADD COLUMN incarnation bigint NOT NULL DEFAULT nextval('whip_run_incarnations');
    ALTER TABLE whip_webhook_cursors ADD COLUMN incarnation bigint;
    UPDATE whip_webhook_cursors c SET incarnation = r.incarnation
        FROM whip_runs r WHERE r.run_id = c.run_id;
    UPDATE whip_webhook_cursors SET incarnation = 0 WHERE incarnation IS NULL;
    """,
)
"""Forward migrations, oldest first (append only; never edit a released one)."""

SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNewError(RegistryError):
    """The database was migrated by newer code than this node's: refusing to start."""

    code = "schema_too_new"

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the cluster store is at schema version {found}, this node knows up to {known}: "
            "upgrade this node (migrations only go forward)"
        )
        self.found = found
        self.known = known


async def migrate(conn: asyncpg.Connection, migrations: tuple[str, ...] = MIGRATIONS) -> int:
    """Bring the database to ``len(migrations)``; returns the version it is at.

    Raises :class:`SchemaTooNewError` when the database is past ``len(migrations)``.
    Cancellation: the open migration's transaction rolls back; applied ones stay.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS whip_schema_version (version integer NOT NULL)"
        )
        found = await conn.fetchval("SELECT version FROM whip_schema_version")
        if found is None:
            await conn.execute("INSERT INTO whip_schema_version (version) VALUES (0)")
            found = 0
    version = int(found)
    if version > len(migrations):
        raise SchemaTooNewError(version, len(migrations))
    while version < len(migrations):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
            current = int(await conn.fetchval("SELECT version FROM whip_schema_version"))
            if current > version:
                version = current
                continue
            await conn.execute(migrations[version])
            await conn.execute("UPDATE whip_schema_version SET version = $1", version + 1)
        logger.info("cluster store: schema version %d -> %d", version, version + 1)
        version += 1
    return version
