"""Warm (snapshot) and cold (WAL) reads give identical answers; seqs have no gaps."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.events import Event, NewEvent
from registry.snapshot import RunTail, extend_tail
from registry.timeline import Timeline

ops = st.lists(
    st.tuples(st.integers(0, 5), st.integers(1, 12), st.booleans()), min_size=1, max_size=25
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=ops,
    cursors=st.lists(st.integers(0, 400), min_size=1, max_size=8),
    limits=st.lists(st.integers(1, 50), min_size=1, max_size=4),
    reopen=st.booleans(),
)
def test_snapshot_and_wal_agree_for_any_interleaving(
    tmp_path: Path,
    timeline_factory: Callable[..., Timeline],
    plan: list[tuple[int, int, bool]],
    cursors: list[int],
    limits: list[int],
    reopen: bool,
) -> None:
    data_dir = tmp_path / uuid.uuid4().hex
    timeline = timeline_factory(data_dir, tail_events=5, warm_runs=3)
    expected: dict[str, list[int]] = {}
    for run_no, count, as_batch in plan:
        run_id = f"run-{run_no}"
        events = [NewEvent(run_id, "stats", "p", {"n": n}) for n in range(count)]
        if as_batch:
            futures = [timeline.wal.submit_nowait(e) for e in events]
            seqs = [f.result(10) for f in futures]
        else:
            seqs = [timeline.append_blocking(e, 10) for e in events]
        expected.setdefault(run_id, []).extend(seqs)
    if reopen:
        timeline.close()
        timeline = timeline_factory(data_dir, tail_events=5, warm_runs=3)

    all_events = timeline.wal.read_all()
    assert [e.seq for e in all_events] == list(range(1, len(all_events) + 1))

    for run_id, seqs in expected.items():
        for after in cursors:
            for limit in limits:
                cold = timeline.read_cold(run_id, after, limit)
                warm = timeline.read_warm(run_id, after, limit)
                answer = timeline.read_run_events(run_id, after, limit)
                want = [s for s in sorted(seqs) if s > after][:limit]
                assert [e.seq for e in cold] == want
                assert answer == cold
                if warm is not None:
                    assert warm == cold


def test_an_untouched_runs_tail_is_the_same_object_after_another_run_appends(
    timeline_factory: Callable[..., Timeline],
) -> None:
    timeline = timeline_factory()
    for run_id in ("a", "b"):
        timeline.append_blocking(NewEvent(run_id, "stats", "p"), 10)
    before = timeline.snapshot
    tail_a = before.tails["a"]
    timeline.append_blocking(NewEvent("b", "stats", "p"), 10)
    after = timeline.snapshot
    assert after is not before
    assert after.tails["a"] is tail_a
    assert after.tails["b"] is not before.tails["b"]
    assert len(after.tails["b"].events) == 2


def test_warm_runs_are_bounded_and_least_recently_appended_is_evicted(
    timeline_factory: Callable[..., Timeline],
) -> None:
    timeline = timeline_factory(warm_runs=3, tail_events=2)
    for run_id in ("a", "b", "c", "a", "d"):
        for _ in range(3):
            timeline.append_blocking(NewEvent(run_id, "stats", "p"), 10)
    tails = timeline.snapshot.tails
    assert sorted(tails) == ["a", "c", "d"]
    assert all(len(t.events) == 2 for t in tails.values())
    # The evicted run is still fully readable (cold), in order.
    b_events: list[Event] = timeline.read_run_events("b", 0, 100)
    assert [e.run_id for e in b_events] == ["b"] * 3
    assert timeline.read_warm("b", 0, 100) is None


def test_recovery_rebuilds_warm_tails_and_registry(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    data_dir = tmp_path / "d"
    first = timeline_factory(data_dir)
    first.append_blocking(NewEvent("r1", "run_created", "alice", {"stream": "cam"}), 10)
    first.append_blocking(NewEvent("r1", "session_connected", "alice"), 10)
    first.append_blocking(NewEvent("r2", "run_created", "bob", {"stream": "x"}), 10)
    first.append_blocking(NewEvent("r2", "session_closed", "bob", {"reason": "peer_gone"}), 10)
    before = first.read_run_events("r1", 0, 10)
    first.close()

    second = timeline_factory(data_dir)
    assert second.interrupted == ["r1"]
    r1 = second.read_run_events("r1", 0, 10)
    assert [e.type for e in r1] == ["run_created", "session_connected", "run_interrupted"]
    assert r1[:2] == before
    assert second.warmed.wait(10), "the writer rebuilds warm tails while idle"
    assert second.read_warm("r1", 0, 10) == r1
    view1, view2 = second.runs.get("r1"), second.runs.get("r2")
    assert view1 is not None and view2 is not None
    assert (view1.principal, view1.stream, view1.state) == ("alice", "cam", "interrupted")
    assert view2.state == "ended"


def test_warm_up_after_restart_merges_with_appends_made_meanwhile(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    data_dir = tmp_path / "d"
    first = timeline_factory(data_dir, tail_events=8, warm_runs=4)
    for run_no in range(6):
        for _ in range(10):
            first.append_blocking(NewEvent(f"run-{run_no}", "stats", "p"), 10)
    first.close()
    second = timeline_factory(data_dir, tail_events=8, warm_runs=4)
    # Appended right after the restart, possibly before its tail was seeded.
    second.append_blocking(NewEvent("run-5", "stats", "p", {"after": "restart"}), 10)
    second.append_blocking(NewEvent("run-0", "stats", "p", {"after": "restart"}), 10)
    assert second.warmed.wait(10)
    tails = second.snapshot.tails
    assert len(tails) == 4, "the warm-up never exceeds the bound"
    assert {"run-0", "run-5"} <= set(tails), "runs appended after the restart stay warm"
    for run_id, tail in tails.items():
        after = tail.events[0].seq - 1
        assert second.read_warm(run_id, after, 100) == second.read_cold(run_id, after, 100)
    # run-5 was among the newest runs: seeded in place, its new event included.
    assert len(tails["run-5"].events) == 8
    assert tails["run-5"].events[-1].data == {"after": "restart"}
    # run-0 was too old to be seeded: its tail starts at the new event; older reads are
    # served cold, with the same answer.
    assert [e.data for e in tails["run-0"].events] == [{"after": "restart"}]
    everything = second.read_run_events("run-0", 0, 100)
    assert len(everything) == 11 and everything[-1].data == {"after": "restart"}


def test_a_run_deleted_while_live_is_still_interrupted_after_a_crash(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    """Found by the system crash harness: every unclosed run gets a terminal event."""
    data_dir = tmp_path / "d"
    first = timeline_factory(data_dir)
    first.append_blocking(NewEvent("r_a", "run_created", "p", {"stream": "s"}), 10)
    first.append_blocking(NewEvent("r_a", "session_connected", "p"), 10)
    first.append_blocking(NewEvent("r_a", "run_deleted", "p"), 10)
    first.close()  # as if killed before session_closed was written
    second = timeline_factory(data_dir)
    assert second.interrupted == ["r_a"]
    types = [e.type for e in second.read_run_events("r_a", 0, 10)]
    assert types[-1] == "run_interrupted"
    view = second.runs.get("r_a")
    assert view is not None and view.state == "deleted"
    assert second.runs.count_active_runs_for_principal("p") == 0


@settings(max_examples=200, deadline=None)
@given(
    tail_events=st.integers(1, 80),
    steps=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=30),
    cursors=st.lists(st.integers(0, 700), min_size=1, max_size=6),
    limit=st.integers(1, 90),
)
def test_a_run_tail_shows_what_it_showed_when_built(
    tail_events: int, steps: list[tuple[int, int]], cursors: list[int], limit: int
) -> None:
    """Sans-IO model check of :func:`extend_tail`: each tail keeps showing exactly the
    newest ``tail_events`` events of its own history, however its successors (or a fork
    from an older tail, as after a publish that failed half-way) append to the open
    chunk they share."""
    seq = 0
    tails: list[tuple[RunTail, list[Event]]] = []
    for count, back in steps:
        new = [Event(seq + i + 1, "r", "stats", 0, "p", {}) for i in range(count)]
        seq += count
        if tails:
            # back > 0 extends an older tail again (a fork); 0 the newest one.
            old, history = tails[max(0, len(tails) - 1 - back)]
            tails.append((extend_tail(old, new, tail_events, False), history + new))
        else:
            tails.append((extend_tail(None, new, tail_events, True), new))
    for tail, history in tails:
        shown = history[-tail_events:]
        complete = len(history) <= tail_events
        seeded = RunTail.of(shown, complete)  # as recovery's warm-up builds it
        for candidate in (tail, seeded):
            assert list(candidate.events) == shown
            assert candidate.size == len(shown)
            assert candidate.complete == complete
            for after in cursors:
                assert candidate.covers(after) == (complete or shown[0].seq <= after + 1)
                if candidate.covers(after):
                    want = [e for e in shown if e.seq > after][:limit]
                    assert candidate.after(after, limit) == want
