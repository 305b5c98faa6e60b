"""WHIP over real loopback UDP against the real aiohttp server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from registry.timeline import Timeline
from tests.support.peers import AiortcPublisher, ffmpeg_whip_push
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.auth import hash_token
from whip.session_manager import SessionManager

FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture
def server_factory(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> Callable[..., Awaitable[TestServer]]:
    return whip_servers


async def _events(timeline: Timeline, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in await timeline.read_events(run_id, 0, 1000)]


async def test_aiortc_publisher_connects_and_delete_closes_it(
    server_factory: Callable[..., Any],
) -> None:
    server = await server_factory()
    timeline = server.app[TIMELINE_KEY]
    manager: SessionManager = server.app[SESSIONS_KEY]
    publisher = AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        response = await publisher.publish(http, str(server.make_url("/whip/cam-1")))
        assert response.status == 201
        assert response.headers["Content-Type"].startswith("application/sdp")
        assert response.headers["Location"].startswith("/whip/sessions/s_")
        assert response.headers["ETag"].startswith('"')
        assert response.headers["Link"] == f'</v1/runs/{publisher.run_id}>; rel="related"'
        answer = await response.text()
        assert "a=recvonly" in answer and "a=sendrecv" not in answer
        assert "a=end-of-candidates" in answer and "typ host" in answer
        await asyncio.wait_for(publisher.connected.wait(), 20)
        await wait_for_type(timeline, publisher.run_id, "session_connected")
        assert len(manager.table) == 1

        deleted = await http.delete(server.make_url(publisher.location))
        assert deleted.status == 200
        again = await http.delete(server.make_url(publisher.location))
        assert again.status == 200, "a repeated DELETE is answered from the tombstone"
        unknown = await http.delete(server.make_url("/whip/sessions/s_AAAAAAAAAAAAAAAAAAAAAA"))
        assert unknown.status == 404
        assert (await unknown.json())["error"]["code"] == "not_found"
    await publisher.close()
    events = await _events(timeline, publisher.run_id)
    types = [t for t, _ in events]
    assert types[:2] == ["run_created", "session_connected"]
    closed = [d for t, d in events if t == "session_closed"]
    assert closed == [{"reason": "deleted"}]
    assert events[0][1]["stream"] == "cam-1"
    view = timeline.runs.get(publisher.run_id)
    assert view is not None and view.state == "ended"
    assert len(manager.table) == 0
    figures = manager.budget.figures()
    assert (figures.bytes_reserved, figures.threads_reserved) == (0, 0)
    assert manager.slots.reserved() == 0


async def test_peer_close_is_reclaimed_as_peer_closed(server_factory: Callable[..., Any]) -> None:
    """An aiortc ``pc.close()`` sends RTCP BYE and DTLS close_notify: a clean end."""
    server = await server_factory(limits__reclaim_after_s=3)
    timeline = server.app[TIMELINE_KEY]
    manager: SessionManager = server.app[SESSIONS_KEY]
    publisher = AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        response = await publisher.publish(http, str(server.make_url("/whip")))
        assert response.status == 201
    await asyncio.wait_for(publisher.connected.wait(), 20)
    await publisher.close()
    await wait_for_type(timeline, publisher.run_id, "session_closed", wait_s=30)
    events = await _events(timeline, publisher.run_id)
    assert [d["reason"] for t, d in events if t == "session_closed"] == ["peer_closed"]
    assert len(manager.table) == 0
    assert manager.budget.figures().bytes_reserved == 0


async def test_status_codes_before_any_resource_is_taken(
    server_factory: Callable[..., Any],
) -> None:
    # H.264 and VP8 only: the in-process aiortc publisher also offers the H.265, AV1 and
    # VP9 the server's app added to aiortc's table (whip/rtc/codec_table.py).
    server = await server_factory(pipeline__video_codecs=("h264", "vp8"))
    manager: SessionManager = server.app[SESSIONS_KEY]
    url = server.make_url("/whip")
    offerer = AiortcPublisher()
    offer = await offerer.offer()
    await offerer.close()
    async with aiohttp.ClientSession() as http:
        cases = [
            ({"Content-Type": "text/plain"}, offer, 415),
            ({}, offer, 415),
            ({"Content-Type": "application/sdp"}, "v=0\r\nthis is not sdp\r\n", 400),
            ({"Content-Type": "application/sdp"}, offer + "a=x:" + "y" * 40_000 + "\r\n", 413),
            (
                {"Content-Type": "application/sdp"},
                offer.replace("VP8/90000", "AV1/90000")
                .replace("H264/90000", "AV2/90000")
                .replace("opus/48000/2", "PCMU/8000"),
                422,
            ),
        ]
        for headers, body, status in cases:
            response = await http.post(url, data=body, headers=headers)
            assert response.status == status, (status, await response.text())
            payload = await response.json()
            assert set(payload["error"]) == {"code", "message"}
        for method in ("GET", "HEAD", "PUT"):
            response = await http.request(method, url)
            assert response.status == 405
            assert "POST" in response.headers["Allow"]
        refused = await http.post(
            url,
            data=offer,
            headers={"Content-Type": "text/plain", "Origin": "https://studio.example"},
        )
        assert refused.status == 415
        assert refused.headers["Access-Control-Allow-Origin"] == "https://studio.example"
        assert "Retry-After" in refused.headers["Access-Control-Expose-Headers"]
        options = await http.options(url, headers={"Origin": "https://studio.example"})
        assert options.status == 204
        assert options.headers["Accept-Post"] == "application/sdp"
        exposed = options.headers["Access-Control-Expose-Headers"].split(", ")
        assert {"Location", "ETag", "Link", "X-Run-Id", "Accept-Patch"} <= set(exposed)
        assert "Access-Control-Allow-Methods" in exposed
        allowed = options.headers["Access-Control-Allow-Headers"].split(", ")
        assert {"Authorization", "Content-Type", "If-Match", "ETag"} <= set(allowed)
    assert len(manager.table) == 0 and manager.slots.reserved() == 0
    assert manager.budget.figures().bytes_reserved == 0


async def test_unauthorized_and_stream_limit(server_factory: Callable[..., Any]) -> None:
    principals = [
        {"name": "studio-a", "role": "publisher", "token_sha256": hash_token("token-a")},
    ]
    server = await server_factory(principals=principals, limits__stream_limit=1)
    url = server.make_url("/whip")
    first, second = AiortcPublisher(), AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        no_token = await http.post(url, data="v=0", headers={"Content-Type": "application/sdp"})
        assert no_token.status == 401
        assert no_token.headers["WWW-Authenticate"].startswith("Bearer")
        bad = await http.post(
            url,
            data="v=0",
            headers={"Content-Type": "application/sdp", "Authorization": "Bearer nope"},
        )
        assert bad.status == 401
        auth = {"Authorization": "Bearer token-a"}
        try:
            ok = await first.publish(http, str(server.make_url("/whip/one")), auth)
            assert ok.status == 201
            refused = await second.publish(http, str(server.make_url("/whip/two")), auth)
            assert refused.status == 409
            assert (await refused.json())["error"]["code"] == "stream_limit"
        finally:
            await first.close()
            await second.close()


async def test_exact_session_cap_under_concurrent_posts(server_factory: Callable[..., Any]) -> None:
    server = await server_factory(limits__max_sessions=5, limits__stream_limit=100)
    manager: SessionManager = server.app[SESSIONS_KEY]
    publishers = [AiortcPublisher() for _ in range(15)]
    offers = await asyncio.gather(*(p.offer(audio=False) for p in publishers))
    async with aiohttp.ClientSession() as http:
        responses = await asyncio.gather(
            *(
                http.post(
                    server.make_url("/whip"), data=o, headers={"Content-Type": "application/sdp"}
                )
                for o in offers
            )
        )
        statuses = sorted(r.status for r in responses)
        assert statuses.count(201) == 5
        assert statuses.count(503) == 10
        assert all(r.headers.get("Retry-After") for r in responses if r.status == 503)
        assert len(manager.table) == 5
    await asyncio.gather(*(p.close() for p in publishers))
    await manager.shutdown()
    assert len(manager.table) == 0
    assert manager.budget.figures().bytes_reserved == 0
    assert manager.slots.reserved() == 0


async def test_ffmpeg_whip_muxer_push_connects_and_its_delete_closes(
    server_factory: Callable[..., Any],
) -> None:
    server = await server_factory()
    timeline = server.app[TIMELINE_KEY]
    manager: SessionManager = server.app[SESSIONS_KEY]
    url = str(server.make_url("/whip/ffmpeg"))
    sent = await asyncio.to_thread(ffmpeg_whip_push, url, 3.0)
    assert sent == 90
    runs = timeline.runs.list_runs()
    assert len(runs) == 1
    run_id = runs[0].run_id
    await wait_for_type(timeline, run_id, "session_closed", wait_s=20)
    events = await _events(timeline, run_id)
    types = [t for t, _ in events]
    assert types[:2] == ["run_created", "session_connected"]
    assert [d["reason"] for t, d in events if t == "session_closed"] == ["deleted"]
    assert events[1][1]["ms_since_post"] < 1000, "the DTLS resend keeps connect well under 1 s"
    assert len(manager.table) == 0
    assert manager.budget.figures().bytes_reserved == 0
