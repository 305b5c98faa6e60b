"""Stop and delete of runs (:mod:`whip.run_control`), on a real timeline.

Pinned here, as the module docstring states them:

- visibility: another principal's run answers exactly like a run that does not exist
  (404 ``not_found``); operators see every run;
- stop: durable ``stop_requested`` then the live session's close (reason ``stopped``);
  an ``ended``, ``interrupted`` or ``deleted`` run is 409 ``not_live``; a repeat answers
  ``repeat: true`` with the first ``stop_requested`` seq and appends nothing; concurrent
  stops share one transaction; a cancelled caller does not stop the transaction;
- delete: single-winner ``run_deleted`` then the close; a run never seen is 404 and
  nothing is appended; concurrent deletes append one ``run_deleted``.

:class:`RunControl` is built directly: a real timeline, a real :class:`DetachedTasks`, and
for the session manager's part a finder over a dict the test controls and a close that
records its calls (and can be held open by an event). No media: most runs have no session.

How each test was checked to fail (then restored): the 409 test by emptying
``NOT_LIVE``; the repeat test by dropping the ``view.state == "stopping"`` branch; the
concurrent-stop test by not recording the task in ``_stops``; the visibility tests by
dropping the principal comparison in ``visible``; the unknown-delete test by removing
``self.visible(...)`` from ``delete``; the cancellation tests by making ``stop`` await
the transaction without ``asyncio.shield`` and ``request_delete`` await ``_delete``
directly; the close tests by passing ``CloseReason.DELETED`` in ``_stop``/``_delete``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from registry.events import EventType, NewEvent
from registry.runs import ClaimKind
from registry.timeline import Timeline
from whip.admission import MediaBudget
from whip.auth import Principal, Role
from whip.detached import DetachedTasks
from whip.errors import NotFoundError
from whip.live_session import CloseReason, LiveSession
from whip.rtc.peer import close_quietly, new_peer_connection
from whip.run_control import NotLiveError, RunControl

ALICE = Principal("alice", Role.PUBLISHER)
BOB = Principal("bob", Role.PUBLISHER)
OPERATOR = Principal("ops", Role.OPERATOR)
WAIT_S = 10.0


@dataclass
class Sessions:
    """The session manager's side of :class:`RunControl`: live sessions by run in a dict
    the test controls, and a close that records each call. ``hold`` (when given) keeps
    every close open until it is set."""

    by_run: dict[str, LiveSession] = field(default_factory=dict)
    closes: list[tuple[str, CloseReason]] = field(default_factory=list)
    hold: asyncio.Event | None = None
    close_entered: asyncio.Event = field(default_factory=asyncio.Event)
    closes_finished: int = 0

    def find(self, run_id: str) -> LiveSession | None:
        return self.by_run.get(run_id)

    async def close(self, session: LiveSession, reason: CloseReason) -> bool:
        self.closes.append((session.session_id, reason))
        self.close_entered.set()
        if self.hold is not None:
            await self.hold.wait()
        self.closes_finished += 1
        return True


@dataclass
class Harness:
    timeline: Timeline
    control: RunControl
    detached: DetachedTasks
    sessions: Sessions

    async def create(self, run_id: str, principal: Principal = ALICE) -> int:
        return await self.timeline.append(
            NewEvent(run_id, EventType.RUN_CREATED, principal.name, {"stream": "main"})
        )

    async def types(self, run_id: str) -> list[str]:
        return [e.type for e in await self.timeline.read_events(run_id, 0, 1000)]

    def appended(self) -> int:
        """Durable events so far, all runs (what "appends nothing" is measured by)."""
        return self.timeline.wal.stats.appended


@pytest.fixture
async def harness(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> AsyncIterator[Harness]:
    timeline = await asyncio.to_thread(timeline_factory, tmp_path / "wal")
    detached = DetachedTasks()
    sessions = Sessions()
    yield Harness(
        timeline, RunControl(timeline, detached, sessions.find, sessions.close), detached, sessions
    )
    assert await detached.wait(WAIT_S) == [], "a stop or delete transaction never finished"


@pytest.fixture
async def live_session() -> AsyncIterator[Callable[[str], LiveSession]]:
    """``live_session(run_id)``: a session with a real (unconnected) peer connection."""
    made: list[LiveSession] = []
    budget = MediaBudget(1 << 20, 8)

    def make(run_id: str) -> LiveSession:
        session = LiveSession(
            session_id=f"s_{run_id}",
            run_id=run_id,
            principal=ALICE.name,
            stream="main",
            pc=new_peer_connection(),
            permit=budget.reserve(1024, 1),
            etag='"1"',
            posted_at=0.0,
        )
        made.append(session)
        return session

    yield make
    for session in made:
        await close_quietly(session.pc, "test")


# ------------------------------------------------------------------ stop


async def test_stop_appends_stop_requested_and_answers_its_seq(harness: Harness) -> None:
    await harness.create("r_1")
    result = await harness.control.stop("r_1", ALICE)
    events = await harness.timeline.read_events("r_1", 0, 10)
    assert [(e.type, e.data) for e in events] == [
        ("run_created", {"stream": "main"}),
        ("stop_requested", {"by": "alice"}),
    ]
    assert (result.seq, result.repeat, result.run.state) == (events[1].seq, False, "stopping")
    assert harness.sessions.closes == [], "no live session: nothing to close"


async def test_stop_closes_the_live_session_as_stopped(
    harness: Harness, live_session: Callable[[str], LiveSession]
) -> None:
    await harness.create("r_1")
    harness.sessions.by_run["r_1"] = live_session("r_1")
    await harness.control.stop("r_1", ALICE)
    assert harness.sessions.closes == [("s_r_1", CloseReason.STOPPED)]


@pytest.mark.parametrize("end", ["ended", "interrupted", "deleted"])
async def test_stop_of_a_run_that_is_over_is_409_not_live_and_appends_nothing(
    harness: Harness, end: str
) -> None:
    await harness.create("r_1")
    if end == "ended":
        await harness.timeline.append(
            NewEvent("r_1", EventType.SESSION_CLOSED, "alice", {"reason": "peer_gone"})
        )
    elif end == "interrupted":
        await harness.timeline.append(NewEvent("r_1", EventType.RUN_INTERRUPTED, "alice", {}))
    else:
        await harness.timeline.delete_run("r_1", "alice")
    before, history = harness.appended(), await harness.types("r_1")
    with pytest.raises(NotLiveError) as refused:
        await harness.control.stop("r_1", ALICE)
    assert (refused.value.http_status, refused.value.code) == (409, "not_live")
    assert end in str(refused.value)
    assert harness.appended() == before
    assert await harness.types("r_1") == history


async def test_a_repeat_stop_answers_the_first_seq_and_appends_nothing(harness: Harness) -> None:
    await harness.create("r_1")
    first = await harness.control.stop("r_1", ALICE)
    before = harness.appended()
    again = await harness.control.stop("r_1", OPERATOR)
    assert (again.repeat, again.seq, again.run.state) == (True, first.seq, "stopping")
    assert harness.appended() == before
    assert await harness.types("r_1") == ["run_created", "stop_requested"]


async def test_concurrent_stops_share_one_transaction(
    harness: Harness, live_session: Callable[[str], LiveSession]
) -> None:
    await harness.create("r_1")
    harness.sessions.by_run["r_1"] = live_session("r_1")
    # All eight reach RunControl.stop before the first one's transaction has run a step.
    results = await asyncio.gather(*(harness.control.stop("r_1", ALICE) for _ in range(8)))
    assert await harness.types("r_1") == ["run_created", "stop_requested"]
    assert len({r.seq for r in results}) == 1
    assert [r.repeat for r in results] == [False] + [True] * 7
    assert harness.sessions.closes == [("s_r_1", CloseReason.STOPPED)]


@pytest.mark.parametrize("action", ["stop", "delete"])
async def test_a_cancelled_caller_does_not_stop_the_transaction(
    harness: Harness, live_session: Callable[[str], LiveSession], action: str
) -> None:
    await harness.create("r_1")
    harness.sessions.by_run["r_1"] = live_session("r_1")
    harness.sessions.hold = asyncio.Event()
    transaction = harness.control.stop if action == "stop" else harness.control.delete
    caller = asyncio.create_task(transaction("r_1", ALICE))
    await asyncio.wait_for(harness.sessions.close_entered.wait(), WAIT_S)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    harness.sessions.hold.set()
    assert await harness.detached.wait(WAIT_S) == []
    assert harness.sessions.closes == [("s_r_1", CloseReason.STOPPED)]
    assert harness.sessions.closes_finished == 1
    appended = "stop_requested" if action == "stop" else "run_deleted"
    assert await harness.types("r_1") == ["run_created", appended]


async def test_request_stop_makes_no_decision(harness: Harness) -> None:
    await harness.create("r_1")
    await harness.timeline.append(
        NewEvent("r_1", EventType.SESSION_CLOSED, "alice", {"reason": "peer_gone"})
    )
    seq = await harness.control.request_stop("r_1", "closers-race")
    events = await harness.timeline.read_events("r_1", 0, 10)
    assert (events[-1].seq, events[-1].type, events[-1].data) == (
        seq,
        "stop_requested",
        {"by": "closers-race"},
    )


# ------------------------------------------------------------------ visibility


async def test_another_principals_run_is_404_exactly_like_a_missing_one(harness: Harness) -> None:
    await harness.create("r_alice", ALICE)
    before = harness.appended()
    answers = []
    for run_id in ("r_alice", "r_never_seen"):
        for action in (harness.control.stop, harness.control.delete):
            with pytest.raises(NotFoundError) as refused:
                await action(run_id, BOB)
            error = refused.value
            answers.append((type(error), error.http_status, error.code, str(error)))
    assert set(answers) == {(NotFoundError, 404, "not_found", "no such run")}
    with pytest.raises(NotFoundError):
        await harness.control.visible("r_alice", BOB)
    assert harness.appended() == before
    assert await harness.types("r_alice") == ["run_created"]


async def test_the_owner_and_operators_see_the_run(harness: Harness) -> None:
    await harness.create("r_1", ALICE)
    assert (await harness.control.visible("r_1", ALICE)).principal == "alice"
    assert (await harness.control.visible("r_1", OPERATOR)).run_id == "r_1"
    result = await harness.control.stop("r_1", OPERATOR)
    assert result.run.state == "stopping"


# ------------------------------------------------------------------ delete


async def test_delete_of_an_unknown_run_is_404_and_appends_nothing(harness: Harness) -> None:
    before = harness.appended()
    for caller in (ALICE, OPERATOR):
        with pytest.raises(NotFoundError):
            await harness.control.delete("r_never_seen", caller)
    assert harness.appended() == before
    assert harness.timeline.runs.get("r_never_seen") is None, "no placeholder was made"


async def test_eight_concurrent_deletes_append_one_run_deleted(
    harness: Harness, live_session: Callable[[str], LiveSession]
) -> None:
    await harness.create("r_1")
    harness.sessions.by_run["r_1"] = live_session("r_1")
    results = await asyncio.gather(*(harness.control.delete("r_1", ALICE) for _ in range(8)))
    assert await harness.types("r_1") == ["run_created", "run_deleted"]
    outcomes = sorted(r.outcome for r in results)
    assert outcomes == sorted([ClaimKind.CLAIMED] + [ClaimKind.ALREADY_DELETED] * 7)
    assert len({r.event.seq for r in results}) == 1
    assert harness.timeline.runs.get("r_1") is not None
    assert (await harness.control.visible("r_1", ALICE)).state == "deleted"
    # The session manager's close decides the one winner; every delete asks it, as stopped.
    assert harness.sessions.closes
    assert set(harness.sessions.closes) == {("s_r_1", CloseReason.STOPPED)}


async def test_a_repeat_delete_appends_nothing(harness: Harness) -> None:
    await harness.create("r_1")
    first = await harness.control.delete("r_1", ALICE)
    before = harness.appended()
    again = await harness.control.delete("r_1", OPERATOR)
    assert (first.synthesized, again.synthesized) == (False, True)
    assert again.event.seq == first.event.seq
    assert harness.appended() == before
