"""The reclaimer (:mod:`whip.reclaimer`): one watch per session, ending it when its peer goes.

Pinned here, as the module docstring states them, with real aiortc peers on 127.0.0.1
(the server side is the session's peer connection, negotiated before the watch starts,
as the session transaction does):

- the first ``connected`` moves the session ADMITTED -> CONNECTED, then ``on_connected``
  runs (once);
- the peer going away (``closed``) ends the watch and hands the session to ``on_gone``,
  once; the reclaimer itself never closes the session;
- a session that never connects is handed to ``on_gone`` after ``connect_timeout_s``;
- an unexpected error ends the watch too, and the session still goes to ``on_gone``;
- no ``on_gone`` for a session already closing (the manager's close won it and cancels
  the watch, or closes the peer under it);
- while connected with media flowing, the run's activity is recorded every
  :data:`ACTIVITY_TOUCH_S`.

``on_connected``/``on_gone``/``touch_run`` are the test's: they record each call (with
the session's lifecycle at that moment) and set events the test waits on.

Checked to fail (then restored): with ``session.advance(SessionState.CONNECTED)`` after
``on_connected``, the connect test fails (the callback sees ADMITTED); with the
``finally`` block's ``if not session.closing`` dropped, both closing tests fail; with the
deadline check removed, the never-connects test fails; with the ``except`` branch
returning before ``on_gone``, the error test fails; with ``_touch_if_alive`` never
calling ``touch_run``, the activity test fails.

Found and fixed: a session that never connected got its run's activity recorded once at
the connect deadline when ``connect_timeout_s`` was under :data:`ACTIVITY_TOUCH_S`
(``test_a_session_that_never_connects_records_no_activity``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from tests.support.eventually import eventually
from tests.support.loopback import ConnectionStates, LoopbackPeers, loopback_peers
from whip.admission import MediaBudget
from whip.live_session import LiveSession, SessionState
from whip.reclaimer import ACTIVITY_TOUCH_S, Reclaimer
from whip.rtc.liveness import install_media_liveness

ADMITTED, CONNECTED, CLOSING = SessionState.ADMITTED, SessionState.CONNECTED, SessionState.CLOSING
WAIT_S = 15.0
NO_CONNECT_TIMEOUT_S = 0.3


@pytest.fixture
async def peers() -> AsyncIterator[LoopbackPeers]:
    async with loopback_peers() as pool:
        yield pool


@dataclass
class Calls:
    """What the reclaimer called, in order, with the session's lifecycle at the time."""

    log: list[tuple[str, list[SessionState]]] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    touched: asyncio.Event = field(default_factory=asyncio.Event)
    gone_at: float | None = None
    fail_on_connected: bool = False

    async def on_connected(self, session: LiveSession) -> None:
        self.log.append(("connected", list(session.lifecycle)))
        self.connected.set()
        if self.fail_on_connected:
            raise RuntimeError("session_connected could not be appended")

    def on_gone(self, session: LiveSession) -> None:
        self.log.append(("gone", list(session.lifecycle)))
        self.gone_at = time.monotonic()
        self.gone.set()

    def touch_run(self, run_id: str) -> None:
        self.log.append((f"touch {run_id}", []))
        self.touched.set()

    def reclaimer(self, connect_timeout_s: float = WAIT_S) -> Reclaimer:
        return Reclaimer(
            connect_timeout_s=connect_timeout_s,
            on_connected=self.on_connected,
            on_gone=self.on_gone,
            touch_run=self.touch_run,
        )


async def wait(event: asyncio.Event, what: str) -> None:
    await eventually(event.is_set, within=WAIT_S, awaiting=what)


@dataclass
class Negotiated:
    publisher: RTCPeerConnection
    session: LiveSession
    answer: str

    async def answer_publisher(self) -> None:
        await self.publisher.setRemoteDescription(
            RTCSessionDescription(sdp=self.answer, type="answer")
        )


async def negotiated_session(peers: LoopbackPeers, *, media: bool = False) -> Negotiated:
    """A publisher's offer answered by a server-side peer, and the live session holding
    that peer (as the transaction inserts it: the publisher has not seen the answer)."""
    publisher, server = peers.new(), peers.new()
    offer = await peers.publisher_offer(publisher, video=False, media=media)
    await server.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    for transceiver in server.getTransceivers():
        transceiver.direction = "recvonly"
    liveness = install_media_liveness(server, timeout_s=30)
    await server.setLocalDescription(await server.createAnswer())
    session = LiveSession(
        session_id="s_1",
        run_id="r_1",
        principal="studio-a",
        stream="main",
        pc=server,
        permit=MediaBudget(1 << 20, 4).reserve(1024, 1),
        etag='"1"',
        posted_at=time.monotonic(),
        liveness=liveness,
    )
    return Negotiated(publisher, session, str(server.localDescription.sdp))


async def test_a_publisher_that_connects_then_closes(peers: LoopbackPeers) -> None:
    calls = Calls()
    pair = await negotiated_session(peers)
    session = pair.session
    task = calls.reclaimer().start(session)
    assert session.reclaimer is task and task.get_name() == "reclaim-s_1"
    publisher_states = ConnectionStates(pair.publisher)
    await pair.answer_publisher()
    await wait(calls.connected, "on_connected")
    await publisher_states.reached("connected")
    await pair.publisher.close()
    await wait(calls.gone, "on_gone")
    async with asyncio.timeout(WAIT_S):
        await task
    assert calls.log == [("connected", [ADMITTED, CONNECTED]), ("gone", [ADMITTED, CONNECTED])]
    assert session.lifecycle == [ADMITTED, CONNECTED], "the reclaimer never closes a session"
    assert session.state_history[-2:] == ["connected", "closed"]
    assert session.state_history in (
        ["connecting", "connected", "closed"],
        ["connected", "closed"],  # "connecting" may come before the watch subscribes
    )


async def test_a_session_that_never_connects_is_gone_after_the_connect_timeout(
    peers: LoopbackPeers,
) -> None:
    calls = Calls()
    pair = await negotiated_session(peers)  # the publisher never gets the answer
    started = time.monotonic()
    task = calls.reclaimer(connect_timeout_s=NO_CONNECT_TIMEOUT_S).start(pair.session)
    await wait(calls.gone, "on_gone")
    async with asyncio.timeout(WAIT_S):
        await task
    assert calls.gone_at is not None and calls.gone_at - started >= NO_CONNECT_TIMEOUT_S
    assert [c for c in calls.log if not c[0].startswith("touch")] == [("gone", [ADMITTED])]
    assert pair.session.pc.connectionState != "connected"


async def test_a_session_that_never_connects_records_no_activity(peers: LoopbackPeers) -> None:
    calls = Calls()
    pair = await negotiated_session(peers)
    task = calls.reclaimer(connect_timeout_s=NO_CONNECT_TIMEOUT_S).start(pair.session)
    await wait(calls.gone, "on_gone")
    async with asyncio.timeout(WAIT_S):
        await task
    assert calls.log == [("gone", [ADMITTED])]


async def test_an_error_in_the_watch_still_hands_the_session_on(
    peers: LoopbackPeers, caplog: pytest.LogCaptureFixture
) -> None:
    calls = Calls(fail_on_connected=True)
    pair = await negotiated_session(peers)
    task = calls.reclaimer().start(pair.session)
    await pair.answer_publisher()
    with caplog.at_level(logging.ERROR, logger="whip.reclaimer"):
        await wait(calls.gone, "on_gone")
        async with asyncio.timeout(WAIT_S):
            await task
    assert task.exception() is None
    assert calls.log == [("connected", [ADMITTED, CONNECTED]), ("gone", [ADMITTED, CONNECTED])]
    assert any("reclaimer failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("how", ["cancelled", "peer closed"])
async def test_no_on_gone_for_a_session_already_closing(peers: LoopbackPeers, how: str) -> None:
    calls = Calls()
    pair = await negotiated_session(peers)
    session = pair.session
    task = calls.reclaimer().start(session)
    await pair.answer_publisher()
    await wait(calls.connected, "on_connected")
    session.advance(CLOSING)  # what the manager's close does once it won the session
    if how == "cancelled":
        task.cancel()
    else:
        await session.pc.close()
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(task, return_exceptions=True)
    assert task.done()
    assert calls.log == [("connected", [ADMITTED, CONNECTED])], "no on_gone"


async def test_media_flowing_records_the_runs_activity(peers: LoopbackPeers) -> None:
    # One activity interval (ACTIVITY_TOUCH_S, 5 s) must pass: a module constant the
    # reclaimer does not take as a parameter.
    calls = Calls()
    pair = await negotiated_session(peers, media=True)
    calls.reclaimer().start(pair.session)
    await pair.answer_publisher()
    await wait(calls.connected, "on_connected")
    try:
        async with asyncio.timeout(ACTIVITY_TOUCH_S + WAIT_S):
            await calls.touched.wait()
    except TimeoutError:
        raise AssertionError("the run's activity was never recorded") from None
    assert calls.log == [("connected", [ADMITTED, CONNECTED]), ("touch r_1", [])]
    liveness = pair.session.liveness
    assert liveness is not None and liveness.media_packets > 0
