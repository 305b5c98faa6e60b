"""Congestion control in the SDP: what an offer says about transport-cc, and the bitrate
ceiling written into the answer. Pure.

Rules:

- :func:`offered_transport_cc` reads, per media section of the offer (by index), the id
  the offer gives the transport-wide sequence number header extension and the payload
  types that carry ``a=rtcp-fb:<pt> transport-cc`` (``a=rtcp-fb:* transport-cc`` covers
  every payload type of the section). A section takes transport-cc feedback only with
  both: libwebrtc runs its send-side estimator for a stream only when the answer has both.
- :func:`announce_start_bitrate` adds ``x-google-start-bitrate`` (kb/s) to the format
  parameters of every video codec (RTX excluded) of the accepted video sections: libwebrtc
  starts its bandwidth estimate there instead of at 300 kb/s (its first probes go to 3x
  and 6x the start). 0 changes nothing. Only libwebrtc reads it; the answer carries it
  only to an offer :func:`offers_transport_cc_video` says is libwebrtc's.
- :func:`offers_transport_cc_video`: some video section of the offer has both the
  transport-wide sequence number extension and ``rtcp-fb transport-cc``, as every
  libwebrtc publisher's does (Chromium, Safari, libwebrtc-native apps); aiortc, FFmpeg's
  WHIP muxer and OBS offer neither, and their answers stay as they were.
- :func:`announce_ceiling` writes ``b=AS`` (kb/s, RFC 4566) and ``b=TIAS`` (b/s, RFC 3890)
  into every accepted video section of the answer, where RFC 4566 puts ``b=`` (after
  ``c=``); a ceiling of 0 changes nothing. Which publishers honour which is in
  ``docs/INTEROP.md`` ("Congestion control").
"""

from __future__ import annotations

from dataclasses import dataclass

from whip.rtc.twcc import TRANSPORT_CC_URI
from whip.sdp.lines import join_sections, split_sections


@dataclass(frozen=True, slots=True)
class TransportCcOffer:
    """What one offered media section says about transport-cc."""

    extension_id: int | None
    """The ``a=extmap`` id of the transport-wide sequence number, or None."""
    feedback_payload_types: frozenset[int]
    """Payload types with ``a=rtcp-fb:<pt> transport-cc``."""

    def usable_for(self, payload_types: set[int]) -> bool:
        """True when the section can take transport-cc feedback for one of ``payload_types``."""
        return self.extension_id is not None and bool(self.feedback_payload_types & payload_types)


def _payload_types(m_line: str) -> set[int]:
    return {int(f) for f in m_line.split()[3:] if f.isdigit()}


def offered_transport_cc(offer_sdp: str) -> list[TransportCcOffer]:
    """One :class:`TransportCcOffer` per media section of ``offer_sdp``, in order."""
    found: list[TransportCcOffer] = []
    for section in split_sections(offer_sdp)[1]:
        extension_id: int | None = None
        feedback: set[int] = set()
        for line in section[1:]:
            if line.startswith("a=extmap:"):
                head, _, rest = line[len("a=extmap:") :].partition(" ")
                number = head.split("/", 1)[0]
                if rest.split(" ", 1)[0] == TRANSPORT_CC_URI and number.isdigit():
                    extension_id = int(number)
            elif line.startswith("a=rtcp-fb:"):
                target, _, kind = line[len("a=rtcp-fb:") :].partition(" ")
                if kind.strip() != "transport-cc":
                    continue
                if target == "*":
                    feedback |= _payload_types(section[0])
                elif target.isdigit():
                    feedback.add(int(target))
        found.append(TransportCcOffer(extension_id, frozenset(feedback)))
    return found


def offers_transport_cc_video(offer_sdp: str) -> bool:
    """True when a video section of ``offer_sdp`` offers transport-cc (module doc)."""
    kinds = [section[0][2:].split(" ", 1)[0] for section in split_sections(offer_sdp)[1]]
    offers = offered_transport_cc(offer_sdp)
    return any(
        kind == "video" and offer.extension_id is not None and offer.feedback_payload_types
        for kind, offer in zip(kinds, offers, strict=True)
    )


def announce_ceiling(answer_sdp: str, max_bitrate_bps: int) -> str:
    """``answer_sdp`` with ``b=AS``/``b=TIAS`` for ``max_bitrate_bps`` in every accepted
    video section (module doc)."""
    if max_bitrate_bps <= 0:
        return answer_sdp
    bandwidth = [f"b=AS:{max(1, max_bitrate_bps // 1000)}", f"b=TIAS:{max_bitrate_bps}"]
    session, media = split_sections(answer_sdp)
    out = list(session)
    for section in media:
        kind, port = section[0][2:].split()[:2]
        kept = [line for line in section if not line.startswith(("b=AS:", "b=TIAS:"))]
        if kind == "video" and port != "0":
            at = next((i + 1 for i, line in enumerate(kept) if line.startswith("c=")), 1)
            kept[at:at] = bandwidth
        out.extend(kept)
    return join_sections(out, [])


def announce_start_bitrate(answer_sdp: str, start_bitrate_bps: int) -> str:
    """``answer_sdp`` with ``x-google-start-bitrate`` for ``start_bitrate_bps`` on every
    video codec of the accepted video sections (module doc)."""
    if start_bitrate_bps <= 0:
        return answer_sdp
    parameter = f"x-google-start-bitrate={max(1, start_bitrate_bps // 1000)}"
    session, media = split_sections(answer_sdp)
    out = list(session)
    for section in media:
        kind, port = section[0][2:].split()[:2]
        if kind != "video" or port == "0":
            out.extend(section)
            continue
        rtx = {
            int(head)
            for line in section
            if line.startswith("a=rtpmap:") and " rtx/" in line.lower()
            for head in [line[len("a=rtpmap:") :].split(" ", 1)[0]]
            if head.isdigit()
        }
        codecs = [pt for pt in section[0].split()[3:] if pt.isdigit() and int(pt) not in rtx]
        with_fmtp: set[str] = set()
        lines: list[str] = []
        for line in section:
            if line.startswith("a=fmtp:"):
                head, _, params = line[len("a=fmtp:") :].partition(" ")
                if head in codecs and "x-google-start-bitrate=" not in params:
                    line = (
                        f"a=fmtp:{head} {params};{parameter}" if params else f"{line} {parameter}"
                    )
                with_fmtp.add(head)
            lines.append(line)
        for pt in codecs:
            if pt not in with_fmtp:
                at = max(
                    (i for i, line in enumerate(lines) if line.startswith(f"a=rtpmap:{pt} ")),
                    default=len(lines) - 1,
                )
                lines.insert(at + 1, f"a=fmtp:{pt} {parameter}")
        out.extend(lines)
    return join_sections(out, [])
