"""Frame statistics of one track: counts, rates, format changes, periodic ``stats``.

Runs on the track's decode worker thread (:meth:`FrameStats.process`); its readings
(:meth:`FrameStats.snapshot`, :meth:`FrameStats.final`) may be taken from any thread.

Where each figure comes from:

- ``frames_decoded``, ``keyframes_decoded``: counted here, one per decoded frame.
- ``frames_in``, ``keyframes``, ``frames_dropped``, ``bitrate_bps``, ``encoded_fps``:
  the track's *encoded* counters (``intake_stats()``, the
  :class:`~pipeline.intake.FrameIntake` readings), so they are right under either decode
  policy: with ``decode = "keyframes"`` the worker decodes one frame per GOP, but the
  intake still sees every frame and every byte.
- ``decode_errors``, ``frames_skipped``: the worker's :class:`~pipeline.decoder.DecodeStats`.
- ``fps``: frames per second over a sliding window (``window_s``) of the times the
  frames were decoded (``meta.decoded_at``): decoded frames normally
  (``decoded_fps``); encoded frames with ``keyframes_only`` (``encoded_fps``), since the
  stream's frame rate is what an operator asks about, not the GOP rate.

The window: a sample ``(decoded_at, counters)`` is kept per frame (``frames_in`` and
``bytes_in`` come from ``intake_counters()`` when given: two plain ints read without the
intake's lock, far cheaper per frame than ``intake_stats()``'s consistent snapshot; a
reading may count a frame's arrival before its bytes, which the next one corrects;
without it, from ``intake_stats()``); samples older than
the window are dropped except the newest of them, so a rate always spans at least the
window when frames are sparse (one keyframe per GOP) and exactly the window when they
are dense. Rates read 0 with ``rate_window_s`` 0.0 until two samples exist.

Events: a ``stats`` event every ``interval_s`` of decode time (None: never; the owner
picks one track to report, the others are nested in it through ``extra``), and one
immediately when the codec or the picture size (audio: the sample rate or channel
count) changes, with ``"change": "codec" | "resolution" | "format"`` and ``previous``.
Both are driven by frames: a stalled track emits nothing until its next frame.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping
from typing import NamedTuple

import av

from pipeline.analyzers.base import Event
from pipeline.decoder import DecodeStats, FrameMeta
from pipeline.frame import Kind
from pipeline.intake import IntakeStats

IntakeCounters = Callable[[], tuple[int, int] | None]
"""``() -> (frames_in, bytes_in)`` of the track's intake, or None (no intake yet)."""


class _Sample(NamedTuple):
    at: float
    frames_decoded: int
    frames_in: int
    bytes_in: int


def _no_intake() -> IntakeStats | None:
    return None


def _no_decode() -> DecodeStats | None:
    return None


class FrameStats:
    """Counters, rates and format changes of one track (module doc)."""

    def __init__(
        self,
        kind: Kind,
        *,
        intake_stats: Callable[[], IntakeStats | None] = _no_intake,
        decode_stats: Callable[[], DecodeStats | None] = _no_decode,
        intake_counters: IntakeCounters | None = None,
        interval_s: float | None = 5.0,
        window_s: float = 2.0,
        keyframes_only: bool = False,
        extra: Callable[[], Mapping[str, object]] | None = None,
    ) -> None:
        if interval_s is not None and interval_s <= 0:
            raise ValueError("interval_s must be positive (None: no periodic stats)")
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.kind: Kind = kind
        self.interval_s = interval_s
        self.window_s = window_s
        self.keyframes_only = keyframes_only
        self._intake_stats = intake_stats
        self._decode_stats = decode_stats
        self._intake_counters: IntakeCounters = intake_counters or self._counters_from_stats
        self._extra = extra
        # Written on the worker thread under the lock; read by snapshot() anywhere.
        self._lock = threading.Lock()
        self._samples: collections.deque[_Sample] = collections.deque()
        self.frames = 0
        self.keyframes_decoded = 0
        self.codec: str | None = None
        self.width: int | None = None
        self.height: int | None = None
        self.sample_rate: int | None = None
        self.channels: int | None = None
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.events = 0
        """``stats`` events this instance produced (periodic and change)."""
        self._next_at: float | None = None

    def bind(
        self,
        *,
        intake_stats: Callable[[], IntakeStats | None] | None = None,
        decode_stats: Callable[[], DecodeStats | None] | None = None,
        intake_counters: IntakeCounters | None = None,
    ) -> None:
        """Replace the counter sources given at construction (None: keep that one).

        Call before frames flow; each source is one attribute rebound in one assignment,
        so a reader on another thread sees the old source or the new one."""
        if intake_stats is not None:
            self._intake_stats = intake_stats
        if decode_stats is not None:
            self._decode_stats = decode_stats
        if intake_counters is not None:
            self._intake_counters = intake_counters

    def _counters_from_stats(self) -> tuple[int, int] | None:
        intake = self._intake_stats()
        return None if intake is None else (intake.frames_in, intake.bytes_in)

    # ------------------------------------------------------------ worker thread

    def process(self, frame: av.VideoFrame | av.AudioFrame, meta: FrameMeta) -> list[Event]:
        """Count one decoded frame; the ``stats`` events due now (module doc)."""
        now = meta.decoded_at
        counters = self._intake_counters()
        changes: list[tuple[str, dict[str, object]]] = []
        previous: dict[str, object]
        with self._lock:
            self.frames += 1
            if meta.keyframe:
                self.keyframes_decoded += 1
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            if self.codec is not None and meta.codec != self.codec:
                changes.append(("codec", {"codec": self.codec}))
            self.codec = meta.codec
            if isinstance(frame, av.VideoFrame):
                size = (frame.width, frame.height)
                if self.width is not None and size != (self.width, self.height):
                    changes.append(("resolution", {"width": self.width, "height": self.height}))
                self.width, self.height = size
            else:
                layout = (frame.sample_rate, frame.layout.nb_channels)
                if self.sample_rate is not None and layout != (self.sample_rate, self.channels):
                    previous = {"sample_rate": self.sample_rate, "channels": self.channels}
                    changes.append(("format", previous))
                self.sample_rate, self.channels = layout
            self._add_sample_locked(now, counters)
        events: list[Event] = []
        for change, previous in changes:
            data = self.snapshot()
            data["change"] = change
            data["previous"] = previous
            events.append(("stats", data))
        if self.interval_s is not None:
            if self._next_at is None:
                self._next_at = now + self.interval_s
            elif now >= self._next_at:
                while self._next_at <= now:
                    self._next_at += self.interval_s
                data = self.snapshot()
                if self._extra is not None:
                    data.update(self._extra())
                events.append(("stats", data))
        self.events += len(events)
        return events

    def _add_sample_locked(self, now: float, counters: tuple[int, int] | None) -> None:
        frames_in, bytes_in = counters if counters is not None else (self.frames, 0)
        samples = self._samples
        samples.append(_Sample(now, self.frames, frames_in, bytes_in))
        horizon = now - self.window_s
        while len(samples) >= 2 and samples[1].at <= horizon:
            samples.popleft()

    # ------------------------------------------------------------ any thread

    def rates(self) -> tuple[float, float, int, float]:
        """``(decoded_fps, encoded_fps, bitrate_bps, window_s)`` as of the last frame."""
        with self._lock:
            if len(self._samples) < 2:
                return 0.0, 0.0, 0, 0.0
            first, last = self._samples[0], self._samples[-1]
        span = last.at - first.at
        if span <= 0:
            return 0.0, 0.0, 0, 0.0
        decoded = (last.frames_decoded - first.frames_decoded) / span
        encoded = (last.frames_in - first.frames_in) / span
        bitrate = round((last.bytes_in - first.bytes_in) * 8 / span)
        return decoded, encoded, bitrate, span

    def fps_and_bitrate(self) -> tuple[float, int, float]:
        """``(fps, bitrate_bps, window_s)``: the one definition of a track's ``fps`` and
        ``bitrate_bps`` (module doc), as the ``stats`` events and ``GET /v1/sessions``
        report them. ``window_s`` 0.0 means not measurable yet (under two frames)."""
        decoded_fps, encoded_fps, bitrate, span = self.rates()
        return (encoded_fps if self.keyframes_only else decoded_fps), bitrate, span

    def snapshot(self) -> dict[str, object]:
        """The ``stats`` data now (any thread): counters live, rates as of the last frame.

        Keys: ``kind, codec, width, height, sample_rate, channels, frames_decoded,
        frames_in, frames_dropped, frames_skipped, decode_errors, keyframes,
        keyframes_decoded, fps, decoded_fps, encoded_fps, bitrate_bps, rate_window_s``
        (width/height are None for audio, sample_rate/channels None for video).
        """
        decoded_fps, encoded_fps, bitrate, span = self.rates()
        fps = encoded_fps if self.keyframes_only else decoded_fps
        intake = self._intake_stats()
        decode = self._decode_stats()
        with self._lock:
            frames, keyframes_decoded = self.frames, self.keyframes_decoded
            codec, width, height = self.codec, self.width, self.height
            sample_rate, channels = self.sample_rate, self.channels
        if codec is None and decode is not None:
            codec = decode.codec
        return {
            "kind": self.kind,
            "codec": codec,
            "width": width,
            "height": height,
            "sample_rate": sample_rate,
            "channels": channels,
            "frames_decoded": frames,
            "frames_in": intake.frames_in if intake is not None else frames,
            "frames_dropped": intake.dropped_frames if intake is not None else 0,
            "frames_skipped": decode.skipped if decode is not None else 0,
            "decode_errors": decode.decode_errors if decode is not None else 0,
            "keyframes": intake.keyframes if intake is not None else keyframes_decoded,
            "keyframes_decoded": keyframes_decoded,
            "fps": round(fps, 2),
            "decoded_fps": round(decoded_fps, 2),
            "encoded_fps": round(encoded_fps, 2),
            "bitrate_bps": bitrate,
            "rate_window_s": round(span, 3),
        }

    def final(self) -> dict[str, object]:
        """:meth:`snapshot` plus whole-track figures, for the closing ``stats`` event:
        ``duration_s`` (first to last decoded frame), ``bytes_in``, ``avg_fps`` and
        ``avg_bitrate_bps`` over that duration (0 when under one frame interval).

        The averages are close, not exact: ``bytes_in`` (and, with ``keyframes_only``,
        the frame count) includes encoded frames received before the first decoded one
        and after the last, which the decoded span does not cover."""
        data = self.snapshot()
        intake = self._intake_stats()
        with self._lock:
            first, last = self.first_at, self.last_at
        duration = last - first if first is not None and last is not None else 0.0
        bytes_in = intake.bytes_in if intake is not None else 0
        frames = data["frames_in"] if self.keyframes_only else data["frames_decoded"]
        assert isinstance(frames, int)
        data["duration_s"] = round(duration, 3)
        data["bytes_in"] = bytes_in
        data["avg_fps"] = round((frames - 1) / duration, 2) if duration > 0 else 0.0
        data["avg_bitrate_bps"] = round(bytes_in * 8 / duration) if duration > 0 else 0
        return data
