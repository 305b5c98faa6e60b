"""Transceivers hold exactly the codecs the answer offers.

aiortc receives every codec both sides support, not only the ones our answer offers:
PCMU/PCMA/G722 on a new SSRC reached the audio receiver of an Opus-only answer.
:func:`restrict_codecs` trims each transceiver to the answer's plan.

aiortc internals touched: ``RTCRtpTransceiver._codecs`` and ``._get_mline_index()``,
and that ``RTCPeerConnection`` builds both the answer's m-line and the receive
parameters from that one list.
"""

from __future__ import annotations

import inspect
from typing import Any

import aiortc
import aiortc.rtcpeerconnection

from whip.sdp import OfferSummary


def restrict_codecs(transceiver: Any, summary: OfferSummary) -> bool:
    """Make ``transceiver`` hold exactly the codecs the answer offers; False when it
    offers none (the section is rejected: the caller makes the transceiver inactive).

    Call after ``setRemoteDescription`` and before ``createAnswer``. aiortc keeps every
    codec both sides support (an Opus-only plan still left PCMU, PCMA and G722 on the
    audio transceiver), and one list, ``RTCRtpTransceiver._codecs``, feeds both the
    answer's m-line and the receive parameters: the receiver's decoders by payload type
    and its ``RtpRouter`` registration. Trimmed to the plan, a payload type outside it
    routes nowhere (``rtp_unroutable``), even on an SSRC the router does not know yet.
    ``RTCRtpTransceiver.setCodecPreferences`` cannot do this here: aiortc applies
    preferences inside ``setRemoteDescription``, which also creates the transceiver.

    The list keeps aiortc's order (the offer's); the plan's payload types it lacks are
    left out, as :func:`whip.sdp.finalize_answer` leaves them out of the answer.
    Touches ``RTCRtpTransceiver._codecs`` and ``._get_mline_index()`` (the offer's
    section index, as :attr:`whip.sdp.SectionPlan.index`).
    """
    index = transceiver._get_mline_index()
    plan = next((p for p in summary.sections if p.index == index), None)
    if plan is None or not plan.accepted:
        return False
    keep = {*plan.payload_types, *plan.rtx_payload_types}
    codecs = [c for c in transceiver._codecs if c.payloadType in keep]
    if not any(c.payloadType in plan.payload_types for c in codecs):
        return False
    transceiver._codecs = codecs
    return True


def internals_problems() -> list[str]:
    """What this module relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []
    transceiver = aiortc.RTCRtpTransceiver
    if "self._codecs" not in inspect.getsource(transceiver):
        problems.append("RTCRtpTransceiver._codecs")
    if not callable(getattr(transceiver, "_get_mline_index", None)):
        problems.append("RTCRtpTransceiver._get_mline_index")
    pc = inspect.getsource(aiortc.rtcpeerconnection)
    if not (  # the one list behind the answer's m-line and the receive parameters
        "fmt=[c.payloadType for c in transceiver._codecs]" in pc
        and "codecs=transceiver._codecs," in pc
    ):
        problems.append("RTCPeerConnection answers and receives transceiver._codecs")
    return problems
