#!/usr/bin/env python3
"""Depacketizer throughput: packets/s per format at 720p30-sized frames, beside decoding.

Prints one JSON document on stdout; progress goes to stderr.

The clips: ``--seconds`` (default 3) of :mod:`bench.support.rtp_reference`'s moving
pattern at 1280x720, 30 fps, encoded with libx265 / libsvtav1 / libvpx-vp9 (and libx264
for the baseline), packetized by FFmpeg's RTP muxer at a 1200-byte MTU (what browsers
and OBS send).

Per format, per repetition (``--repeat``, default 5; the best is reported, the median
too): every packet through :meth:`Depacketizer.depacketize`, the outputs of one RTP
timestamp joined as aiortc's jitter buffer joins them, and :meth:`Depacketizer.assemble`
on each frame, then the bitstream keyframe check the intake runs. Figures: ``packets_per_s``
and ``frames_per_s`` (CPU time of this thread: ``time.thread_time``, steadier than wall
time on a shared host), ``us_per_frame``; then PyAV decoding the same frames on one
thread (``decode_us_per_frame``, FFmpeg threads = 1, the server's default) and
``depacketize_share`` = depacketize / decode time: what the depacketizer adds in front
of a decode worker. Issue 12's target is pipeline fps / PyAV fps >= 0.9; the
depacketizer runs on the event loop thread, not the worker's, so on a free core it costs
the worker nothing, and on a busy host it competes for at most ``depacketize_share`` of
a decode's CPU. ``baseline_h264`` is aiortc's own ``h264_depayload`` on an H.264 clip
of the same size (the per-packet step only: aiortc has no frame step).

Usage::

    .venv/bin/python bench/rtp_payload.py             # 3 s clips, 5 repetitions
    .venv/bin/python bench/rtp_payload.py --quick     # 1 s clips, 2 repetitions
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

import av  # noqa: E402
from aiortc.codecs.h264 import h264_depayload  # noqa: E402

from bench.support.rtp_reference import (  # noqa: E402
    SETUPS,
    EncoderSetup,
    RtpPacket,
    encode,
    packetize,
)
from pipeline.keyframes import is_keyframe  # noqa: E402
from pipeline.rtp_payload.formats import depacketizer_for  # noqa: E402

WIDTH, HEIGHT, MTU = 1280, 720, 1200
FORMATS = ("H265", "AV1", "VP9")
H264 = EncoderSetup(
    "libx264", "h264", "h264", {"preset": "veryfast", "tune": "zerolatency", "g": "30"}
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def depacketize_once(codec: str, rtp: list[RtpPacket]) -> tuple[float, list[bytes]]:
    """Thread-CPU seconds to depacketize, assemble and keyframe-check ``rtp``."""
    depacketizer = depacketizer_for(codec, {})
    assert depacketizer is not None
    per_packet = depacketizer.depacketize
    assemble = depacketizer.assemble
    frames: list[bytes] = []
    started = time.thread_time()
    current: list[bytes] = []
    timestamp = rtp[0].timestamp
    for packet in rtp:
        if packet.timestamp != timestamp:
            frame = assemble(b"".join(current)).data
            is_keyframe(codec, frame)
            frames.append(frame)
            current = []
            timestamp = packet.timestamp
        current.append(per_packet(packet.payload).data)
    frame = assemble(b"".join(current)).data
    is_keyframe(codec, frame)
    frames.append(frame)
    elapsed = time.thread_time() - started
    assert not depacketizer.errors, depacketizer.errors
    return elapsed, frames


def decode_once(decoder: str, frames: list[bytes]) -> float:
    """Thread-CPU seconds for PyAV to decode ``frames`` on one FFmpeg thread."""
    context = av.CodecContext.create(decoder, "r")
    context.thread_count = 1
    started = time.thread_time()
    for data in frames:
        context.decode(av.Packet(data))
    context.decode(None)
    return time.thread_time() - started


def measure(codec: str, seconds: float, repeat: int) -> dict[str, Any]:
    count = round(30 * seconds)
    log(f"{codec}: encoding {count} frames at {WIDTH}x{HEIGHT}")
    packets = encode(codec, count, WIDTH, HEIGHT)
    rtp = packetize(codec, packets, WIDTH, HEIGHT, MTU)
    runs = [depacketize_once(codec, rtp) for _ in range(repeat)]
    times = [elapsed for elapsed, _ in runs]
    frames = runs[0][1]
    decode = min(decode_once(SETUPS[codec].decoder, frames) for _ in range(max(1, repeat // 2)))
    best = min(times)
    payload_bytes = sum(len(p.payload) for p in rtp)
    return {
        "frames": len(frames),
        "packets": len(rtp),
        "packets_per_frame": round(len(rtp) / len(frames), 2),
        "stream_bitrate_bps": round(payload_bytes * 8 / seconds),
        "packets_per_s": round(len(rtp) / best),
        "packets_per_s_median": round(len(rtp) / statistics.median(times)),
        "frames_per_s": round(len(frames) / best),
        "us_per_frame": round(best / len(frames) * 1e6, 1),
        "us_per_packet": round(best / len(rtp) * 1e6, 2),
        "decode_us_per_frame": round(decode / len(frames) * 1e6, 1),
        "depacketize_share": round(best / decode, 4),
        "realtime_margin": round((len(rtp) / best) / (len(rtp) / seconds), 1),
    }


def baseline_h264(seconds: float, repeat: int) -> dict[str, Any]:
    SETUPS["H264"] = H264
    count = round(30 * seconds)
    log(f"H264 baseline: encoding {count} frames")
    rtp = packetize("H264", encode("H264", count, WIDTH, HEIGHT), WIDTH, HEIGHT, MTU)
    times = []
    for _ in range(repeat):
        started = time.thread_time()
        for packet in rtp:
            h264_depayload(packet.payload)
        times.append(time.thread_time() - started)
    best = min(times)
    return {
        "packets": len(rtp),
        "packets_per_s": round(len(rtp) / best),
        "us_per_packet": round(best / len(rtp) * 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 s clips, 2 repetitions")
    args = parser.parse_args()
    seconds, repeat = (1.0, 2) if args.quick else (args.seconds, args.repeat)
    out: dict[str, Any] = {
        "bench": "rtp_payload",
        "size": f"{WIDTH}x{HEIGHT}",
        "fps": 30,
        "seconds": seconds,
        "mtu": MTU,
        "repeat": repeat,
        "clock": "time.thread_time (CPU of the measuring thread)",
        "formats": {codec: measure(codec, seconds, repeat) for codec in FORMATS},
        "baseline_h264_aiortc_depayload": baseline_h264(seconds, repeat),
        "host": {"python": platform.python_version(), "av": av.__version__},
    }
    out["host"]["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
