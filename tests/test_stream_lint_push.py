"""Ingest linting end to end: real publishers over loopback to a real server.

- FFmpeg's WHIP muxer (PyAV) writes the real ``profile-level-id``: ``first_frame`` says
  the profile and the offered one, and no ``stream_warning`` comes.
- The same muxer behind a front that makes its offer say ``42e01f`` (as OBS does) while
  libx264 makes High: one ``stream_warning`` ``profile_mismatch``.
- An aiortc publisher whose track changes size, or frame rate, mid-push: one
  ``stream_changed``; OBS-shaped (libdatachannel) and Chromium pushes report their
  H.264 / H.265 / AV1 / VP9 profile.
"""

from __future__ import annotations

import asyncio
import fractions
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import av
import pytest
from aiohttp.test_utils import TestServer
from aiortc.mediastreams import VideoStreamTrack

from bench.support.obs_like import ObsLikePublisher, VideoCodec
from pipeline.offered_profile import read_offered_profile
from registry.timeline import Timeline
from tests.support.chromium import ChromiumPage
from tests.support.eventually import eventually
from tests.support.offer_rewrite import profile_level_id, start_offer_rewrite
from tests.support.peers import AiortcPublisher, ffmpeg_whip_push
from tests.support.servers import wait_for_type
from whip.appkeys import TIMELINE_KEY

ServerFactory = Callable[..., Awaitable[TestServer]]


async def _events(timeline: Timeline, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in await timeline.read_events(run_id, 0, 1000)]


async def _only_run(timeline: Timeline) -> str:
    runs = timeline.runs.list_runs()
    assert len(runs) == 1
    return runs[0].run_id


async def test_ffmpeg_offer_is_true(whip_servers: ServerFactory) -> None:
    """High (libx264 at ``veryfast``: its profile is a ceiling, ``ultrafast`` would make
    constrained baseline whatever was asked)."""
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    url = str(server.make_url("/whip/honest"))
    await asyncio.to_thread(
        ffmpeg_whip_push, url, 2.0, audio=False, profile="high", preset="veryfast"
    )
    run_id = await _only_run(timeline)
    await wait_for_type(timeline, run_id, "session_closed")
    events = await _events(timeline, run_id)
    first = next(d for t, d in events if t == "first_frame")
    assert (first["profile"], first["offered_profile"]) == ("high", "high")
    assert first["b_frames"] is False
    assert [d for t, d in events if t == "stream_warning"] == []
    final = [d for t, d in events if t == "stats" and d.get("final")]
    assert final and final[0]["keyframe_interval_s"] == 1.0  # the muxer's 1 s GOP


async def test_ffmpeg_baseline_is_constrained_baseline(whip_servers: ServerFactory) -> None:
    """libx264's baseline sets constraint_set1 (constrained baseline); FFmpeg's offer says
    baseline, which constrained baseline conforms to: no warning."""
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    url = str(server.make_url("/whip/baseline"))
    await asyncio.to_thread(ffmpeg_whip_push, url, 1.5, audio=False)
    run_id = await _only_run(timeline)
    await wait_for_type(timeline, run_id, "session_closed")
    events = await _events(timeline, run_id)
    first = next(d for t, d in events if t == "first_frame")
    assert (first["profile"], first["offered_profile"]) == ("constrained-baseline", "baseline")
    assert [d for t, d in events if t == "stream_warning"] == []


@pytest.mark.parametrize(
    ("offered", "level", "warnings"),
    [
        ("42e01f", "3.1", ["profile_mismatch"]),  # OBS's, whatever its encoder makes
        ("42e00a", "1", ["profile_mismatch", "level_mismatch"]),  # 320x180 at 30 fps is 1.2+
    ],
)
async def test_obs_style_offer_lies_and_gets_a_warning(
    whip_servers: ServerFactory, offered: str, level: str, warnings: list[str]
) -> None:
    """The offer's own fmtp reaches the linting (not the stack's local codec parameters,
    which say level 3.1 whatever the offer said)."""
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    front = await start_offer_rewrite(server, profile_level_id(offered))
    try:
        url = str(front.make_url("/whip/obs"))
        await asyncio.to_thread(
            ffmpeg_whip_push, url, 2.0, audio=False, profile="high", preset="veryfast"
        )
    finally:
        await front.close()
    run_id = await _only_run(timeline)
    warning = await wait_for_type(timeline, run_id, "stream_warning")
    assert warning.data["warning"] == "profile_mismatch"
    assert (warning.data["profile"], warning.data["offered_profile"]) == (
        "high",
        "constrained-baseline",
    )
    await wait_for_type(timeline, run_id, "session_closed")
    events = await _events(timeline, run_id)
    assert [d["warning"] for t, d in events if t == "stream_warning"] == warnings
    first = next(d for t, d in events if t == "first_frame")
    assert (first["profile"], first["offered_profile"]) == ("high", "constrained-baseline")
    assert first["offered_level"] == level


class ResizingTrack(VideoStreamTrack):
    """aiortc's test track at 320x240 for its first ``switch_at`` frames, then 640x360
    (aiortc's encoders start over at the new size)."""

    def __init__(self, switch_at: int = 45) -> None:
        super().__init__()
        self.switch_at = switch_at
        self.sent = 0

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        width, height = (320, 240) if self.sent < self.switch_at else (640, 360)
        self.sent += 1
        frame = av.VideoFrame(width, height, "yuv420p")
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        frame.pts = pts
        frame.time_base = fractions.Fraction(time_base)
        return frame


async def test_resolution_change_mid_push(whip_servers: ServerFactory) -> None:
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    publisher = AiortcPublisher(video_track=ResizingTrack)
    try:
        async with aiohttp.ClientSession() as http:
            response = await publisher.publish(http, str(server.make_url("/whip/resize")))
            assert response.status == 201
            changed = await wait_for_type(timeline, publisher.run_id, "stream_changed", 30)
            assert changed.data["change"] == "resolution"
            assert changed.data["old"] == {"width": 320, "height": 240}
            assert changed.data["new"] == {"width": 640, "height": 360}

            async def stats_at_new_size() -> dict[str, Any] | None:
                events = await _events(timeline, publisher.run_id)
                sized = [d for t, d in events if t == "stats" and d.get("width") == 640]
                return sized[0] if sized else None

            stats = await eventually(stats_at_new_size, within=20, awaiting="stats at 640x360")
            assert stats["profile"] is not None or stats["codec"] == "VP8"
            assert (await http.delete(server.make_url(publisher.location))).status == 200
    finally:
        await publisher.close()
    events = await _events(timeline, publisher.run_id)
    assert len([d for t, d in events if t == "stream_changed"]) == 1


def _video_fmtp(offer: str) -> dict[str, object]:
    """The offer's fmtp of payload type 96 (the OBS shape's one video format)."""
    for line in offer.replace("\r\n", "\n").split("\n"):
        if line.startswith("a=fmtp:96 "):
            pairs = (p.split("=", 1) for p in line.split(" ", 1)[1].split(";") if "=" in p)
            return {k.strip(): v.strip() for k, v in pairs}
    return {}


@pytest.mark.parametrize(
    ("codec", "name", "profile"),
    [("h264", "H264", "constrained-baseline"), ("h265", "H265", "main"), ("av1", "AV1", "main")],
    ids=str,
)
async def test_obs_shaped_push_reports_its_profile(
    whip_servers: ServerFactory, codec: VideoCodec, name: str, profile: str
) -> None:
    """libdatachannel (OBS's WebRTC library) pushing PyAV-encoded H.264, H.265 and AV1:
    the bitstream's profile and level, and the offer's, in ``first_frame``."""
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    publisher = ObsLikePublisher(codec)
    offered = read_offered_profile(name, _video_fmtp(publisher.offer))
    try:
        async with aiohttp.ClientSession() as http:
            run_id, location, _ = await publisher.publish(http, str(server.make_url("/whip/obs")))
            push = asyncio.create_task(asyncio.to_thread(publisher.push, 2.0))
            first = await wait_for_type(timeline, run_id, "first_frame", wait_s=30)
            await push
            # Still live (the DELETE is below): the session list reads the same linting.
            async with http.get(server.make_url("/v1/sessions")) as listed:
                assert listed.status == 200
                (item,) = [s for s in (await listed.json())["items"] if s["run_id"] == run_id]
            tracks = {t["kind"]: t for t in item["tracks"]}
            live = tracks["video"]["bitstream"]
            assert all(t["bitstream"] is None for t in item["tracks"] if t["kind"] != "video")
            assert (await http.delete(server.make_url(location))).status == 200
    finally:
        publisher.close()
    lint_fields = ("profile", "level", "tier", "offered_profile", "offered_level", "b_frames")
    assert {k: live[k] for k in lint_fields} == {k: first.data[k] for k in lint_fields}
    assert live["warnings"] == []
    assert first.data["codec"] == name
    assert first.data["profile"] == profile
    assert first.data["level"] is not None
    assert first.data["offered_profile"] == (offered.profile if offered else None)
    assert first.data["offered_level"] == (offered.level if offered else None)
    assert first.data["b_frames"] is (False if codec != "av1" else None)


async def test_obs_shaped_push_with_b_frames_is_decoded_and_warned_once(
    whip_servers: ServerFactory,
) -> None:
    """OBS's x264 with ``bframes=2`` through libdatachannel: the SPS declares reordering
    (one ``b_frames`` warning, from the parameter set: the timestamps that then go back
    add no second one), and every frame still decodes, in presentation order."""
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    publisher = ObsLikePublisher("h264", b_frames=2)
    try:
        async with aiohttp.ClientSession() as http:
            url = str(server.make_url("/whip/obs-bframes"))
            run_id, location, _ = await publisher.publish(http, url)
            sent = await asyncio.to_thread(publisher.push, 3.0)
            await wait_for_type(timeline, run_id, "stream_warning", wait_s=30)
            assert (await http.delete(server.make_url(location))).status == 200
    finally:
        publisher.close()
    await wait_for_type(timeline, run_id, "session_closed", wait_s=30)
    events = await _events(timeline, run_id)
    warnings = {d["warning"]: d for t, d in events if t == "stream_warning"}
    # Main profile (B-frames need it) under the offer's constrained baseline: a second,
    # rightful warning; no keyframe-interval one (the timeline did not jump 2^32 ticks).
    assert sorted(warnings) == ["b_frames", "profile_mismatch"]
    assert warnings["b_frames"]["source"] == "parameter_set"
    assert warnings["b_frames"]["reorder"] == 2
    first = next(d for t, d in events if t == "first_frame")
    assert first["b_frames"] is True
    (final,) = [d for t, d in events if t == "stats" and d.get("final")]
    assert final["decode_errors"] == 0
    # Every frame that arrived decoded (the decoder is drained at the clean end); aiortc's
    # jitter buffer keeps the last frame until a next packet that never comes.
    assert final["frames_decoded"] == final["frames_in"] >= sent - 2, (sent, final)


@pytest.mark.parametrize(
    ("mime_type", "codec", "profile"),
    [("video/VP9", "VP9", "profile-0"), ("video/AV1", "AV1", "main")],
    ids=["vp9", "av1"],
)
async def test_chromium_push_reports_its_profile(
    whip_servers: ServerFactory,
    chromium: Callable[..., Awaitable[ChromiumPage]],
    mime_type: str,
    codec: str,
    profile: str,
) -> None:
    """Chromium's VP9 and AV1 (libvpx, libaom or its AV1 encoder): the profile read from
    the frame header or sequence header, the offer's fmtp, and no profile warning."""
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    page = await chromium()
    endpoint = str(server.make_url("/whip/browser"))
    status = await page.evaluate(f"whipPublish({endpoint!r}, {{videoCodec: {mime_type!r}}})")
    assert status == 201
    run_id: str = (await page.evaluate("window.whip"))["runId"]
    first = await wait_for_type(timeline, run_id, "first_frame", wait_s=30)

    async def stats_with_keyframe_interval() -> dict[str, Any] | None:
        events = await _events(timeline, run_id)
        found = [d for t, d in events if t == "stats" and d.get("frames_decoded", 0) > 30]
        return found[-1] if found else None

    stats = await eventually(stats_with_keyframe_interval, within=30, awaiting="30 frames")
    assert await page.evaluate("whipStop()") == 200
    await wait_for_type(timeline, run_id, "session_closed")
    events = await _events(timeline, run_id)
    if codec == "AV1":  # Chromium offers level-idx=5 (3.1); 640x360 needs far less
        assert first.data["level"] is not None
        assert first.data["offered_level"] == "3.1"
    assert (first.data["codec"], first.data["profile"]) == (codec, profile)
    assert stats["profile"] == profile
    assert first.data["offered_profile"] == profile
    assert "profile_mismatch" not in [d["warning"] for t, d in events if t == "stream_warning"]


class SlowingTrack(VideoStreamTrack):
    """320x240 frames at 30 fps for ``fast_s`` seconds, then at 15 fps (its own pacing:
    aiortc's ``next_timestamp`` is fixed at 30 fps)."""

    def __init__(self, fast_s: float = 4.0) -> None:
        super().__init__()
        self.fast_s = fast_s
        self._started: float | None = None
        self._next = 0.0
        self._pts = 0

    async def recv(self) -> av.VideoFrame:
        loop = asyncio.get_running_loop()
        if self._started is None:
            self._started = self._next = loop.time()
        else:
            fast = self._next - self._started < self.fast_s
            step = 1 / 30 if fast else 1 / 15
            self._next += step
            self._pts += round(step * 90000)
            await asyncio.sleep(max(0.0, self._next - loop.time()))
        frame = av.VideoFrame(320, 240, "yuv420p")
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, 90000)
        return frame


async def test_fps_change_mid_push(whip_servers: ServerFactory) -> None:
    """30 -> 15 fps: one ``stream_changed`` once the new rate has held for 5 s."""
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    publisher = AiortcPublisher(video_track=SlowingTrack)
    try:
        async with aiohttp.ClientSession() as http:
            response = await publisher.publish(http, str(server.make_url("/whip/slower")))
            assert response.status == 201
            changed = await wait_for_type(timeline, publisher.run_id, "stream_changed", 40)
            assert (await http.delete(server.make_url(publisher.location))).status == 200
    finally:
        await publisher.close()
    assert changed.data["change"] == "fps"
    assert 27 <= changed.data["old"]["fps"] <= 33
    assert 13 <= changed.data["new"]["fps"] <= 17
    events = await _events(timeline, publisher.run_id)
    assert [d["change"] for t, d in events if t == "stream_changed"] == ["fps"]
