"""Parsing an SDP offer. Pure: bytes in, a :class:`SessionDescription` out.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from whip.sdp.model import (
    Codec,
    Direction,
    MediaSection,
    SdpError,
    SdpTooLargeError,
    SessionDescription,
)

DEFAULT_MAX_BYTES = 32 * 1024

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]|\r(?!\n)")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`{|}~0-9A-Za-z]+")
_ICE_CHARS = re.compile(r"[A-Za-z0-9+/]{1,256}")
PAYLOAD_TYPE = re.compile(r"\d{1,3}")
"""A payload type as SDP writes it (range-checked where it is used)."""
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
            if not PAYLOAD_TYPE.fullmatch(fmt) or int(fmt) > 127:
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
