"""Congestion control end to end (:mod:`whip.rtc.congestion`): headless Chromium pushing
720p VP8 with no bitrate hints ramps on the default config (transport-wide feedback, and the
answer's start bitrate) to well past what REMB alone gave it; the ceiling holds it down; an
aiortc publisher (which offers no transport-cc) still gets REMB, capped.

Issue 12's figure (1.5 Mb/s and 30 fps at 1280x720 within 10 s) is ``bench/ramp.py``'s, not
asserted here: whether Chromium gets there is decided by its own encoder (its first frames
are 640x360 whatever the server says, and its quality scaler climbs with the picture), and
on a loaded host (the suite's two workers) it held 0.9-1.0 Mb/s at 640x360 for 12 s.

The Chromium camera is :mod:`bench.support.busy_video`'s loop: Chromium's own fake camera
is so flat that VP8 never needs more than about 700 kb/s at 720p, whatever it may send.
The ramp test uses its ``MEDIUM`` preset (1.5 Mb/s and more at full rate), the ceiling test
the busier default. The figures (per second, per start bitrate, with and without
transport-cc) are ``bench/ramp.py``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from aiortc.rtp import RTCP_PSFB_APP, RtcpPsfbPacket, unpack_remb_fci

from bench.support.busy_video import MEDIUM, write_busy_mjpeg
from bench.support.publisher import AiortcPublisher
from registry.timeline import Timeline
from tests.support.chromium import ChromiumPage
from tests.support.eventually import eventually
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.rtc.arrival_stamps import StampedQueue
from whip.rtc.ice_restart import ice_connection
from whip.rtc.twcc import TRANSPORT_CC_URI

Launch = Callable[..., Awaitable[ChromiumPage]]

TARGET_BPS = 800_000
"""The ramp this test asserts: well above the 506 kb/s REMB-only Chromium reached in 16 s
(and its 190 kb/s start). Issue 12's 1.5 Mb/s is ``bench/ramp.py``'s (module doc)."""
TARGET_FPS = 15.0
"""Far above the 2-3 fps REMB-only Chromium encoded for its first 10 s. Issue 12's 30 fps
is what Chromium sends on a quiet host (``bench/ramp.py``); on a loaded one its own
capture and encoder drop to 18-25 fps whatever the server does (``chromium_fps``), so the
test asserts the bitrate band at a rate that only a starved encoder misses."""
PUSH_STATS = 16
"""The ramp must show within the first 16 stats (one a second): issue 12's 16 s push."""
PUBLISH_720P = "{videoCodec: 'video/VP8', width: 1280, height: 720}"


async def _video_stats(timeline: Timeline, run_id: str) -> list[dict[str, Any]]:
    events = await timeline.read_events(run_id, 0, limit=1000)
    return [e.data for e in events if e.type == "stats" and e.data.get("kind") == "video"]


async def _camera_chromium(chromium: Launch, tmp_path: Path, **preset: int) -> ChromiumPage:
    camera = await asyncio.to_thread(write_busy_mjpeg, tmp_path / "camera.mjpeg", **preset)
    return await chromium(
        "--use-fake-device-for-media-stream=fps=30",
        f"--use-file-for-fake-video-capture={camera}",
    )


def _in_band(stats: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The first three stats in a row at the target bitrate on average (one-second windows
    split frames unevenly) and each at the target fps, or None."""
    for i in range(len(stats) - 2):
        run = stats[i : i + 3]
        mean_bps = sum(s["bitrate_bps"] for s in run) / len(run)
        if mean_bps >= TARGET_BPS and all(s["fps"] >= TARGET_FPS for s in run):
            return run
    return None


async def test_chromium_720p_vp8_ramps_with_no_hints_on_the_default_config(
    whip_servers: Callable[..., Awaitable[TestServer]], chromium: Launch, tmp_path: Path
) -> None:
    server = await whip_servers(pipeline__stats_interval_s=1.0)  # otherwise the defaults
    timeline: Timeline = server.app[TIMELINE_KEY]
    page = await _camera_chromium(chromium, tmp_path, **MEDIUM)
    endpoint = str(server.make_url("/whip/browser"))

    assert await page.evaluate(f"whipPublish({endpoint!r}, {PUBLISH_720P})") == 201
    state = await page.evaluate("window.whip")
    assert "b=AS" not in state["offer"] and "x-google" not in state["offer"]  # no hints
    video = state["answer"][state["answer"].index("m=video") :]
    assert f" {TRANSPORT_CC_URI}" in video
    assert " transport-cc" in video  # a=rtcp-fb:<pt> transport-cc
    assert "x-google-start-bitrate=1000" in video  # pipeline.start_bitrate_bps's default
    assert "b=AS:10000\r\n" in video  # pipeline.max_bitrate_bps's default, 10 Mb/s
    run_id: str = state["runId"]
    first = await wait_for_type(timeline, run_id, "first_frame", wait_s=30)
    assert first.data["codec"] == "VP8"

    async def ramped_or_pushed() -> list[dict[str, Any]] | None:
        stats = (await _video_stats(timeline, run_id))[:PUSH_STATS]
        return stats if _in_band(stats) or len(stats) == PUSH_STATS else None

    stats = await eventually(ramped_or_pushed, within=40, awaiting="the ramp or 16 stats")
    figures = [(s["bitrate_bps"], s["fps"], s["width"], s["height"]) for s in stats]
    band = _in_band(stats)
    assert band is not None, figures  # (bitrate, fps, size) per second: bench/ramp.py's
    assert all(s["codec"] == "VP8" and s["decode_errors"] == 0 for s in band)
    async with (
        aiohttp.ClientSession() as http,
        http.get(server.make_url("/v1/sessions")) as response,
    ):
        (session,) = (await response.json())["items"]
    congestion = session["congestion"]
    assert congestion["mode"] == "transport-cc"
    assert congestion["feedback_packets"] > 0 and congestion["arrivals"] > 0
    live = server.app[SESSIONS_KEY].find_by_run(run_id)
    assert live is not None  # arrivals stamped where aioice queues them:
    transport = live.pc.getTransceivers()[0].receiver.transport
    assert isinstance(ice_connection(transport.transport)._queue, StampedQueue)
    assert await page.evaluate("whipStop()") == 200


async def test_chromium_stays_under_the_configured_ceiling(
    whip_servers: Callable[..., Awaitable[TestServer]], chromium: Launch, tmp_path: Path
) -> None:
    ceiling = 400_000
    server = await whip_servers(pipeline__stats_interval_s=1.0, pipeline__max_bitrate_bps=ceiling)
    timeline: Timeline = server.app[TIMELINE_KEY]
    page = await _camera_chromium(chromium, tmp_path)
    endpoint = str(server.make_url("/whip/browser"))

    assert await page.evaluate(f"whipPublish({endpoint!r}, {PUBLISH_720P})") == 201
    state = await page.evaluate("window.whip")
    video = state["answer"][state["answer"].index("m=video") :]
    assert "b=AS:400\r\n" in video and "b=TIAS:400000\r\n" in video
    assert "x-google-start-bitrate=400" in video  # the default start, held to the ceiling
    assert f" {TRANSPORT_CC_URI}" in video  # the ceiling does not turn transport-cc off
    run_id: str = state["runId"]

    async def steady_stats() -> list[dict[str, Any]] | None:
        stats = await _video_stats(timeline, run_id)
        return stats[2:8] if len(stats) >= 8 else None  # past the first seconds

    stats = await eventually(steady_stats, within=40, awaiting="8 seconds of video stats")
    # the encoder's own overshoot is a few percent; 25% is room for a keyframe
    assert all(s["bitrate_bps"] < 1.25 * ceiling for s in stats), stats
    view = await page.evaluate("whipOutboundVideo()")
    assert view["layers"][0]["targetBitrate"] <= ceiling
    assert feedback_tasks() == 1  # one transport (BUNDLE), one feedback task
    assert await page.evaluate("whipStop()") == 200
    await wait_for_type(timeline, run_id, "session_closed")
    await eventually(lambda: feedback_tasks() == 0, within=10, awaiting="the feedback task's end")


def feedback_tasks() -> int:
    return sum(1 for t in asyncio.all_tasks() if t.get_name() == "whip-transport-cc-feedback")


async def test_an_aiortc_publisher_gets_remb_capped_at_the_ceiling(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    ceiling = 200_000
    server = await whip_servers(pipeline__max_bitrate_bps=ceiling)
    publisher = AiortcPublisher()
    rembs: list[int] = []
    try:
        async with aiohttp.ClientSession() as http:
            offer = await publisher.offer()
            assert TRANSPORT_CC_URI not in offer  # aiortc offers abs-send-time and REMB only
            response = await http.post(
                server.make_url("/whip/aiortc"),
                data=offer,
                headers={"Content-Type": "application/sdp"},
            )
            answer = await response.text()
            assert response.status == 201
            assert "transport-cc" not in answer
            assert "goog-remb" in answer and "b=AS:200\r\n" in answer
            video_sender = next(
                t.sender for t in publisher.pc.getTransceivers() if t.kind == "video"
            )
            handle = video_sender._handle_rtcp_packet

            async def observe(packet: Any) -> None:  # the publisher's RTCP, read only
                if isinstance(packet, RtcpPsfbPacket) and packet.fmt == RTCP_PSFB_APP:
                    rembs.append(unpack_remb_fci(packet.fci)[0])
                await handle(packet)

            video_sender._handle_rtcp_packet = observe
            await publisher.answer(answer)
            await eventually(lambda: len(rembs) >= 2, within=30, awaiting="two REMBs")
    finally:
        await publisher.close()
    assert all(0 < bitrate <= ceiling for bitrate in rembs), rembs
