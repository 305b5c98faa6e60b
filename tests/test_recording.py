"""Recording by remux, end to end: a real push through FFmpeg's WHIP muxer, the real server,
segment files read back with PyAV, the REST routes; a write error that must not stop the
push.

The publisher's own encoder output is captured (``ffmpeg_whip_push(on_packet=...)``) and
compared packet by packet with what the segments hold: the MP4 muxer stores H.264 as
length-prefixed NAL units where the encoder wrote Annex B, so a packet is compared as its
sequence of NAL units (start codes and length prefixes are framing, the NAL units are the
encoder's bytes). The encoder keeps its SPS and PPS in its extradata and FFmpeg's WHIP
muxer sends them before every keyframe: a recorded keyframe is its parameter sets, which
must be the encoder's extradata's, then the encoder's packet.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import av
from aiohttp.test_utils import TestServer

from pipeline.recording.codec_setup import nal_units
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.peers import ffmpeg_whip_push
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.auth import hash_token

ServerFactory = Callable[..., Awaitable[TestServer]]
TOKENS = {"a": "token-studio-a", "b": "token-studio-b", "op": "token-ops"}
PRINCIPALS = [
    {"name": "studio-a", "role": "publisher", "token_sha256": hash_token(TOKENS["a"])},
    {"name": "studio-b", "role": "publisher", "token_sha256": hash_token(TOKENS["b"])},
    {"name": "ops", "role": "operator", "token_sha256": hash_token(TOKENS["op"])},
]
FPS = 30
GOP = FPS  # the WHIP output's 1 s GOP (whip.publish.open_whip_output)
SIZE = (320, 180)


def _auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


def _digest(units: list[bytes]) -> str:
    return hashlib.sha256(b"".join(struct.pack(">I", len(u)) + u for u in units)).hexdigest()


def _length_prefixed(sample: bytes) -> list[bytes]:
    units, offset = [], 0
    while offset < len(sample):
        (size,) = struct.unpack_from(">I", sample, offset)
        units.append(sample[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return units


@dataclass
class Sent:
    """What the publisher's encoders produced, in order, as digests."""

    video: list[str] = field(default_factory=list)
    audio: list[str] = field(default_factory=list)
    parameter_sets: list[bytes] = field(default_factory=list)

    def capture(self, kind: str, data: bytes) -> None:
        if kind == "video-extradata":
            self.parameter_sets = nal_units(data)
        elif kind == "video":
            self.video.append(_digest(nal_units(data)))
        else:
            self.audio.append(hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class SegmentRead:
    codec: str
    size: tuple[int, int]
    video: list[str]
    """NAL-unit digests of each packet, a keyframe's leading SPS/PPS left out."""
    parameter_sets: list[list[bytes]]
    """The leading SPS/PPS of each keyframe."""
    audio: list[str]
    decoded: int
    first_is_key: bool
    bytes: int


def _read_segment(path: Path) -> SegmentRead:
    """Open ``path`` with PyAV: video packets as NAL-unit digests, audio packet digests,
    and a full decode of the video (off the event loop)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        size = (stream.codec_context.width, stream.codec_context.height)
        video: list[str] = []
        parameter_sets: list[list[bytes]] = []
        audio: list[str] = []
        first_key = False
        for packet in container.demux():
            if not packet.size:
                continue
            if packet.stream.type == "video":
                if not video:
                    first_key = packet.is_keyframe
                units = _length_prefixed(bytes(packet))
                if packet.is_keyframe:
                    leading = [u for u in units[:2] if u[0] & 0x1F in (7, 8)]
                    parameter_sets.append(leading)
                    units = units[len(leading) :]
                video.append(_digest(units))
            else:
                audio.append(hashlib.sha256(bytes(packet)).hexdigest())
    with av.open(str(path)) as container:
        decoded = sum(1 for _ in container.decode(video=0))
    return SegmentRead(
        codec, size, video, parameter_sets, audio, decoded, first_key, path.stat().st_size
    )


async def _events(timeline: Timeline, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, dict(e.data)) for e in await timeline.read_events(run_id, 0, 1000)]


async def _the_run(timeline: Timeline) -> str:
    runs = await eventually(
        lambda: timeline.runs.list_runs() or None, within=15, awaiting="the push's run"
    )
    return runs[0].run_id


async def test_a_push_is_recorded_in_segments_byte_for_byte(
    whip_servers: ServerFactory,
) -> None:
    server = await whip_servers(PRINCIPALS, recording__enabled=True, recording__segment_s=5.0)
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager = server.app[SESSIONS_KEY]
    sent = Sent()
    url = str(server.make_url("/whip/studio"))
    push = asyncio.create_task(
        asyncio.to_thread(
            ffmpeg_whip_push, url, 12.0, size=SIZE, token=TOKENS["a"], on_packet=sent.capture
        )
    )
    run_id = await _the_run(timeline)
    session = await eventually(
        lambda: manager.find_by_run(run_id), within=15, awaiting="the live session"
    )
    video_intake = next(i for i in session.intakes if i.kind == "video")
    audio_intake = next(i for i in session.intakes if i.kind == "audio")
    await push
    await wait_for_type(timeline, run_id, "session_closed")

    events = await _events(timeline, run_id)
    types = [t for t, _ in events]
    assert "recording_failed" not in types and "worker_fault" not in types
    segments = [d for t, d in events if t == "recording_segment"]
    assert len(segments) >= 2
    assert [d["index"] for d in segments] == list(range(len(segments)))
    assert [d["name"] for d in segments] == [f"{i}.mp4" for i in range(len(segments))]
    # Every segment but the last is segment_s long (to the keyframe that follows it).
    for data in segments[:-1]:
        assert 5000 <= data["duration_ms"] <= 5000 + 1000 + 100
    assert abs(segments[1]["start_ms"] - segments[0]["start_ms"] - segments[0]["duration_ms"]) <= 1

    run_dir = manager.recordings.store.run_dir(run_id)
    reads = [await asyncio.to_thread(_read_segment, run_dir / d["name"]) for d in segments]
    for data, read in zip(segments, reads, strict=True):
        assert (read.codec, read.size) == ("h264", SIZE)
        assert read.first_is_key
        assert len(read.video) == read.decoded == data["video_frames"]
        assert len(read.audio) == data["audio_frames"] > 0
        assert read.bytes == data["bytes"]
        assert read.parameter_sets and all(p == sent.parameter_sets for p in read.parameter_sets)

    recorded_video = [d for read in reads for d in read.video]
    recorded_audio = [d for read in reads for d in read.audio]
    # Byte-identical and in order: the recording is one contiguous run of what the
    # encoder produced (it starts at the first keyframe the server got).
    start = sent.video.index(recorded_video[0])
    assert recorded_video == sent.video[start : start + len(recorded_video)]
    assert start < GOP
    assert abs(video_intake.frames_in - len(recorded_video)) <= GOP
    assert set(recorded_audio) <= set(sent.audio)
    assert abs(audio_intake.frames_in - len(recorded_audio)) <= 50  # 1 s of 20 ms frames

    await _check_rest(server, run_id, segments, run_dir)


async def _check_rest(
    server: TestServer, run_id: str, segments: list[dict[str, Any]], run_dir: Path
) -> None:
    """The list, a Range download, isolation, names, and the operator's delete."""
    base = f"/v1/runs/{run_id}/recordings"
    async with aiohttp.ClientSession() as http:
        listed = await (await http.get(server.make_url(base), headers=_auth("a"))).json()
        assert [(i["name"], i["bytes"], i["duration_ms"]) for i in listed["items"]] == [
            (d["name"], d["bytes"], d["duration_ms"]) for d in segments
        ]
        assert listed["items"][0]["url"] == f"{base}/0.mp4"
        run = await (
            await http.get(server.make_url(f"/v1/runs/{run_id}"), headers=_auth("a"))
        ).json()
        assert run["recording_bytes"] == sum(d["bytes"] for d in segments)

        whole = await asyncio.to_thread((run_dir / "0.mp4").read_bytes)
        ranged = await http.get(
            server.make_url(f"{base}/0.mp4"), headers={**_auth("a"), "Range": "bytes=100-299"}
        )
        assert ranged.status == 206
        assert ranged.headers["Content-Range"] == f"bytes 100-299/{len(whole)}"
        assert await ranged.read() == whole[100:300]
        full = await http.get(server.make_url(f"{base}/1.mp4"), headers=_auth("op"))
        assert full.status == 200 and full.headers["Content-Type"] == "video/mp4"
        assert await full.read() == await asyncio.to_thread((run_dir / "1.mp4").read_bytes)

        # Another principal's run is not there at all; neither is any other name.
        for path in (base, f"{base}/0.mp4"):
            answer = await http.get(server.make_url(path), headers=_auth("b"))
            assert (answer.status, (await answer.json())["error"]["code"]) == (404, "not_found")
        for name in ("..%2F..%2Fwal", "00.mp4", "0.mp4.tmp", "%2E%2E", "99.mp4"):
            answer = await http.get(server.make_url(f"{base}/{name}"), headers=_auth("a"))
            assert answer.status == 404, name

        metrics = await (await http.get(server.make_url("/metrics"))).text()
        assert f"whip_recording_segments_total {float(len(segments))}" in metrics
        assert f"whip_recording_bytes {float(run['recording_bytes'])}" in metrics

        refused = await http.delete(server.make_url(base), headers=_auth("a"))
        assert refused.status == 403
        deleted = await http.delete(server.make_url(base), headers=_auth("op"))
        assert (deleted.status, (await deleted.json())["deleted"]) == (200, len(segments))
        after = await (await http.get(server.make_url(base), headers=_auth("a"))).json()
        assert after["items"] == [] and after["recording_bytes"] == 0
        assert not await asyncio.to_thread(run_dir.exists)


async def test_a_write_error_is_reported_and_the_push_goes_on(
    whip_servers: ServerFactory, tmp_path: Path
) -> None:
    """The recordings directory cannot be created (a file is in its way: as root, a
    read-only mode would not stop the writes): ``recording_failed``, no fault, and the
    push is decoded to its end."""
    blocker = tmp_path / "not-a-directory"
    await asyncio.to_thread(blocker.write_bytes, b"")
    server = await whip_servers(recording__enabled=True, recording__dir=str(blocker / "rec"))
    timeline: Timeline = server.app[TIMELINE_KEY]
    url = str(server.make_url("/whip/failing"))
    await asyncio.to_thread(ffmpeg_whip_push, url, 2.0, size=SIZE, audio=False)
    run_id = await _the_run(timeline)
    closed = await wait_for_type(timeline, run_id, "session_closed")
    assert closed.data["reason"] == "deleted"
    events = await _events(timeline, run_id)
    failed = [d for t, d in events if t == "recording_failed"]
    assert len(failed) == 1 and "NotADirectoryError" in failed[0]["error"]
    assert failed[0]["index"] == 0
    types = [t for t, _ in events]
    assert "worker_fault" not in types and "recording_segment" not in types
    final = next(d for t, d in events if t == "stats" and d.get("final"))
    assert final["frames_decoded"] >= FPS  # decoding went on after the failure
