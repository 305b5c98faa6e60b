"""The live session's lifecycle (:mod:`whip.live_session`): the transition table, whole.

Pinned here, as the module docstring states them:

- :data:`TRANSITIONS` allows exactly ADMITTED -> CONNECTED | CLOSING, CONNECTED ->
  CLOSING, CLOSING -> CLOSED; :meth:`LiveSession.advance` applies every allowed move and
  refuses every other one with :class:`SessionStateError`, leaving the state and the
  ``lifecycle`` history unchanged; CLOSED is absorbing.
- ``lifecycle`` records every state in order, starting with ADMITTED.
- ``connected``: the peer connected at some point (true from CONNECTED on, also while
  closing); ``closing``: the close has begun (CLOSING or CLOSED).

The sessions hold a real aiortc peer connection and a real media permit.

How each test was checked to fail (then restored): the table test by adding CLOSED to
ADMITTED's moves; the refusal test by making ``advance`` assign the state before its
check; the history test by dropping ``self.lifecycle.append(new)``; the flag test by
making ``connected`` read ``self.state is SessionState.CONNECTED``.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable

import pytest

from whip.admission import MediaBudget
from whip.live_session import TRANSITIONS, LiveSession, SessionState, SessionStateError
from whip.rtc.peer import close_quietly, new_peer_connection

ADMITTED, CONNECTED, CLOSING, CLOSED = (
    SessionState.ADMITTED,
    SessionState.CONNECTED,
    SessionState.CLOSING,
    SessionState.CLOSED,
)

PATH_TO: dict[SessionState, tuple[SessionState, ...]] = {
    ADMITTED: (),
    CONNECTED: (CONNECTED,),
    CLOSING: (CONNECTED, CLOSING),
    CLOSED: (CONNECTED, CLOSING, CLOSED),
}
"""Allowed moves that take a new session to each state."""

ALLOWED = [(src, dst) for src, targets in TRANSITIONS.items() for dst in sorted(targets)]
REFUSED = [
    (src, dst)
    for src, dst in itertools.product(SessionState, SessionState)
    if dst not in TRANSITIONS[src]
]


@pytest.fixture
async def new_session() -> AsyncIterator[Callable[[], LiveSession]]:
    """Fresh sessions, each with its own peer connection (closed at teardown)."""
    budget = MediaBudget(1 << 20, 8)
    pcs = []

    def make() -> LiveSession:
        pc = new_peer_connection()
        pcs.append(pc)
        n = len(pcs)
        return LiveSession(
            session_id=f"s_{n}",
            run_id=f"r_{n}",
            principal="studio-a",
            stream="main",
            pc=pc,
            permit=budget.reserve(1024, 1),
            etag=f'"{n}"',
            posted_at=0.0,
        )

    yield make
    for pc in pcs:
        await close_quietly(pc, "test")


def drive(session: LiveSession, to: SessionState) -> None:
    for state in PATH_TO[to]:
        session.advance(state)
    assert session.state is to


def test_the_table_is_exactly_the_documented_one() -> None:
    documented = {
        ADMITTED: frozenset({CONNECTED, CLOSING}),
        CONNECTED: frozenset({CLOSING}),
        CLOSING: frozenset({CLOSED}),
        CLOSED: frozenset(),
    }
    assert documented == TRANSITIONS
    assert set(TRANSITIONS) == set(SessionState), "every state has a row"


@pytest.mark.parametrize(("src", "dst"), ALLOWED, ids=lambda s: str(s))
def test_every_allowed_move_is_applied(
    new_session: Callable[[], LiveSession], src: SessionState, dst: SessionState
) -> None:
    session = new_session()
    drive(session, src)
    before = list(session.lifecycle)
    session.advance(dst)
    assert session.state is dst
    assert session.lifecycle == [*before, dst]


@pytest.mark.parametrize(("src", "dst"), REFUSED, ids=lambda s: str(s))
def test_every_refused_move_raises_and_changes_nothing(
    new_session: Callable[[], LiveSession], src: SessionState, dst: SessionState
) -> None:
    session = new_session()
    drive(session, src)
    before = list(session.lifecycle)
    with pytest.raises(SessionStateError, match=f"{session.session_id}: {src} -> {dst}"):
        session.advance(dst)
    assert session.state is src
    assert session.lifecycle == before


def test_closed_is_absorbing(new_session: Callable[[], LiveSession]) -> None:
    session = new_session()
    drive(session, CLOSED)
    for target in SessionState:
        with pytest.raises(SessionStateError):
            session.advance(target)
    assert session.state is CLOSED
    assert session.lifecycle == [ADMITTED, CONNECTED, CLOSING, CLOSED]


def test_a_refused_move_is_our_bug_and_maps_to_500() -> None:
    assert SessionStateError.http_status == 500
    assert SessionStateError.code == "internal"


def test_lifecycle_records_whole_histories(new_session: Callable[[], LiveSession]) -> None:
    connected = new_session()
    never_connected = new_session()
    assert connected.lifecycle == [ADMITTED] and connected.state is ADMITTED
    for state in (CONNECTED, CLOSING, CLOSED):
        connected.advance(state)
    for state in (CLOSING, CLOSED):
        never_connected.advance(state)
    assert connected.lifecycle == [ADMITTED, CONNECTED, CLOSING, CLOSED]
    assert never_connected.lifecycle == [ADMITTED, CLOSING, CLOSED]
    assert connected.state_history == [] == never_connected.state_history, (
        "the peer's connection states are the reclaimer's to record"
    )


def test_each_session_has_its_own_history(new_session: Callable[[], LiveSession]) -> None:
    first, second = new_session(), new_session()
    first.advance(CONNECTED)
    assert second.lifecycle == [ADMITTED]


def test_connected_and_closing_along_both_paths(new_session: Callable[[], LiveSession]) -> None:
    def flags(session: LiveSession) -> tuple[bool, bool]:
        return session.connected, session.closing

    session = new_session()
    seen = [flags(session)]
    for state in (CONNECTED, CLOSING, CLOSED):
        session.advance(state)
        seen.append(flags(session))
    assert seen == [(False, False), (True, False), (True, True), (True, True)]

    session = new_session()
    seen = [flags(session)]
    for state in (CLOSING, CLOSED):
        session.advance(state)
        seen.append(flags(session))
    assert seen == [(False, False), (False, True), (False, True)], (
        "a session that never connected stays not connected while it closes"
    )
