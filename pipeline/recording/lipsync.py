"""Media time of a recording's tracks: arrival alignment, then RTCP sender reports (sans-IO).

A frame's media time is ``offset[kind] + timestamp / clock[kind]``: its track's RTP
spacing (the timestamp is the adapter's unwrapped one, 0 at the track's first frame) plus
one offset per track. Rules:

- **Before sender reports (the fallback).** A track's offset is fixed at its first
  frame so that frame lands at its arrival time after the session's first frame (the
  first frame of the session is media time 0): the tracks are aligned by arrival.
- **Sender reports.** A report of a track pairs one of its timestamps with the
  publisher's NTP wall clock, the same clock for every track: ``anchor = ntp_s -
  timestamp / clock`` is that track's timestamp 0 in wall time. Once every track
  being timed has an anchor, the offsets should differ as the anchors do.
  :meth:`LipSync.align` compares them and, when they are more than
  :data:`TOLERANCE_S` apart, moves the track that is early in the file *later* by the
  difference, never the other one earlier: no track's media time ever goes backwards,
  so the file's timestamps stay monotonic. The moved track gets a gap (audio) or a held
  frame (video) of that size, once; later reports (the latest of each track is used)
  correct drift and the sender's send-time jitter the same way, beyond the tolerance.
- A track whose first frame comes after the anchors are known still starts at its
  arrival (the fallback), then is aligned at once by the same forward-only move.
- Only two kinds are timed (one video, one audio track: what a recording holds); a
  report of a kind with no frame yet is kept for when it has one.

Threads: one :class:`LipSync` per recorder, used by the recorder's thread only.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

from pipeline.frame import Kind

logger = logging.getLogger(__name__)

CLOCK_HZ: dict[str, int] = {"video": 90000, "audio": 48000}
KEPT_MOVES = 64
TOLERANCE_S = 0.015
"""Disagreement with the reports below which nothing moves: under half a 30 fps frame,
above the send-time jitter of a sender report (aiortc stamps it after the packet went
out)."""


@dataclass(frozen=True, slots=True)
class SenderReport:
    """One track's report: ``timestamp`` (on the frames' timeline) at ``ntp_s``."""

    timestamp: int
    ntp_s: float


@dataclass(frozen=True, slots=True)
class Move:
    """One alignment step :meth:`LipSync.align` made: ``kind`` moved later by ``by_s``."""

    kind: str
    by_s: float


class LipSync:
    """Per-track offsets of one recording (module rules)."""

    def __init__(self) -> None:
        self._t0: float | None = None
        self.offsets: dict[str, float] = {}
        """Seconds added to ``timestamp / clock`` per kind (set at the track's first frame)."""
        self.anchors: dict[str, float] = {}
        """Per kind, the wall time (NTP seconds) of its timestamp 0, from its latest report."""
        self.moves: collections.deque[Move] = collections.deque(maxlen=KEPT_MOVES)
        """The last :data:`KEPT_MOVES` alignment steps, in order."""
        self.moves_made = 0
        """Alignment steps made so far (all of them)."""

    def media_s(self, kind: Kind, timestamp: int, arrival: float) -> float:
        """The frame's media time (module rules). ``arrival``: ``time.monotonic()`` when
        it reached the intake; used for a track's first frame only."""
        clock = CLOCK_HZ[kind]
        offset = self.offsets.get(kind)
        if offset is None:
            if self._t0 is None:
                self._t0 = arrival
            offset = self.offsets[kind] = (arrival - self._t0) - timestamp / clock
            self.align()
        return self.offsets[kind] + timestamp / clock

    def report(self, kind: Kind, report: SenderReport) -> Move | None:
        """Take ``kind``'s latest sender report, then :meth:`align`."""
        self.anchors[kind] = report.ntp_s - report.timestamp / CLOCK_HZ[kind]
        return self.align()

    def align(self) -> Move | None:
        """Move one track later when the offsets disagree with the anchors by more than
        :data:`TOLERANCE_S` (module rules); the move made, if any."""
        if not {"video", "audio"} <= self.offsets.keys() & self.anchors.keys():
            return None
        # > 0: video sits later in the file than the reports say, relative to audio.
        error = (self.offsets["video"] - self.offsets["audio"]) - (
            self.anchors["video"] - self.anchors["audio"]
        )
        if abs(error) <= TOLERANCE_S:
            return None
        move = Move("audio", error) if error > 0 else Move("video", -error)
        self.offsets[move.kind] += move.by_s
        self.moves.append(move)
        self.moves_made += 1
        return move
