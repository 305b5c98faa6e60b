"""Run registry: state tables, principal index, derived expiry."""

from __future__ import annotations

import pytest

from registry.events import Event
from registry.runs import (
    STREAM_TRANSITIONS,
    InvalidTransitionError,
    RunRegistry,
    StreamState,
    next_stream_state,
)


def _ev(
    seq: int, run_id: str, etype: str, principal: str = "alice", ts: int = 1000, **data: object
) -> Event:
    return Event(seq, run_id, etype, ts, principal, dict(data))


def test_stream_state_history_of_a_normal_run() -> None:
    history: list[StreamState | None] = [None]
    for etype in [
        "run_created",
        "session_connected",
        "stats",
        "stop_requested",
        "session_closed",
        "stats",
    ]:
        history.append(next_stream_state(history[-1], etype))
    assert history == [None, "starting", "live", "live", "stopping", "ended", "ended"]


@pytest.mark.parametrize("terminal", [StreamState.ENDED, StreamState.INTERRUPTED])
def test_terminal_states_are_absorbing(terminal: StreamState) -> None:
    for _, etype in STREAM_TRANSITIONS:
        with pytest.raises(InvalidTransitionError):
            next_stream_state(terminal, etype)


def test_a_bad_transition_leaves_the_state_and_still_counts_as_activity() -> None:
    registry = RunRegistry()
    registry.apply(_ev(1, "r", "run_created", ts=1000, stream="cam"))
    registry.apply(_ev(2, "r", "session_closed", ts=2000, reason="peer_gone"))
    registry.apply(_ev(3, "r", "session_connected", ts=3000))
    view = registry.get("r")
    assert view is not None
    assert (view.state, view.last_activity_ms, view.last_seq) == ("ended", 3000, 3)


def test_expiry_is_derived_at_read_time_and_a_keepalive_reverses_it() -> None:
    registry = RunRegistry(stream_ttl_s=10)
    registry.apply(_ev(1, "r", "run_created", ts=1_000))
    registry.apply(_ev(2, "r", "session_connected", ts=2_000))
    assert registry.get("r", now=11_000).state == "live"  # type: ignore[union-attr]
    assert registry.get("r", now=12_001).state == "expired"  # type: ignore[union-attr]
    assert registry.count_active_runs_for_principal("alice", now=12_001) == 0
    registry.touch("r", ts_ms=12_500)
    assert registry.get("r", now=13_000).state == "live"  # type: ignore[union-attr]
    assert registry.count_active_runs_for_principal("alice", now=13_000) == 1


def test_count_active_runs_per_principal() -> None:
    registry = RunRegistry()
    registry.apply(_ev(1, "a1", "run_created", "alice"))
    registry.apply(_ev(2, "a2", "run_created", "alice"))
    registry.apply(_ev(3, "b1", "run_created", "bob"))
    registry.apply(_ev(4, "a2", "session_closed", "alice"))
    registry.apply(_ev(5, "a3", "run_created", "alice"))
    registry.apply(_ev(6, "a3", "run_deleted", "alice"))
    assert registry.count_active_runs_for_principal("alice") == 1
    assert registry.count_active_runs_for_principal("bob") == 1
    assert registry.count_active_runs_for_principal("carol") == 0
    assert [v.run_id for v in registry.list_runs("alice")] != []
    assert {v.run_id for v in registry.list_runs()} == {"a1", "a2", "a3", "b1"}


def test_list_is_newest_first() -> None:
    registry = RunRegistry()
    for i, ts in enumerate([5, 1, 9]):
        registry.apply(_ev(i + 1, f"r{i}", "run_created", ts=ts))
    assert [v.run_id for v in registry.list_runs()] == ["r2", "r0", "r1"]


def test_view_json_shape() -> None:
    registry = RunRegistry()
    registry.apply(_ev(1, "r", "run_created", stream="cam", session_id="s1"))
    view = registry.get("r")
    assert view is not None
    assert set(view.to_json()) == {
        "id",
        "principal",
        "stream",
        "state",
        "created_ms",
        "last_activity_ms",
        "session_id",
    }
