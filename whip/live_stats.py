"""Live-session figures: the one place they are read, for every reader.

:func:`read_figures` reads one session once into a typed :class:`SessionFigures`;
``GET /v1/sessions`` answers with its :meth:`SessionFigures.to_json`, ``/metrics`` sums
and labels it, and a closing session folds it into the process's :class:`ClosedTotals`.
Nothing else computes a session figure.

One definition of each figure:

- ``fps`` and ``bitrate_bps``: the track's sliding-window rates of its frame statistics
  (:meth:`pipeline.analyzers.frame_stats.FrameStats.fps_and_bitrate`), the same numbers
  its ``stats`` events carry; null while not measurable yet (under two frames), and for a
  track past the first of its kind (one frame-statistics per kind).
- ``jitter_ms``: RTP interarrival jitter (RFC 3550) of the track's inbound RTP stream, in
  milliseconds (aiortc reports it in RTP timestamp units: divided by the codec clock,
  :data:`CLOCK_HZ`). A session's ``jitter_ms`` is its worst track's.
- ``packets_received``, ``packets_lost``: aiortc's receiver statistics per inbound RTP
  stream (lost clamped at 0: RFC 3550's cumulative loss goes negative with duplicates,
  and Prometheus counters must not); null for a session whose peer gave none.
- ``frames_*``, ``bytes_in``, queue figures: the track's intake and decode counters.
- ``rtp_discarded``: the RTP guard's counters (:mod:`whip.rtc.rtp_guard`).
- ``congestion``: the session's congestion control (:mod:`whip.rtc.congestion`).
- ``rtp_payload_errors``: H.265/AV1/VP9 packets and frames their depacketizer refused,
  codec -> reason -> count (:func:`whip.rtc.tap.payload_errors_of`); a refused packet is
  also in ``rtp_discarded`` as ``malformed``, a refused frame in the track's
  ``frames_lost``.
- ``simulcast``: the RID demultiplexer's counters (:mod:`whip.rtc.simulcast`), and a
  simulcast video track's ``layers``.
- ``bitstream``: what the ingest linting read of the first video track
  (:meth:`pipeline.stream_lint.StreamLint.fields`: the fields ``stats`` events carry) and
  the warnings it raised so far, sorted; null for other tracks.

Cancellation: ``getStats`` is a short local computation; a cancelled caller loses only
its answer.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.decoder import DecodeStats
from pipeline.frame import Kind
from pipeline.intake import FrameIntake
from whip.live_session import CloseReason, LiveSession
from whip.rtc.congestion import congestion_figures
from whip.rtc.rtp_guard import RtpGuard, discarded_by_reason
from whip.rtc.simulcast import simulcast_counters, simulcast_figures
from whip.rtc.tap import payload_errors_of

logger = logging.getLogger(__name__)

CLOCK_HZ: dict[str, int] = {"video": 90_000, "audio": 48_000}
"""RTP clocks of what the offer policy accepts (H.264/VP8 at 90 kHz, Opus at 48 kHz)."""


@dataclass(frozen=True, slots=True)
class RtpReading:
    """One inbound RTP stream's receiver statistics."""

    kind: str
    packets_received: int
    packets_lost: int
    jitter_ms: float


@dataclass(frozen=True, slots=True)
class TrackFigures:
    """One track of a live session (module doc for each figure)."""

    kind: str
    codec: str | None = None
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    bitrate_bps: int | None = None
    frames_in: int = 0
    frames_decoded: int = 0
    frames_dropped: int = 0
    frames_oversized: int = 0
    frames_lost: int = 0
    decode_errors: int = 0
    bytes_in: int = 0
    queue_depth: int = 0
    queue_max_depth: int = 0
    queue_limit: int = 0
    keyframe_requests: int = 0
    worker_alive: bool = False
    rtp: RtpReading | None = None
    layer: str | None = None
    """The RID of a further decoded simulcast layer's track (``pipeline.simulcast = all``)."""
    layers: list[dict[str, object]] | None = None
    """Simulcast layers (:meth:`whip.rtc.simulcast.SimulcastDemux.figures`), or None."""
    bitstream: dict[str, object] | None = None
    """The linting's reading of the first video track (module doc), or None."""

    def to_json(self) -> dict[str, Any]:
        """A track of ``GET /v1/sessions``."""
        rtp = self.rtp
        return {
            "kind": self.kind,
            "codec": self.codec,
            "width": self.width,
            "height": self.height,
            "fps": self.fps,
            "bitrate_bps": self.bitrate_bps,
            "frames_in": self.frames_in,
            "frames_decoded": self.frames_decoded,
            "frames_dropped": self.frames_dropped,
            "frames_oversized": self.frames_oversized,
            "frames_lost": self.frames_lost,
            "decode_errors": self.decode_errors,
            "queue_depth": self.queue_depth,
            "queue_max_depth": self.queue_max_depth,
            "queue_limit": self.queue_limit,
            "keyframe_requests": self.keyframe_requests,
            "worker_alive": self.worker_alive,
            "packets_received": rtp.packets_received if rtp is not None else None,
            "packets_lost": rtp.packets_lost if rtp is not None else None,
            "jitter_ms": rtp.jitter_ms if rtp is not None else None,
            "layers": self.layers,
            "layer": self.layer,
            "bitstream": self.bitstream,
        }


@dataclass(frozen=True, slots=True)
class SessionFigures:
    """One reading of a live session (all counters since it started)."""

    session_id: str
    run_id: str
    principal: str
    stream: str
    state: str
    """The peer connection's state."""
    connected: bool
    age_s: float
    tracks: tuple[TrackFigures, ...]
    workers_detached: int
    rtp_discarded: dict[str, int]
    rtp_payload_errors: dict[str, dict[str, int]]
    has_rtp: bool
    """The peer gave receiver statistics (False once it is gone)."""
    congestion: dict[str, Any] = field(default_factory=dict)
    """:func:`whip.rtc.congestion.congestion_figures`."""
    simulcast: dict[str, int] | None = None
    """:func:`whip.rtc.simulcast.simulcast_counters` (None without simulcast)."""

    @property
    def frames_decoded(self) -> int:
        return sum(t.frames_decoded for t in self.tracks)

    @property
    def decode_errors(self) -> int:
        return sum(t.decode_errors for t in self.tracks)

    @property
    def frames_dropped(self) -> int:
        return sum(t.frames_dropped for t in self.tracks)

    @property
    def frames_oversized(self) -> int:
        return sum(t.frames_oversized for t in self.tracks)

    @property
    def bytes_in(self) -> int:
        return sum(t.bytes_in for t in self.tracks)

    @property
    def queue_depth(self) -> int:
        return sum(t.queue_depth for t in self.tracks)

    @property
    def workers(self) -> int:
        return sum(1 for t in self.tracks if t.worker_alive)

    @property
    def packets_received(self) -> int:
        return sum(t.rtp.packets_received for t in self.tracks if t.rtp is not None)

    @property
    def packets_lost(self) -> int:
        return sum(t.rtp.packets_lost for t in self.tracks if t.rtp is not None)

    def to_json(self) -> dict[str, Any]:
        """The ``GET /v1/sessions`` shape: identity, peer state, per-track figures and a
        summary (the first video track's codec/size/fps; totals of bitrate, loss, queue
        depth and drops; the worst jitter)."""
        tracks = self.tracks
        video = next((t for t in tracks if t.kind == "video"), tracks[0] if tracks else None)
        bitrates = [t.bitrate_bps for t in tracks if t.bitrate_bps is not None]
        jitters = [t.rtp.jitter_ms for t in tracks if t.rtp is not None]
        return {
            "id": self.session_id,
            "run_id": self.run_id,
            "principal": self.principal,
            "stream": self.stream,
            "state": self.state,
            "connected": self.connected,
            "age_s": round(self.age_s, 3),
            "codec": video.codec if video is not None else None,
            "width": video.width if video is not None else None,
            "height": video.height if video is not None else None,
            "fps": video.fps if video is not None else None,
            "bitrate_bps": sum(bitrates) if bitrates else None,
            "packets_received": self.packets_received if self.has_rtp else None,
            "packets_lost": self.packets_lost if self.has_rtp else None,
            "jitter_ms": max(jitters) if jitters else None,
            "queue_depth": self.queue_depth,
            "drops": self.frames_dropped,
            "workers": self.workers,
            "workers_detached": self.workers_detached,
            "rtp_discarded": self.rtp_discarded,
            "congestion": self.congestion,
            "rtp_payload_errors": self.rtp_payload_errors,
            "simulcast": self.simulcast,
            "tracks": [t.to_json() for t in tracks],
        }


@dataclass(slots=True)
class ClosedTotals:
    """Counters of closed sessions (live ones are added at scrape time). Loop thread."""

    frames_decoded: int = 0
    frames_dropped: int = 0
    frames_oversized: int = 0
    decode_errors: int = 0
    inbound_bytes: int = 0
    rtp_packets_lost: int = 0
    worker_faults: int = 0
    forced_shutdowns: int = 0
    rtp_discarded: dict[str, int] = field(default_factory=RtpGuard.no_counts)
    rtp_payload_errors: dict[tuple[str, str], int] = field(default_factory=dict)
    """(codec, reason) -> count."""
    closed_by_reason: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((r.value for r in CloseReason), 0)
    )
    """Closed sessions by ``session_closed`` reason (every reason listed, zeros too)."""

    def add_closed(self, media: SessionFigures, rtp: SessionFigures) -> None:
        """Fold a closed session in: ``media`` read after its workers stopped, ``rtp``
        before its peer closed (RTP statistics die with the peer)."""
        self.frames_decoded += media.frames_decoded
        self.decode_errors += media.decode_errors
        self.frames_dropped += media.frames_dropped
        self.frames_oversized += media.frames_oversized
        self.inbound_bytes += media.bytes_in
        self.rtp_packets_lost += rtp.packets_lost
        for why, count in media.rtp_discarded.items():
            self.rtp_discarded[why] = self.rtp_discarded.get(why, 0) + count
        for codec, reasons in media.rtp_payload_errors.items():
            for why, count in reasons.items():
                key = (codec, why)
                self.rtp_payload_errors[key] = self.rtp_payload_errors.get(key, 0) + count


async def read_rtp(session: LiveSession) -> list[RtpReading]:
    """Every inbound RTP stream of the session, in transceiver order; empty when the
    peer is gone or closing (statistics are best effort)."""
    found: list[RtpReading] = []
    try:
        for transceiver in list(session.pc.getTransceivers()):
            report = await transceiver.receiver.getStats()
            for entry in report.values():
                if getattr(entry, "type", None) != "inbound-rtp":
                    continue
                kind = str(entry.kind)
                jitter_ms = round(float(entry.jitter) * 1000 / CLOCK_HZ.get(kind, 90_000), 3)
                found.append(
                    RtpReading(
                        kind, int(entry.packetsReceived), max(0, int(entry.packetsLost)), jitter_ms
                    )
                )
    except Exception as exc:  # a peer closing under us: no RTP figures this time
        logger.debug("session %s: no RTP stats: %r", session.session_id, exc)
        return []
    return found


def _track(
    session: LiveSession,
    kind: str,
    intake: FrameIntake | None,
    decode: DecodeStats | None,
    alive: bool,
    *,
    first_of_kind: bool,
) -> TrackFigures:
    fps: float | None = None
    bitrate: int | None = None
    bitstream: dict[str, object] | None = None
    analysis = session.analysis
    if analysis is not None and first_of_kind and kind in ("video", "audio"):
        track_kind: Kind = "video" if kind == "video" else "audio"
        rate, bits, window = analysis.track_rates(track_kind)
        if window > 0:
            fps, bitrate = round(rate, 2), bits
        if track_kind == "video":
            bitstream = {**analysis.lint.fields(), "warnings": sorted(analysis.lint.warnings())}
    queue = intake.stats() if intake is not None else None
    return TrackFigures(
        kind=kind,
        codec=decode.codec if decode is not None else None,
        width=decode.width if decode is not None else None,
        height=decode.height if decode is not None else None,
        fps=fps,
        bitrate_bps=bitrate,
        frames_in=queue.frames_in if queue is not None else 0,
        frames_decoded=decode.frames_decoded if decode is not None else 0,
        frames_dropped=queue.dropped_frames if queue is not None else 0,
        frames_oversized=queue.oversized_frames if queue is not None else 0,
        frames_lost=queue.lost_frames if queue is not None else 0,
        decode_errors=decode.decode_errors if decode is not None else 0,
        bytes_in=queue.bytes_in if queue is not None else 0,
        queue_depth=queue.depth if queue is not None else 0,
        queue_max_depth=queue.max_depth if queue is not None else 0,
        queue_limit=intake.depth_limit if intake is not None else 0,
        keyframe_requests=queue.keyframe_requests if queue is not None else 0,
        worker_alive=alive,
        bitstream=bitstream,
        layer=intake.layer if intake is not None else None,
        layers=(
            simulcast_figures(t.receiver for t in session.pc.getTransceivers())
            if kind == "video"
            and session.pc is not None
            and (intake is None or intake.layer is None)
            else None
        ),
    )


def figures_of(
    session: LiveSession, rtp: list[RtpReading], now: float | None = None
) -> SessionFigures:
    """The session's figures with ``rtp`` from :func:`read_rtp` (no await: a reader
    that has the RTP readings already, or none)."""
    now = time.monotonic() if now is None else now
    supervisor = session.supervisor
    workers = supervisor.workers if supervisor is not None else ()
    seen: set[str] = set()
    tracks: list[TrackFigures] = []
    if workers:
        for worker in workers:
            kind = worker.intake.kind
            alive = worker.thread is not None and worker.thread.is_alive()
            first = kind not in seen
            seen.add(kind)
            tracks.append(
                _track(session, kind, worker.intake, worker.stats, alive, first_of_kind=first)
            )
    else:
        for intake in session.intakes:
            tracks.append(_track(session, intake.kind, intake, None, False, first_of_kind=False))
    # Each RTP stream goes to the first track of its kind without one (transceiver order).
    for reading in rtp:
        index = next(
            (i for i, t in enumerate(tracks) if t.kind == reading.kind and t.rtp is None), None
        )
        if index is None:
            tracks.append(TrackFigures(kind=reading.kind, rtp=reading))
        else:
            tracks[index] = dataclasses.replace(tracks[index], rtp=reading)
    return SessionFigures(
        session_id=session.session_id,
        run_id=session.run_id,
        principal=session.principal,
        stream=session.stream,
        state=str(session.pc.connectionState),
        connected=session.connected,
        age_s=now - session.created_at,
        tracks=tuple(tracks),
        workers_detached=len(supervisor.detached) if supervisor is not None else 0,
        rtp_discarded=discarded_by_reason(t.receiver for t in session.pc.getTransceivers()),
        rtp_payload_errors=payload_errors_of(t.receiver for t in session.pc.getTransceivers()),
        has_rtp=bool(rtp),
        congestion=congestion_figures(t.receiver for t in session.pc.getTransceivers()),
        simulcast=simulcast_counters(t.receiver for t in session.pc.getTransceivers()),
    )


async def read_figures(session: LiveSession, now: float | None = None) -> SessionFigures:
    """Read ``session`` once (module doc)."""
    return figures_of(session, await read_rtp(session), now)
