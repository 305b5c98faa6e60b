"""``whip-ingest publish``: push a file or a test pattern over WHIP with FFmpeg's muxer.

Paced in real time; H.264 (baseline, no B-frames, 1 s GOP) + Opus, which every WHIP
server accepts. A file is decoded and re-encoded (any input works; ``--loop`` repeats
it). Blocking, single-threaded: it is a command-line tool, not part of the server.

Rules:

- Every way a push ends goes through one close of the WHIP container, and closing it
  DELETEs the session URL: the source ends, ``duration_s`` passes, an error, or a stop
  signal. A stop signal is SIGINT (Ctrl-C) or SIGTERM (a service manager, ``timeout``, a
  container stop): both end the push the same way, so the server records
  ``session_closed{deleted}`` instead of reclaiming the session (30 s later by default).
- A stop signal only asks (:class:`StopSignals` sets a flag): it is acted on between two
  frames, at most one frame interval of the source later, or once a blocking ``mux``
  returns (the first one runs the handshake, bounded by its 5 s timeout). Nothing is cut
  halfway, and the close itself cannot be interrupted by a second signal.
- Handlers are installed only when :func:`publish` runs in the main thread (Python's rule
  for signal handlers) and the previous ones are restored when it returns.
"""

from __future__ import annotations

import fractions
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TextIO

import av
import numpy as np

FPS = 30
SAMPLE_RATE = 48000
AUDIO_CHUNK = 960  # 20 ms
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Progress:
    """What the live progress line shows."""

    started: float
    frames: int = 0
    bytes_sent: int = 0
    last_print: float = 0.0
    stopped_by: signal.Signals | None = None
    """The stop signal that ended the push (None: it ended otherwise)."""

    def line(self) -> str:
        """``frames 300  bitrate 812 kb/s  elapsed 10.0 s``."""
        elapsed = max(time.monotonic() - self.started, 1e-6)
        kbps = self.bytes_sent * 8 / elapsed / 1000
        return f"frames {self.frames}  bitrate {kbps:.0f} kb/s  elapsed {elapsed:.1f} s"


class StopSignals:
    """While entered (in the main thread): SIGINT and SIGTERM set :attr:`received` (the
    first one wins) instead of interrupting; on exit the previous handlers come back.
    Entered in another thread it installs nothing and :attr:`received` stays None."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            # None: a handler installed outside Python, which cannot be put back.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)


def _pattern(width: int, height: int) -> Iterator[av.VideoFrame | av.AudioFrame]:
    """A moving bar over a gradient, and a 440 Hz tone, forever (caller bounds it)."""
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.zeros((height, width, 3), dtype=np.uint8)
    base[..., 0] = (xs * 255 // max(width - 1, 1)).astype(np.uint8)
    base[..., 1] = (ys * 255 // max(height - 1, 1)).astype(np.uint8)
    audio_done = 0
    index = 0
    while True:
        image = base.copy()
        x = (index * 8) % width
        image[:, x : x + 16, :] = 255
        image[..., 2] = (index * 3) % 256
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = index
        frame.time_base = fractions.Fraction(1, FPS)
        yield frame
        index += 1
        while audio_done * AUDIO_CHUNK < index * SAMPLE_RATE // FPS:
            first = audio_done * AUDIO_CHUNK
            phase = (np.arange(AUDIO_CHUNK) + first) * (2 * np.pi * 440 / SAMPLE_RATE)
            mono = (np.sin(phase) * 6000).astype(np.int16)
            chunk = av.AudioFrame.from_ndarray(
                np.repeat(mono, 2).reshape(1, -1), format="s16", layout="stereo"
            )
            chunk.sample_rate = SAMPLE_RATE
            chunk.pts = audio_done * AUDIO_CHUNK
            chunk.time_base = fractions.Fraction(1, SAMPLE_RATE)
            yield chunk
            audio_done += 1


def _file(path: Path, loop: bool) -> Iterator[av.VideoFrame | av.AudioFrame]:
    """Decoded frames of ``path`` with timestamps continued across loops."""
    offset_s = 0.0
    while True:
        last_s = 0.0
        with av.open(str(path)) as source:
            streams = [s for s in source.streams if s.type in ("video", "audio")]
            for frame in source.decode(*streams):
                if not isinstance(frame, av.VideoFrame | av.AudioFrame):
                    continue
                if frame.pts is None or frame.time_base is None:
                    continue
                seconds = float(frame.pts * frame.time_base)
                last_s = max(last_s, seconds)
                frame.pts = int((seconds + offset_s) / frame.time_base)
                yield frame
        if not loop:
            return
        offset_s += last_s + 1 / FPS


def open_whip_output(
    url: str,
    *,
    width: int,
    height: int,
    fps: int = FPS,
    token: str | None = None,
    audio: bool = True,
    preset: str = "veryfast",
    handshake_timeout_ms: int = 5000,
    bit_rate: int | None = None,
    profile: str = "baseline",
) -> tuple[Any, Any, Any]:
    """FFmpeg's WHIP muxer with an H.264 stream (libx264 ``profile``, baseline unless
    given; no B-frames, which FFmpeg's WHIP muxer refuses; 1 s GOP; at
    ``bit_rate`` bits/s if given, else libx264's default) and, if ``audio``, an Opus
    stream: ``(container, video, audio_or_None)``. Nothing is sent until the first
    ``mux`` (which runs the POST, ICE and DTLS); a stream that cannot be set up closes
    the container before the error propagates."""
    options = {"handshake_timeout": str(handshake_timeout_ms)}
    if token:
        options["authorization"] = token
    container = av.open(url, mode="w", format="whip", options=options)
    try:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.codec_context.gop_size = fps
        video.codec_context.max_b_frames = 0
        if bit_rate is not None:
            video.codec_context.bit_rate = bit_rate
        video.codec_context.options = {
            "preset": preset,
            "tune": "zerolatency",
            "profile": profile,
        }
        video.codec_context.time_base = fractions.Fraction(1, fps)
        sound = (
            container.add_stream("libopus", rate=SAMPLE_RATE, layout="stereo") if audio else None
        )
    except BaseException:
        container.close()
        raise
    return container, video, sound


def publish(
    url: str,
    *,
    source: Path | None,
    token: str | None = None,
    loop: bool = False,
    duration_s: float | None = None,
    size: tuple[int, int] = (640, 360),
    out: TextIO = sys.stderr,
) -> Progress:
    """Push until the source ends, ``duration_s`` passes, or a stop signal (SIGINT,
    SIGTERM: :attr:`Progress.stopped_by` says which); then close, which DELETEs the
    session URL. Errors of the muxer (``OSError``) propagate after the same close."""
    width, height = size
    with StopSignals() as stop:
        container, video, audio = open_whip_output(
            url, width=width, height=height, token=token, bit_rate=1_500_000
        )
        progress = Progress(time.monotonic())
        try:
            frames = _file(source, loop) if source is not None else _pattern(width, height)
            resampler = av.AudioResampler(format="s16", layout="stereo", rate=SAMPLE_RATE)
            for frame in frames:
                seconds = float(frame.pts * frame.time_base) if frame.pts is not None else 0.0
                if duration_s is not None and seconds >= duration_s:
                    break
                delay = progress.started + seconds - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # a stop signal lets it run out (its handler returns)
                if stop.received is not None:
                    break
                packets: list[Any] = []
                if isinstance(frame, av.VideoFrame):
                    scaled = frame.reformat(width=width, height=height, format="yuv420p")
                    scaled.pts = round(seconds * FPS)
                    scaled.time_base = fractions.Fraction(1, FPS)
                    packets = video.encode(scaled)
                    progress.frames += 1
                else:
                    for chunk in resampler.resample(frame):
                        packets.extend(audio.encode(chunk))
                for packet in packets:
                    container.mux(packet)
                    progress.bytes_sent += packet.size
                now = time.monotonic()
                if now - progress.last_print >= 1.0:
                    progress.last_print = now
                    print("\r" + progress.line(), end="", file=out, flush=True)
        finally:
            container.close()  # the muxer DELETEs the session URL
            progress.stopped_by = stop.received
            print("\r" + progress.line(), file=out, flush=True)
    return progress
