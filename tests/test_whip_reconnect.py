"""Reconnects (supersede / reject), ICE server links and advertised public hosts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.eventually import eventually
from tests.support.peers import AiortcPublisher
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.session_manager import SessionManager


@pytest.fixture
def start(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> Callable[..., Awaitable[TestServer]]:
    return whip_servers


async def test_a_reconnect_to_the_same_stream_supersedes_the_ghost(
    start: Callable[..., Any],
) -> None:
    server = await start()
    manager: SessionManager = server.app[SESSIONS_KEY]
    timeline = server.app[TIMELINE_KEY]
    ghost, fresh, other = AiortcPublisher(), AiortcPublisher(), AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        first = await ghost.publish(http, str(server.make_url("/whip/cam")))
        assert first.status == 201
        await asyncio.wait_for(ghost.connected.wait(), 20)
        elsewhere = await other.publish(http, str(server.make_url("/whip/other")))
        assert elsewhere.status == 201
        second = await fresh.publish(http, str(server.make_url("/whip/cam")))
        assert second.status == 201
        # The ghost's session is gone with reason superseded; its run ended; the other
        # stream is untouched; its URL now answers DELETE from the tombstone.
        ghost_events = await timeline.read_events(ghost.run_id, 0, 100)
        assert [e.data for e in ghost_events if e.type == "session_closed"] == [
            {"reason": "superseded"}
        ]
        view = timeline.runs.get(ghost.run_id)
        assert view is not None and view.state == "ended"
        assert {s.stream for s in manager.table.live()} == {"cam", "other"}
        stale = await http.delete(server.make_url(ghost.location))
        assert stale.status == 200
    for publisher in (ghost, fresh, other):
        await publisher.close()


async def test_reject_policy_answers_409_and_keeps_the_live_session(
    start: Callable[..., Any],
) -> None:
    server = await start(server__reconnect="reject")
    manager: SessionManager = server.app[SESSIONS_KEY]
    live, late = AiortcPublisher(), AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        assert (await live.publish(http, str(server.make_url("/whip/cam")))).status == 201
        refused = await late.publish(http, str(server.make_url("/whip/cam")))
        assert refused.status == 409
        assert (await refused.json())["error"]["code"] == "stream_busy"
        assert len(manager.table) == 1
        assert manager.slots.reserved() == 0 and manager.budget.figures().bytes_reserved > 0
    await live.close()
    await late.close()


async def test_ice_server_links_and_a_nat_public_host_in_the_answer(
    start: Callable[..., Any],
) -> None:
    # Loopback literals: the server may really try these servers while gathering.
    server = await start(
        server__ice_servers=[
            "stun:127.0.0.1:3478",
            {"url": "turn:127.0.0.1:3479", "username": "u", "credential": "c"},
        ],
        server__public_hosts=["203.0.113.7"],
    )
    publisher = AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        offer = await publisher.offer()
        response = await http.post(
            server.make_url("/whip"), data=offer, headers={"Content-Type": "application/sdp"}
        )
        assert response.status == 201
        links = response.headers.getall("Link")
        assert '<stun:127.0.0.1:3478>; rel="ice-server"' in links
        assert any(link.startswith("<turn:127.0.0.1:3479>") for link in links)
        answer = await response.text()
        assert " 203.0.113.7 " in answer, "the NAT address is advertised as a host candidate"
        assert " 127.0.0.1 " in answer
        await http.delete(server.make_url(response.headers["Location"]))
    await publisher.close()


async def test_a_client_that_hangs_up_mid_post_leaves_no_half_built_session(
    start: Callable[..., Any],
) -> None:
    server = await start(limits__connect_timeout_s=2)
    manager: SessionManager = server.app[SESSIONS_KEY]
    timeline = server.app[TIMELINE_KEY]
    offerer = AiortcPublisher()
    offer = (await offerer.offer()).encode()
    await offerer.close()
    _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"POST /whip/hangup HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\n"
        + f"Content-Length: {len(offer)}\r\n\r\n".encode()
        + offer
    )
    await writer.drain()
    writer.close()  # gone before any answer
    await writer.wait_closed()
    await eventually(
        manager.table.live, within=10, awaiting="the detached admission completed", every=0.01
    )
    # Fully built: a live session owned by its reclaimer, its run_created durable.
    (session,) = manager.table.live()
    (run,) = timeline.runs.list_runs()
    assert session.run_id == run.run_id and session.reclaimer is not None

    async def closes() -> list[dict[str, object]]:
        events = await timeline.read_events(run.run_id, 0, 1000)
        return [e.data for e in events if e.type == "session_closed"]

    closed = await eventually(closes, within=10, awaiting="the session closed")
    assert closed == [{"reason": "peer_gone"}]
    assert len(manager.table) == 0 and manager.slots.reserved() == 0
    assert manager.budget.figures().bytes_reserved == 0
