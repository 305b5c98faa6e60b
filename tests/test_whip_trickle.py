"""PATCH rules: trickle ICE applied to the live peer; preconditions (428, 412, the ETag
request header); refused ICE restarts change nothing; bad input rejected, never a 500.
Restarts that succeed are ``tests/test_whip_ice_restart.py``'s."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.peers import AiortcPublisher
from whip.appkeys import SESSIONS_KEY
from whip.rtc.ice_restart import bundle_ice_transport, ice_connection
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


def _ice_state(manager: SessionManager) -> tuple[str, str, str | None, str]:
    """The session's ETag and its ICE credentials (local ufrag, remote ufrag, local pwd)."""
    (session,) = manager.table.live()
    ice = ice_connection(bundle_ice_transport(session.pc))
    return session.etag, ice.local_username, ice.remote_username, ice.local_password


async def test_patch_refusals_change_nothing(server: TestServer) -> None:
    manager: SessionManager = server.app[SESSIONS_KEY]
    publisher = AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        response = await publisher.publish(http, str(server.make_url("/whip")))
        assert response.status == 201
        await asyncio.wait_for(publisher.connected.wait(), 20)
        url = server.make_url(publisher.location)
        etag = response.headers["ETag"]
        before = _ice_state(manager)
        current_ufrag = before[2]
        good = "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"
        new_pwd = "a=ice-pwd:newpasswordnewpassword12\r\n"
        cases = [
            ({"Content-Type": "application/sdp", "If-Match": etag}, good, 415),
            ({"Content-Type": FRAG, "If-Match": '"stale"'}, good, 412),
            ({"Content-Type": FRAG, "If-Match": "W/" + etag}, good, 412),
            ({"Content-Type": FRAG, "If-Match": "not a tag"}, good, 412),
            ({"Content-Type": FRAG}, good, 428),
            ({"Content-Type": FRAG, "If-Match": etag}, "a=candidate:not a candidate\r\n", 400),
            ({"Content-Type": FRAG, "If-Match": etag}, "x" * 20_000, 413),
            ({"Content-Type": FRAG, "If-Match": etag}, b"\xff\xfe", 400),
            # New credentials without If-Match: * are not a trickle.
            ({"Content-Type": FRAG, "If-Match": etag}, "a=ice-ufrag:newufrag\r\n" + new_pwd, 400),
            # Restarts the server refuses: no password, bad syntax, not new, bad candidate.
            ({"Content-Type": FRAG, "If-Match": "*"}, "a=ice-ufrag:newufrag\r\n", 400),
            ({"Content-Type": FRAG, "If-Match": "*"}, good, 400),
            ({"Content-Type": FRAG, "If-Match": "*"}, "a=ice-ufrag:n!\r\n" + new_pwd, 400),
            (
                {"Content-Type": FRAG, "If-Match": "*"},
                "a=ice-ufrag:newufrag\r\na=ice-pwd:short\r\n",
                400,
            ),
            (
                {"Content-Type": FRAG, "If-Match": "*"},
                f"a=ice-ufrag:{current_ufrag}\r\n" + new_pwd,
                400,
            ),
            (
                {"Content-Type": FRAG, "If-Match": "*"},
                "a=ice-ufrag:newufrag\r\n" + new_pwd + "a=candidate:1 1 udp 1 127.0.0.1 9 typ\r\n",
                400,
            ),
        ]
        codes = {
            400: {"bad_sdpfrag"},
            412: {"precondition_failed"},
            413: {"payload_too_large"},
            415: {"unsupported_media_type"},
            428: {"precondition_required"},
        }
        for headers, body, status in cases:
            answer = await http.patch(url, data=body, headers=headers)
            assert answer.status == status, (headers, body, await answer.text())
            assert (await answer.json())["error"]["code"] in codes[status]
            assert _ice_state(manager) == before, (headers, body)
        # Trickle with the current tag: 204 and no ETag (RFC 9725 section 4.3.1); Eyevinn's
        # client sends the tag in an ETag request header, quoted or not.
        for headers in (
            {"If-Match": etag},
            {"If-Match": f'"other", {etag}'},
            {"ETag": etag},
            {"ETag": etag.strip('"')},
        ):
            ok = await http.patch(url, data=good, headers={"Content-Type": FRAG, **headers})
            assert ok.status == 204, (headers, await ok.text())
            assert "ETag" not in ok.headers
        stale_etag_header = await http.patch(
            url, data=good, headers={"Content-Type": FRAG, "ETag": '"stale"'}
        )
        assert stale_etag_header.status == 412
        assert _ice_state(manager) == before
        unknown = await http.patch(
            server.make_url("/whip/sessions/s_AAAAAAAAAAAAAAAAAAAAAA"),
            data=good,
            headers={"Content-Type": FRAG, "If-Match": etag},
        )
        assert unknown.status == 404
        assert publisher.pc.connectionState == "connected"
    await publisher.close()


async def test_restart_before_ice_connected_is_409_and_changes_nothing(server: TestServer) -> None:
    manager: SessionManager = server.app[SESSIONS_KEY]
    publisher = AiortcPublisher()
    offer, _ = _without_candidates(await publisher.offer())
    async with aiohttp.ClientSession() as http:
        response = await http.post(
            server.make_url("/whip"), data=offer, headers={"Content-Type": "application/sdp"}
        )
        assert response.status == 201
        before = _ice_state(manager)
        restart = await http.patch(
            server.make_url(response.headers["Location"]),
            data="a=ice-ufrag:newufrag\r\na=ice-pwd:newpasswordnewpassword12\r\n",
            headers={"Content-Type": FRAG, "If-Match": "*"},
        )
        assert restart.status == 409
        assert (await restart.json())["error"]["code"] == "ice_not_connected"
        assert _ice_state(manager) == before
        await http.delete(server.make_url(response.headers["Location"]))
    await publisher.close()
