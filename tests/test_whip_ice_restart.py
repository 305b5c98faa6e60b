"""ICE restart over PATCH (RFC 9725 section 4.3.2) with real aiortc publishers on loopback.

A publisher restarts mid-push through its own aioice connection
(``tests/support/ice_restart_client.py``); the server answers its new credentials and
candidates with a new ETag; both sides nominate a pair of the new generation; DTLS, SRTP
and the decoders carry on: one run, one session, ``ice_restarted`` on its timeline, the
old ETag now 412. Refused restarts change nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.eventually import eventually
from tests.support.ice_restart_client import restart_publisher_ice
from tests.support.peers import AiortcPublisher
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.live_session import LiveSession
from whip.live_stats import read_figures
from whip.rtc.ice_restart import RestartOutcome, bundle_ice_transport, ice_connection
from whip.session_manager import SessionManager
from whip.trickle import CONTENT_TYPE as FRAG

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def server(whip_servers: Callable[..., Awaitable[TestServer]]) -> TestServer:
    return await whip_servers()


async def _live_push(
    server: TestServer, http: aiohttp.ClientSession
) -> tuple[AiortcPublisher, LiveSession, str]:
    manager: SessionManager = server.app[SESSIONS_KEY]
    publisher = AiortcPublisher()
    response = await publisher.publish(http, str(server.make_url("/whip")))
    assert response.status == 201, await response.text()
    assert response.headers["Accept-Patch"] == FRAG
    (session,) = manager.table.live()
    await wait_for_type(server.app[TIMELINE_KEY], publisher.run_id, "first_frame")
    return publisher, session, response.headers["ETag"]


async def _decoded(session: LiveSession) -> int:
    return (await read_figures(session)).frames_decoded


@pytest.mark.parametrize("send_candidates", [True, False], ids=["candidates", "prflx"])
async def test_aiortc_publisher_restarts_ice_mid_push(
    server: TestServer, send_candidates: bool
) -> None:
    manager: SessionManager = server.app[SESSIONS_KEY]
    timeline = server.app[TIMELINE_KEY]
    async with aiohttp.ClientSession() as http:
        publisher, session, first_etag = await _live_push(server, http)
        url = str(server.make_url(publisher.location))
        server_ice = ice_connection(bundle_ice_transport(session.pc))
        client_ice = ice_connection(bundle_ice_transport(publisher.pc))
        old_pairs = (server_ice._nominated[1], client_ice._nominated[1])
        old_server_ufrag = server_ice.local_username

        restarted = await restart_publisher_ice(
            publisher, http, url, send_candidates=send_candidates
        )

        assert restarted.status == 200
        assert restarted.etag is not None and restarted.etag != first_etag
        assert restarted.etag == session.etag
        answer = restarted.answer
        assert answer is not None and answer.candidates and answer.end_of_candidates
        assert answer.ice_ufrag == server_ice.local_username != old_server_ufrag
        assert answer.ice_pwd == server_ice.local_password
        assert server_ice.remote_username == restarted.local.ufrag
        assert restarted.restart is not None
        assert await restarted.restart.settled() is RestartOutcome.COMPLETED
        event = await wait_for_type(timeline, publisher.run_id, "ice_restarted")
        assert event.data["generation"] == 1 and event.data["outcome"] == "completed"
        # A pair of the new generation carries the media on both sides.
        assert server_ice._nominated[1] is not old_pairs[0]
        assert client_ice._nominated[1] is not old_pairs[1]
        before = await _decoded(session)

        async def decoding_on() -> bool:
            return await _decoded(session) > before + 10

        await eventually(decoding_on, within=20, awaiting="frames decoded after the restart")

        # The old ETag names the old ICE session; the new one trickles (204, no ETag).
        candidate = "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"
        stale = await http.patch(
            url, data=candidate, headers={"Content-Type": FRAG, "If-Match": first_etag}
        )
        assert stale.status == 412
        assert (await stale.json())["error"]["code"] == "precondition_failed"
        fresh = await http.patch(
            url, data=candidate, headers={"Content-Type": FRAG, "If-Match": session.etag}
        )
        assert fresh.status == 204 and "ETag" not in fresh.headers

        # One run, one session, still connected.
        assert manager.table.live() == [session] and len(timeline.runs.list_runs()) == 1
        metrics = await (await http.get(server.make_url("/metrics"))).text()
        assert 'whip_ice_restarts_total{outcome="completed"} 1.0' in metrics
        assert publisher.pc.connectionState == "connected"
        deleted = await http.delete(url)
        assert deleted.status == 200
    await publisher.close()
    events = await timeline.read_events(publisher.run_id, 0, 1000)
    types = [e.type for e in events]
    assert types.count("session_connected") == 1 and types.count("ice_restarted") == 1
    assert [e.data for e in events if e.type == "session_closed"] == [{"reason": "deleted"}]


async def test_two_restarts_in_a_row_each_take_over(server: TestServer) -> None:
    timeline = server.app[TIMELINE_KEY]
    async with aiohttp.ClientSession() as http:
        publisher, session, _ = await _live_push(server, http)
        url = str(server.make_url(publisher.location))
        tags = []
        for _ in range(2):
            restarted = await restart_publisher_ice(publisher, http, url)
            assert restarted.status == 200 and restarted.restart is not None
            assert await restarted.restart.settled() is RestartOutcome.COMPLETED
            server_side = session.ice_restart
            assert server_side is not None  # the server nominates a moment after the client
            assert await server_side.settled() is RestartOutcome.COMPLETED
            tags.append(restarted.etag)
        assert len(set(tags)) == 2 and session.etag == tags[-1] and session.ice_generation == 2
        before = await _decoded(session)

        async def decoding_on() -> bool:
            return await _decoded(session) > before + 10

        await eventually(decoding_on, within=20, awaiting="frames decoded after two restarts")

        async def recorded() -> list[Any]:
            events = await timeline.read_events(publisher.run_id, 0, 1000)
            return [e.data for e in events if e.type == "ice_restarted"]

        restarts = await eventually(
            lambda: _when_two(recorded), within=20, awaiting="two ice_restarted events"
        )
        assert [d["generation"] for d in restarts] == [1, 2]
        assert all(d["outcome"] == "completed" for d in restarts)
        await http.delete(url)
    await publisher.close()


async def _when_two(read: Callable[[], Awaitable[list[Any]]]) -> list[Any] | None:
    found = await read()
    return found if len(found) >= 2 else None


async def test_concurrent_restarts_trickles_and_a_delete_are_serialized(
    server: TestServer,
) -> None:
    """Restarts, trickles (each sent once some restarts were answered, with the newest
    ETag its sender knows, one candidate on a port of its own) and then a DELETE, all at
    once. Every PATCH is judged inside the
    session's lock against the ETag of that moment, so the candidates the final ICE
    generation holds came exactly from the trickles answered 204 with the final ETag; the
    final ETag and credentials come from the same 200; the DELETE wins once; nothing
    is ever a 500."""
    manager: SessionManager = server.app[SESSIONS_KEY]
    timeline = server.app[TIMELINE_KEY]
    async with aiohttp.ClientSession() as http:
        publisher, session, first_etag = await _live_push(server, http)
        url = str(server.make_url(publisher.location))
        ice = ice_connection(bundle_ice_transport(session.pc))
        known = [first_etag]
        answered = [asyncio.Event() for _ in range(13)]
        answered[0].set()
        restarts: list[tuple[int, str | None, str]] = []
        trickles: dict[int, tuple[int, str]] = {}

        async def restart(n: int) -> None:
            body = f"a=ice-ufrag:client{n:03d}\r\na=ice-pwd:{'p' * 22}{n:03d}\r\n"
            answer = await http.patch(
                url, data=body, headers={"Content-Type": FRAG, "If-Match": "*"}
            )
            text = await answer.text()
            restarts.append((answer.status, answer.headers.get("ETag"), text))
            if answer.status == 200:
                known.append(answer.headers["ETag"])
            answered[len(restarts)].set()

        async def trickle(port: int, after: int, stale: bool = False) -> None:
            await answered[after].wait()  # sent once ``after`` restarts were answered
            tag = first_etag if stale else known[-1]
            line = f"a=candidate:{port} 1 udp 1 127.0.0.1 {port} typ host\r\n"
            answer = await http.patch(
                url, data=line, headers={"Content-Type": FRAG, "If-Match": tag}
            )
            trickles[port] = (answer.status, tag)

        async with asyncio.TaskGroup() as group:
            for n in range(12):
                group.create_task(restart(n))
                group.create_task(trickle(41000 + 2 * n, n))
                group.create_task(trickle(41001 + 2 * n, n + 1))
            group.create_task(trickle(41999, 12, stale=True))
        statuses = [s for s, _, _ in restarts] + [s for s, _ in trickles.values()]
        assert set(statuses) <= {200, 204, 412}, statuses
        applied = [(tag, text) for status, tag, text in restarts if status == 200]
        assert len(applied) == session.ice_generation == 12
        assert len({tag for tag, _ in applied}) == 12
        (final,) = [text for tag, text in applied if tag == session.etag]
        assert f"a=ice-ufrag:{ice.local_username}\r\n" in final
        held = {c.port for c in ice.remote_candidates if 41000 <= c.port < 42000}
        accepted_last = {
            port
            for port, (status, tag) in trickles.items()
            if status == 204 and tag == session.etag
        }
        assert held == accepted_last
        assert trickles[41999][0] == 412 and trickles[41023][0] == 204

        # A DELETE among more PATCHes: it wins once; the PATCHes after it are refused.
        answers: list[int] = []

        async def late_patch(n: int) -> None:
            body = f"a=ice-ufrag:late{n:03d}\r\na=ice-pwd:{'q' * 22}{n:03d}\r\n"
            answer = await http.patch(
                url, data=body, headers={"Content-Type": FRAG, "If-Match": "*"}
            )
            answers.append(answer.status)

        async with asyncio.TaskGroup() as group:
            for n in range(8):
                group.create_task(late_patch(n))
            deleting = group.create_task(http.delete(url))
            for n in range(8, 16):
                group.create_task(late_patch(n))
        assert deleting.result().status == 200
        assert set(answers) <= {200, 404, 409}, answers
        assert manager.table.live() == []
        after = await http.patch(url, data=b"", headers={"Content-Type": FRAG, "If-Match": "*"})
        assert after.status == 404
    await publisher.close()
    events = await timeline.read_events(publisher.run_id, 0, 1000)
    assert [e.data for e in events if e.type == "session_closed"] == [{"reason": "deleted"}]


async def test_a_restart_the_publisher_never_follows_keeps_the_old_pair(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    """The server restarts (200) but the publisher never applies the answer: no pair of
    the new generation is ever nominated, so the kept pair carries the media throughout
    and the restart settles as ``timed_out`` (bounded by ``limits.reclaim_after_s``)."""
    server = await whip_servers(limits__reclaim_after_s=3)
    timeline = server.app[TIMELINE_KEY]
    async with aiohttp.ClientSession() as http:
        publisher, session, _ = await _live_push(server, http)
        server_ice = ice_connection(bundle_ice_transport(session.pc))
        kept = server_ice._nominated[1]
        body = "a=ice-ufrag:neverapplied\r\na=ice-pwd:neverappliedneverapplied\r\n"
        answer = await http.patch(
            str(server.make_url(publisher.location)),
            data=body,
            headers={"Content-Type": FRAG, "If-Match": "*"},
        )
        assert answer.status == 200
        event = await wait_for_type(timeline, publisher.run_id, "ice_restarted", wait_s=20)
        assert event.data["outcome"] == "timed_out"
        assert server_ice._nominated[1] is kept
        before = await _decoded(session)

        async def decoding_on() -> bool:
            return await _decoded(session) > before + 10

        await eventually(decoding_on, within=20, awaiting="frames over the kept pair")
        assert session.state.value == "connected"
        await http.delete(str(server.make_url(publisher.location)))
    await publisher.close()


async def test_back_to_back_restarts_each_settle_and_are_recorded(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    """Restarts sent back to back (the next may supersede the previous before its task
    ran): each settles and is recorded once, the last one's ETag stands (the publisher
    follows none, so the last one times out after ``limits.reclaim_after_s``)."""
    server = await whip_servers(limits__reclaim_after_s=3)
    timeline = server.app[TIMELINE_KEY]
    manager: SessionManager = server.app[SESSIONS_KEY]
    async with aiohttp.ClientSession() as http:
        publisher, session, _ = await _live_push(server, http)
        url = str(server.make_url(publisher.location))

        async def restart(n: int) -> str | None:
            body = f"a=ice-ufrag:again{n:03d}\r\na=ice-pwd:{'r' * 22}{n:03d}\r\n"
            answer = await http.patch(
                url, data=body, headers={"Content-Type": FRAG, "If-Match": "*"}
            )
            assert answer.status == 200
            return answer.headers["ETag"]

        tags = await asyncio.gather(*(restart(n) for n in range(6)))
        assert session.etag in tags and len(set(tags)) == 6

        async def all_recorded() -> list[Any] | None:
            events = await timeline.read_events(publisher.run_id, 0, 1000)
            found = [e.data for e in events if e.type == "ice_restarted"]
            return found if len(found) == 6 else None

        recorded = await eventually(all_recorded, within=20, awaiting="six ice_restarted")
        assert sorted(d["generation"] for d in recorded) == [1, 2, 3, 4, 5, 6]
        by_generation = {d["generation"]: d["outcome"] for d in recorded}
        assert {by_generation[g] for g in range(1, 6)} == {"superseded"}
        assert by_generation[6] == "timed_out"
        assert sum(manager.patches.restarts.values()) == 6
        await http.delete(url)
    await publisher.close()
