"""The encoded frame: what the pipeline takes in, one complete frame of one track.

The WebRTC adapter (:mod:`whip.rtc.tap`) makes them from depacketized RTP; the pipeline
never sees RTP or aiortc objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["video", "audio"]


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """One complete encoded frame as the decode worker receives it."""

    kind: Kind
    codec: str
    """The codec's RTP encoding name as negotiated: ``H264``, ``VP8``, ``opus``."""
    data: bytes
    timestamp: int
    """RTP timestamp as the depacketizer maps it: 0 at the track's first frame, unwrapped
    (it keeps growing past 2**32), in the codec's clock rate (90 kHz video, 48 kHz Opus)."""
    keyframe: bool
    """Decodable without earlier frames (always True for non-empty audio)."""
    arrival: float
    """``time.monotonic()`` when the frame reached the intake."""
