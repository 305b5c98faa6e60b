"""FFmpeg's WHIP muxer (PyAV's bundled FFmpeg) pushing H.264 baseline, main and high (no
B-frames: the muxer refuses them): decoded, and the answer reflects the offered
``profile-level-id``, which FFmpeg reads from the stream's SPS (unlike OBS's fixed
``42e01f``).
"""

from __future__ import annotations

import asyncio
import fractions
import re
from collections.abc import Awaitable, Callable

import av
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.peers import ffmpeg_whip_push
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY

SIZE = (320, 180)


def _profile_level_ids(sdp: str) -> list[str]:
    return re.findall(r"profile-level-id=([0-9A-Fa-f]{6})", sdp)


def _profile_idc(profile: str) -> int:
    """The SPS ``profile_idc`` libx264 writes with the push's settings (whip/publish.py:
    ``tune=zerolatency``, no B-frames; ``preset=veryfast``): what the server decodes."""
    encoder = av.CodecContext.create("libx264", "w")
    assert isinstance(encoder, av.VideoCodecContext)
    encoder.width, encoder.height, encoder.pix_fmt = *SIZE, "yuv420p"
    encoder.time_base = fractions.Fraction(1, 30)
    encoder.max_b_frames = 0
    encoder.options = {"profile": profile, "preset": "veryfast", "tune": "zerolatency"}
    image = np.zeros((SIZE[1], SIZE[0], 3), dtype=np.uint8)
    frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
    frame.pts = 0
    data = b"".join(bytes(p) for p in [*encoder.encode(frame), *encoder.encode(None)])
    return data[data.index(b"\x00\x00\x01\x67") + 4]


@pytest.mark.parametrize(("profile", "idc"), [("baseline", 0x42), ("main", 0x4D), ("high", 0x64)])
async def test_ffmpeg_pushes_each_h264_profile_and_it_is_decoded(
    whip_servers: Callable[..., Awaitable[TestServer]], profile: str, idc: int
) -> None:
    assert _profile_idc(profile) == idc  # the stream really has that profile
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager = server.app[SESSIONS_KEY]
    url = str(server.make_url(f"/whip/ffmpeg-{profile}"))
    push = asyncio.create_task(
        asyncio.to_thread(
            ffmpeg_whip_push, url, 3.0, size=SIZE, audio=False, profile=profile, preset="veryfast"
        )
    )

    session = await eventually(
        lambda: next(iter(manager.table.live()), None), within=20, awaiting="the session"
    )
    offered = _profile_level_ids(session.pc.remoteDescription.sdp)
    answered = _profile_level_ids(session.pc.localDescription.sdp)
    assert [int(p[:2], 16) for p in offered] == [idc]
    assert answered == offered

    async def decoded() -> dict[str, object] | None:
        events = await timeline.read_events(session.run_id, 0, limit=1000)
        stats = [e.data for e in events if e.type == "stats" and e.data["codec"] == "H264"]
        return stats[-1] if stats and int(str(stats[-1]["frames_decoded"])) >= 30 else None

    stats = await eventually(decoded, within=30, awaiting="30 H.264 frames decoded")
    assert (stats["width"], stats["height"], stats["decode_errors"]) == (*SIZE, 0)
    assert await push == 90
