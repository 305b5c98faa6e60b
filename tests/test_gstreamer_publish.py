"""GStreamer's webrtcbin (1.22, Debian packages) pushing over WHIP: a third WebRTC stack
(libnice for ICE, its own DTLS and RTP payloaders) next to aiortc, libwebrtc (Chromium)
and libdatachannel (OBS). Each push is ``tests/support/gst_whip_push.py`` under the system
Python (tests/support/gstreamer.py): webrtcbin's own offer, non-trickle, then DELETE.

What webrtcbin's offer does that the others do not, and the server must accept: the audio
section is ``m=audio 0`` with ``a=bundle-only`` (RFC 8843: it exists only in the bundle),
and both sections use payload type 96 (distinct only by MID and SSRC), with
``a=setup:actpass`` and ``a=rtcp-mux-only``.

libnice gathers no loopback candidate when the machine has another interface, and its
UDP checks between an interface address and 127.0.0.1 never succeed here: a
loopback-only server is reached over ICE-TCP (the second test, after libnice's UDP pair
times out, about 5 s). The first test advertises the machine's interface address
(``server.public_hosts``), as a deployment advertises its public one, and the push
connects over UDP.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aioice.ice
import pytest
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric import rsa

from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.gstreamer import gst_whip_push, require_gstreamer
from tests.support.peers import server_dtls
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.rtc.host_addresses import local_addresses

PUSH_S = 3.0
SIZE = (640, 360)


def interface_address() -> str:
    """One IPv4 address of this machine's own interfaces (not loopback)."""
    found = sorted(
        a for a in local_addresses() if ":" not in a and not ipaddress.ip_address(a).is_loopback
    )
    if not found:
        pytest.skip("this machine has no IPv4 interface address besides loopback")
    return found[0]


async def push_and_read(
    server: TestServer, stream: str, codec: str
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """One webrtcbin push to ``stream``; its result, its run's events (type and data) once
    the run closed, and what the server's DTLS transport saw while connected (the DTLS
    role of the server, the publisher's key type, the cipher suite)."""
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager = server.app[SESSIONS_KEY]
    push = asyncio.create_task(
        gst_whip_push(str(server.make_url(f"/whip/{stream}")), PUSH_S, codec)
    )

    def live() -> Any:
        if push.done():
            push.result()  # a push that failed before its session was seen: its error
        return next(iter(manager.table.live()), None)

    session = await eventually(live, within=60, awaiting="the webrtcbin session")
    await eventually(lambda: session.connected or None, within=60, awaiting="connected")
    dtls = server_dtls(session)
    peer_key = dtls._ssl.get_peer_certificate(as_cryptography=True).public_key()
    seen = {
        "role": dtls._role,
        "peer_key": "rsa" if isinstance(peer_key, rsa.RSAPublicKey) else type(peer_key).__name__,
        "cipher": dtls._ssl.get_cipher_name(),
    }
    result = await push
    run_id = session.run_id

    async def closed() -> list[dict[str, Any]] | None:
        events = await timeline.read_events(run_id, 0, limit=1000)
        if not any(e.type == "session_closed" for e in events):
            return None
        return [{"type": e.type, "data": e.data} for e in events]

    events = await eventually(closed, within=20, awaiting="session_closed")
    return result, events, seen


def final_stats(events: list[dict[str, Any]]) -> dict[str, Any]:
    stats = [e["data"] for e in events if e["type"] == "stats" and e["data"].get("final")]
    assert stats, [e["type"] for e in events]
    return stats[-1]


@pytest.mark.parametrize(("codec", "name"), [("h264", "H264"), ("vp8", "VP8")])
async def test_webrtcbin_push_over_udp_is_decoded_video_and_audio(
    whip_servers: Callable[..., Awaitable[TestServer]],
    monkeypatch: pytest.MonkeyPatch,
    codec: str,
    name: str,
) -> None:
    require_gstreamer()
    address = interface_address()
    # The server's configure_ice restricts aioice's host addresses process-wide, to the
    # interface address here: put back what the next test of this worker expects.
    monkeypatch.setattr(aioice.ice, "get_host_addresses", aioice.ice.get_host_addresses)
    server = await whip_servers(server__public_hosts=[address], pipeline__stats_interval_s=0.5)
    result, events, dtls = await push_and_read(server, f"gst-{codec}", codec)

    assert (result["post_status"], result["delete_status"]) == (201, 200)
    offer = result["offer"]
    # webrtcbin's shape, which the answer must accept (module doc).
    assert re.search(r"^m=audio 0 ", offer, re.M) and "a=bundle-only" in offer
    assert re.findall(r"^m=\w+ \d+ \S+ (\d+)\r?$", offer, re.M) == ["96", "96"]
    answer = result["answer"]
    assert re.search(r"^m=audio [1-9]\d* ", answer, re.M), answer
    assert f" udp 2130706431 {address} " in answer.lower()
    # webrtcbin's DTLS certificate is RSA: the server, DTLS client for its actpass offer,
    # must offer ECDHE-RSA suites (whip/rtc/certificate.py, docs/INTEROP.md section 3).
    assert "a=setup:active" in answer
    assert (dtls["role"], dtls["peer_key"]) == ("client", "rsa"), dtls
    assert dtls["cipher"].startswith("ECDHE-RSA-"), dtls

    stats = final_stats(events)
    video_packets = max(s["packets"] for s in result["sent"].values())
    assert stats["codec"] == name and (stats["width"], stats["height"]) == SIZE, stats
    assert stats["decode_errors"] == 0 and stats["frames_decoded"] >= 45, (stats, result["sent"])
    assert stats["audio"]["codec"] == "opus" and stats["audio"]["frames_decoded"] >= 50, stats
    assert video_packets > 0
    closed = [e["data"] for e in events if e["type"] == "session_closed"]
    assert closed == [{"reason": "deleted"}]
    # Reached over UDP: the ICE-TCP listener bound nothing.
    listener = server.app[SESSIONS_KEY].ice_tcp
    assert listener is not None and listener.counters.bound == 0


async def test_webrtcbin_on_a_loopback_only_server_connects_over_ice_tcp(
    whip_servers: Callable[..., Awaitable[TestServer]], caplog: pytest.LogCaptureFixture
) -> None:
    """Over ICE-TCP, after its ~5 s of failed UDP checks, webrtcbin 1.22 sometimes (about
    one push in four here) sends an RTCP BYE for one of its sources right after the
    connection comes up, and sends that source no more: aiortc ends that track on the
    BYE. So each track must be decoded, or its BYE logged (module doc)."""
    require_gstreamer()
    caplog.set_level(logging.INFO, logger="whip.rtc.peer_end")
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    result, events, _ = await push_and_read(server, "gst-tcp", "h264")

    assert (result["post_status"], result["delete_status"]) == (201, 200)
    assert "tcptype passive" in result["answer"]
    listener = server.app[SESSIONS_KEY].ice_tcp
    assert listener is not None
    assert listener.counters.bound >= 1 and listener.counters.frames_in > 100, listener.counters
    stats = final_stats(events)
    said_bye = {
        kind
        for kind in ("video", "audio")
        for record in caplog.records
        if f"RTCP BYE for the {kind} sources" in record.getMessage()
    }
    video, audio = stats, stats["audio"]
    assert said_bye != {"video", "audio"}, "both tracks ended by BYE: nothing to check"
    if "video" not in said_bye:
        assert video["codec"] == "H264" and (video["width"], video["height"]) == SIZE, json.dumps(
            stats
        )
        assert video["frames_decoded"] >= 45, json.dumps(stats)
    if "audio" not in said_bye:
        assert audio["codec"] == "opus" and audio["frames_decoded"] >= 50, json.dumps(stats)
    assert video["decode_errors"] == 0 and audio["decode_errors"] == 0, json.dumps(stats)
