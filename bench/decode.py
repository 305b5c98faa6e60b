#!/usr/bin/env python3
"""Decode efficiency: PyAV alone vs the pipeline's intake -> decode -> analyzers path.

Prints one JSON document on stdout; progress goes to stderr.

The clip: H.264 (libx264, constrained baseline, no B-frames, GOP 30) 1280x720 at 30 fps,
encoded in memory from a moving synthetic pattern (``--seconds``, default 10 s). The
encoder's packets are Annex B, which is what aiortc's depayloader hands the intake.

Per repetition (order alternates between repetitions):

- ``pyav``: ``av.CodecContext.create("h264", "r")``, decode every packet, flush.
- ``pipeline_analyzers``: a :class:`~pipeline.intake.FrameIntake` (depth 16, 1 MiB
  payload limit, the server defaults) fed :class:`~pipeline.intake.EncodedFrame`
  objects as fast as it takes them (the producer waits while the queue is full, so
  nothing is dropped), :func:`~pipeline.decoder.decoder_worker` on its own thread,
  :meth:`~pipeline.analysis.Analysis.on_frame` attached (stats, scene, black and
  thumbnail analyzers; thumbnails written to a temp dir).
- ``pipeline_bare``: the same without ``on_frame`` (analyzers off).

Both sides decode with the same FFmpeg thread count (``--codec-threads``, default 1, the
server's default): PyAV's own default (0) starts a slice thread per core, which turned
the comparison into one of thread counts and of how idle the other cores were.

fps = decoded frames / wall time from the first packet to the last decoded frame (the
target figure: ``ratio_analyzers`` = pipeline fps / PyAV fps, >= 0.85); cpu_fps =
decoded frames / CPU time of the whole process over the same span (producer and worker
threads); ``worker_cpu_ratio_*``: PyAV's decoding thread against the pipeline's worker
thread, CPU time only (with ``--codec-threads 1`` each side decodes on that one thread).
On a shared host (other jobs competing for the CPUs) wall-time fps is noisy; the
CPU-time figures are steadier, and the worker-thread one is the steadiest
(``host.loadavg`` says how busy the host was).
Then a breakdown (thread-CPU timers around each analyzer's ``process`` and around
``on_frame``: microseconds per frame of the worker thread, by analyzer, the glue
between them, and the rest: decode and intake), an ablation (one analyzer's ``process``
made a no-op at a time, CPU-time fps; the small luma picture scene and black share is
computed whichever is disabled, and timed on its own as ``small_luma``) and
one profiled pipeline run (cProfile; Python 3.12's cProfile sees every thread, the
producer's own rows are filtered out) show where the pipeline's extra time goes.

Per codec (``per_codec``; ``--codecs``, default H.264, H.265, AV1, VP9, VP8): the same
1280x720 30 fps pattern through each format's encoder (:data:`CLIP_ENCODERS`: libx264,
libx265, libsvtav1, libvpx-vp9, libvpx; no B-frames, one keyframe a second, real-time
settings, as a live publisher encodes), then ``pyav`` against ``pipeline_analyzers`` and
``pipeline_bare`` with the decoder the pipeline opens for that codec
(:data:`pipeline.decoder.DECODERS`: ``h264``, ``hevc``, ``libdav1d``, ``vp9``, ``vp8``),
``--codec-repetitions`` times (order alternating); then the same three sides by the
interleaved method (``interleaved``: ``--interleaved-segments`` segments of 30 frames
taken in turn, every decoding thread pinned to one core; why and how:
``bench/support/interleaved_decode.py``), whose wall-time ratio decides the target:
``interleaved.ratio_analyzers`` >= 0.9 for each (``passes``). The whole-run ratios stay
beside it for comparison; on the shared host they moved by ±0.1 between runs. With
``--codec-breakdown``, each codec also gets the thread-CPU breakdown (below) of
``--codec-repetitions`` more runs, with ``on_frame`` (the analyzers in all) and its share
of the worker's decode time. The depacketizers' own cost is
``bench/rtp_payload.py``'s, not counted here.

Usage::

    .venv/bin/python bench/decode.py            # 10 s clip, 3 repetitions
    .venv/bin/python bench/decode.py --quick    # 4 s clip, 1 repetition
    .venv/bin/python bench/decode.py --quick --only-codecs   # just the per-codec runs
"""

from __future__ import annotations

import argparse
import cProfile
import fractions
import io
import json
import platform
import pstats
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

import av  # noqa: E402
import numpy as np  # noqa: E402

import pipeline.analysis  # noqa: E402
from bench.support.interleaved_decode import run_interleaved, video_analysis  # noqa: E402
from pipeline.decoder import DECODERS, DecodeStats, decoder_worker  # noqa: E402
from pipeline.frame import EncodedFrame  # noqa: E402
from pipeline.intake import FrameIntake  # noqa: E402
from pipeline.keyframes import is_keyframe  # noqa: E402
from whip.webhooks.child_priority import reset_to_normal_policy  # noqa: E402

DEPTH = 16
PAYLOAD_LIMIT = 1 << 20
PRODUCER_POLL_S = 0.002
"""How long the producer sleeps while the queue is full. Every wake-up takes the GIL
from the worker (a thread switch on the worker's clock); 2 ms is well within the
time the worker takes to drain a full queue (16 frames, about 20 ms at 720p), so it
is never starved (``worker_starved`` counts wake-ups that found the queue empty)."""


def log(message: str) -> None:
    print(f"[bench/decode {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the clip


CLIP_ENCODERS: dict[str, tuple[str, dict[str, str]]] = {
    "H264": (
        "libx264",
        {"preset": "veryfast", "profile": "baseline", "tune": "zerolatency", "sc_threshold": "0"},
    ),
    "H265": ("libx265", {"preset": "ultrafast", "x265-params": "log-level=none:bframes=0"}),
    "AV1": ("libsvtav1", {"preset": "12", "svtav1-params": "pred-struct=1:rc=2"}),
    "VP9": ("libvpx-vp9", {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}),
    "VP8": ("libvpx", {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}),
}
"""Encoder and options per codec: what a live publisher sends (no B-frames, no lookahead)."""


def make_clip(
    seconds: float, width: int, height: int, fps: int, gop: int, codec_name: str = "H264"
) -> list[bytes]:
    """Encoded packets (Annex B for H.264/H.265) of a synthetic moving pattern, no B-frames."""
    encoder, options = CLIP_ENCODERS[codec_name]
    codec = av.CodecContext.create(encoder, "w")
    assert isinstance(codec, av.VideoCodecContext)
    codec.width, codec.height, codec.pix_fmt = width, height, "yuv420p"
    codec.time_base = fractions.Fraction(1, fps)
    codec.framerate = fractions.Fraction(fps, 1)
    codec.gop_size = gop
    codec.max_b_frames = 0
    codec.bit_rate = 2_500_000 if height >= 720 else 800_000
    codec.options = {**options, "keyint_min": str(gop)} if encoder == "libx264" else options
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    packets: list[bytes] = []
    frames = int(seconds * fps)
    for index in range(frames):
        t = index / fps
        r = 128 + 100 * np.sin(x / 37.0 + t * 2.0)
        g = 128 + 100 * np.sin(y / 23.0 - t * 1.3)
        b = 128 + 100 * np.sin((x + y) / 51.0 + t * 0.7)
        image = np.stack([r, g, b], axis=2)
        # a moving box so there is real motion
        cx = int((index * 8) % (width - 200))
        image[200:400, cx : cx + 200] = (240, 240, 240)
        frame = av.VideoFrame.from_ndarray(image.astype(np.uint8), format="rgb24")
        frame = frame.reformat(format="yuv420p")
        frame.pts = index
        frame.time_base = codec.time_base
        packets.extend(bytes(p) for p in codec.encode(frame))
    packets.extend(bytes(p) for p in codec.encode(None))
    reset_to_normal_policy()  # libsvtav1 opened as root left this thread at SCHED_FIFO 99
    return packets


# ---------------------------------------------------------------- the two paths


def run_pyav(packets: list[bytes], codec_threads: int, codec_name: str = "H264") -> dict[str, Any]:
    """Plain PyAV: one decoder, the pipeline's thread settings (see ``open_decoder``)."""
    decoder = av.CodecContext.create(DECODERS[codec_name], "r")
    assert isinstance(decoder, av.VideoCodecContext)
    # Explicit, as the pipeline does: PyAV's default (0) lets FFmpeg start one slice
    # thread per core, which made "PyAV alone" a multi-threaded decoder racing the
    # pipeline's single-threaded one (the wall-time ratio then measured how idle the
    # other cores were, not the pipeline's overhead).
    decoder.thread_count = codec_threads
    if codec_threads != 1:
        decoder.thread_type = "AUTO"
    decoded = 0
    started, cpu0, thread0 = time.perf_counter(), time.process_time(), time.thread_time()
    for index, data in enumerate(packets):
        packet = av.Packet(data)
        packet.pts = index * 3000
        decoded += len(decoder.decode(packet))
    decoded += len(decoder.decode(None))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    thread_cpu = time.thread_time() - thread0
    return {
        "frames": decoded,
        "wall_s": round(wall, 4),
        "fps": round(decoded / wall, 1),
        "cpu_s": round(cpu, 4),
        "cpu_fps": round(decoded / cpu, 1),
        "thread_cpu_s": round(thread_cpu, 4),
        "thread_cpu_fps": round(decoded / thread_cpu, 1),
    }


def encoded_frames(packets: list[bytes], codec_name: str = "H264") -> list[EncodedFrame]:
    now = time.monotonic()
    return [
        EncodedFrame(
            kind="video",
            codec=codec_name,
            data=data,
            timestamp=index * 3000,
            keyframe=is_keyframe(codec_name, data),
            arrival=now,
        )
        for index, data in enumerate(packets)
    ]


def run_pipeline(
    packets: list[bytes],
    analyzers: bool,
    thumb_dir: Path | None,
    profile: bool = False,
    disable: tuple[str, ...] = (),
    codec_threads: int = 1,
    timed: bool = False,
    codec_name: str = "H264",
) -> dict[str, Any]:
    """Producer on this thread, decoder_worker on a worker thread (profiled if asked;
    with ``timed``, each analyzer's ``process`` and ``on_frame`` are wrapped in
    thread-CPU timers: the ``breakdown``)."""
    intake = FrameIntake("video", depth=DEPTH, payload_limit=PAYLOAD_LIMIT, label="bench")
    stats = DecodeStats("video")
    events: list[tuple[str, dict[str, object]]] = []
    analysis = None
    if analyzers:
        analysis = video_analysis(
            intake, stats, thumb_dir, lambda etype, data: events.append((etype, data))
        )
        for name in disable:  # ablation: the analyzer's step becomes a no-op
            setattr(getattr(analysis, name), ANALYZERS[name], lambda *_args: [])
    spent: dict[str, float] = {}
    restore_luma = None
    if analysis is not None and timed:
        for name, method in ANALYZERS.items():
            target = getattr(analysis, name)
            setattr(target, method, _timer(getattr(target, method), name, spent))
        restore_luma = pipeline.analysis.small_luma
        pipeline.analysis.small_luma = _timer(restore_luma, "small_luma", spent)
        analysis.on_frame = _timer(analysis.on_frame, "on_frame", spent)  # type: ignore[method-assign]
    profiler = cProfile.Profile() if profile else None
    error: list[BaseException] = []
    worker_cpu: list[float] = []

    def body() -> None:
        cpu0 = time.thread_time()
        try:
            if profiler is not None:
                profiler.enable()
            decoder_worker(
                intake,
                stats,
                codec_threads=codec_threads,
                on_frame=analysis.on_frame if analysis else None,
            )
        except BaseException as exc:  # reported below
            error.append(exc)
        finally:
            worker_cpu.append(time.thread_time() - cpu0)
            if profiler is not None:
                profiler.disable()

    # the EncodedFrame objects are built as the tap would (bytes, keyframe scan) ...
    frames = encoded_frames(packets, codec_name)
    worker = threading.Thread(target=body, name="decode-video-bench", daemon=True)
    waits = starved = 0
    started, cpu0 = time.perf_counter(), time.process_time()
    worker.start()
    for frame in frames:
        # ... and offered only when the queue has room: a put() into a full queue would
        # drop the frame and open a drop episode (single producer, so this check holds).
        while intake.depth >= intake.depth_limit:
            waits += 1
            time.sleep(PRODUCER_POLL_S)
            if intake.depth == 0:
                starved += 1
        if not intake.put(frame):
            raise RuntimeError("intake dropped a frame")
    intake.close(drain=True)
    worker.join(120)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    if restore_luma is not None:
        pipeline.analysis.small_luma = restore_luma
    if error:
        raise error[0]
    if worker.is_alive():
        raise RuntimeError("decode worker did not finish within 120 s")
    out: dict[str, Any] = {
        "frames": stats.frames_decoded,
        "wall_s": round(wall, 4),
        "fps": round(stats.frames_decoded / wall, 1),
        "cpu_s": round(cpu, 4),
        "cpu_fps": round(stats.frames_decoded / cpu, 1),
        "worker_cpu_s": round(worker_cpu[0], 4) if worker_cpu else None,
        "worker_cpu_fps": round(stats.frames_decoded / worker_cpu[0], 1) if worker_cpu else None,
        "dropped": intake.dropped_frames,
        "producer_waits": waits,
        "worker_starved": starved,
        "decode_errors": stats.decode_errors,
    }
    if analysis is not None:
        kinds: dict[str, int] = {}
        for etype, _ in events:
            kinds[etype] = kinds.get(etype, 0) + 1
        out["events"] = kinds
        out["thumbnails"] = analysis.thumbnailer.encoded
    if spent and worker_cpu:
        decoded = max(1, stats.frames_decoded)
        per_frame = {name: round(1e6 * value / decoded, 1) for name, value in spent.items()}
        on_frame = per_frame.pop("on_frame")
        per_frame["analysis_glue"] = round(on_frame - sum(per_frame.values()), 1)
        per_frame["decode_and_intake"] = round(1e6 * worker_cpu[0] / decoded - on_frame, 1)
        out["breakdown_us_per_frame"] = per_frame
    if profiler is not None:
        out["_profiler"] = profiler
    return out


ANALYZERS = {
    "video_stats": "process",
    "scene": "process_luma",
    "black": "process_luma",
    "thumbnailer": "process",
}
"""The video analyzers of :class:`~pipeline.analysis.Analysis` in the order it runs
them -> the method it calls on each. Scene and black get the small luma picture that
:class:`~pipeline.analysis.Analysis` computes once for both (timed as ``small_luma``)."""


def _timer[**P, R](call: Callable[P, R], name: str, spent: dict[str, float]) -> Callable[P, R]:
    """``call`` with its thread-CPU time added to ``spent[name]``."""
    spent.setdefault(name, 0.0)

    def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            spent[name] += time.thread_time() - started

    return timed


def profile_summary(profiler: cProfile.Profile, top: int = 18) -> dict[str, Any]:
    """Top functions by own time and by cumulative time (worker thread only)."""
    stream = io.StringIO()
    st = pstats.Stats(profiler, stream=stream)
    # Python 3.12's cProfile uses sys.monitoring, which sees every thread: the producer's
    # sleeps show up too. Shares are of the worker's decoder_worker cumulative time.
    rows = []
    for (filename, line, name), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        short = filename.replace(str(REPO) + "/", "")
        if "site-packages/" in short:
            short = short.split("site-packages/", 1)[1]
        if "time.sleep" in name or "bench/decode.py" in short or name in ("put", "close"):
            continue
        rows.append((tt, ct, nc, f"{short}:{line}({name})"))
    total = sum(r[0] for r in rows)

    def fmt(row: tuple[float, float, int, str]) -> dict[str, Any]:
        return {
            "func": row[3],
            "calls": row[2],
            "tottime_s": round(row[0], 4),
            "cumtime_s": round(row[1], 4),
            "tottime_pct": round(100 * row[0] / total, 1) if total else None,
        }

    by_tt = sorted(rows, reverse=True)[:top]
    by_ct = sorted(rows, key=lambda r: r[1], reverse=True)[:top]
    return {
        "worker_tottime_sum_s": round(total, 4),
        "by_tottime": [fmt(r) for r in by_tt],
        "by_cumtime": [fmt(r) for r in by_ct],
    }


# ---------------------------------------------------------------- per codec

TARGET_RATIO_PER_CODEC = 0.9


def run_codec(
    codec_name: str, args: argparse.Namespace, thumb_dir: Path, repetitions: int
) -> dict[str, Any]:
    """One codec's clip: PyAV alone against the pipeline (module doc)."""
    started = time.perf_counter()
    packets = make_clip(args.seconds, args.width, args.height, args.fps, args.gop, codec_name)
    encode_s = round(time.perf_counter() - started, 2)
    threads = args.codec_threads
    run_pyav(packets[: args.gop], threads, codec_name)  # warm-up
    run_pipeline(packets[: args.gop], True, thumb_dir, codec_threads=threads, codec_name=codec_name)
    reps: list[dict[str, Any]] = []
    for rep in range(repetitions):
        order = ["pyav", "pipeline_analyzers", "pipeline_bare"]
        if rep % 2:
            order.reverse()
        result: dict[str, Any] = {}
        for name in order:
            if name == "pyav":
                result[name] = run_pyav(packets, threads, codec_name)
            else:
                result[name] = run_pipeline(
                    packets,
                    name == "pipeline_analyzers",
                    thumb_dir,
                    codec_threads=threads,
                    codec_name=codec_name,
                )
        reps.append(result)

    def median(side: str, key: str) -> float:
        return round(statistics.median(float(r[side][key]) for r in reps), 1)

    pyav_fps, pyav_cpu = median("pyav", "fps"), median("pyav", "thread_cpu_fps")
    out: dict[str, Any] = {
        "encoder": CLIP_ENCODERS[codec_name][0],
        "decoder": DECODERS[codec_name],
        "frames": len(packets),
        "keyframes": sum(is_keyframe(codec_name, p) for p in packets),
        "bytes": sum(len(p) for p in packets),
        "encode_s": encode_s,
        "pyav_fps": pyav_fps,
        "decode_errors": max(r["pipeline_analyzers"]["decode_errors"] for r in reps),
    }
    for name in ("analyzers", "bare"):
        fps = median(f"pipeline_{name}", "fps")
        out[f"pipeline_{name}_fps"] = fps
        out[f"ratio_{name}"] = round(fps / pyav_fps, 3)
        worker = median(f"pipeline_{name}", "worker_cpu_fps")
        out[f"worker_cpu_ratio_{name}"] = round(worker / pyav_cpu, 3)
    if args.interleaved_segments > 0:
        # The steadier figure (bench/support/interleaved_decode.py): it decides the target.
        out["interleaved"] = run_interleaved(
            packets,
            codec_name,
            thumb_dir,
            segments=args.interleaved_segments,
            depth=DEPTH,
            payload_limit=PAYLOAD_LIMIT,
            log=log,
        )
        out["passes"] = out["interleaved"]["ratio_analyzers"] >= TARGET_RATIO_PER_CODEC
    else:
        out["passes"] = out["ratio_analyzers"] >= TARGET_RATIO_PER_CODEC
    out["analyzer_ms_per_frame"] = round(
        1000 / out["pipeline_analyzers_fps"] - 1000 / out["pipeline_bare_fps"], 3
    )
    if args.codec_breakdown:
        # The analyzers' own worker-thread CPU (module doc, "breakdown"): steadier on a
        # shared host than any wall-time ratio of a run this short.
        timed_runs = [
            run_pipeline(
                packets, True, thumb_dir, codec_threads=threads, timed=True, codec_name=codec_name
            )["breakdown_us_per_frame"]
            for _ in range(repetitions)
        ]
        breakdown = {
            key: round(statistics.median(run[key] for run in timed_runs), 1)
            for key in timed_runs[0]
        }
        on_frame = sum(v for k, v in breakdown.items() if k != "decode_and_intake")
        breakdown["on_frame"] = round(on_frame, 1)
        breakdown["on_frame_share_of_decode"] = round(on_frame / breakdown["decode_and_intake"], 3)
        out["breakdown_us_per_frame"] = breakdown
    log(f"{codec_name}: {out}")
    return out


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 s clip, 1 repetition")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--gop", type=int, default=30)
    parser.add_argument("--loops", type=int, default=4, help="decode the clip this many times")
    parser.add_argument(
        "--codec-threads",
        type=int,
        default=1,
        help="FFmpeg decoder threads on both sides (default 1, the server default)",
    )
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--codecs",
        default="H264,H265,AV1,VP9,VP8",
        help="comma-separated codecs of the per-codec runs (empty: none)",
    )
    parser.add_argument("--codec-repetitions", type=int, default=3)
    parser.add_argument(
        "--only-codecs", action="store_true", help="only the per-codec runs (no H.264 analysis)"
    )
    parser.add_argument(
        "--interleaved-segments",
        type=int,
        default=150,
        help="per codec also the interleaved method's segments of 30 frames on one pinned "
        "core (bench/support/interleaved_decode.py; it decides `passes`); 0: skip it",
    )
    parser.add_argument(
        "--codec-breakdown",
        action="store_true",
        help="per codec also the analyzers' worker-thread CPU per frame (timed runs)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.repetitions, args.loops = min(args.seconds, 4.0), 1, 1
        args.codec_repetitions = min(args.codec_repetitions, 2)
        args.interleaved_segments = min(args.interleaved_segments, 40)
    codecs = [c.strip().upper() for c in args.codecs.split(",") if c.strip()]
    if args.only_codecs:
        with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
            per_codec = {c: run_codec(c, args, Path(tmp), args.codec_repetitions) for c in codecs}
        json.dump(
            {
                "bench": "decode",
                "per_codec": per_codec,
                "target_ratio_per_codec": TARGET_RATIO_PER_CODEC,
                "clip": {
                    "width": args.width,
                    "height": args.height,
                    "fps": args.fps,
                    "gop": args.gop,
                    "seconds": args.seconds,
                },
                "codec_threads": args.codec_threads,
                "host": {"loadavg": Path("/proc/loadavg").read_text().split()[:3]},
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
        return 0

    started = time.perf_counter()
    log(f"encoding {args.seconds} s of {args.width}x{args.height}@{args.fps} (GOP {args.gop})")
    clip_packets = make_clip(args.seconds, args.width, args.height, args.fps, args.gop)
    # the clip starts with an IDR (SPS/PPS in band), so it can simply be repeated
    packets = clip_packets * max(1, args.loops)
    clip = {
        "width": args.width,
        "height": args.height,
        "fps": args.fps,
        "gop": args.gop,
        "frames": len(clip_packets),
        "keyframes": sum(is_keyframe("H264", p) for p in clip_packets),
        "bytes": sum(len(p) for p in clip_packets),
        "loops": args.loops,
        "frames_per_run": len(packets),
        "encoder": "libx264 veryfast baseline zerolatency, Annex B",
        "encode_s": round(time.perf_counter() - started, 2),
    }
    log(f"clip: {clip}")
    # warm-up (decoder init, numpy/reformatter first-call costs)
    threads = args.codec_threads
    run_pyav(packets[: args.gop * 2], threads)
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        thumb_dir = Path(tmp)
        run_pipeline(packets[: args.gop * 2], True, thumb_dir, codec_threads=threads)
        reps: list[dict[str, Any]] = []
        for rep in range(args.repetitions):
            order = ["pyav", "pipeline_analyzers", "pipeline_bare"]
            if rep % 2:
                order.reverse()
            result: dict[str, Any] = {}
            for name in order:
                if name == "pyav":
                    result[name] = run_pyav(packets, threads)
                else:
                    analyzers = name == "pipeline_analyzers"
                    result[name] = run_pipeline(
                        packets, analyzers, thumb_dir, codec_threads=threads
                    )
            result["ratio_analyzers"] = round(
                result["pipeline_analyzers"]["fps"] / result["pyav"]["fps"], 3
            )
            result["ratio_bare"] = round(result["pipeline_bare"]["fps"] / result["pyav"]["fps"], 3)
            for name in ("analyzers", "bare"):
                result[f"cpu_ratio_{name}"] = round(
                    result[f"pipeline_{name}"]["cpu_fps"] / result["pyav"]["cpu_fps"], 3
                )
                result[f"worker_cpu_ratio_{name}"] = round(
                    result[f"pipeline_{name}"]["worker_cpu_fps"] / result["pyav"]["thread_cpu_fps"],
                    3,
                )
            log(
                f"rep {rep + 1}: pyav {result['pyav']['fps']} fps, pipeline+analyzers "
                f"{result['pipeline_analyzers']['fps']} fps ({result['ratio_analyzers']}), bare "
                f"{result['pipeline_bare']['fps']} fps ({result['ratio_bare']}); by CPU time: "
                f"{result['cpu_ratio_analyzers']} / {result['cpu_ratio_bare']}; worker thread "
                f"CPU: {result['worker_cpu_ratio_analyzers']} / "
                f"{result['worker_cpu_ratio_bare']}"
            )
            reps.append(result)
        log("breakdown: thread-CPU timers around each analyzer")
        timed_runs = [
            run_pipeline(packets, True, thumb_dir, codec_threads=threads, timed=True)[
                "breakdown_us_per_frame"
            ]
            for _ in range(args.repetitions)
        ]
        breakdown = {
            key: round(statistics.median(run[key] for run in timed_runs), 1)
            for key in timed_runs[0]
        }
        log(f"breakdown (us per frame, worker thread CPU): {breakdown}")
        log("ablation: pipeline with one analyzer disabled at a time")
        ablation: dict[str, Any] = {}
        for name in ANALYZERS:
            fps_values = [
                run_pipeline(packets, True, thumb_dir, disable=(name,), codec_threads=threads)[
                    "cpu_fps"
                ]
                for _ in range(max(1, min(2, args.repetitions)))
            ]
            ablation[f"without_{name}_cpu_fps"] = round(statistics.median(fps_values), 1)
        profile = None
        if not args.no_profile:
            log("profiled pipeline run (cProfile on the worker thread)")
            prof = run_pipeline(packets, True, thumb_dir, profile=True, codec_threads=threads)
            profile = profile_summary(prof.pop("_profiler"))
            profile["run"] = prof
            profile["note"] = "cProfile overhead inflates Python-level costs; use shares, not fps"
        log(f"per codec: {codecs}")
        per_codec = {c: run_codec(c, args, thumb_dir, args.codec_repetitions) for c in codecs}

    def med(path: tuple[str, ...]) -> float:
        values = []
        for rep in reps:
            node: Any = rep
            for key in path:
                node = node[key]
            values.append(float(node))
        return round(statistics.median(values), 3)

    out = {
        "bench": "decode",
        "clip": clip,
        "repetitions": reps,
        "median": {
            "pyav_fps": med(("pyav", "fps")),
            "pipeline_analyzers_fps": med(("pipeline_analyzers", "fps")),
            "pipeline_bare_fps": med(("pipeline_bare", "fps")),
            "ratio_analyzers": med(("ratio_analyzers",)),
            "ratio_bare": med(("ratio_bare",)),
            "pyav_cpu_fps": med(("pyav", "cpu_fps")),
            "pipeline_analyzers_cpu_fps": med(("pipeline_analyzers", "cpu_fps")),
            "pipeline_bare_cpu_fps": med(("pipeline_bare", "cpu_fps")),
            "cpu_ratio_analyzers": med(("cpu_ratio_analyzers",)),
            "cpu_ratio_bare": med(("cpu_ratio_bare",)),
            "worker_cpu_ratio_analyzers": med(("worker_cpu_ratio_analyzers",)),
            "worker_cpu_ratio_bare": med(("worker_cpu_ratio_bare",)),
        },
        "ms_per_frame": {
            "pyav": round(1000 / med(("pyav", "fps")), 3),
            "pipeline_analyzers": round(1000 / med(("pipeline_analyzers", "fps")), 3),
            "pipeline_bare": round(1000 / med(("pipeline_bare", "fps")), 3),
        },
        "target_ratio": 0.85,
        "breakdown_us_per_frame": breakdown,
        "ablation": ablation,
        "profile": profile,
        "per_codec": per_codec,
        "target_ratio_per_codec": TARGET_RATIO_PER_CODEC,
        "settings": {
            "intake_depth": DEPTH,
            "payload_limit": PAYLOAD_LIMIT,
            "analysis": "AnalysisSettings() defaults (thumbnail interval 10 s wall clock)",
            "codec_threads": threads,
            "decoder_threads": "the same FFmpeg thread_count on both sides (1: the server "
            "default; PyAV's own default, 0, would start one slice thread per core)",
        },
        "host": {
            "python": platform.python_version(),
            "pyav": av.__version__,
            "ffmpeg": str(av.ffmpeg_version_info),
            "cpus": len(__import__("os").sched_getaffinity(0)),
        },
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    out["median"]["passes"] = out["median"]["ratio_analyzers"] >= 0.85
    out["median"]["passes_by_cpu"] = out["median"]["cpu_ratio_analyzers"] >= 0.85
    out["cpu_ms_per_frame"] = {
        "pyav": round(1000 / med(("pyav", "cpu_fps")), 3),
        "pipeline_analyzers": round(1000 / med(("pipeline_analyzers", "cpu_fps")), 3),
        "pipeline_bare": round(1000 / med(("pipeline_bare", "cpu_fps")), 3),
    }
    base_ms = out["cpu_ms_per_frame"]["pipeline_analyzers"]
    out["ablation"]["saved_cpu_ms_per_frame"] = {
        k.removeprefix("without_").removesuffix("_cpu_fps"): round(base_ms - 1000 / v, 3)
        for k, v in ablation.items()
        if k.endswith("_fps")
    }
    out["host"]["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
