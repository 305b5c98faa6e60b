"""A ``whip_runs`` row as the API sees it: the :class:`RunView` of a row and the SQL twins
of its derived fields, so a read, a filter and a count never disagree.

Rules: a row's ``state`` is derived in one place in Python (:func:`run_from_row`) and one in
SQL (:func:`state_sql`), the same cases in the same order: ``deleted`` (a recorded
deletion), ``starting`` (no run_created yet), ``expired`` (starting or live, last activity
before now minus the stream TTL), else the stream state. :func:`holds_slot_sql` is the
store's definition of an *active run* (the embedded registry's ``_holds_slot_locked``):
starting, live or stopping, not deleted, not expired. The SQL helpers take the SQL text of
"now minus the TTL" (a bind parameter; NULL: no TTL).
"""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

from registry.pg.leases import ACTIVE_STATES_SQL
from registry.runs import DeleteState, RunView, StreamState


def run_from_row(row: asyncpg.Record, expired_before_ms: int | None) -> RunView:
    """The API's view of a run row; a starting/live run whose last activity is older than
    ``expired_before_ms`` (now minus the stream TTL; None: no TTL) reads ``expired``, as
    :meth:`registry.runs.RunRegistry.get` derives it."""
    stream_state = None if row["stream_state"] is None else StreamState(row["stream_state"])
    deleted = row["deleted_seq"] is not None
    if deleted:
        state = "deleted"
    elif stream_state is None:
        state = "starting"
    elif (
        expired_before_ms is not None
        and stream_state in (StreamState.STARTING, StreamState.LIVE)
        and row["last_activity_ms"] < expired_before_ms
    ):
        state = "expired"
    else:
        state = stream_state.value
    return RunView(
        row["run_id"],
        row["principal"],
        row["stream"],
        row["session_id"],
        row["created_ms"],
        row["last_activity_ms"],
        row["last_seq"],
        state,
        stream_state,
        DeleteState.DELETED if deleted else DeleteState.LIVE,
        row["node_id"],
    )


def expired_sql(before: str) -> str:
    """SQL true for a row :func:`run_from_row` reads as ``expired`` (not deleted), given
    the SQL expression ``before`` of ``expired_before_ms`` (NULL: never)."""
    return (
        f"(stream_state IN ('starting', 'live') AND coalesce(last_activity_ms < {before}, false))"
    )


def state_sql(before: str) -> str:
    """A run row's API state in SQL, exactly as :func:`run_from_row` derives it."""
    return (
        "(CASE WHEN deleted_seq IS NOT NULL THEN 'deleted'"
        f" WHEN {expired_sql(before)} THEN 'expired'"
        " ELSE coalesce(stream_state, 'starting') END)"
    )


def holds_slot_sql(before: str) -> str:
    """SQL true for a run holding a stream slot: the one definition of an *active run*
    (:meth:`registry.runs.RunRegistry._holds_slot_locked`): starting, live or stopping,
    not deleted, not expired."""
    return (
        f"(stream_state IN {ACTIVE_STATES_SQL} AND deleted_seq IS NULL"
        f" AND NOT {expired_sql(before)})"
    )


class RunsPage(NamedTuple):
    """One page of runs, newest first, and whether more match past it."""

    runs: list[RunView]
    more: bool


RUN_COLUMNS = (
    "run_id, principal, stream, session_id, node_id, created_ms, last_activity_ms, last_seq,"
    " stream_state, deleted_seq"
)
