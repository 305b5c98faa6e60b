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

from whip.sdp import OfferSummary, SectionPlan


def plan_of(transceiver: Any, summary: OfferSummary) -> SectionPlan | None:
    """The plan of ``transceiver``'s offered section (by ``_get_mline_index()``)."""
    index = transceiver._get_mline_index()
    return next((p for p in summary.sections if p.index == index), None)


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

    The list takes the plan's order (for video the server's preference, so the answer
    lists the preferred format first), each RTX right after the format it repairs; the
    plan's payload types aiortc lacks are left out, as :func:`whip.sdp.finalize_answer`
    leaves them out of the answer. A video format's parameters become the plan's answer
    fmtp (:attr:`whip.sdp.SectionPlan.answer_params`): aiortc would answer with its own
    table's (``profile-level-id=42001f`` for any H.264), where RFC 7798 and the AV1 and
    H.264 payload formats want the offer's profile reflected.
    Touches ``RTCRtpTransceiver._codecs`` and ``._get_mline_index()`` (the offer's
    section index, as :attr:`whip.sdp.SectionPlan.index`).
    """
    plan = plan_of(transceiver, summary)
    if plan is None or not plan.accepted:
        return False
    have = {c.payloadType: c for c in transceiver._codecs}
    answers = dict(zip(plan.payload_types, plan.answer_params, strict=False))
    codecs = []
    for payload_type in plan.payload_types:
        codec = have.get(payload_type)
        if codec is None:
            continue
        if payload_type in answers:
            codec.parameters = dict(answers[payload_type])
        codecs.append(codec)
        codecs.extend(
            have[rtx]
            for rtx in plan.rtx_payload_types
            if rtx in have and str(have[rtx].parameters.get("apt")) == str(payload_type)
        )
    if not codecs:
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
