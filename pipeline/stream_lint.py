"""Ingest linting of one video track: what the stream really is against what the offer
said, and the changes a downstream player cares about.

Two sides, one lock (a leaf: nothing is called while it is held):

- The producer side, :meth:`StreamLint.observe`, runs where the encoded frame enters the
  pipeline (:meth:`pipeline.intake.FrameIntake.put`, the event loop thread), for every
  frame, dropped or queued: so the figures describe the stream as sent, whatever the
  decode policy or queue drops. Per frame it compares a few integers; each keyframe's
  parameter set is read (:func:`pipeline.stream_profile.read_stream_profile`: one scan
  for start codes, then a few dozen bytes, bounded), as cheap as the keyframe detection
  the intake already does on that thread.
- The worker side, :meth:`StreamLint.process`, runs on the track's decode worker thread
  for each decoded picture: it compares the picture size and the track's ``fps`` (the
  one definition, :meth:`pipeline.analyzers.frame_stats.FrameStats.fps_and_bitrate`),
  and hands over the warnings the producer side queued, so every event leaves on the
  worker thread, in order with the other analyzers' events.
- :meth:`StreamLint.fields` (any thread): the ``stats`` / ``first_frame`` fields
  ``profile``, ``level``, ``tier``, ``offered_profile``, ``offered_level``,
  ``b_frames``, ``keyframe_interval_s``.

``stream_warning`` (``data["warning"]`` names it), each at most once per track:

- ``profile_mismatch``: the bitstream's profile is not the offered one, nor a subset of
  it (constrained baseline fits an offer of baseline or main; progressive and
  constrained high fit high).
- ``level_mismatch``: the bitstream's level is above the offered one (a lower level is
  what the offer allows).
- ``b_frames``: frames are reordered. ``source`` says how it was known:
  ``parameter_set`` (the H.264 VUI's ``max_num_reorder_frames`` or the H.265 SPS's
  ``sps_max_num_reorder_pics`` is above 0: the encoder declared it) or ``timestamps``
  (a frame's RTP timestamp, which is its presentation time, is below an earlier frame's
  while frames arrive in decode order: seen in the stream). Without either, a profile
  that allows B-frames is not enough to warn.
- ``keyframe_interval``: more than ``keyframe_limit_s`` (10 s) of RTP time since the
  last keyframe (or since the first frame, when none came yet). Keyframes the server
  asked for (PLI) count too, so ``keyframe_interval_s`` in ``stats`` (the last interval
  between two keyframes, RTP time) can be shorter than the encoder's setting, never longer.

``stream_changed`` (``data["change"]``, with ``old`` and ``new``):

- ``resolution``: a decoded picture's size differs from the previous one's.
- ``fps``: hysteresis, so jitter does not spam. The reference is the first reading
  measured over a full rate window; a reading *differs* when it is off the reference by
  more than ``max(fps_abs_tolerance, fps_rel_tolerance * reference)`` (2 fps, 20 %). A
  change is reported once every reading for ``fps_hold_s`` (5 s of decode time) has
  differed; the latest reading becomes the reference. One reading within tolerance
  restarts the wait.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import av

from pipeline.analyzers.base import Event
from pipeline.decoder import FrameMeta
from pipeline.frame import EncodedFrame
from pipeline.offered_profile import OfferedProfile, read_offered_profile
from pipeline.stream_profile import StreamProfile, read_stream_profile

logger = logging.getLogger(__name__)

VIDEO_CLOCK_HZ = 90000
PROFILE_SUBSETS = {
    "constrained-baseline": frozenset({"baseline", "main"}),
    "progressive-high": frozenset({"high"}),
    "constrained-high": frozenset({"high", "progressive-high"}),
}
"""Bitstream profile -> offered profiles it also conforms to (H.264 A.2)."""


@dataclass(frozen=True, slots=True)
class LintSettings:
    keyframe_limit_s: float = 10.0
    fps_abs_tolerance: float = 2.0
    fps_rel_tolerance: float = 0.2
    fps_hold_s: float = 5.0
    rate_window_s: float = 2.0
    """The track's fps window: a reading over a shorter span is not a reading yet."""


def level_value(level: str) -> float | None:
    """A level name as a number for comparison (``1b`` between 1 and 1.1; AV1 ``max``
    above all); None for anything else."""
    if level == "1b":
        return 1.05
    if level == "max":
        return float("inf")
    try:
        return float(level)
    except ValueError:
        return None


class StreamLint:
    """The linting state of one video track (module doc)."""

    def __init__(self, settings: LintSettings | None = None, *, label: str = "") -> None:
        self.settings = settings or LintSettings()
        self.label = label
        self._lock = threading.Lock()
        # Producer side, under the lock.
        self._codec: str | None = None
        self._fmtp: Mapping[str, object] | None = None
        self._offered: OfferedProfile | None = None
        self._profile: StreamProfile | None = None
        self._max_ts: int | None = None
        self._first_ts: int | None = None
        self._keyframe_ts: int | None = None
        self._keyframe_interval_s: float | None = None
        self._b_frames: bool | None = None
        self._warned: set[str] = set()
        self._pending: list[Event] = []
        # Worker side only.
        self._size: tuple[int, int] | None = None
        self._fps_reference: float | None = None
        self._fps_differs_since: float | None = None

    # ------------------------------------------------------------ producer side

    def observe(self, frame: EncodedFrame, fmtp: Mapping[str, object] | None) -> None:
        """One encoded frame of the track and its codec's fmtp (module doc). Never
        raises on bad media; does not block."""
        with self._lock:
            if frame.codec != self._codec or fmtp is not self._fmtp:
                if frame.codec != self._codec:
                    self._max_ts = self._first_ts = self._keyframe_ts = None
                    self._profile = None
                self._codec = frame.codec
                self._fmtp = fmtp
                self._offered = read_offered_profile(frame.codec, fmtp)
            self._order_locked(frame)
            if frame.keyframe:
                self._keyframe_locked(frame)
            self._keyframe_gap_locked(frame.timestamp)

    def _order_locked(self, frame: EncodedFrame) -> None:
        ts = frame.timestamp
        if self._first_ts is None:
            self._first_ts = ts
        if self._max_ts is not None and ts < self._max_ts:
            earlier = self._max_ts
            self._b_frames = True
            self._warn_locked(
                "b_frames",
                f"a frame's timestamp {ts} is below an earlier frame's {earlier}: "
                "frames arrive out of presentation order",
                source="timestamps",
            )
        if self._max_ts is None or ts > self._max_ts:
            self._max_ts = ts

    def _keyframe_locked(self, frame: EncodedFrame) -> None:
        if self._keyframe_ts is not None and frame.timestamp > self._keyframe_ts:
            self._keyframe_interval_s = (frame.timestamp - self._keyframe_ts) / VIDEO_CLOCK_HZ
        if self._keyframe_ts is None or frame.timestamp > self._keyframe_ts:
            self._keyframe_ts = frame.timestamp
        read = read_stream_profile(frame.codec, frame.data)
        if read is None:
            return
        if read != self._profile:
            logger.info(
                "%s: %s profile %s level %s tier %s reorder %s (%s)",
                self.label,
                read.codec,
                read.profile,
                read.level,
                read.tier,
                read.reorder,
                read.reorder_source,
            )
        self._profile = read
        if read.reorder is not None:
            self._b_frames = bool(read.reorder) or bool(self._b_frames)
            if read.reorder > 0:
                self._warn_locked(
                    "b_frames",
                    f"the parameter set declares up to {read.reorder} reordered frames",
                    source="parameter_set",
                    reorder=read.reorder,
                )
        self._compare_locked(read)

    def _compare_locked(self, read: StreamProfile) -> None:
        offered = self._offered
        if offered is None:
            return
        if offered.profile is not None and read.profile is not None:
            fits = read.profile == offered.profile or offered.profile in PROFILE_SUBSETS.get(
                read.profile, frozenset()
            )
            if not fits:
                self._warn_locked(
                    "profile_mismatch",
                    f"the offer said profile {offered.profile}, the bitstream is {read.profile}",
                    profile=read.profile,
                    offered_profile=offered.profile,
                )
        if offered.level is not None and read.level is not None:
            real, said = level_value(read.level), level_value(offered.level)
            if real is not None and said is not None and real > said:
                self._warn_locked(
                    "level_mismatch",
                    f"the offer said level {offered.level}, the bitstream is {read.level}",
                    level=read.level,
                    offered_level=offered.level,
                )

    def _keyframe_gap_locked(self, ts: int) -> None:
        since = self._keyframe_ts if self._keyframe_ts is not None else self._first_ts
        if since is None:
            return
        gap_s = (ts - since) / VIDEO_CLOCK_HZ
        if gap_s > self.settings.keyframe_limit_s:
            self._warn_locked(
                "keyframe_interval",
                f"{gap_s:.1f} s without a keyframe (over {self.settings.keyframe_limit_s:g} s)",
                since_keyframe_s=round(gap_s, 3),
                limit_s=self.settings.keyframe_limit_s,
                keyframes_seen=self._keyframe_ts is not None,
            )

    def _warn_locked(self, warning: str, message: str, **details: object) -> None:
        if warning in self._warned:
            return
        self._warned.add(warning)
        data: dict[str, object] = {
            "kind": "video",
            "codec": self._codec,
            "warning": warning,
            "message": message,
        }
        data.update(details)
        logger.warning("%s: stream warning %s: %s", self.label, warning, message)
        self._pending.append(("stream_warning", data))

    # ------------------------------------------------------------ worker side

    def process(
        self, frame: av.VideoFrame, meta: FrameMeta, fps: float, span_s: float
    ) -> list[Event]:
        """One decoded picture and the track's fps reading (``span_s``: its window, 0.0
        when not measurable): the events due now, queued warnings first."""
        with self._lock:
            events, self._pending = self._pending, []
        size = (frame.width, frame.height)
        if self._size is not None and size != self._size:
            old_w, old_h = self._size
            events.append(
                (
                    "stream_changed",
                    {
                        "kind": "video",
                        "codec": meta.codec,
                        "change": "resolution",
                        "old": {"width": old_w, "height": old_h},
                        "new": {"width": frame.width, "height": frame.height},
                    },
                )
            )
            logger.info("%s: resolution %dx%d -> %dx%d", self.label, old_w, old_h, *size)
        self._size = size
        if span_s >= self.settings.rate_window_s:
            events += self._fps(fps, meta)
        return events

    def _fps(self, fps: float, meta: FrameMeta) -> list[Event]:
        reference = self._fps_reference
        if reference is None:
            self._fps_reference = fps
            return []
        s = self.settings
        if abs(fps - reference) <= max(s.fps_abs_tolerance, s.fps_rel_tolerance * reference):
            self._fps_differs_since = None
            return []
        if self._fps_differs_since is None:
            self._fps_differs_since = meta.decoded_at
            return []
        if meta.decoded_at - self._fps_differs_since < s.fps_hold_s:
            return []
        self._fps_reference = fps
        self._fps_differs_since = None
        logger.info("%s: fps %.2f -> %.2f", self.label, reference, fps)
        data: dict[str, object] = {
            "kind": "video",
            "codec": meta.codec,
            "change": "fps",
            "old": {"fps": round(reference, 2)},
            "new": {"fps": round(fps, 2)},
        }
        return [("stream_changed", data)]

    # ------------------------------------------------------------ any thread

    def fields(self) -> dict[str, object]:
        """The linting fields of ``stats`` and ``first_frame`` (module doc)."""
        with self._lock:
            profile, offered = self._profile, self._offered
            interval, b_frames = self._keyframe_interval_s, self._b_frames
        return {
            "profile": profile.profile if profile else None,
            "level": profile.level if profile else None,
            "tier": profile.tier if profile else None,
            "offered_profile": offered.profile if offered else None,
            "offered_level": offered.level if offered else None,
            "b_frames": b_frames,
            "keyframe_interval_s": round(interval, 3) if interval is not None else None,
        }

    def warnings(self) -> frozenset[str]:
        """The warnings raised so far (any thread)."""
        with self._lock:
            return frozenset(self._warned)
