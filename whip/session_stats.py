"""Live statistics of one WHIP session, gathered from aiortc and the pipeline.

:func:`session_stats` is the one place that reads them, for ``GET /v1/sessions``,
``/metrics`` and the final figures folded into process totals when a session closes.
Cancellation: ``getStats`` is a short local computation; a cancelled caller loses only
its answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from whip.rtc.rtp_guard import RtpGuard, discarded_by_reason
from whip.session import WhipSession


@dataclass(slots=True)
class SessionStats:
    """A reading of one session (all counters since the session started)."""

    session_id: str
    run_id: str
    principal: str
    stream: str
    age_s: float
    connected: bool
    packets_received: int = 0
    packets_lost: int = 0
    jitter: float = 0.0
    bytes_in: int = 0
    frames_in: int = 0
    frames_dropped: int = 0
    frames_oversized: int = 0
    """Of ``frames_dropped``, frames larger than the payload limit."""
    queue_depth: int = 0
    keyframe_requests: int = 0
    workers: int = 0
    tracks: dict[str, dict[str, object]] = field(default_factory=dict)
    rtp_discarded: dict[str, int] = field(default_factory=RtpGuard.no_counts)
    """Datagrams and RTP packets that never reached a frame, by reason
    (:class:`whip.rtc.rtp_guard.RtpGuard`)."""

    def frames_decoded(self) -> int:
        """Decoded frames over all tracks."""
        return sum(int(str(t.get("frames_decoded", 0))) for t in self.tracks.values())

    def decode_errors(self) -> int:
        """Decode errors over all tracks."""
        return sum(int(str(t.get("decode_errors", 0))) for t in self.tracks.values())

    def to_json(self) -> dict[str, object]:
        """The ``GET /v1/sessions`` shape."""
        return {
            "id": self.session_id,
            "run_id": self.run_id,
            "principal": self.principal,
            "stream": self.stream,
            "age_s": round(self.age_s, 3),
            "connected": self.connected,
            "packets_received": self.packets_received,
            "packets_lost": self.packets_lost,
            "jitter": self.jitter,
            "bytes_in": self.bytes_in,
            "frames_dropped": self.frames_dropped,
            "frames_oversized": self.frames_oversized,
            "queue_depth": self.queue_depth,
            "keyframe_requests": self.keyframe_requests,
            "workers": self.workers,
            "tracks": self.tracks,
            "rtp_discarded": self.rtp_discarded,
        }


async def session_stats(session: WhipSession) -> SessionStats:
    """Read aiortc's inbound RTP statistics and the pipeline's counters."""
    stats = SessionStats(
        session.session_id,
        session.run_id,
        session.principal,
        session.stream,
        time.monotonic() - session.created_at,
        session.connected,
    )
    try:
        report = await session.pc.getStats()
    except Exception:  # a closing peer: the pipeline's counters still stand
        report = {}
    for entry in report.values():
        if getattr(entry, "type", "") == "inbound-rtp":
            stats.packets_received += int(entry.packetsReceived)
            stats.packets_lost += max(0, int(entry.packetsLost))
            stats.jitter = max(stats.jitter, float(entry.jitter))
    for intake in session.intakes:
        reading = intake.stats()
        stats.bytes_in += reading.bytes_in
        stats.frames_in += reading.frames_in
        stats.frames_dropped += reading.dropped_frames
        stats.frames_oversized += reading.oversized_frames
        stats.queue_depth += reading.depth
        stats.keyframe_requests += reading.keyframe_requests
    stats.rtp_discarded = rtp_discarded(session)
    runtime = session.runtime
    if runtime is not None:
        stats.workers = sum(
            1 for w in runtime.workers if w.thread is not None and w.thread.is_alive()
        )
        for stage, decode in runtime.stats().items():
            stats.tracks[stage] = decode.as_dict()
    return stats


def rtp_discarded(session: WhipSession) -> dict[str, int]:
    """The session's datagrams and RTP packets that never reached a frame, by reason."""
    return discarded_by_reason(t.receiver for t in session.pc.getTransceivers())
