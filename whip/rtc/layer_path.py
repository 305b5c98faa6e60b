"""One simulcast layer's own receive path, for ``pipeline.simulcast = "all"``.

aiortc's ``RTCRtpReceiver._handle_rtp_packet`` keeps one jitter buffer, one NACK
generator and one timestamp mapper per receiver; with every layer decoded, each layer
needs its own. :class:`LayerPath` repeats aiortc's receive steps for one layer, in
aiortc's order, with state of its own:

1. RTX: a packet of the layer's RTX SSRC is unwrapped (``apt``) into the layer's media
   SSRC; without a known media SSRC, a short payload or an unknown ``apt`` it is dropped.
2. NACK: missing sequence numbers are asked for (``BoundedNackGenerator`` of
   :mod:`whip.rtc.rtp_guard`, the same bound as every other receiver).
3. Depayload with aiortc's ``depayload`` (read from ``aiortc.rtcrtpreceiver`` at call
   time, so a codec the adapter adds there is depayloaded here too); a payload it
   rejects is counted in ``malformed`` and dropped.
4. The jitter buffer (aiortc's, video capacity 512); its PLI request goes to the layer's
   SSRC; a complete frame gets a timestamp from the layer's mapper and goes to ``sink``
   (:meth:`pipeline.intake.FrameIntake.offer`), whose exception is logged once and
   counted, never raised into aiortc.

aiortc's receiver does not see these packets: no RTCP receiver report and no REMB for
them (transport-cc feedback, recorded per transport, is unaffected). Loop thread only.

aiortc private names touched (:func:`internals_problems` verifies each):
``aiortc.rtcrtpreceiver.depayload``, ``.is_rtx``, ``.JitterBuffer`` (frame timestamps:
:class:`whip.rtc.rtp_timestamps.FrameTimestamps`),
``aiortc.rtp.unwrap_rtx``, ``RTCRtpReceiver.__codecs``, ``._send_rtcp_nack(ssrc, lost)``,
``._send_rtcp_pli(ssrc)``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import aiortc.rtcrtpreceiver
import aiortc.rtp

from whip.rtc.rtp_guard import BoundedNackGenerator
from whip.rtc.rtp_timestamps import FrameTimestamps

logger = logging.getLogger(__name__)

_RECEIVER = aiortc.rtcrtpreceiver.RTCRtpReceiver
_CODECS = "_RTCRtpReceiver__codecs"
VIDEO_JITTER_CAPACITY = 512
"""aiortc's video jitter buffer capacity (``RTCRtpReceiver.__init__``)."""

Sink = Callable[[Any, Any], object]


class LayerPath:
    """The receive path of one layer (module rules)."""

    def __init__(self, receiver: Any, rid: str, sink: Sink, label: str) -> None:
        module = aiortc.rtcrtpreceiver
        self.receiver = receiver
        self.rid = rid
        self.sink = sink
        self.label = label
        self.jitter = vars(module)["JitterBuffer"](capacity=VIDEO_JITTER_CAPACITY, is_video=True)
        self.nack = BoundedNackGenerator()
        self.mapper = FrameTimestamps()
        self.frames = 0
        self.malformed = 0
        self.sink_errors = 0

    async def handle(self, packet: Any, media_ssrc: int | None) -> None:
        """aiortc's receive steps for one packet of this layer (module rules)."""
        module = aiortc.rtcrtpreceiver
        codecs = getattr(self.receiver, _CODECS)
        codec = codecs.get(packet.payload_type)
        if codec is None:
            return
        if vars(module)["is_rtx"](codec):
            apt = codec.parameters.get("apt")
            if (
                media_ssrc is None
                or len(packet.payload) < 2
                or not isinstance(apt, int)
                or apt not in codecs
            ):
                return
            packet = aiortc.rtp.unwrap_rtx(packet, payload_type=apt, ssrc=media_ssrc)
            codec = codecs[apt]
        if self.nack.add(packet):
            await self.receiver._send_rtcp_nack(packet.ssrc, sorted(self.nack.missing))
        try:
            depayload = vars(module)["depayload"]
            packet._data = depayload(codec, packet.payload) if packet.payload else b""
        except ValueError:
            self.malformed += 1
            return
        pli, frame = self.jitter.add(packet)
        if pli:
            await self.receiver._send_rtcp_pli(packet.ssrc)
        if frame is None:
            return
        frame.timestamp = self.mapper.map(frame.timestamp)
        self.frames += 1
        try:
            self.sink(codec, frame)
        except Exception:
            self.sink_errors += 1
            if self.sink_errors == 1:
                logger.exception("session %s: layer %s sink failed", self.label, self.rid)


def internals_problems() -> list[str]:
    """What a layer path relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    module = aiortc.rtcrtpreceiver
    for name in ("depayload", "is_rtx", "JitterBuffer"):
        if not callable(getattr(module, name, None)):
            problems.append(f"aiortc.rtcrtpreceiver.{name}")
    if not callable(getattr(aiortc.rtp, "unwrap_rtx", None)):
        problems.append("aiortc.rtp.unwrap_rtx")
    for name in ("_send_rtcp_nack", "_send_rtcp_pli"):
        if not inspect.iscoroutinefunction(getattr(_RECEIVER, name, None)):
            problems.append(f"RTCRtpReceiver.{name}")
    if "self.__codecs" not in inspect.getsource(_RECEIVER.__init__):
        problems.append("RTCRtpReceiver.__codecs")
    return problems
