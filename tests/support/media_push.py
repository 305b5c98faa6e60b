"""Push a fixture file over WHIP with FFmpeg's WHIP muxer (PyAV), stream copy.

No re-encode: the mp4's H.264 packets are muxed as they are (the WHIP muxer converts
the mp4's length-prefixed NAL units to Annex B itself), paced by their pts in real time.
``corrupt`` lets a test damage chosen packets on the way out.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av

MEDIA = Path(__file__).resolve().parents[2] / "fixtures" / "media"

Corrupt = Callable[[int, int, bytes, bool], bytes | None]
"""``corrupt(loop, index, data, keyframe)`` -> replacement payload, or None to keep it."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClipInfo:
    """What the fixture holds (counted with PyAV, not trusted from metadata)."""

    packets: int
    keyframes: int
    width: int
    height: int
    fps: float
    codec: str


def clip_info(path: Path) -> ClipInfo:
    """Count the video packets and keyframes of ``path``."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = keyframes = 0
        for packet in container.demux(stream):
            if packet.size:
                packets += 1
                keyframes += int(packet.is_keyframe)
        ctx = stream.codec_context
        return ClipInfo(
            packets, keyframes, ctx.width, ctx.height, float(stream.average_rate or 0), ctx.name
        )


@dataclasses.dataclass(slots=True)
class PushResult:
    packets: int = 0
    keyframes: int = 0
    corrupted: int = 0
    loops: int = 0


def push_file(
    url: str,
    path: Path,
    *,
    loops: int = 1,
    max_seconds: float = 30.0,
    corrupt: Corrupt | None = None,
    stop: Callable[[], bool] | None = None,
    before_close: Callable[[], None] | None = None,
) -> PushResult:
    """Stream-copy ``path``'s video to ``url`` ``loops`` times, paced in real time.

    Blocking; bounded by ``max_seconds`` of wall time and by ``stop()`` (checked before
    every packet). Closing the container makes the muxer DELETE its session URL;
    ``before_close()`` runs (on this thread) after the last packet, before that.
    """
    result = PushResult()
    out = av.open(url, mode="w", format="whip", options={"handshake_timeout": "5000"})
    try:
        started = time.monotonic()
        offset = 0.0  # media time of the current loop's start
        dts_offset = 0
        for loop in range(loops):
            with av.open(str(path)) as source:
                in_stream = source.streams.video[0]
                if loop == 0:
                    out_stream = out.add_stream_from_template(in_stream)
                tb = in_stream.time_base
                index = 0
                for packet in source.demux(in_stream):
                    pts = packet.pts
                    if packet.size == 0 or pts is None:
                        continue
                    if stop is not None and stop():
                        return result
                    now = time.monotonic() - started
                    if now > max_seconds:
                        return result
                    due = offset + float(pts * tb)
                    if due > now:
                        time.sleep(due - now)
                    keyframe = packet.is_keyframe
                    dts = packet.dts if packet.dts is not None else pts
                    outgoing: av.Packet[Any] = packet
                    if corrupt is not None:
                        replacement = corrupt(loop, index, bytes(packet), keyframe)
                        if replacement is not None:
                            outgoing = av.Packet(replacement)
                            outgoing.time_base = tb
                            outgoing.is_keyframe = keyframe
                            result.corrupted += 1
                    outgoing.pts = pts + dts_offset
                    outgoing.dts = dts + dts_offset
                    outgoing.stream = out_stream
                    out.mux(outgoing)
                    result.packets += 1
                    result.keyframes += int(keyframe)
                    index += 1
                duration = float((in_stream.duration or 0) * tb) or index / 30
                offset += duration
                dts_offset += round(duration / tb)
                result.loops += 1
        if before_close is not None:
            before_close()
        return result
    finally:
        out.close()
