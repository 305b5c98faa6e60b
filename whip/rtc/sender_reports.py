"""RTCP sender reports of a receiver, placed on its frame timeline (for lip-sync).

A sender report (RFC 3550 section 6.4.1) pairs one RTP timestamp of a source with the
sender's NTP wall clock at that instant. Every track of a publisher shares that wall
clock, so two tracks whose RTP timestamps start at unrelated random offsets can be put on
one time line: :mod:`pipeline.recording.lipsync` does that for the recording.

:func:`watch_sender_reports` shadows one ``RTCRtpReceiver``'s ``_handle_rtcp_packet`` per
instance (chained: aiortc's handling, and any earlier shadow such as
:mod:`whip.rtc.peer_end`'s, still run) and hands each usable report to a listener as
``listener(timestamp, ntp_s)``:

- ``timestamp`` is the report's RTP timestamp placed on the receiver's frame timeline by
  its :class:`whip.rtc.rtp_timestamps.FrameTimestamps` (the same unwrapping the frames
  get, so a report across a 32-bit wrap lands where its frames do), without moving that
  timeline's reference;
- ``ntp_s`` is the report's 64-bit NTP timestamp in seconds (since 1900).

A report is used only when it can be tied to the frames: it comes from the one media
SSRC the receiver has received (its RTP sources less their RTX ones), and a frame has
been mapped already. So nothing is reported once a receiver has received more than one
media SSRC (simulcast layers: each layer's timeline differs, :mod:`whip.rtc.simulcast`),
before the first frame, or for a report whose NTP timestamp is 0 (aiortc's sender
reports 0 until it has sent a packet). Only SRTCP
that passed unprotect reaches the handler. Event loop thread only; the listener must
not block, and an exception from it is logged, never raised into aiortc's RTCP loop.

aiortc private names touched (:func:`internals_problems` verifies them):
``RTCRtpReceiver._handle_rtcp_packet`` (shadowed per instance),
``RTCRtpReceiver.__remote_streams`` and ``__rtx_ssrc`` (read), ``RtcpSrPacket.ssrc`` and
``sender_info.ntp_timestamp`` / ``rtp_timestamp``; the timeline is
:data:`whip.rtc.rtp_timestamps.MAPPER_ATTRIBUTE`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import aiortc.rtcrtpreceiver
from aiortc.rtp import RtcpSenderInfo, RtcpSrPacket

from whip.rtc.rtp_timestamps import MAPPER_ATTRIBUTE, FrameTimestamps

logger = logging.getLogger(__name__)

_RECEIVER = aiortc.rtcrtpreceiver.RTCRtpReceiver
_REMOTE_STREAMS = "_RTCRtpReceiver__remote_streams"
_RTX_SSRC = "_RTCRtpReceiver__rtx_ssrc"
_NTP_UNIT = float(1 << 32)

ReportListener = Callable[[int, float], None]
"""``listener(timestamp, ntp_s)`` (module doc)."""


def ntp_seconds(ntp_timestamp: int) -> float:
    """A 64-bit NTP timestamp (32.32 fixed point) in seconds."""
    return ntp_timestamp / _NTP_UNIT


def _media_ssrc(receiver: Any) -> int | None:
    """The one media SSRC ``receiver`` has received, or None (none yet, or several)."""
    streams = getattr(receiver, _REMOTE_STREAMS, None)
    rtx = getattr(receiver, _RTX_SSRC, None)
    if not isinstance(streams, dict) or not isinstance(rtx, dict):
        return None
    media = [ssrc for ssrc in streams if ssrc not in rtx]
    return media[0] if len(media) == 1 else None


def place_report(receiver: Any, packet: RtcpSrPacket) -> tuple[int, float] | None:
    """``packet``'s (timestamp, ntp_s) on ``receiver``'s frame timeline, or None when it
    cannot be tied to the frames (module doc)."""
    info = packet.sender_info
    if info.ntp_timestamp == 0 or packet.ssrc != _media_ssrc(receiver):
        return None
    mapper = getattr(receiver, MAPPER_ATTRIBUTE, None)
    if not isinstance(mapper, FrameTimestamps):
        return None
    placed = mapper.place(info.rtp_timestamp)
    if placed is None:
        return None
    return placed, ntp_seconds(info.ntp_timestamp)


def watch_sender_reports(receiver: Any, listener: ReportListener, label: str = "") -> None:
    """Call ``listener`` with every usable sender report ``receiver`` gets (module doc).
    Any time before the reports that matter; event loop thread."""
    handle = receiver._handle_rtcp_packet
    failures = 0

    async def handle_rtcp_packet(packet: Any) -> None:
        nonlocal failures
        if isinstance(packet, RtcpSrPacket):
            placed = place_report(receiver, packet)
            if placed is not None:
                try:
                    listener(*placed)
                except Exception:
                    failures += 1
                    if failures == 1:
                        logger.exception("%s: sender report listener failed", label or "receiver")
        await handle(packet)

    receiver._handle_rtcp_packet = handle_rtcp_packet


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    if not inspect.iscoroutinefunction(getattr(_RECEIVER, "_handle_rtcp_packet", None)):
        problems.append("RTCRtpReceiver._handle_rtcp_packet")
    init = inspect.getsource(_RECEIVER.__init__)
    for name in ("__remote_streams", "__rtx_ssrc"):
        if f"self.{name}" not in init:
            problems.append(f"RTCRtpReceiver.{name}")
    if "self.__remote_streams[packet.ssrc]" not in inspect.getsource(_RECEIVER._handle_rtp_packet):
        problems.append("_handle_rtp_packet records its sources in __remote_streams")
    report = RtcpSrPacket(ssrc=7, sender_info=RtcpSenderInfo(1 << 32, 9, 0, 0))
    if (report.ssrc, report.sender_info.ntp_timestamp, report.sender_info.rtp_timestamp) != (
        7,
        1 << 32,
        9,
    ):
        problems.append("RtcpSrPacket(ssrc, sender_info(ntp_timestamp, rtp_timestamp))")
    return problems
