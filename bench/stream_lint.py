#!/usr/bin/env python3
"""Ingest linting's cost on the event loop thread: :meth:`StreamLint.observe` per frame.

Prints one JSON document on stdout; progress goes to stderr.

The clip: ``--seconds`` (default 4) of moving noise at 1280x720, 30 fps, GOP 30 (so
keyframes are the size of a real camera's, not a test pattern's), encoded with libx264
(high, no B-frames) and libx265, each keyframe carrying its parameter sets in band
(Annex-B), as WebRTC senders put them. Per codec, per
repetition (``--repeat``, default 5; the best is reported, the median too): every frame
through ``observe`` (the call the video intake makes per frame on the event loop
thread), timed with ``time.thread_time``. Figures: ``us_per_keyframe`` (the parameter
set read), ``us_per_frame`` (the other frames: the timestamp and keyframe-gap checks).

Usage::

    .venv/bin/python bench/stream_lint.py
    .venv/bin/python bench/stream_lint.py --quick     # 1 s clip, 2 repetitions
"""

from __future__ import annotations

import argparse
import fractions
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

import av  # noqa: E402
import numpy as np  # noqa: E402

from pipeline.frame import EncodedFrame  # noqa: E402
from pipeline.keyframes import is_keyframe  # noqa: E402
from pipeline.stream_lint import StreamLint  # noqa: E402

ENCODERS = {
    "H264": ("libx264", {"profile": "high", "preset": "veryfast", "bf": "0"}),
    "H265": ("libx265", {"x265-params": "log-level=error:bframes=0:repeat-headers=1"}),
}


def clip(codec: str, seconds: float) -> list[EncodedFrame]:
    encoder, options = ENCODERS[codec]
    context = av.CodecContext.create(encoder, "w")
    context.width, context.height, context.pix_fmt = 1280, 720, "yuv420p"
    context.time_base = fractions.Fraction(1, 30)
    context.framerate = fractions.Fraction(30)
    context.gop_size = 30
    context.options = options
    noise = np.random.default_rng(7).integers(0, 256, (720, 1280, 3), np.uint8)
    frames: list[EncodedFrame] = []
    for i in range(int(seconds * 30) + 1):
        if i == int(seconds * 30):
            packets = context.encode(None)
        else:
            image = np.roll(noise, i * 8, axis=1)
            picture = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            picture.pts = i
            packets = context.encode(picture)
        for packet in packets:
            data = bytes(packet)
            ts = (packet.pts or 0) * 3000
            frames.append(EncodedFrame("video", codec, data, ts, is_keyframe(codec, data), 0.0))
    return frames


def measure(frames: list[EncodedFrame]) -> tuple[float, float]:
    lint = StreamLint()
    key_s = other_s = 0.0
    keys = others = 0
    for frame in frames:
        started = time.thread_time()
        lint.observe(frame, {"profile-level-id": "42e01f"})
        spent = time.thread_time() - started
        if frame.keyframe:
            key_s, keys = key_s + spent, keys + 1
        else:
            other_s, others = other_s + spent, others + 1
    return key_s / max(keys, 1) * 1e6, other_s / max(others, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeat = 1.0, 2
    results: dict[str, object] = {}
    for codec in ENCODERS:
        print(f"encoding {codec}", file=sys.stderr)
        frames = clip(codec, args.seconds)
        runs = [measure(frames) for _ in range(args.repeat)]
        results[codec] = {
            "frames": len(frames),
            "keyframes": sum(f.keyframe for f in frames),
            "keyframe_bytes": max(len(f.data) for f in frames if f.keyframe),
            "us_per_keyframe": round(min(r[0] for r in runs), 2),
            "us_per_keyframe_median": round(statistics.median(r[0] for r in runs), 2),
            "us_per_frame": round(min(r[1] for r in runs), 2),
            "us_per_frame_median": round(statistics.median(r[1] for r in runs), 2),
        }
    document = {
        "bench": "stream_lint",
        "python": platform.python_version(),
        "seconds": args.seconds,
        "repeat": args.repeat,
        "codecs": results,
    }
    json.dump(document, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
