"""SDP offer checks and answer policy for WHIP. Pure: strings and bytes in, values out.

Parsing rules (:func:`parse_offer`, :func:`parse_description`):

- The body is at most ``max_bytes`` (else 413), UTF-8 text without control characters
  other than CR/LF/TAB (else 400). Lines end in CRLF or LF; blank lines are ignored.
- Every line is ``<lowercase letter>=<value>``; the first is exactly ``v=0``; ``o=`` (six
  fields) and ``s=`` appear once each, before the first ``m=``; at least one ``m=``.
- ``m=<kind> <port>[/<n>] <proto> <fmt>...``: for RTP profiles each format is a payload
  type 0..127, listed once. ``a=rtpmap`` / ``a=fmtp`` / ``a=mid`` / a direction /
  ``a=ice-ufrag`` / ``a=ice-pwd`` / ``a=setup`` appear at most once per scope (per
  payload type for rtpmap and fmtp). Session-level ICE, DTLS and direction attributes
  are the defaults of every media section. Unknown line types and attributes are kept
  out of the way, not refused.
- Mids are unique; every mid of an ``a=group:BUNDLE`` exists. An active RTP section
  (port != 0, not ``bundle-only``) carries ``ice-ufrag``, ``ice-pwd`` and a fingerprint.
  Every syntax error is a 400 ``bad_sdp`` whose message names the line.

Offer policy (:func:`plan_offer`): a section is accepted when it is audio or video, active,
``UDP/TLS/RTP/SAVPF`` (or ``RTP/SAVPF``), offered ``sendonly`` or ``sendrecv`` and has a
receivable codec: video H.264 with ``packetization-mode=1`` and a baseline (42), main
(4d) or high (64) ``profile-level-id`` (or none), or VP8; audio Opus 48000/2. RTX whose
``apt`` is a kept codec is kept too. Payload types keep the offer's preference order.
Other sections are rejected (port 0 in the answer). More than one sending audio or video
section is a 422 ``too_many_tracks`` (WHIP ingests one stream: one audio + one video);
no accepted section at all is a 422 ``nothing_receivable``.

Answer policy (:func:`finalize_answer`): codecs filtered to the plan, ``a=recvonly``,
rejected sections reduced to port 0 and dropped from BUNDLE, ``a=end-of-candidates``,
and host candidates for the configured public addresses (:func:`add_host_candidates`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from whip.errors import HttpError

DEFAULT_MAX_BYTES = 32 * 1024
CONTENT_TYPE = "application/sdp"
RECEIVABLE_PROTOS = frozenset({"UDP/TLS/RTP/SAVPF", "RTP/SAVPF"})
H264_PROFILES = frozenset({0x42, 0x4D, 0x64})  # baseline family, main, high


class SdpError(HttpError):
    """The offer is not acceptable SDP (remote fault)."""

    http_status = 400
    code = "bad_sdp"


class SdpTooLargeError(SdpError):
    http_status = 413
    code = "sdp_too_large"


class UnsupportedMediaTypeError(SdpError):
    http_status = 415
    code = "unsupported_media_type"


class UnprocessableOfferError(SdpError):
    """Well-formed SDP this server cannot ingest."""

    http_status = 422
    code = "unprocessable_offer"


class NothingReceivableError(UnprocessableOfferError):
    code = "nothing_receivable"


class TooManyTracksError(UnprocessableOfferError):
    code = "too_many_tracks"


class AnswerMismatchError(HttpError):
    """The media stack's answer does not line up with the offer (local fault)."""

    http_status = 500
    code = "answer_mismatch"


class Direction(StrEnum):
    SENDRECV = "sendrecv"
    SENDONLY = "sendonly"
    RECVONLY = "recvonly"
    INACTIVE = "inactive"


@dataclass(frozen=True, slots=True)
class Codec:
    """One ``a=rtpmap`` (plus its ``a=fmtp`` parameters, in written order)."""

    payload_type: int
    name: str
    clock_rate: int
    channels: int | None = None
    params: tuple[tuple[str, str], ...] = ()

    @property
    def encoding(self) -> str:
        return self.name.lower()

    def param(self, key: str) -> str | None:
        """A format parameter by case-insensitive name."""
        key = key.lower()
        return next((v for k, v in self.params if k.lower() == key), None)


@dataclass(frozen=True, slots=True)
class MediaSection:
    index: int
    line: int
    kind: str
    port: int
    proto: str
    formats: tuple[str, ...]
    direction: Direction
    mid: str | None
    codecs: tuple[Codec, ...]  # in m= line order; formats without rtpmap are left out
    bundle_only: bool
    ice_ufrag: str | None
    ice_pwd: str | None
    fingerprints: tuple[str, ...]
    setup: str | None

    @property
    def active(self) -> bool:
        return self.port != 0 or self.bundle_only


@dataclass(frozen=True, slots=True)
class SessionDescription:
    origin: str
    name: str
    bundle: tuple[str, ...]
    media: tuple[MediaSection, ...]


@dataclass(frozen=True, slots=True)
class SectionPlan:
    """What the answer does with one offered media section."""

    index: int
    kind: str
    mid: str | None
    accepted: bool
    payload_types: tuple[int, ...] = ()  # receivable codecs, offer preference order
    rtx_payload_types: tuple[int, ...] = ()
    codecs: tuple[Codec, ...] = ()  # the codecs of payload_types
    reason: str | None = None  # why rejected

    @property
    def chosen(self) -> Codec | None:
        return self.codecs[0] if self.codecs else None


@dataclass(frozen=True, slots=True)
class OfferSummary:
    sections: tuple[SectionPlan, ...]
    bundle: tuple[str, ...]

    @property
    def accepted(self) -> tuple[SectionPlan, ...]:
        return tuple(s for s in self.sections if s.accepted)

    @property
    def audio(self) -> SectionPlan | None:
        return next((s for s in self.accepted if s.kind == "audio"), None)

    @property
    def video(self) -> SectionPlan | None:
        return next((s for s in self.accepted if s.kind == "video"), None)


# --- parsing ----------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`{|}~0-9A-Za-z]+")
_ICE_CHARS = re.compile(r"[A-Za-z0-9+/]{1,256}")
_PT = re.compile(r"\d{1,3}")
_PORT = re.compile(r"(\d{1,5})(?:/\d{1,5})?")
_RTPMAP = re.compile(r"(\d{1,3})\s+([^/\s]+)/(\d{1,7})(?:/(\d{1,3}))?\s*")
_FMTP = re.compile(r"(\d{1,3})(?:\s+(.*))?")
_FINGERPRINT = re.compile(r"[A-Za-z0-9-]+ [0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2})+")
_SETUP = frozenset({"actpass", "active", "passive", "holdconn"})
_DIRECTION_NAMES = frozenset(d.value for d in Direction)


@dataclass(slots=True)
class _Scope:
    """Transport and direction attributes of the session or of one media section."""

    direction: Direction | None = None
    ice_ufrag: str | None = None
    ice_pwd: str | None = None
    setup: str | None = None
    fingerprints: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Section:
    index: int
    line: int
    kind: str
    port: int
    proto: str
    formats: tuple[str, ...]
    scope: _Scope = field(default_factory=_Scope)
    mid: str | None = None
    bundle_only: bool = False
    rtpmap: dict[int, tuple[str, int, int | None]] = field(default_factory=dict)
    fmtp: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)


def _error(line: int, message: str) -> SdpError:
    return SdpError(f"line {line}: {message}")


def decode_body(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The body as text: 413 over ``max_bytes``; 400 when empty, not UTF-8 or binary."""
    if len(data) > max_bytes:
        raise SdpTooLargeError(f"SDP is {len(data)} bytes, the limit is {max_bytes}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SdpError(f"SDP is not UTF-8 text (invalid byte at offset {exc.start})") from None
    if not text.strip():
        raise SdpError("empty SDP body")
    bad = _CONTROL.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        raise _error(line, f"control character {bad.group()[:1]!r}: SDP is text")
    return text


def parse_offer(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> SessionDescription:
    """Decode and parse an offer body (see the module rules). Raises only SdpError."""
    return parse_description(decode_body(data, max_bytes=max_bytes))


def parse_description(text: str) -> SessionDescription:
    """Parse SDP text (offer or answer) by the module rules. Raises only SdpError."""
    lines: list[tuple[int, str, str]] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r")
        if not line:
            continue
        if len(line) < 2 or line[1] != "=" or not "a" <= line[0] <= "z":
            raise _error(number, f"not an SDP line (expected 'x=value'): {line[:40]!r}")
        lines.append((number, line[0], line[2:]))
    if not lines or lines[0][1:] != ("v", "0"):
        raise _error(lines[0][0] if lines else 1, "an SDP description starts with 'v=0'")
    session = _Scope()
    seen: dict[str, int] = {}
    origin = name = ""
    bundle: tuple[str, ...] = ()
    bundle_line = 0
    sections: list[_Section] = []
    for number, kind, value in lines[1:]:
        if kind in ("v", "o", "s"):
            if kind == "v" or sections or kind in seen:
                raise _error(number, f"unexpected '{kind}=' line")
            seen[kind] = number
            if kind == "o" and len(value.split()) != 6:
                raise _error(number, "o= needs six fields")
            origin, name = (value, name) if kind == "o" else (origin, value)
        elif kind == "m":
            sections.append(_media_line(number, value, len(sections)))
        elif kind == "a":
            attr, sep, rest = value.partition(":")
            if not _TOKEN.fullmatch(attr):
                raise _error(number, f"malformed attribute {value[:40]!r}")
            arg = rest if sep else None
            if sections:
                _media_attribute(sections[-1], number, attr, arg)
            elif attr == "group" and arg is not None and arg.split()[:1] == ["BUNDLE"]:
                if bundle_line:
                    raise _error(number, "more than one BUNDLE group")
                bundle, bundle_line = tuple(arg.split()[1:]), number
            else:
                _scope_attribute(session, number, attr, arg)
    for needed in "os":
        if needed not in seen:
            raise _error(lines[0][0], f"missing '{needed}=' line")
    if not sections:
        raise _error(lines[-1][0], "no media section (m=)")
    media = tuple(_finish(s, session) for s in sections)
    mids = [m.mid for m in media if m.mid is not None]
    for section in media:
        if section.mid is not None and mids.count(section.mid) > 1:
            raise _error(section.line, f"duplicate mid {section.mid!r}")
    for mid in bundle:
        if mid not in mids:
            raise _error(bundle_line, f"BUNDLE names unknown mid {mid!r}")
    return SessionDescription(origin, name, bundle, media)


def _media_line(number: int, value: str, index: int) -> _Section:
    fields = value.split()
    if len(fields) < 4 or not _TOKEN.fullmatch(fields[0]):
        raise _error(number, "m= needs '<media> <port> <proto> <fmt> ...'")
    port = _PORT.fullmatch(fields[1])
    if port is None or int(port.group(1)) > 65535:
        raise _error(number, f"bad port {fields[1][:20]!r}")
    proto, formats = fields[2], tuple(fields[3:])
    if "RTP/" in proto:
        for fmt in formats:
            if not _PT.fullmatch(fmt) or int(fmt) > 127:
                raise _error(number, f"bad payload type {fmt[:20]!r}")
        if len({int(f) for f in formats}) != len(formats):
            raise _error(number, "payload type listed twice")
    return _Section(index, number, fields[0], int(port.group(1)), proto, formats)


def _scope_attribute(scope: _Scope, number: int, attr: str, arg: str | None) -> bool:
    """Apply a direction/ICE/DTLS attribute to ``scope``; False if it is none of those."""
    if attr in _DIRECTION_NAMES:
        if scope.direction is not None:
            raise _error(number, "more than one direction attribute")
        scope.direction = Direction(attr)
    elif attr in ("ice-ufrag", "ice-pwd"):
        if arg is None or not _ICE_CHARS.fullmatch(arg):
            raise _error(number, f"malformed a={attr}")
        if getattr(scope, attr.replace("-", "_")) is not None:
            raise _error(number, f"a={attr} given twice")
        setattr(scope, attr.replace("-", "_"), arg)
    elif attr == "fingerprint":
        if arg is None or not _FINGERPRINT.fullmatch(arg.strip()):
            raise _error(number, "malformed a=fingerprint (expected '<hash> XX:XX:...')")
        scope.fingerprints.append(arg.strip())
    elif attr == "setup":
        if arg not in _SETUP or scope.setup is not None:
            raise _error(number, f"bad or repeated a=setup ({arg!r})")
        scope.setup = arg
    else:
        return False
    return True


def _media_attribute(section: _Section, number: int, attr: str, arg: str | None) -> None:
    if _scope_attribute(section.scope, number, attr, arg):
        return
    if attr == "mid":
        if not arg or not _TOKEN.fullmatch(arg) or section.mid is not None:
            raise _error(number, f"bad or repeated a=mid ({arg!r})")
        section.mid = arg
    elif attr == "bundle-only":
        section.bundle_only = True
    elif attr == "rtpmap":
        match = _RTPMAP.fullmatch(arg or "")
        if match is None or int(match.group(1)) > 127 or int(match.group(3)) == 0:
            raise _error(number, "malformed a=rtpmap (expected '<pt> <name>/<clock>[/<ch>]')")
        pt, enc, clock, channels = match.groups()
        if int(pt) in section.rtpmap:
            raise _error(number, f"second a=rtpmap for payload type {pt}")
        section.rtpmap[int(pt)] = (enc, int(clock), int(channels) if channels else None)
    elif attr == "fmtp":
        match = _FMTP.fullmatch(arg or "")
        if match is None or int(match.group(1)) > 127:
            raise _error(number, "malformed a=fmtp (expected '<pt> <parameters>')")
        if int(match.group(1)) in section.fmtp:
            raise _error(number, f"second a=fmtp for payload type {match.group(1)}")
        section.fmtp[int(match.group(1))] = _fmtp_params(match.group(2) or "")


def _fmtp_params(text: str) -> tuple[tuple[str, str], ...]:
    params: list[tuple[str, str]] = []
    for item in text.split(";"):
        key, _, value = item.partition("=")
        if key.strip():
            params.append((key.strip(), value.strip()))
    return tuple(params)


def _finish(section: _Section, session: _Scope) -> MediaSection:
    scope = section.scope
    codecs = []
    for fmt in section.formats if "RTP/" in section.proto else ():
        entry = section.rtpmap.get(int(fmt))
        if entry is not None:
            enc, clock, channels = entry
            codecs.append(Codec(int(fmt), enc, clock, channels, section.fmtp.get(int(fmt), ())))
    result = MediaSection(
        index=section.index,
        line=section.line,
        kind=section.kind,
        port=section.port,
        proto=section.proto,
        formats=section.formats,
        direction=scope.direction or session.direction or Direction.SENDRECV,
        mid=section.mid,
        codecs=tuple(codecs),
        bundle_only=section.bundle_only,
        ice_ufrag=scope.ice_ufrag or session.ice_ufrag,
        ice_pwd=scope.ice_pwd or session.ice_pwd,
        fingerprints=tuple(scope.fingerprints or session.fingerprints),
        setup=scope.setup or session.setup,
    )
    values = (result.ice_ufrag, result.ice_pwd, result.fingerprints)
    names = ("ice-ufrag", "ice-pwd", "fingerprint")
    missing = [name for name, value in zip(names, values, strict=True) if not value]
    if "RTP/" in result.proto and result.port != 0 and not result.bundle_only and missing:
        raise _error(section.line, f"media section {section.index} has no a={missing[0]}")
    return result


# --- offer policy -----------------------------------------------------------------------


def receivable(kind: str, codec: Codec) -> bool:
    """Whether the pipeline can decode ``codec`` in a section of ``kind`` (module rules)."""
    name = codec.encoding
    if kind == "video" and name == "h264" and codec.clock_rate == 90000:
        if codec.param("packetization-mode") != "1":
            return False
        plid = codec.param("profile-level-id")
        if plid is None:
            return True
        return (
            re.fullmatch(r"[0-9A-Fa-f]{6}", plid) is not None and int(plid[:2], 16) in H264_PROFILES
        )
    if kind == "video" and name == "vp8":
        return codec.clock_rate == 90000
    if kind == "audio" and name == "opus":
        return codec.clock_rate == 48000 and codec.channels == 2
    return False


def _rtx_for(codec: Codec, payload_types: set[int]) -> bool:
    apt = codec.param("apt") or ""
    return codec.encoding == "rtx" and _PT.fullmatch(apt) is not None and int(apt) in payload_types


def _describe(codec: Codec) -> str:
    text = f"{codec.name}/{codec.clock_rate}"
    if codec.encoding == "h264":
        mode = codec.param("packetization-mode") or "0"
        text += f" packetization-mode={mode} profile-level-id={codec.param('profile-level-id')}"
    return text


def _rejection(section: MediaSection) -> str | None:
    if section.kind not in ("audio", "video"):
        return f"{section.kind} sections are not ingested"
    if not section.active:
        return "disabled by the offer (port 0)"
    if section.proto not in RECEIVABLE_PROTOS:
        return f"transport {section.proto} is not supported"
    if section.direction not in (Direction.SENDONLY, Direction.SENDRECV):
        return f"direction {section.direction}: a WHIP publisher must send"
    return None


def _plan(section: MediaSection) -> SectionPlan:
    base = (section.index, section.kind, section.mid)
    reason = _rejection(section)
    if reason is not None:
        return SectionPlan(*base, False, reason=reason)
    kept = tuple(c for c in section.codecs if receivable(section.kind, c))
    if not kept:
        offered = ", ".join(map(_describe, section.codecs)) or "none"
        return SectionPlan(*base, False, reason=f"no receivable codec (offered: {offered})")
    pts = tuple(c.payload_type for c in kept)
    rtx = tuple(c.payload_type for c in section.codecs if _rtx_for(c, set(pts)))
    return SectionPlan(*base, True, pts, rtx, kept)


def plan_offer(offer: SessionDescription) -> OfferSummary:
    """Decide per section what the answer accepts (module rules). Raises 422 errors."""
    for kind in ("audio", "video"):
        sending = [s for s in offer.media if s.kind == kind and _rejection(s) is None]
        if len(sending) > 1:
            where = ", ".join(f"line {s.line}" for s in sending)
            raise TooManyTracksError(
                f"{len(sending)} sending {kind} sections ({where}); one allowed"
            )
    summary = OfferSummary(tuple(map(_plan, offer.media)), offer.bundle)
    if not summary.accepted:
        why = "; ".join(f"section {p.index} ({p.kind}): {p.reason}" for p in summary.sections)
        raise NothingReceivableError(f"nothing receivable in the offer: {why}")
    return summary


def check_offer(data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> OfferSummary:
    """Parse and plan an offer body. Raises only :class:`SdpError` subclasses."""
    return plan_offer(parse_offer(data, max_bytes=max_bytes))


def check_content_type(value: str | None) -> None:
    """415 unless the Content-Type is ``application/sdp`` (parameters ignored)."""
    if (value or "").split(";")[0].strip().lower() != CONTENT_TYPE:
        raise UnsupportedMediaTypeError(f"Content-Type must be {CONTENT_TYPE}, got {value!r}")


# --- answer policy ----------------------------------------------------------------------

_DIRECTIONS = tuple(f"a={d}" for d in Direction)


def _blocks(sdp: str) -> tuple[list[str], list[list[str]]]:
    session: list[str] = []
    media: list[list[str]] = []
    for raw in sdp.split("\n"):
        line = raw.removesuffix("\r")
        if line.startswith("m="):
            media.append([line])
        elif line:
            (media[-1] if media else session).append(line)
    return session, media


def _join(session: list[str], media: list[list[str]]) -> str:
    return "\r\n".join([*session, *(line for block in media for line in block)]) + "\r\n"


def _pt_of(line: str) -> int | None:
    """The payload type an rtpmap/fmtp/rtcp-fb line is about, or None."""
    for prefix in ("a=rtpmap:", "a=fmtp:", "a=rtcp-fb:"):
        if line.startswith(prefix):
            head = line[len(prefix) :].split(" ", 1)[0]
            return int(head) if _PT.fullmatch(head) else None
    return None


def _filter_block(block: list[str], keep: set[int]) -> list[str] | None:
    kind, port, proto, *formats = block[0][2:].split()
    kept = [f for f in formats if _PT.fullmatch(f) and int(f) in keep]
    if not kept:
        return None
    lines = [f"m={kind} {port} {proto} {' '.join(kept)}"]
    for line in block[1:]:
        pt = _pt_of(line)
        if line in _DIRECTIONS and "a=recvonly" not in lines:
            lines.append("a=recvonly")  # the first direction line becomes recvonly, in place
        elif line not in _DIRECTIONS and (pt is None or pt in keep):
            lines.append(line)
    if "a=recvonly" not in lines:
        mid = next((i for i, line in enumerate(lines) if line.startswith("a=mid:")), 0)
        lines.insert(mid + 1, "a=recvonly")
    return lines


def _rejected_block(block: list[str]) -> list[str]:
    kind, _port, proto, *formats = block[0][2:].split()
    keep = [line for line in block[1:] if line.startswith(("c=", "a=mid:"))]
    return [f"m={kind} 0 {proto} {formats[0] if formats else '0'}", *keep]


def _candidate(line: str) -> tuple[str, int, str, int] | None:
    """(transport, component, address, port) of an ``a=candidate`` host line."""
    parts = line.removeprefix("a=candidate:").split()
    if not line.startswith("a=candidate:") or len(parts) < 8 or parts[6:8] != ["typ", "host"]:
        return None
    if not parts[1].isdigit() or not parts[5].isdigit():
        return None
    return parts[2].lower(), int(parts[1]), parts[4], int(parts[5])


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        return None


def _host_candidates(block: list[str], hosts: Sequence[str]) -> list[str]:
    existing = [c for c in map(_candidate, block) if c is not None and c[0] == "udp"]
    added: list[str] = []
    for i, ip in enumerate(map(ipaddress.ip_address, hosts)):
        if not existing or any(_ip(c[2]) == ip for c in existing):
            continue
        for component in sorted({c[1] for c in existing}):
            mine = [c for c in existing if c[1] == component]
            same_family = [c for c in mine if (a := _ip(c[2])) and a.version == ip.version]
            port = (same_family or mine)[0][3]
            foundation = hashlib.sha256(f"public {ip}".encode()).hexdigest()[:16]
            priority = (126 << 24) | ((65534 - i) << 8) | (256 - component)
            added.append(
                f"a=candidate:{foundation} {component} udp {priority} {ip} {port} typ host"
            )
    if not added:
        return block
    last = max(i for i, line in enumerate(block) if line.startswith("a=candidate:"))
    return [*block[: last + 1], *added, *block[last + 1 :]]


def _end_of_candidates(block: list[str]) -> list[str]:
    if "a=end-of-candidates" in block:
        return block
    candidates = [i for i, line in enumerate(block) if line.startswith("a=candidate:")]
    at = candidates[-1] + 1 if candidates else len(block)
    return [*block[:at], "a=end-of-candidates", *block[at:]]


def add_host_candidates(sdp: str, hosts: Sequence[str]) -> str:
    """Add a UDP host candidate per address in ``hosts`` to every section with candidates.

    The port is the one of an existing UDP host candidate of the same component (of the
    same address family when there is one): the public address is expected to forward to
    the server's socket. Addresses already present are skipped. ``hosts`` must be IP
    literals (ValueError otherwise).
    """
    session, media = _blocks(sdp)
    return _join(session, [_host_candidates(block, hosts) for block in media])


def finalize_answer(sdp: str, summary: OfferSummary, public_hosts: Sequence[str] = ()) -> str:
    """Apply the answer policy to the media stack's answer for the offer of ``summary``.

    Accepted sections keep only the plan's payload types (and their rtpmap/fmtp/rtcp-fb
    lines), say ``a=recvonly``, list host candidates for ``public_hosts`` and end with
    ``a=end-of-candidates``. Rejected sections, and accepted ones left without a codec,
    become ``m=<kind> 0 <proto> <fmt>`` with only ``c=`` and ``a=mid`` and leave BUNDLE.
    Raises :class:`AnswerMismatchError` when the answer's sections do not match the
    offer's, :class:`NothingReceivableError` when no section is left.
    """
    session, media = _blocks(sdp)
    if len(media) != len(summary.sections):
        raise AnswerMismatchError(
            f"answer has {len(media)} media sections, the offer {len(summary.sections)}"
        )
    rejected: set[str] = set()
    out: list[list[str]] = []
    accepted = 0
    for plan, block in zip(summary.sections, media, strict=True):
        mid = next((line[6:] for line in block if line.startswith("a=mid:")), None)
        if plan.mid is not None and mid != plan.mid:
            raise AnswerMismatchError(f"answer section {plan.index} has mid {mid!r}")
        keep = {*plan.payload_types, *plan.rtx_payload_types}
        filtered = _filter_block(block, keep) if plan.accepted else None
        if filtered is None:
            out.append(_rejected_block(block))
            rejected.add(mid or "")
            continue
        accepted += 1
        out.append(_end_of_candidates(_host_candidates(filtered, public_hosts)))
    if not accepted:
        raise NothingReceivableError("the media stack accepted none of the receivable codecs")
    session = [_without_mids(line, rejected) for line in session if line not in _DIRECTIONS]
    return _join([line for line in session if line != "a=group:BUNDLE"], out)


def _without_mids(line: str, mids: set[str]) -> str:
    if not line.startswith("a=group:BUNDLE"):
        return line
    return " ".join(word for word in line.split(" ") if word not in mids)
