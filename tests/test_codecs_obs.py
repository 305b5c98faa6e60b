"""OBS-shaped pushes (libdatachannel, bench/support/obs_like.py) of H.264, H.265 and AV1,
encoded with PyAV and packetized by libdatachannel's own packetizers, and of VP9
(libvpx-vp9, packetized by bench/support/vp9_rtp.py: ``bench/capacity.py --codecs vp9``),
decoded by the server with the right codec and size; the answer reflects what OBS can
apply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from bench.support.obs_like import ObsLikePublisher, VideoCodec
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.servers import wait_for_type
from whip.appkeys import TIMELINE_KEY

SIZE = (320, 180)


def _video_section(sdp: str) -> list[str]:
    lines = sdp.replace("\r\n", "\n").split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("m=video"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("m=")), None)
    return lines[start:end]


@pytest.mark.parametrize(
    ("codec", "name"), [("h264", "H264"), ("h265", "H265"), ("av1", "AV1"), ("vp9", "VP9")], ids=str
)
async def test_obs_shaped_push_is_decoded_with_its_codec_and_size(
    whip_servers: Callable[..., Awaitable[TestServer]], codec: VideoCodec, name: str
) -> None:
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    publisher = ObsLikePublisher(codec)
    assert "a=candidate" not in publisher.offer and "a=rtx" not in publisher.offer.lower()
    try:
        async with aiohttp.ClientSession() as http:
            run_id, location, answer = await publisher.publish(http, server.make_url("/whip/obs"))
            video = _video_section(answer)
            assert video[0].split()[3:] == ["96"]  # the one format OBS offered, nothing else
            assert f"a=rtpmap:96 {name}/90000" in video
            push = asyncio.create_task(asyncio.to_thread(publisher.push, 4.0, SIZE))

            first = await wait_for_type(timeline, run_id, "first_frame", wait_s=30)
            assert first.data["codec"] == name
            assert (first.data["width"], first.data["height"]) == SIZE

            async def decoded_past(count: int) -> dict[str, object] | None:
                events = await timeline.read_events(run_id, 0, limit=1000)
                stats = [e.data for e in events if e.type == "stats"]
                past = [s for s in stats if int(s["frames_decoded"]) > count]  # type: ignore[call-overload]
                return past[-1] if past else None

            stats = await eventually(
                lambda: decoded_past(30), within=30, awaiting="stats past 30 decoded frames"
            )
            assert stats["decode_errors"] == 0
            sent = await push
            assert sent == 4 * 30
            assert publisher.peer_states.poll() == "Connected", publisher.peer_states.seen
            sessions = await (await http.get(server.make_url("/v1/sessions"))).json()
            (session,) = sessions["items"]
            assert session["codec"] == name
            assert session["rtp_payload_errors"] == {}
            assert (await http.delete(server.make_url(location))).status == 200
        closed = await wait_for_type(timeline, run_id, "session_closed")
        assert closed.data["reason"] == "deleted"
        events = await timeline.read_events(run_id, 0, limit=1000)
        (final,) = [
            e.data
            for e in events
            if e.type == "stats" and e.data.get("final") and e.data.get("kind") == "video"
        ]
        assert (final["width"], final["height"]) == SIZE
        assert final["keyframes_decoded"] == sent // 30  # GOP 30
        assert final["frames_decoded"] >= sent - 2, final  # the last may stay in the buffer
        assert "Failed" not in publisher.peer_states.seen
    finally:
        publisher.close()
