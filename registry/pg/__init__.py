"""Cluster mode's store: the registry's interface over PostgreSQL (asyncpg).

Imported only when ``[cluster] store`` is configured (the embedded WAL stays the default and
never imports asyncpg). The entry point is :class:`registry.pg.timeline.ClusterTimeline`;
the modules, from the bottom up: :mod:`~registry.pg.schema` (versioned, forward-only
migrations), :mod:`~registry.pg.batches` (one group commit: fencing, per-run order, NOTIFY),
:mod:`~registry.pg.committer` (the node's group-commit task), :mod:`~registry.pg.leases`
(leases, self-fencing, reaping dead nodes), :mod:`~registry.pg.listener` (LISTEN/NOTIFY),
:mod:`~registry.pg.run_rows` (a run row's API view and its SQL twins: state, expiry, slots),
:mod:`~registry.pg.retention` (deleted-run retention, one node sweeping at a time).
Like the rest of ``registry/``, nothing here knows HTTP or media.
"""
