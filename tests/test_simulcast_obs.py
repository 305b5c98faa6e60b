"""OBS 32.1-shaped 3-layer simulcast from libdatachannel (bench/support/obs_simulcast.py):
one video m-line, ``a=rid:0..2 send``, ``a=simulcast:send 0;1;2``, the RTP stream id
extension and no ``a=ssrc`` for video; libdatachannel's packetizers write the RID into every
packet. The server accepts every layer, decodes the highest and reports all three in
``stats``, each with its picture size (read from its SPS), the closing ``stats`` too."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from bench.support.obs_simulcast import LAYER_SIZES, RID_URI, ObsSimulcastPublisher
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.servers import wait_for_type
from whip.appkeys import TIMELINE_KEY

PUSH_S = 3.0


def _section(sdp: str, kind: str) -> list[str]:
    lines = sdp.replace("\r\n", "\n").split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"m={kind}"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("m=")), None)
    return lines[start:end]


async def test_obs_shaped_three_layer_simulcast_is_accepted_decoded_and_measured(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    publisher = ObsSimulcastPublisher()
    offered = _section(publisher.offer, "video")
    assert not any(line.startswith("a=ssrc") for line in offered)  # RIDs only, as OBS
    assert [line for line in offered if line.startswith(("a=rid:", "a=simulcast:"))] == [
        "a=rid:0 send",
        "a=rid:1 send",
        "a=rid:2 send",
        "a=simulcast:send 0;1;2",
    ]
    assert any(line.endswith(f" {RID_URI}") for line in offered)
    push: asyncio.Task[int] | None = None
    try:
        async with aiohttp.ClientSession() as http:
            run_id, answer = await publisher.publish(http, str(server.make_url("/whip/obs")))
        video = _section(answer, "video")
        assert "a=simulcast:recv 0;1;2" in video  # every offered layer (OBS aborts otherwise)
        assert [line for line in video if line.startswith("a=rid:")] == [
            "a=rid:0 recv",
            "a=rid:1 recv",
            "a=rid:2 recv",
        ]
        push = asyncio.create_task(asyncio.to_thread(publisher.push, PUSH_S))
        first = await wait_for_type(timeline, run_id, "first_frame", wait_s=30)
        assert first.data["codec"] == "H264"

        async def highest_decoded_all_measured() -> dict[str, Any] | None:
            events = await timeline.read_events(run_id, 0, limit=1000)
            for event in events:
                layers = event.data.get("layers") if event.type == "stats" else None
                if (
                    layers
                    and (event.data["width"], event.data["height"]) == LAYER_SIZES[-1]
                    and all(layer["frames_in"] > 0 and layer["fps"] > 0 for layer in layers)
                ):
                    return dict(event.data)
            return None

        stats = await eventually(
            highest_decoded_all_measured, within=30, awaiting="the highest layer decoded"
        )
        layers = stats["layers"]
        assert stats["decode_errors"] == 0, stats
        # Each layer's size is read from the SPS libdatachannel sends with its IDRs
        # (whip/rtc/layer_size.py), not decoded: every height here needs the SPS cropping.
        assert [la["rid"] for la in layers] == ["0", "1", "2"]
        assert [(la["width"], la["height"]) for la in layers] == list(LAYER_SIZES)
        assert [la["decoding"] for la in layers] == [False, False, True]  # the highest
        rates = [la["bitrate_bps"] for la in layers]
        assert rates == sorted(rates), rates
        sent = await push
        assert sent == int(PUSH_S * publisher.fps)
        async with (
            aiohttp.ClientSession() as http,
            http.delete(server.make_url(publisher.location)) as gone,
        ):
            assert gone.status == 200
        await wait_for_type(timeline, run_id, "session_closed")
        events = await timeline.read_events(run_id, 0, limit=1000)
        (final,) = [e.data for e in events if e.type == "stats" and e.data.get("final")]
        # The closing stats carry the layers too, with every frame each layer sent (the
        # last may still be in the jitter buffer when the session closes).
        assert [la["rid"] for la in final["layers"]] == ["0", "1", "2"]
        assert [la["decoding"] for la in final["layers"]] == [False, False, True]
        assert all(sent - 2 <= la["frames_in"] <= sent for la in final["layers"]), final
        assert final["frames_decoded"] >= sent - 2  # the decoded layer's: the highest
    finally:
        if push is not None:  # the push thread ends on its own (PUSH_S): let it, before
            await asyncio.gather(push, return_exceptions=True)  # its peer is closed
        publisher.close()
