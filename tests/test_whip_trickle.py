"""PATCH: trickle ICE applied to the live peer, ICE restart refused, bad input rejected."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.peers import AiortcPublisher
from whip.appkeys import SESSIONS_KEY
from whip.session_manager import SessionManager

FRAG = "application/trickle-ice-sdpfrag"


@pytest.fixture
async def server(whip_servers: Callable[..., Awaitable[TestServer]]) -> TestServer:
    return await whip_servers()


def _without_candidates(sdp: str) -> tuple[str, list[str]]:
    kept, candidates = [], []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            candidates.append(line)
        elif not line.startswith("a=end-of-candidates"):
            kept.append(line)
    return "\r\n".join(kept) + "\r\n", candidates


def _remote_candidates(manager: SessionManager) -> list[str]:
    (session,) = manager.table.live()
    ice = session.pc.getTransceivers()[0].receiver.transport.transport
    return [f"{c.ip}:{c.port}" for c in ice.getRemoteCandidates()]


async def test_trickled_candidates_reach_the_peer_and_it_connects(server: TestServer) -> None:
    manager: SessionManager = server.app[SESSIONS_KEY]
    publisher = AiortcPublisher()
    offer, candidates = _without_candidates(await publisher.offer())
    assert candidates, "the publisher gathered candidates to trickle"
    ufrag = next(line for line in offer.splitlines() if line.startswith("a=ice-ufrag:"))
    pwd = next(line for line in offer.splitlines() if line.startswith("a=ice-pwd:"))
    async with aiohttp.ClientSession() as http:
        response = await http.post(
            server.make_url("/whip"), data=offer, headers={"Content-Type": "application/sdp"}
        )
        assert response.status == 201
        etag = response.headers["ETag"]
        location = response.headers["Location"]
        assert _remote_candidates(manager) == []
        fragment = "\r\n".join(
            [
                ufrag,
                pwd,
                "m=audio 9 UDP/TLS/RTP/SAVPF 0",
                "a=mid:0",
                *candidates,
                "a=end-of-candidates",
                "",
            ]
        )
        patched = await http.patch(
            server.make_url(location),
            data=fragment,
            headers={"Content-Type": FRAG, "If-Match": etag},
        )
        assert patched.status == 204, await patched.text()
        assert len(_remote_candidates(manager)) == len(candidates)
        await publisher.answer(await response.text())
        await asyncio.wait_for(publisher.connected.wait(), 20)
        deleted = await http.delete(server.make_url(location))
        assert deleted.status == 200
    await publisher.close()


async def test_patch_refusals(server: TestServer) -> None:
    publisher = AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        response = await publisher.publish(http, str(server.make_url("/whip")))
        assert response.status == 201
        url = server.make_url(publisher.location)
        etag = response.headers["ETag"]
        good = "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"
        cases = [
            ({"Content-Type": "application/sdp"}, good, 415, "unsupported_media_type"),
            ({"Content-Type": FRAG, "If-Match": '"stale"'}, good, 412, "precondition_failed"),
            ({"Content-Type": FRAG}, "a=candidate:not a candidate\r\n", 400, "bad_sdpfrag"),
            ({"Content-Type": FRAG}, "x" * 20_000, 413, "payload_too_large"),
            ({"Content-Type": FRAG}, b"\xff\xfe", 400, "bad_sdpfrag"),
            (
                {"Content-Type": FRAG, "If-Match": etag},
                "a=ice-ufrag:newufrag\r\na=ice-pwd:newpasswordnewpassword12\r\n",
                422,
                "ice_restart_unsupported",
            ),
        ]
        for headers, body, status, code in cases:
            answer = await http.patch(url, data=body, headers=headers)
            assert answer.status == status, (status, await answer.text())
            assert (await answer.json())["error"]["code"] == code
        ok = await http.patch(url, data=good, headers={"Content-Type": FRAG, "If-Match": "*"})
        assert ok.status == 204
        unknown = await http.patch(
            server.make_url("/whip/sessions/s_AAAAAAAAAAAAAAAAAAAAAA"),
            data=good,
            headers={"Content-Type": FRAG},
        )
        assert unknown.status == 404
    await publisher.close()
