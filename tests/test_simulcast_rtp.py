"""Simulcast shaped like OBS 32.1 (RIDs, no ``a=ssrc`` lines), from a hand-built RTP
publisher (tests/support/hostile_rtp.py): layers told apart by the RID header extension and
then by SSRC, the highest decoded, a stopped layer switched away from and back to, and
hostile RIDs and SSRCs counted, never kept."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp.test_utils import TestServer
from aiortc import RTCRtpParameters
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters
from aiortc.rtp import HeaderExtensionsMap, RtpPacket

from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.hostile_rtp import HostilePublisher, RtpStream, h264_frames
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.rtc.pli import send_pli
from whip.rtc.simulcast import SimulcastDemux, simulcast_of
from whip.sdp.simulcast import REPAIRED_RID_URI, RID_URI

RID_ID, REPAIRED_ID = 10, 11
SIZES = {"0": (160, 96), "1": (320, 176)}
"""Layer 0 the small one, layer 1 the large (ranked by the sizes read from each layer's
SPS, which aiortc's packetizer sends in a STAP-A with every IDR)."""
WAIT_S = 20
TAGGED_FRAMES = 5
"""Frames per layer sent with the RID extension; later packets carry none (as libwebrtc
and OBS do once the SSRC is known)."""


RTX_PT = 120


def obs_shaped(offer: str, *, rtx: bool = False) -> str:
    """aiortc's offer as OBS 32.1 writes simulcast: no ``a=ssrc``/``a=ssrc-group``; the RID
    extensions, ``a=rid:0..1 send`` and ``a=simulcast:send 0;1`` in the video section
    (``rtx``: and an RTX format, :data:`RTX_PT`, for the H.264 one, as Chromium offers)."""
    out: list[str] = []
    in_video = False
    rtx_lines: list[str] = []
    for line in offer.splitlines():
        if line.startswith(("a=ssrc:", "a=ssrc-group:")):
            continue
        if line.startswith("m="):
            out += rtx_lines  # after the section's own rtpmap lines (aiortc reads them in order)
            rtx_lines = []
            in_video = line.startswith("m=video")
            if in_video and rtx:
                h264 = line.split()[3]
                line = f"{line} {RTX_PT}"
                rtx_lines = [f"a=rtpmap:{RTX_PT} rtx/90000", f"a=fmtp:{RTX_PT} apt={h264}"]
        out.append(line)
        if in_video and line.startswith("a=mid:"):
            out += [
                f"a=extmap:{RID_ID} {RID_URI}",
                f"a=extmap:{REPAIRED_ID} {REPAIRED_RID_URI}",
                "a=rid:0 send",
                "a=rid:1 send",
                "a=simulcast:send 0;1",
            ]
    out += rtx_lines
    return "\r\n".join(out) + "\r\n"


@functools.cache
def _layer_frames(rid: str) -> tuple[tuple[bytes, ...], ...]:
    return tuple(tuple(p) for p in h264_frames(60, SIZES[rid]))


@dataclass
class Sender:
    """Sends both layers at about 30 fps while ``active`` names them."""

    pub: HostilePublisher
    streams: dict[str, RtpStream]
    active: set[str] = field(default_factory=lambda: {"0", "1"})
    sent_frames: dict[str, int] = field(default_factory=lambda: {"0": 0, "1": 0})
    extensions: HeaderExtensionsMap = field(default_factory=HeaderExtensionsMap)

    def __post_init__(self) -> None:
        self.extensions.configure(
            RTCRtpParameters(
                headerExtensions=[
                    RTCRtpHeaderExtensionParameters(id=RID_ID, uri=RID_URI),
                    RTCRtpHeaderExtensionParameters(id=REPAIRED_ID, uri=REPAIRED_RID_URI),
                ]
            )
        )

    async def send(self, packets: list[RtpPacket]) -> None:
        transport = self.pub._transceiver("video").sender.transport
        for packet in packets:
            await transport._send_rtp(packet.serialize(self.extensions))

    async def run(self) -> None:
        while True:
            for rid in sorted(self.active):
                frames = _layer_frames(rid)
                packets = self.streams[rid].packets(frames[self.sent_frames[rid] % len(frames)])
                if self.sent_frames[rid] < TAGGED_FRAMES:
                    for packet in packets:
                        packet.extensions.rtp_stream_id = rid
                await self.send(packets)
                self.sent_frames[rid] += 1
            await asyncio.sleep(1 / 30)  # pacing of a live source, not test ordering


@contextlib.asynccontextmanager
async def _simulcast_push(
    server: TestServer, *, rtx: bool = False
) -> AsyncIterator[tuple[Sender, SimulcastDemux]]:
    pub = HostilePublisher(offer_edit=functools.partial(obs_shaped, rtx=rtx))
    task: asyncio.Task[None] | None = None
    try:
        async with aiohttp.ClientSession() as http:
            response = await pub.publish(http, str(server.make_url("/whip/obs")))
            answer = await response.text()
            assert response.status == 201, answer
            assert "a=simulcast:recv 0;1" in answer
            assert f"a=extmap:{RID_ID} {RID_URI}" in answer
            assert f"a=extmap:{REPAIRED_ID} {REPAIRED_RID_URI}" in answer
            await asyncio.wait_for(pub.connected.wait(), 15)
            session = server.app[SESSIONS_KEY].find_by_run(pub.run_id)
            assert session is not None
            demux = next(
                d
                for d in (simulcast_of(t.receiver) for t in session.pc.getTransceivers())
                if d is not None
            )
            streams = {
                rid: RtpStream(random.randrange(1 << 32), pub.video_payload_type) for rid in "01"
            }
            sender = Sender(pub, streams)
            task = asyncio.create_task(sender.run(), name="simulcast sender")
            yield sender, demux
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await pub.close()


async def test_layers_without_ssrc_lines_highest_decoded_and_a_stopped_layer_switches(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    async with _simulcast_push(server) as (sender, demux):
        run_id = sender.pub.run_id
        first = await wait_for_type(timeline, run_id, "first_frame", wait_s=WAIT_S)
        assert (first.data["width"], first.data["height"]) == SIZES["1"]
        assert demux.decoding == "1"
        assert {rid: layer.ssrc for rid, layer in demux.layers.items()} == {
            rid: stream.ssrc for rid, stream in sender.streams.items()
        }
        await eventually(
            lambda: all(s > TAGGED_FRAMES * 3 for s in sender.sent_frames.values()),
            within=WAIT_S,
            awaiting="untagged frames sent on both layers",
        )

        async def stats_of(size: tuple[int, int], after: int) -> bool:
            events = await timeline.read_events(run_id, after, limit=1000)
            return any(
                e.type == "stats" and (e.data["width"], e.data["height"]) == size for e in events
            )

        sender.active = {"0"}  # the upper layer stops (bandwidth, or OBS dropping it)
        await eventually(lambda: demux.decoding == "0", within=WAIT_S, awaiting="switch down")
        switched_at = (await timeline.read_events(run_id, 0, limit=1000))[-1].seq
        await eventually(
            lambda: stats_of(SIZES["0"], switched_at),
            within=WAIT_S,
            awaiting="the lower layer decoded",
        )
        sender.active = {"0", "1"}
        await eventually(lambda: demux.decoding == "1", within=WAIT_S, awaiting="switch back")
        back_at = (await timeline.read_events(run_id, 0, limit=1000))[-1].seq
        await eventually(
            lambda: stats_of(SIZES["1"], back_at),
            within=WAIT_S,
            awaiting="the upper layer decoded again",
        )
        events = await timeline.read_events(run_id, 0, limit=1000)
        changes = [
            (e.data["change"], e.data["rid"], e.data["decoding"])
            for e in events
            if e.type == "simulcast_layer"
        ]
        assert changes == [
            ("layer_decoded", "1", "1"),
            ("layer_stopped", "1", "1"),
            ("layer_decoded", "0", "0"),
            ("layer_resumed", "1", "0"),
            ("layer_decoded", "1", "1"),
        ]
        assert demux.counters() == {
            "unknown_rid": 0,
            "unknown_ssrc": 0,
            "ssrc_changes": 0,
            "switches": 2,
            "pli_withheld": demux.pli_withheld,
        }
        # A keyframe request for every layer aiortc saw reaches the decoded one only.
        withheld = demux.pli_withheld
        assert await send_pli(demux.receiver) == 2
        assert demux.pli_withheld == withheld + 1
        stats = [e.data for e in events if e.type == "stats" and e.data.get("layers")]
        assert [layer["rid"] for layer in stats[-1]["layers"]] == ["0", "1"]
        assert [(la["width"], la["height"]) for la in stats[-1]["layers"]] == [
            SIZES["0"],
            SIZES["1"],
        ]
        # Each layer has its own RTP timestamp base; the decoded track's timeline goes on
        # growing across both switches, so the linting sees no frame out of order.
        warnings = [e.data["warning"] for e in events if e.type == "stream_warning"]
        assert "b_frames" not in warnings
        assert first.data["b_frames"] is False


async def test_hostile_rids_and_ssrcs_are_counted_and_bounded(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers()
    async with _simulcast_push(server) as (sender, demux):
        await eventually(lambda: demux.decoding == "1", within=WAIT_S, awaiting="decoding")
        payload = _layer_frames("0")[1]
        stranger = RtpStream(random.randrange(1 << 32), sender.pub.video_payload_type)
        invented: list[RtpPacket] = []
        for _ in range(40):
            (packet,) = stranger.packets(payload[:1])
            packet.extensions.rtp_stream_id = "zz"  # never offered
            invented.append(packet)
        await sender.send(invented)
        untagged = RtpStream(random.randrange(1 << 32), sender.pub.video_payload_type)
        await sender.send([p for _ in range(25) for p in untagged.packets(payload[:1])])
        await eventually(
            lambda: (demux.unknown_rid, demux.unknown_ssrc) == (40, 25),
            within=WAIT_S,
            awaiting="invented RIDs and unknown SSRCs counted",
        )
        # A layer's SSRC replaced again and again: one entry per layer, changes counted.
        for _ in range(6):
            hijack = RtpStream(random.randrange(1 << 32), sender.pub.video_payload_type)
            (packet,) = hijack.packets(payload[:1])
            packet.extensions.rtp_stream_id = "0"
            await sender.send([packet])
        await eventually(
            lambda: demux.ssrc_changes >= 6, within=WAIT_S, awaiting="SSRC changes counted"
        )
        assert len(demux._by_ssrc) <= 2 * len(demux.layers)
        assert set(demux.layers) == {"0", "1"}


async def test_lowest_decodes_the_small_layer(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers(pipeline__simulcast="lowest")
    timeline: Timeline = server.app[TIMELINE_KEY]
    async with _simulcast_push(server) as (sender, demux):
        first = await wait_for_type(timeline, sender.pub.run_id, "first_frame", wait_s=WAIT_S)
        assert (first.data["width"], first.data["height"]) == SIZES["0"]
        assert demux.decoding == "0"


async def test_rtx_is_bound_to_its_layer_by_the_repaired_rid(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers()
    async with _simulcast_push(server, rtx=True) as (sender, demux):
        await eventually(lambda: demux.decoding == "1", within=WAIT_S, awaiting="decoding")
        media = sender.streams["1"]
        repair = RtpStream(random.randrange(1 << 32), RTX_PT)
        # Retransmit the layer's latest packet again (original sequence number in front).
        original = (media.sequence - 1) & 0xFFFF
        (packet,) = repair.packets([original.to_bytes(2, "big") + _layer_frames("1")[1][-1]])
        packet.extensions.repaired_rtp_stream_id = "1"
        await sender.send([packet])
        layer = demux.layers["1"]
        await eventually(
            lambda: layer.rtx_ssrc == repair.ssrc, within=WAIT_S, awaiting="RTX SSRC bound"
        )
        rtx_table = demux.receiver._RTCRtpReceiver__rtx_ssrc
        assert rtx_table[repair.ssrc] == media.ssrc
        assert demux.counters()["unknown_rid"] == 0


async def test_all_decodes_each_layer_on_its_own_path(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers(pipeline__simulcast="all")
    async with _simulcast_push(server) as (sender, demux):
        session = server.app[SESSIONS_KEY].find_by_run(sender.pub.run_id)
        assert session is not None and session.supervisor is not None
        assert session.permit.threads == 2  # two layers, no audio: workers_per_session
        supervisor = session.supervisor

        def decoded_sizes() -> set[tuple[int | None, int | None]] | None:
            video = [w.stats for w in supervisor.workers if w.intake.kind == "video"]
            if len(video) == 2 and all(s.frames_decoded > 10 for s in video):
                return {(s.width, s.height) for s in video}
            return None

        sizes = await eventually(decoded_sizes, within=WAIT_S, awaiting="both layers decoded")
        assert sizes == set(SIZES.values())
        assert [w.intake.layer for w in supervisor.workers] == [None, "1"]
        assert {rid: path.malformed for rid, path in demux.paths.items()} == {"0": 0, "1": 0}
        assert demux.decoding is None
