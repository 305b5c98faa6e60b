#!/usr/bin/env python3
"""What each video analyzer costs in place: paired frames, one analyzer knocked out.

Prints one JSON document on stdout; progress goes to stderr.

``bench/decode.py``'s ablation times whole runs with one analyzer made a no-op, so its
figures carry the host's swings between runs (±0.1 of the decode on the shared 2-core
host). This one pairs frames instead: one decoder (PyAV, the server's settings, pinned to
the last CPU) decodes the 720p H.264 clip of ``bench/decode.py``, and after each decode
the frame goes to one of two :class:`~pipeline.analysis.Analysis` instances with the
server's defaults, alternately: ``intact`` on even frames, ``ablated`` (one piece
replaced by a no-op) on odd ones. Both therefore run right after a decode, with the
caches the decoder left, which is where the server runs them; the thread CPU time of each
``on_frame`` call is taken (``time.thread_time_ns``), and the difference of the two means
is what the piece costs there. With nothing knocked out (``none``), the two means differ
by 1-2 us: the method's resolution.

Pieces (``--pieces``): ``luma`` (the scene and black analyzers, with the small luma
picture they share: on the ablated side it is answered by a constant picture through the
same Python shim both sides call), ``luma_read`` (only the C read of the luma plane,
:func:`pipeline._luma.block_means`, answered by a constant picture instead; both sides
then call it through the same Python shim, so the shim's cost cancels out), ``stats``
(the frame counters and rate window), ``lint`` (the linting's per-frame step and the
fps reading it takes), ``thumbnail`` (one JPEG per 300 frames, as at 30 fps with the
10 s default), ``everything`` (``on_frame`` a no-op: the analyzers in all) and ``none``.

Usage::

    .venv/bin/python bench/analysis_ablation.py            # 4 loops of the 10 s clip a piece
    .venv/bin/python bench/analysis_ablation.py --quick    # 1 loop, for a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import av

import pipeline.analysis
import pipeline.analyzers.base as analyzers_base
from bench.decode import make_clip
from bench.support.interleaved_decode import THUMBNAIL_EVERY_FRAMES, video_analysis
from pipeline.analysis import Analysis
from pipeline.analyzers.base import SMALL_HEIGHT, SMALL_WIDTH
from pipeline.decoder import DecodeStats, FrameMeta, open_decoder
from pipeline.intake import FrameIntake

SMALL_PIXELS = SMALL_WIDTH * SMALL_HEIGHT

PIECES = ("none", "luma", "luma_read", "stats", "lint", "thumbnail", "everything")


class _Switch:
    """A module function both sides call: the real one, or (while ``constant``, on the
    ablated side only) ``stand_in``, which answers without doing the work."""

    def __init__(self, real: Callable[..., bytes], stand_in: Callable[..., bytes]) -> None:
        self.real = real
        self.stand_in = stand_in
        self.constant = False

    def __call__(self, *args: Any) -> bytes:
        return self.stand_in(*args) if self.constant else self.real(*args)


def _switched_while(analysis: Analysis, switch: _Switch) -> None:
    """Make ``switch`` answer with its stand-in during ``analysis``'s ``on_frame`` only."""
    analyze = analysis.on_frame

    def on_frame_switched(frame: Any, meta: FrameMeta) -> None:
        switch.constant = True
        try:
            analyze(frame, meta)
        finally:
            switch.constant = False

    analysis.on_frame = on_frame_switched  # type: ignore[method-assign]


def log(message: str) -> None:
    print(f"[bench/analysis_ablation {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr)


def _no_events(*_args: object) -> list[Any]:
    return []


def knock_out(analysis: Analysis, piece: str) -> None:
    """Make ``piece`` of ``analysis`` a no-op (module doc)."""
    if piece == "luma":
        analysis.scene.process_luma = _no_events  # type: ignore[method-assign]
        analysis.black.process_luma = _no_events  # type: ignore[method-assign]
        switch = _Switch(pipeline.analysis.small_luma, lambda *_args: bytes(SMALL_PIXELS))
        pipeline.analysis.small_luma = switch
        _switched_while(analysis, switch)
    elif piece == "stats":
        analysis.video_stats.process = _no_events  # type: ignore[method-assign]
    elif piece == "lint":
        analysis.lint.process = _no_events  # type: ignore[method-assign]
        analysis.video_stats.fps_and_bitrate = lambda: (0.0, 0, 0.0)  # type: ignore[method-assign]
    elif piece == "thumbnail":
        analysis.thumbnailer.process = _no_events  # type: ignore[method-assign]
    elif piece == "luma_read":
        # block_means(plane, width, height, stride, out_width, out_height, limited)
        switch = _Switch(analyzers_base.block_means, lambda *args: bytes(args[4] * args[5]))
        analyzers_base.block_means = switch
        _switched_while(analysis, switch)
    elif piece == "everything":
        analysis.on_frame = lambda frame, meta: None  # type: ignore[method-assign]
    elif piece != "none":
        raise ValueError(f"unknown piece {piece!r}")


def _analysis() -> Analysis:
    intake = FrameIntake("video", depth=16, payload_limit=1 << 20, label="ablation")
    return video_analysis(intake, DecodeStats("video"), None, lambda etype, data: None)


def measure(packets: list[bytes], piece: str, loops: int) -> dict[str, Any]:
    """``loops`` passes of the clip, frames alternating between the two analyses."""
    sides = {"intact": _analysis(), "ablated": _analysis()}
    real_read, real_luma = analyzers_base.block_means, pipeline.analysis.small_luma
    knock_out(sides["ablated"], piece)
    try:
        return _alternate(packets, sides, loops)
    finally:
        analyzers_base.block_means = real_read
        pipeline.analysis.small_luma = real_luma


def _alternate(packets: list[bytes], sides: dict[str, Analysis], loops: int) -> dict[str, Any]:
    """Decode, and give each picture to ``intact`` and ``ablated`` in turn (module doc)."""
    spent: dict[str, list[int]] = {name: [] for name in sides}
    decode_ns: list[int] = []
    decoder = open_decoder("H264", 1)
    index = 0
    for loop in range(loops):
        for number, data in enumerate(packets):
            timestamp = (loop * len(packets) + number) * 3000
            packet = av.Packet(data)
            packet.pts = timestamp
            started = time.thread_time_ns()
            pictures = decoder.decode(packet)
            decode_ns.append(time.thread_time_ns() - started)
            for picture in pictures:
                name = "intact" if index % 2 == 0 else "ablated"
                analysis = sides[name]
                if (index // 2) % THUMBNAIL_EVERY_FRAMES == 0:
                    analysis.thumbnailer._next_at = None  # due (the clip runs faster than 30 fps)
                now = time.monotonic()
                meta = FrameMeta(
                    kind="video",
                    codec="H264",
                    index=index // 2,
                    timestamp=timestamp,
                    keyframe=False,
                    arrival=now,
                    decoded_at=now,
                )
                started = time.thread_time_ns()
                analysis.on_frame(picture, meta)
                spent[name].append(time.thread_time_ns() - started)
                index += 1
    means = {name: statistics.mean(values) / 1000 for name, values in spent.items()}
    medians = {name: statistics.median(values) / 1000 for name, values in spent.items()}
    return {
        "frames_per_side": len(spent["intact"]),
        "on_frame_us_mean": {name: round(value, 1) for name, value in means.items()},
        "on_frame_us_median": {name: round(value, 1) for name, value in medians.items()},
        "piece_us": round(means["intact"] - means["ablated"], 1),
        "decode_us_median": round(statistics.median(decode_ns) / 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 loop of a 4 s clip a piece")
    parser.add_argument("--loops", type=int, default=4, help="passes of the clip a piece")
    parser.add_argument("--pieces", default=",".join(PIECES), help="comma-separated pieces")
    args = parser.parse_args(argv)
    pieces = [piece for piece in args.pieces.split(",") if piece]
    unknown = set(pieces) - set(PIECES)
    if unknown:
        parser.error(f"unknown pieces {sorted(unknown)}; known: {', '.join(PIECES)}")
    seconds, loops = (4.0, 1) if args.quick else (10.0, args.loops)
    affinity = os.sched_getaffinity(0)
    cpu = max(affinity)
    os.sched_setaffinity(0, {cpu})
    try:
        log(f"encoding a {seconds:g} s 720p30 H.264 clip")
        packets = make_clip(seconds, 1280, 720, 30, 30, "H264")
        results: dict[str, Any] = {}
        for piece in pieces:
            results[piece] = measure(packets, piece, loops)
            log(f"{piece}: {results[piece]['piece_us']} us a frame")
    finally:
        os.sched_setaffinity(0, affinity)
    out = {
        "bench": "analysis_ablation",
        "clip": {"width": 1280, "height": 720, "fps": 30, "seconds": seconds, "loops": loops},
        "cpu": cpu,
        "pieces": results,
        "host": {"loadavg": os.getloadavg()},
    }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
