#!/usr/bin/env python3
"""What transport-wide feedback costs on the event loop: per packet, and per feedback.

Prints one JSON document on stdout.

The load is 720p video as Chromium sends it at the top of its ramp: 2.5 Mb/s of
1200-byte packets (about 260 packets/s) plus Opus (50 packets/s), one transport-wide
sequence, 0.5% of packets lost and 1% reordered by one place, arrival times 3.2 ms apart
with jitter. Per repetition (``--repeat``, default 5; best and median reported),
``--seconds`` (default 60) of that traffic, on this one thread (CPU time:
``time.thread_time``):

- ``record_ns_per_packet``: :meth:`whip.rtc.twcc.FeedbackRecorder.record` alone;
- ``hook_ns_per_packet``: what :mod:`whip.rtc.congestion` adds to aiortc's RTP routing
  per packet (the router hook reading the extension, the clock read, the record), against
  a stand-in router that routes nothing;
- ``build_us_per_feedback``: :meth:`FeedbackRecorder.build` every 50 ms (the feedback
  interval), with ``bytes_per_feedback`` and ``feedback_bps`` (the feedback's own rate).

``loop_share_percent`` puts them together: the share of one core the feedback machinery
takes for one such session.

Usage::

    .venv/bin/python bench/twcc.py
    .venv/bin/python bench/twcc.py --quick
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from whip.rtc.congestion import TransportFeedback, hook_router
from whip.rtc.twcc import FeedbackRecorder

VIDEO_PPS = 2_500_000 // (1200 * 8)
AUDIO_PPS = 50
INTERVAL_S = 0.05


def traffic(seconds: float, seed: int) -> list[tuple[int, int, int]]:
    """(sequence number, arrival us, ssrc) as received: loss and reordering applied."""
    rng = random.Random(seed)
    rate = VIDEO_PPS + AUDIO_PPS
    gap_us = 1_000_000 / rate
    packets: list[tuple[int, int, int]] = []
    now = 1_000_000.0
    for i in range(int(seconds * rate)):
        now += gap_us * rng.uniform(0.5, 1.5)
        if rng.random() < 0.005:
            continue
        ssrc = 1111 if i % (rate // AUDIO_PPS) else 2222
        packets.append((i & 0xFFFF, int(now), ssrc))
        if len(packets) > 1 and rng.random() < 0.01:
            packets[-1], packets[-2] = packets[-2], packets[-1]
    return packets


def run_record(packets: list[tuple[int, int, int]]) -> dict[str, float]:
    recorder = FeedbackRecorder()
    record = recorder.record
    started = time.thread_time_ns()
    for seq, arrival, _ssrc in packets:
        record(seq, arrival)
    return {"record_ns_per_packet": (time.thread_time_ns() - started) / len(packets)}


class _Extensions:
    __slots__ = ("transport_sequence_number",)

    def __init__(self, seq: int) -> None:
        self.transport_sequence_number = seq


class _Packet:
    __slots__ = ("extensions", "ssrc")

    def __init__(self, seq: int, ssrc: int) -> None:
        self.extensions = _Extensions(seq)
        self.ssrc = ssrc


class _Router:
    def route_rtp(self, packet: Any) -> None:
        return None


class _Transport:
    def __init__(self) -> None:
        self._rtp_router = _Router()


def run_hook(packets: list[tuple[int, int, int]]) -> dict[str, float]:
    parsed = [_Packet(seq, ssrc) for seq, _arrival, ssrc in packets]
    bare = _Router().route_rtp
    started = time.thread_time_ns()
    for packet in parsed:
        bare(packet)
    bare_ns = time.thread_time_ns() - started
    transport = _Transport()
    hook_router(transport, TransportFeedback(transport, [], 0))
    hooked = transport._rtp_router.route_rtp
    started = time.thread_time_ns()
    for packet in parsed:
        hooked(packet)
    hooked_ns = time.thread_time_ns() - started
    return {"hook_ns_per_packet": (hooked_ns - bare_ns) / len(parsed)}


def run_build(packets: list[tuple[int, int, int]]) -> dict[str, float]:
    recorder = FeedbackRecorder()
    per_feedback = int(INTERVAL_S * (VIDEO_PPS + AUDIO_PPS))
    build_ns = 0
    builds = 0
    sizes: list[int] = []
    for start in range(0, len(packets), per_feedback):
        for seq, arrival, _ssrc in packets[start : start + per_feedback]:
            recorder.record(seq, arrival)
        began = time.thread_time_ns()
        built = recorder.build(1, 2222)
        build_ns += time.thread_time_ns() - began
        builds += 1
        sizes.extend(len(p) for p in built)
    seconds = len(packets) / (VIDEO_PPS + AUDIO_PPS)
    return {
        "build_us_per_feedback": build_ns / builds / 1000,
        "bytes_per_feedback": statistics.mean(sizes),
        "feedback_bps": sum(sizes) * 8 / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10 s of traffic, 2 repetitions")
    args = parser.parse_args()
    seconds, repeat = (10.0, 2) if args.quick else (args.seconds, args.repeat)
    packets = traffic(seconds, seed=7)
    runs: list[dict[str, float]] = []
    for _ in range(repeat):
        runs.append({**run_record(packets), **run_hook(packets), **run_build(packets)})
    best = {key: min(run[key] for run in runs) for key in runs[0]}
    median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    pps = VIDEO_PPS + AUDIO_PPS
    share = (median["hook_ns_per_packet"] * pps + median["build_us_per_feedback"] * 1000 * 20) / 1e9
    print(
        json.dumps(
            {
                "bench": "twcc",
                "traffic": {
                    "seconds": seconds,
                    "packets_per_s": pps,
                    "loss": 0.005,
                    "reordered": 0.01,
                    "feedback_interval_s": INTERVAL_S,
                },
                "repeat": repeat,
                "best": {k: round(v, 2) for k, v in best.items()},
                "median": {k: round(v, 2) for k, v in median.items()},
                "loop_share_percent": round(100 * share, 4),
                "host": {"python": platform.python_version(), "machine": platform.machine()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
