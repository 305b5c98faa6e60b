"""RTP payload formats aiortc lacks (H.265, AV1, VP9), in aiortc's receive path.

Rules:

- Per packet: :func:`install_depayload` (idempotent, process-wide; ``create_app`` calls
  it) replaces ``aiortc.rtcrtpreceiver.depayload``, the name the receiver calls for every
  RTP payload. A codec that carries one of our depacketizers (bound by
  :meth:`PayloadFormats.bind`) goes through its
  :meth:`~pipeline.rtp_payload.depacketizer.Depacketizer.depacketize`; every other codec
  through aiortc's own function, unchanged. A :class:`~pipeline.rtp_payload.errors.PayloadError`
  is a ``ValueError``: aiortc drops that packet (the RTP guard counts it ``malformed``) and
  the depacketizer counts it by reason.
- One depacketizer per track per codec: :class:`PayloadFormats` belongs to one receiver,
  and :meth:`PayloadFormats.bind` runs inside the tap's ``receive(parameters)`` wrapper
  (:func:`whip.rtc.tap.install_tap`), on the receive parameters' codec objects, which are
  that transceiver's own copies (an RTX payload is unwrapped to its ``apt`` codec, the same
  object). The depacketizer is made from the *offered* fmtp (``sprop-max-don-diff`` is the
  sender's), not the answered one aiortc holds.
- Per frame: :meth:`PayloadFormats.framing` wraps the tap's sink. aiortc's jitter buffer
  joins one timestamp's per-packet outputs; the wrapper turns them into the decoder's
  bitstream with ``assemble`` before the sink sees the frame. A frame that does not
  assemble is lost: counted by reason, and ``on_lost()`` (the intake opens a drop episode
  and asks for a keyframe, as a dropped H.264 frame does). H.264 and VP8 frames pass
  through untouched.
- Counters: :meth:`PayloadFormats.errors` (codec -> reason -> count) is read from any
  thread; only the event loop thread writes (plain ints in ``Counter``\\ s).

aiortc names touched (:func:`internals_problems`): ``aiortc.rtcrtpreceiver.depayload``
(module global, called per packet by ``RTCRtpReceiver._handle_rtp_packet``) and
``aiortc.codecs.depayload`` (the stock one, kept for every other codec); ours on aiortc's
``RTCRtpCodecParameters``: ``_whip_ingest_depacketizer``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiortc.codecs
import aiortc.rtcrtpreceiver
from aiortc.jitterbuffer import JitterFrame

from pipeline.rtp_payload.depacketizer import Depacketizer
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.formats import depacketizer_for

logger = logging.getLogger(__name__)

_STOCK_DEPAYLOAD = aiortc.codecs.depayload
_DEPACKETIZER = "_whip_ingest_depacketizer"


def depayload(codec: Any, payload: bytes) -> bytes:
    """``aiortc.rtcrtpreceiver.depayload``'s replacement (module rules). Raises
    ``ValueError`` (aiortc drops the packet)."""
    depacketizer: Depacketizer | None = getattr(codec, _DEPACKETIZER, None)
    if depacketizer is None:
        return bytes(_STOCK_DEPAYLOAD(codec, payload))
    return depacketizer.depacketize(payload).data


def install_depayload() -> None:
    """Route every RTP payload through :func:`depayload` (module rules). Idempotent."""
    aiortc.rtcrtpreceiver.depayload = depayload  # type: ignore[attr-defined]


def installed() -> bool:
    """Whether :func:`install_depayload` is in effect."""
    return getattr(aiortc.rtcrtpreceiver, "depayload", None) is depayload


Sink = Callable[[Any, Any], object]


class PayloadFormats:
    """The depacketizers of one receiver (module rules). Event loop thread.

    ``offered`` maps each payload type to its offered fmtp parameters.
    """

    def __init__(
        self, offered: Mapping[int, Mapping[str, object]], *, max_frame_bytes: int, label: str
    ) -> None:
        self._offered = offered
        self._max_frame_bytes = max_frame_bytes
        self.label = label
        self.by_payload_type: dict[int, Depacketizer] = {}
        self.lost_frames = 0

    def bind(self, codecs: Iterable[Any]) -> None:
        """Give each codec of ours among ``codecs`` (aiortc's receive parameters) its own
        depacketizer. Raises ``ValueError`` for an offered fmtp the format forbids (the
        offer policy refuses those first)."""
        for codec in codecs:
            params = self._offered.get(codec.payloadType, {})
            found = depacketizer_for(codec.name, params, max_frame_bytes=self._max_frame_bytes)
            if found is not None:
                setattr(codec, _DEPACKETIZER, found)
                self.by_payload_type[codec.payloadType] = found

    def framing(self, sink: Sink, on_lost: Callable[[], object]) -> Sink:
        """``sink`` behind the frame step (module rules)."""

        def assembled(codec: Any, frame: Any) -> object:
            depacketizer: Depacketizer | None = getattr(codec, _DEPACKETIZER, None)
            if depacketizer is None:
                return sink(codec, frame)
            try:
                whole = depacketizer.assemble(frame.data)
            except PayloadError as exc:
                self.lost_frames += 1
                if self.lost_frames == 1:
                    logger.warning(
                        "%s: a %s frame does not assemble (%s; first of possibly many)",
                        self.label,
                        codec.name,
                        exc.reason,
                    )
                on_lost()
                return False
            return sink(codec, JitterFrame(data=whole.data, timestamp=frame.timestamp))

        return assembled

    def errors(self) -> dict[str, dict[str, int]]:
        """Refused packets and frames: codec name -> reason -> count."""
        found: dict[str, dict[str, int]] = {}
        for depacketizer in list(self.by_payload_type.values()):
            for reason, count in list(depacketizer.errors.items()):
                into = found.setdefault(depacketizer.codec, {})
                into[reason] = into.get(reason, 0) + count
        return found


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    receiver = aiortc.rtcrtpreceiver
    current = getattr(receiver, "depayload", None)
    if current is not depayload and current is not _STOCK_DEPAYLOAD:
        problems.append("aiortc.rtcrtpreceiver.depayload is aiortc.codecs.depayload")
    handle = inspect.getsource(receiver.RTCRtpReceiver._handle_rtp_packet)
    if "packet._data = depayload(codec, packet.payload)" not in handle:
        problems.append("RTCRtpReceiver._handle_rtp_packet calls depayload(codec, payload)")
    if "apt not in self.__codecs" not in handle or "codec = self.__codecs[apt]" not in handle:
        problems.append("RTX is depayloaded with its apt codec object")
    if not inspect.isfunction(_STOCK_DEPAYLOAD):
        problems.append("aiortc.codecs.depayload")
    frame = JitterFrame(data=b"\x01", timestamp=3)
    if (frame.data, frame.timestamp) != (b"\x01", 3):
        problems.append("JitterFrame(data=, timestamp=)")
    return problems
