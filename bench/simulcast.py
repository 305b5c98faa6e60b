#!/usr/bin/env python3
"""What the simulcast demultiplexer costs on the event loop, per RTP packet.

Prints one JSON document on stdout.

The load is Chromium's 3-layer VP8 simulcast of a 720p capture at the top of its ramp:
layers q (320x180, ~150 kb/s), h (640x360, ~500 kb/s) and f (1280x720, ~1.7 Mb/s) in
1200-byte packets, interleaved as they arrive, about 250 packets/s in all, the RID
extension on each layer's first 10 packets only (then the SSRC), a keyframe every 3 s.
Per repetition (``--repeat``, default 5; best and median reported) ``--seconds`` (default
60) of that traffic go through :meth:`whip.rtc.simulcast.SimulcastDemux.handle` on this
one thread (CPU time: ``time.thread_time``), in front of an aiortc receive path that takes
the decoded layer's packets and does nothing with them (so the figure is the demux alone):

- ``demux_ns_per_packet``: classification (RID or SSRC), the layer's counters and rates,
  the VP8 keyframe size read, and the layer choice;
- ``loop_share_percent``: the share of one core that takes for one such session;
- ``codecs``: the same traffic in H.264, H.265, AV1 and VP9 (``--codecs``), every layer's
  size read from its payloads (:mod:`whip.rtc.layer_size`): per codec the demux's cost
  per packet and ``vs_vp8``, its median over VP8's median in the same run (the figure to
  compare across machines), and the layer sizes the demux read (they must be the
  layers'). Their payloads are real: FFmpeg's RTP muxer packetizing PyAV-encoded frames
  at each layer's size (``bench/support/rtp_reference.py``); a keyframe's first packets
  are that stream's, up to the one that carries the size, the other packets cycle
  through the stream's inter frames. VP8's are synthetic (a keyframe header, then zeros).

Usage::

    .venv/bin/python bench/simulcast.py
    .venv/bin/python bench/simulcast.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from aiortc.rtp import RtpPacket

from bench.support.rtp_reference import reference_stream
from whip.rtc.layer_size import size_reader
from whip.rtc.simulcast import SimulcastDemux
from whip.sdp.simulcast import SimulcastOffer

LAYERS = {"q": (320, 180, 150_000), "h": (640, 360, 500_000), "f": (1280, 720, 1_700_000)}
PACKET_BYTES = 1200
FPS = 30
KEYFRAME_EVERY_S = 3
TAGGED = 10
MIME_TYPES = {
    "VP8": "video/VP8",
    "H264": "video/H264",
    "H265": "video/H265",
    "AV1": "video/AV1",
    "VP9": "video/VP9",
}
CODEC_FRAMES = 4
"""Frames encoded per layer and codec for the real payloads: one keyframe, then inter frames."""


class _ReceivePath:
    """Where the decoded layer's packets go: aiortc's codecs table and a handler that
    takes them (the part of ``RTCRtpReceiver`` the demux reads)."""

    def __init__(self, codec: str = "VP8") -> None:
        parameters = RTCRtpCodecParameters(
            mimeType=MIME_TYPES[codec], clockRate=90000, payloadType=96
        )
        self._RTCRtpReceiver__codecs = {96: parameters}
        self._RTCRtpReceiver__rtx_ssrc: dict[int, int] = {}
        self.taken = 0

    async def handle(self, packet: RtpPacket, arrival_time_ms: int) -> None:
        self.taken += 1

    async def _send_rtcp_pli(self, media_ssrc: int) -> None:
        return None


def _keyframe_payload(width: int, height: int) -> bytes:
    header = bytes([0x10]) + bytes([0x00, 0x00, 0x00]) + b"\x9d\x01\x2a"
    size = width.to_bytes(2, "little") + height.to_bytes(2, "little")
    return header + size + bytes(PACKET_BYTES - len(header) - len(size))


Payloads = tuple[tuple[bytes, ...], tuple[bytes, ...]]
"""A layer's keyframe start (its first packets, through the one with the size) and the
payloads the other packets cycle through."""


def vp8_payloads(width: int, height: int) -> Payloads:
    return (_keyframe_payload(width, height),), (bytes([0x00]) + bytes(PACKET_BYTES - 1),)


def real_payloads(codec: str, width: int, height: int) -> Payloads:
    """FFmpeg's packetization of ``codec`` frames at this size (module doc)."""
    if codec == "VP8":
        return vp8_payloads(width, height)
    stream = reference_stream(codec, CODEC_FRAMES, width, height, PACKET_BYTES + 12)
    read = size_reader(MIME_TYPES[codec], {})
    assert read is not None
    first = stream.rtp[0].timestamp
    keyframe: list[bytes] = []
    for packet in stream.rtp:
        keyframe.append(packet.payload)
        if read(packet.payload) is not None:
            break
    other = tuple(p.payload for p in stream.rtp if p.timestamp != first)
    assert read(keyframe[-1]) == (width, height) and other, codec
    return tuple(keyframe), other


def traffic(
    seconds: float, rng: random.Random, codec: str = "VP8"
) -> list[tuple[float, RtpPacket]]:
    """(arrival time, packet) of every layer, in arrival order."""
    out: list[tuple[float, RtpPacket]] = []
    for rid, (width, height, bitrate) in LAYERS.items():
        keyframe_start, others = real_payloads(codec, width, height)
        ssrc = rng.randrange(1 << 32)
        per_frame = max(1, round(bitrate / 8 / FPS / PACKET_BYTES))
        sequence = rng.randrange(1 << 16)
        sent = 0
        for frame in range(int(seconds * FPS)):
            keyframe = frame % (KEYFRAME_EVERY_S * FPS) == 0
            for index in range(per_frame):
                if keyframe and index < len(keyframe_start):
                    payload = keyframe_start[index]
                else:
                    payload = others[sent % len(others)]
                packet = RtpPacket(
                    payload_type=96,
                    marker=int(index == per_frame - 1),
                    sequence_number=sequence,
                    timestamp=frame * 3000,
                    ssrc=ssrc,
                    payload=payload,
                )
                if sent < TAGGED:
                    packet.extensions.rtp_stream_id = rid
                sequence = (sequence + 1) & 0xFFFF
                sent += 1
                out.append((frame / FPS + index * 0.0005 + rng.random() * 0.002, packet))
    out.sort(key=lambda item: item[0])
    return out


async def one_run(seconds: float, seed: int, codec: str = "VP8") -> dict[str, Any]:
    packets = traffic(seconds, random.Random(seed), codec)
    offer = SimulcastOffer(1, tuple(LAYERS), ";".join(LAYERS), frozenset(), ())
    clock = [0.0]
    path = _ReceivePath(codec)
    demux = SimulcastDemux(path, offer, "highest", "bench", clock=lambda: clock[0])
    demux._inner = path.handle
    start = time.thread_time_ns()
    for arrival, packet in packets:
        clock[0] = arrival
        await demux.handle(packet, int(arrival * 1000))
    spent = time.thread_time_ns() - start
    return {
        "packets": len(packets),
        "ns_per_packet": spent / len(packets),
        "packets_per_s": len(packets) / seconds,
        "decoded": demux.decoding,
        "taken_by_receive_path": path.taken,
        "sizes": {str(f["rid"]): [f["width"], f["height"]] for f in demux.figures()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="5 s, 2 repetitions")
    parser.add_argument(
        "--codecs",
        default="H264,H265,AV1,VP9",
        help="codecs timed beside VP8 in each repetition (comma-separated, or empty)",
    )
    args = parser.parse_args()
    seconds, repeat = (5.0, 2) if args.quick else (args.seconds, args.repeat)
    codecs = [c for c in args.codecs.upper().split(",") if c]
    unknown = set(codecs) - set(MIME_TYPES)
    if unknown:
        parser.error(f"unknown codecs: {sorted(unknown)}")
    for codec in codecs:  # encode and packetize before the clock starts
        for width, height, _ in LAYERS.values():
            real_payloads(codec, width, height)
    runs: list[dict[str, Any]] = []
    codec_runs: dict[str, list[dict[str, Any]]] = {codec: [] for codec in codecs}
    for seed in range(repeat):  # VP8 and the others interleaved: same-run ratios
        runs.append(asyncio.run(one_run(seconds, seed)))
        for codec in codecs:
            codec_runs[codec].append(asyncio.run(one_run(seconds, seed, codec)))
    per_packet = [r["ns_per_packet"] for r in runs]
    rate = runs[0]["packets_per_s"]
    median = statistics.median(per_packet)
    by_codec: dict[str, Any] = {}
    for codec, done in codec_runs.items():
        costs = [r["ns_per_packet"] for r in done]
        by_codec[codec] = {
            "ns_per_packet": {"best": round(min(costs)), "median": round(statistics.median(costs))},
            "vs_vp8": round(statistics.median(costs) / median, 3),
            "decoded_layer": done[0]["decoded"],
            "layer_sizes": done[0]["sizes"],
        }
    print(
        json.dumps(
            {
                "bench": "simulcast",
                "python": platform.python_version(),
                "seconds": seconds,
                "repeat": repeat,
                "layers": {
                    rid: {"width": w, "height": h, "bitrate_bps": b}
                    for rid, (w, h, b) in LAYERS.items()
                },
                "packets_per_s": round(rate, 1),
                "decoded_layer": runs[0]["decoded"],
                "demux_ns_per_packet": {"best": round(min(per_packet)), "median": round(median)},
                "loop_share_percent": round(median * rate / 1e9 * 100, 4),
                "vp8_layer_sizes": runs[0]["sizes"],
                "codecs": by_codec,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
