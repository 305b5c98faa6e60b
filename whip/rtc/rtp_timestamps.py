"""A receiver's frame timestamps, unwrapped so that a frame presented earlier stays earlier.

aiortc's ``TimestampMapper`` takes every RTP timestamp below the previous one for a 32-bit
wrap. With B-frames (H.264 and H.265 from x264, x265 and OBS's encoders) a frame's
presentation time, its RTP timestamp (RFC 6184, RFC 7798), is often below the one sent
just before it, so aiortc moves it, and every frame after it, 2^32 ticks (13 h 15 min at
90 kHz) ahead: the linting then sees a 47,722 s keyframe gap, a recording a broken clock.
:class:`FrameTimestamps` replaces it on every tapped receiver (:func:`whip.rtc.tap.install_tap`)
and on every simulcast layer path.

Rules:

- **Unwrapping.** A timestamp is placed by its signed 32-bit distance from the highest
  one so far (the rule RFC 3550 appendix A.1 gives sequence numbers): less than 2^31
  behind is an earlier frame, anything else a step forward (over a wrap when it is
  numerically smaller). Only the highest moves the reference.
- **Origin.** The first timestamp maps to ``start`` (0 unless a simulcast switch gave
  another); a later frame presented before the first maps below it (negative at 0).
- **Continuing.** :meth:`FrameTimestamps.following` is the mapper of a stream that takes
  over (a simulcast layer switch, :mod:`whip.rtc.simulcast`): it starts the wall time
  ``elapsed_s`` (at least one tick) after the highest value mapped so far.
- **Placing.** :meth:`FrameTimestamps.place` says where a timestamp that is not a frame's
  (an RTCP sender report's, :mod:`whip.rtc.sender_reports`) lies on the same timeline, by
  the same unwrapping, without moving the reference; None before the first frame.
- One instance per receiver or layer path, used on the event loop thread only.

aiortc private names touched (:func:`internals_problems` verifies them):
``RTCRtpReceiver.__timestamp_mapper`` (replaced) and its ``map(timestamp)`` call in
``_handle_rtp_packet``.
"""

from __future__ import annotations

import inspect
from typing import Any

import aiortc.rtcrtpreceiver

VIDEO_CLOCK_HZ = 90000
_WRAP = 1 << 32
_HALF = 1 << 31
MAPPER_ATTRIBUTE = "_RTCRtpReceiver__timestamp_mapper"
_RECEIVER = aiortc.rtcrtpreceiver.RTCRtpReceiver


class FrameTimestamps(aiortc.rtcrtpreceiver.TimestampMapper):
    """RTP timestamps to a growing timeline that keeps earlier frames earlier (module rules)."""

    def __init__(self, start: int = 0) -> None:
        super().__init__()
        self.start = start
        self._first: int | None = None
        self._highest: int | None = None
        self.highest_mapped: int | None = None
        """The largest value :meth:`map` returned, or None before the first frame."""

    def map(self, timestamp: int) -> int:
        """``timestamp``'s place on the timeline (module rules)."""
        if self._highest is None or self._first is None:
            self._first = self._highest = timestamp
            unwrapped = timestamp
        else:
            unwrapped = self._unwrap(timestamp, self._highest)
            if unwrapped > self._highest:
                self._highest = unwrapped
        mapped = unwrapped - self._first + self.start
        if self.highest_mapped is None or mapped > self.highest_mapped:
            self.highest_mapped = mapped
        return mapped

    def place(self, timestamp: int) -> int | None:
        """Where ``timestamp`` lies on the timeline, the reference unmoved (module rules)."""
        if self._highest is None or self._first is None:
            return None
        return self._unwrap(timestamp, self._highest) - self._first + self.start

    @staticmethod
    def _unwrap(timestamp: int, highest: int) -> int:
        """``timestamp`` placed by its signed 32-bit distance from ``highest``."""
        distance = (timestamp - highest) % _WRAP
        if distance >= _HALF:
            distance -= _WRAP
        return highest + distance

    def following(self, elapsed_s: float) -> FrameTimestamps:
        """The mapper of the stream that takes over from this one (module rules)."""
        if self.highest_mapped is None:
            return FrameTimestamps(self.start)
        step = max(1, round(elapsed_s * VIDEO_CLOCK_HZ))
        return FrameTimestamps(self.highest_mapped + step)


def install_frame_timestamps(receiver: Any) -> FrameTimestamps:
    """Give ``receiver`` (an ``RTCRtpReceiver``, before it receives) a
    :class:`FrameTimestamps` in place of aiortc's mapper; the one it has if it has one."""
    current = getattr(receiver, MAPPER_ATTRIBUTE, None)
    if isinstance(current, FrameTimestamps):
        return current
    mapper = FrameTimestamps()
    setattr(receiver, MAPPER_ATTRIBUTE, mapper)
    return mapper


def internals_problems() -> list[str]:
    """What the replacement relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    if "self.__timestamp_mapper = TimestampMapper()" not in inspect.getsource(_RECEIVER.__init__):
        problems.append("RTCRtpReceiver.__timestamp_mapper")
    if "self.__timestamp_mapper.map(" not in inspect.getsource(_RECEIVER._handle_rtp_packet):
        problems.append("_handle_rtp_packet maps frame timestamps through __timestamp_mapper")
    mapper = FrameTimestamps()
    if [mapper.map(t) for t in (_WRAP - 100, 50, _WRAP - 200)] != [0, 150, -100]:
        problems.append("TimestampMapper can be subclassed with map(timestamp)")
    return problems
