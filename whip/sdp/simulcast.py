"""Simulcast in the SDP (RFC 8851 RIDs, RFC 8853 ``a=simulcast``): what an offer sends, and
the answer that receives every layer of it. Pure.

Rules:

- A media section offers simulcast when it has ``a=simulcast:send <list>``; each RID in the
  list must have an ``a=rid:<id> send`` line in the same section (RFC 8853 section 5.1).
  The list is streams separated by ``;``, each a list of alternatives separated by ``,``;
  a ``~`` prefix marks a RID the sender starts paused. ``a=rid`` lines without
  ``a=simulcast`` are not simulcast (a single stream with restrictions) and change nothing.
- A RID is 1 to :data:`MAX_RID_LENGTH` characters of ``[A-Za-z0-9_-]`` (RFC 8851's
  rid-id, bounded by the RTP header extension element of RFC 8852: 16 bytes); a section
  offers at most :data:`MAX_LAYERS` RIDs, each once. Anything else is a 400 ``bad_sdp``
  naming the section: a hostile offer cannot make the demultiplexer keep more state.
- The answer (:func:`answer_simulcast`) accepts every offered RID, whatever
  ``pipeline.simulcast`` decodes: OBS aborts a push whose answer accepts fewer layers than
  it offered. Each accepted video section gets one ``a=rid:<id> recv`` per offered RID, in
  the offer's ``a=rid`` order, and ``a=simulcast:recv`` with the offer's list verbatim
  (order, alternatives and pause markers kept). A rejected section (port 0) gets nothing.
- The header extensions the demultiplexer reads (:data:`RID_URI`,
  :data:`REPAIRED_RID_URI`, and :data:`MID_URI`, which aiortc already answers) are taken
  with the ids the offer gives them (:attr:`SimulcastOffer.extension_ids`); the answer's
  ``a=extmap`` lines are aiortc's, from the transceiver's header extensions
  (:func:`whip.rtc.simulcast.install_simulcast`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from whip.sdp.lines import join_sections, split_sections
from whip.sdp.model import SdpError

RID_URI = "urn:ietf:params:rtp-hdrext:sdes:rtp-stream-id"
REPAIRED_RID_URI = "urn:ietf:params:rtp-hdrext:sdes:repaired-rtp-stream-id"
MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"
SIMULCAST_URIS = (MID_URI, RID_URI, REPAIRED_RID_URI)

MAX_LAYERS = 8
"""RIDs one section may offer (Chromium and OBS send at most 4)."""
MAX_RID_LENGTH = 16

_RID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_RID_LENGTH}}}")


@dataclass(frozen=True, slots=True)
class SimulcastOffer:
    """The simulcast of one offered media section."""

    index: int
    """The media section's index in the offer."""
    rids: tuple[str, ...]
    """Every offered RID, in the offer's ``a=rid`` order."""
    send_list: str
    """The ``a=simulcast:send`` list as offered (streams, alternatives, pause markers)."""
    paused: frozenset[str]
    """RIDs the sender starts paused (``~``)."""
    extension_ids: tuple[tuple[str, int], ...]
    """(uri, id) of the offered :data:`SIMULCAST_URIS` extensions."""

    def extension_id(self, uri: str) -> int | None:
        return next((i for u, i in self.extension_ids if u == uri), None)

    def answer_lines(self) -> list[str]:
        """The section's ``a=rid``/``a=simulcast`` lines of the answer (module rules)."""
        return [*(f"a=rid:{rid} recv" for rid in self.rids), f"a=simulcast:recv {self.send_list}"]


PER_LAYER_CODECS = frozenset({"h264", "vp8"})
"""Codecs ``all`` decodes layer by layer: aiortc's depayloaders for them keep no state
between packets. H.265, AV1 and VP9 have one depacketizer per receiver and codec
(:mod:`whip.rtc.depayload`), which layers must not share: for them ``all`` decodes the
highest layer only (:func:`simulcast_mode`)."""


def simulcast_mode(mode: str, codec: str | None) -> str:
    """The ``pipeline.simulcast`` mode in effect for a section whose chosen codec is
    ``codec`` (an encoding name, any case): ``all`` becomes ``highest`` for a codec outside
    :data:`PER_LAYER_CODECS`."""
    if mode == "all" and (codec or "").lower() not in PER_LAYER_CODECS:
        return "highest"
    return mode


def decoded_layers(offer: SimulcastOffer, mode: str) -> int:
    """How many of ``offer``'s layers ``pipeline.simulcast = mode`` (the mode in effect,
    :func:`simulcast_mode`) decodes (each one a track of the media budget)."""
    return len(offer.rids) if mode == "all" else 1


def _send_list(value: str, index: int) -> tuple[str, list[str], set[str]]:
    """(the send list, its RIDs in list order, the paused ones) of an ``a=simulcast`` value."""
    words = value.split()
    if len(words) not in (2, 4) or words[0] != "send":
        if len(words) == 4 and words[2] == "send":
            words = words[2:]
        else:
            raise SdpError(f"media section {index}: a=simulcast must offer 'send <list>'")
    listed: list[str] = []
    paused: set[str] = set()
    for stream in words[1].split(";"):
        for alternative in stream.split(","):
            rid = alternative.removeprefix("~")
            if not _RID.fullmatch(rid):
                raise SdpError(f"media section {index}: bad RID {alternative[:40]!r}")
            if rid in listed:
                raise SdpError(f"media section {index}: RID {rid!r} listed twice")
            if alternative.startswith("~"):
                paused.add(rid)
            listed.append(rid)
    if len(listed) > MAX_LAYERS:
        raise SdpError(f"media section {index}: {len(listed)} RIDs, at most {MAX_LAYERS}")
    return words[1], listed, paused


def offered_simulcast(offer_sdp: str) -> dict[int, SimulcastOffer]:
    """The simulcast offers of ``offer_sdp`` by media section index (module rules).

    Raises :class:`SdpError` (400) for a malformed or oversized simulcast description.
    """
    found: dict[int, SimulcastOffer] = {}
    for index, section in enumerate(split_sections(offer_sdp)[1]):
        send_rids: list[str] = []
        simulcast: str | None = None
        extensions: list[tuple[str, int]] = []
        for line in section[1:]:
            if line.startswith("a=rid:"):
                parts = line[len("a=rid:") :].split()
                if len(parts) >= 2 and parts[1] == "send":
                    if not _RID.fullmatch(parts[0]) or parts[0] in send_rids:
                        raise SdpError(f"media section {index}: bad or repeated a=rid line")
                    send_rids.append(parts[0])
                    if len(send_rids) > MAX_LAYERS:
                        raise SdpError(f"media section {index}: more than {MAX_LAYERS} RIDs")
            elif line.startswith("a=simulcast:"):
                if simulcast is not None:
                    raise SdpError(f"media section {index}: a=simulcast appears twice")
                simulcast = line[len("a=simulcast:") :]
            elif line.startswith("a=extmap:"):
                head, _, rest = line[len("a=extmap:") :].partition(" ")
                number = head.split("/", 1)[0]
                uri = rest.split(" ", 1)[0]
                if uri in SIMULCAST_URIS and number.isdigit() and 1 <= int(number) <= 255:
                    extensions.append((uri, int(number)))
        if simulcast is None:
            continue
        send_list, listed, paused = _send_list(simulcast, index)
        missing = [rid for rid in listed if rid not in send_rids]
        if missing:
            raise SdpError(f"media section {index}: simulcast RID {missing[0]!r} has no a=rid")
        rids = tuple(rid for rid in send_rids if rid in listed)
        found[index] = SimulcastOffer(index, rids, send_list, frozenset(paused), tuple(extensions))
    return found


def answer_simulcast(answer_sdp: str, offers: dict[int, SimulcastOffer]) -> str:
    """``answer_sdp`` with the receive side of every offer in ``offers`` (module rules):
    the lines go after the section's ``a=mid`` (or last, without one); earlier ``a=rid``
    or ``a=simulcast`` lines of that section are replaced."""
    if not offers:
        return answer_sdp
    session, media = split_sections(answer_sdp)
    out = list(session)
    for index, section in enumerate(media):
        offer = offers.get(index)
        if offer is None or section[0].split()[1:2] == ["0"]:
            out.extend(section)
            continue
        kept = [line for line in section if not line.startswith(("a=rid:", "a=simulcast:"))]
        at = next((i + 1 for i, line in enumerate(kept) if line.startswith("a=mid:")), len(kept))
        kept[at:at] = offer.answer_lines()
        out.extend(kept)
    return join_sections(out, [])
