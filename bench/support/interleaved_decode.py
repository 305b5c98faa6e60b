"""PyAV alone against the pipeline, in short alternating segments on one dedicated core.

``bench/decode.py``'s first method times whole runs of a clip (0.3-1 s each) one after
the other. On the shared 2-core host those runs moved by ±0.1 between repetitions of the
same code, and the ratio of their medians then said more about the host than about the
pipeline (2026-12-03: the bare pipeline came out at 0.74 and at 1.26 of PyAV alone in
two runs, CPU time included: a busy neighbour slows a core for a few hundred
milliseconds at a time, and which side it hit decided the figure).

This method takes that noise out in two ways:

- **Interleaved segments.** Three sides stay open for the whole measurement: PyAV alone
  (one decoder on its own thread), the pipeline with its analyzers and the bare pipeline
  (each a :class:`~pipeline.intake.FrameIntake` and a
  :func:`~pipeline.decoder.decoder_worker` thread that live across segments, so the
  decoders and analyzers see one continuous stream). They take turns at segments of
  ``segment_frames`` frames (default 30, one GOP, 30-100 ms of decoding), the order
  reversed every segment, so each side's total is spread over the same seconds as the
  others'.
- **One dedicated decoding core.** Every decoding thread (PyAV's and both workers) is
  pinned to ``decode_cpu``, and the producer (this thread) to the other core. Without
  pinning, the scheduler put the sides' decoding threads on different cores, whose speed
  differs from one moment to the next on this host; pinned, every side decodes on the same
  core. The producer runs beside it as the event loop runs beside the workers in the server.

A segment's time runs from handing over its first packet to the callback of its last
decoded frame (the analyzers' work on it included); the decoding thread's CPU time over
the segment is read with ``pthread_getcpuclockid``. Figures: fps per side over all its
segments, and the ratios of the two pipelines to PyAV alone (``ratio_*``: wall time;
``worker_cpu_ratio_*``: the decoding thread's CPU), each also per fifth of the segments
(``*_blocks``), which shows how steady the figure was.

Work per frame is the server's: the same decoder settings (:func:`pipeline.decoder.open_decoder`),
the intake's defaults, and on the analyzers' side :class:`~pipeline.analysis.Analysis`
with its defaults. One thumbnail per 300 frames (10 s of a 30 fps push): the thumbnailer
times its interval by the wall clock, which at several hundred fps would give one per
several thousand frames; it is made due again at each 300th frame instead.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av

from pipeline.analysis import Analysis, AnalysisSettings
from pipeline.decoder import DecodeStats, FrameMeta, decoder_worker, open_decoder
from pipeline.frame import EncodedFrame, Kind
from pipeline.intake import FrameIntake
from pipeline.keyframes import is_keyframe

THUMBNAIL_EVERY_FRAMES = 300
"""One thumbnail per 10 s of a 30 fps stream (the default interval)."""

VIDEO: tuple[Kind] = ("video",)

PRODUCER_POLL_S = 0.0005
"""How long the producer sleeps while the intake is full (on the other core)."""

WAIT_S = 60.0
"""The longest a segment may take before the measurement is abandoned."""


def video_analysis(
    intake: FrameIntake,
    stats: DecodeStats,
    thumb_dir: Path | None,
    emit: Callable[[str, dict[str, object]], None],
) -> Analysis:
    """The server's video analyzers with their defaults, bound to ``intake`` and
    ``stats`` as a session binds them (both of ``bench/decode.py``'s methods use it)."""
    analysis = Analysis(
        emit,
        run_id="r_bench",
        settings=AnalysisSettings(),
        kinds=VIDEO,
        thumbnail_dir=thumb_dir,
        posted_at=time.monotonic(),
    )
    analysis.bind(
        "video",
        intake_stats=intake.stats,
        decode_stats=lambda: stats,
        intake_counters=lambda: (intake.frames_in, intake.bytes_in),
    )
    return analysis


def _pin(cpu: int) -> None:
    """Pin the calling thread (Linux: affinity is per thread) to ``cpu``."""
    os.sched_setaffinity(0, {cpu})


def _thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class _Clip:
    """The clip's packets, looped, with timestamps that keep rising across loops."""

    def __init__(self, packets: list[bytes], codec: str) -> None:
        self.packets = packets
        self.keyframe = [is_keyframe(codec, data) for data in packets]
        self.next = 0

    def take(self, count: int) -> list[tuple[int, bytes, bool]]:
        """The next ``count`` frames: (frame number, data, keyframe)."""
        out = []
        for index in range(self.next, self.next + count):
            position = index % len(self.packets)
            out.append((index, self.packets[position], self.keyframe[position]))
        self.next += count
        return out


class _AloneSide:
    """PyAV alone: one decoder on a thread of its own, pinned to the decoding core."""

    def __init__(self, packets: list[bytes], codec: str, decode_cpu: int) -> None:
        self.clip = _Clip(packets, codec)
        self.codec = codec
        self.decode_cpu = decode_cpu
        self._job: list[Any] = []  # av.Packet
        self._go = threading.Event()
        self._done = threading.Event()
        self._stop = False
        self._decoded = 0
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="bench-pyav", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        _pin(self.decode_cpu)
        decoder = open_decoder(self.codec, 1)
        while True:
            self._go.wait()
            self._go.clear()
            if self._stop:
                return
            try:
                self._decoded = sum(len(decoder.decode(packet)) for packet in self._job)
            except BaseException as exc:  # reported by segment()
                self._error = exc
            self._done.set()

    def segment(self, count: int) -> tuple[float, float]:
        """Decode the next ``count`` frames: (wall s, decoding thread CPU s)."""
        job = []
        for index, data, _keyframe in self.clip.take(count):
            packet = av.Packet(data)
            packet.pts = index * 3000
            job.append(packet)
        self._job = job
        self._done.clear()
        cpu0, started = _thread_cpu(self.thread), time.perf_counter()
        self._go.set()
        if not self._done.wait(WAIT_S):
            raise RuntimeError("PyAV alone did not finish a segment")
        wall = time.perf_counter() - started
        if self._error is not None:
            raise self._error
        if self._decoded != count:
            raise RuntimeError(f"PyAV alone decoded {self._decoded} of {count} frames")
        return wall, _thread_cpu(self.thread) - cpu0

    def close(self) -> None:
        self._stop = True
        self._go.set()
        self.thread.join(WAIT_S)


class _PipelineSide:
    """The pipeline: intake and decode worker (with or without the analyzers), kept open
    across segments, the worker pinned to the decoding core."""

    def __init__(
        self,
        packets: list[bytes],
        codec: str,
        decode_cpu: int,
        analyzers: bool,
        thumb_dir: Path,
        depth: int,
        payload_limit: int,
    ) -> None:
        self.clip = _Clip(packets, codec)
        self.codec = codec
        self.intake = FrameIntake("video", depth=depth, payload_limit=payload_limit, label="bench")
        self.stats = DecodeStats("video")
        self.analysis: Analysis | None = None
        if analyzers:
            self.analysis = video_analysis(
                self.intake, self.stats, thumb_dir, lambda etype, data: None
            )
        self._delivered = 0
        self._target = 0
        self._reached = threading.Event()
        self._error: list[BaseException] = []
        self.thread = threading.Thread(
            target=self._run, args=(decode_cpu,), name="bench-decode", daemon=True
        )
        self.thread.start()

    def _on_frame(self, frame: av.VideoFrame | av.AudioFrame, meta: FrameMeta) -> None:
        # Both pipelines count their frames here, so both pay for this one call.
        if self.analysis is not None:
            self.analysis.on_frame(frame, meta)
        self._delivered += 1
        if self._delivered >= self._target:
            self._reached.set()

    def _run(self, decode_cpu: int) -> None:
        _pin(decode_cpu)
        try:
            decoder_worker(self.intake, self.stats, codec_threads=1, on_frame=self._on_frame)
        except BaseException as exc:  # reported by segment()
            self._error.append(exc)
            self._reached.set()

    def segment(self, count: int) -> tuple[float, float]:
        """Feed the next ``count`` frames and wait for the last one's callback:
        (wall s, worker thread CPU s)."""
        if self.analysis is not None and self.clip.next % THUMBNAIL_EVERY_FRAMES == 0:
            self.analysis.thumbnailer._next_at = None  # due again (module doc)
        now = time.monotonic()
        frames = [
            EncodedFrame(
                kind="video",
                codec=self.codec,
                data=data,
                timestamp=index * 3000,
                keyframe=keyframe,
                arrival=now,
            )
            for index, data, keyframe in self.clip.take(count)
        ]
        self._target = self._delivered + count
        self._reached.clear()
        cpu0, started = _thread_cpu(self.thread), time.perf_counter()
        for frame in frames:
            while self.intake.depth >= self.intake.depth_limit:
                time.sleep(PRODUCER_POLL_S)
            if not self.intake.put(frame):
                raise RuntimeError("intake dropped a frame")
        if not self._reached.wait(WAIT_S):
            raise RuntimeError("the pipeline did not finish a segment")
        wall = time.perf_counter() - started
        if self._error:
            raise self._error[0]
        return wall, _thread_cpu(self.thread) - cpu0

    def close(self) -> None:
        self.intake.close(drain=False)
        self.thread.join(WAIT_S)


def choose_cpus() -> tuple[int, int]:
    """(decoding core, producer core): the last two this process may use (one: both)."""
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[-1], allowed[-2] if len(allowed) > 1 else allowed[-1]


def run_interleaved(
    packets: list[bytes],
    codec: str,
    thumb_dir: Path,
    *,
    segments: int,
    segment_frames: int = 30,
    depth: int,
    payload_limit: int,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """The three sides over ``segments`` rounds of ``segment_frames`` frames each (module
    doc). Restores this thread's CPU affinity before it returns."""
    decode_cpu, producer_cpu = choose_cpus()
    affinity = os.sched_getaffinity(0)
    _pin(producer_cpu)
    sides: dict[str, Any] = {}
    try:
        sides["pyav"] = _AloneSide(packets, codec, decode_cpu)
        for name in ("pipeline_analyzers", "pipeline_bare"):
            sides[name] = _PipelineSide(
                packets,
                codec,
                decode_cpu,
                name == "pipeline_analyzers",
                thumb_dir,
                depth,
                payload_limit,
            )
        for side in sides.values():  # warm-up: decoder, analyzers' first frames
            side.segment(segment_frames)
        walls: dict[str, list[float]] = {name: [] for name in sides}
        cpus: dict[str, list[float]] = {name: [] for name in sides}
        order = list(sides)
        for number in range(segments):
            for name in order if number % 2 == 0 else reversed(order):
                wall, cpu = sides[name].segment(segment_frames)
                walls[name].append(wall)
                cpus[name].append(cpu)
    finally:
        for side in sides.values():
            side.close()
        os.sched_setaffinity(0, affinity)

    fifth = max(1, segments // 5)
    blocks = [slice(start, start + fifth) for start in range(0, fifth * 5, fifth)]

    def ratio(values: dict[str, list[float]], name: str, part: slice = slice(None)) -> float:
        return round(sum(values["pyav"][part]) / sum(values[name][part]), 3)

    frames = segments * segment_frames
    out: dict[str, Any] = {
        "segments": segments,
        "segment_frames": segment_frames,
        "decode_cpu": decode_cpu,
        "producer_cpu": producer_cpu,
    }
    for name in sides:
        out[f"{name}_fps"] = round(frames / sum(walls[name]), 1)
        out[f"{name}_us_per_frame_cpu"] = round(1e6 * sum(cpus[name]) / frames, 1)
    for name in ("analyzers", "bare"):
        side = f"pipeline_{name}"
        out[f"ratio_{name}"] = ratio(walls, side)
        out[f"worker_cpu_ratio_{name}"] = ratio(cpus, side)
        out[f"ratio_{name}_blocks"] = [ratio(walls, side, part) for part in blocks]
    paired = zip(walls["pyav"], walls["pipeline_analyzers"], strict=True)
    pairs = [alone / piped for alone, piped in paired]
    out["ratio_analyzers_median_pair"] = round(statistics.median(pairs), 3)
    log(
        f"{codec} interleaved: analyzers {out['ratio_analyzers']} "
        f"{out['ratio_analyzers_blocks']}, bare {out['ratio_bare']}"
    )
    return out
