"""A bounded reader of STUN Binding requests for the one-port UDP mux (RFC 8489, RFC 7983).

Rules, in the order they are applied to one datagram:

1. At most :data:`MAX_DATAGRAM` (1500) bytes are considered; a longer datagram is
   :attr:`StunFault.OVERSIZE` before any byte is read.
2. STUN or not (RFC 7983 section 7, RFC 8489 section 5): at least the 20-byte header,
   a first byte of 0..3 (the two top bits of the type are zero) and the magic cookie
   0x2112A442. Anything else (DTLS 20..63, RTP/RTCP 128..191, garbage) is
   :attr:`StunFault.NOT_STUN`.
3. Only a Binding request (message type 0x0001) is read further; every other STUN
   message (a response, an error response, an indication, another method) is
   :attr:`StunFault.NOT_BINDING_REQUEST`.
4. The header's length must equal the bytes that follow it and be a multiple of 4;
   every attribute (type, length, value, padding to 4) must lie inside the message;
   MESSAGE-INTEGRITY must be 20 bytes and FINGERPRINT 4 bytes and the last attribute.
   A violation is :attr:`StunFault.MALFORMED`.
5. Attributes after MESSAGE-INTEGRITY are ignored, except FINGERPRINT (RFC 8489 section
   14.5: they are not authenticated), so a USERNAME placed after it does not count. Of a
   repeated attribute only the first is read (RFC 8489 section 14).
6. FINGERPRINT, when present, must match (CRC-32 of the message before it, XOR
   0x5354554E); otherwise :attr:`StunFault.BAD_FINGERPRINT`.

Work per datagram is bounded: one pass over at most 1500 bytes (at most 370 attribute
headers), one CRC-32 when FINGERPRINT is present, no attribute value decoded. USERNAME is
returned as the raw bytes; no string is built. MESSAGE-INTEGRITY is checked only when the
caller asks (:meth:`BindingRequest.integrity_matches`), so the caller decides, from the
USERNAME, whether the HMAC-SHA1 is worth computing.

Why not :func:`aioice.stun.parse_message`: it checks neither the magic cookie nor the
length's alignment nor FINGERPRINT's position, raises ``struct.error`` (not
``ValueError``) on a truncated numeric attribute, and decodes every attribute (XOR
addresses byte by byte). The cryptography is aioice's own, public,
:func:`aioice.stun.message_integrity` and :func:`aioice.stun.message_fingerprint`: the
functions a publisher built on aiortc signs its requests with.
"""

from __future__ import annotations

import enum
import hmac
import struct
from dataclasses import dataclass

from aioice.stun import message_fingerprint, message_integrity

MAX_DATAGRAM = 1500
"""The longest datagram read as a STUN message (an Ethernet MTU; ICE checks are ~100)."""

HEADER_LENGTH = 20
MAGIC_COOKIE = b"\x21\x12\xa4\x42"
BINDING_REQUEST_TYPE = b"\x00\x01"
"""The first two bytes of every Binding request (method 0x001, class request)."""

ATTR_USERNAME = 0x0006
ATTR_MESSAGE_INTEGRITY = 0x0008
ATTR_FINGERPRINT = 0x8028
INTEGRITY_VALUE_LENGTH = 20
FINGERPRINT_VALUE_LENGTH = 4

_ATTRIBUTE_HEADER = struct.Struct("!HH")
_FINGERPRINT_VALUE = struct.Struct("!I")


class StunFault(enum.Enum):
    """Why a datagram is not a usable Binding request (the values are metric labels)."""

    # Members are singletons compared by identity: hashing by identity keeps a drop off
    # Enum.__hash__ (a Python-level hash of the name, about 4x a dict hit).
    __hash__ = object.__hash__

    OVERSIZE = "oversize"
    NOT_STUN = "not_stun"
    NOT_BINDING_REQUEST = "not_binding_request"
    MALFORMED = "malformed"
    BAD_FINGERPRINT = "bad_fingerprint"


@dataclass(slots=True)
class BindingRequest:
    """A structurally valid Binding request (module rules 1-6 passed); read-only by
    convention (one is built per datagram, and a frozen dataclass's ``__init__`` costs
    five times as much).

    ``username`` is the first USERNAME before MESSAGE-INTEGRITY (raw bytes) or ``None``;
    ``integrity_offset`` is where MESSAGE-INTEGRITY starts (the bytes it covers end
    there) or ``None`` when it is absent; ``integrity`` is its 20-byte value.
    """

    datagram: bytes
    username: bytes | None
    integrity_offset: int | None
    integrity: bytes
    has_fingerprint: bool

    def integrity_matches(self, key: bytes) -> bool:
        """Whether MESSAGE-INTEGRITY verifies with ``key`` (ICE short-term credentials:
        the receiver's password, UTF-8); ``False`` when it is absent. One HMAC-SHA1 over
        the bytes before it, the header's length set as RFC 8489 section 14.5 says."""
        if self.integrity_offset is None:
            return False
        expected = message_integrity(self.datagram[: self.integrity_offset], key)
        return hmac.compare_digest(self.integrity, expected)


def read_binding_request(datagram: bytes) -> BindingRequest | StunFault:
    """Read ``datagram`` as a Binding request, or say why it is not one (module rules).
    Never raises for any input."""
    size = len(datagram)
    if size > MAX_DATAGRAM:
        return StunFault.OVERSIZE
    if size < HEADER_LENGTH or datagram[0] > 3 or datagram[4:8] != MAGIC_COOKIE:
        return StunFault.NOT_STUN
    if datagram[0:2] != BINDING_REQUEST_TYPE:
        return StunFault.NOT_BINDING_REQUEST
    body_length = (datagram[2] << 8) | datagram[3]
    if body_length != size - HEADER_LENGTH or body_length % 4:
        return StunFault.MALFORMED

    username: bytes | None = None
    integrity_offset: int | None = None
    integrity = b""
    fingerprint_offset: int | None = None
    fingerprint = 0
    pos = HEADER_LENGTH
    while pos < size:
        if fingerprint_offset is not None or pos + 4 > size:
            return StunFault.MALFORMED  # an attribute after FINGERPRINT, or a cut header
        attr_type, attr_length = _ATTRIBUTE_HEADER.unpack_from(datagram, pos)
        value_start = pos + 4
        value_end = value_start + attr_length
        next_pos = value_end + (-attr_length % 4)
        if next_pos > size:
            return StunFault.MALFORMED
        if attr_type == ATTR_FINGERPRINT:
            if attr_length != FINGERPRINT_VALUE_LENGTH:
                return StunFault.MALFORMED
            fingerprint_offset = pos
            (fingerprint,) = _FINGERPRINT_VALUE.unpack_from(datagram, value_start)
        elif integrity_offset is not None:
            pass  # after MESSAGE-INTEGRITY: not authenticated, ignored (rule 5)
        elif attr_type == ATTR_MESSAGE_INTEGRITY:
            if attr_length != INTEGRITY_VALUE_LENGTH:
                return StunFault.MALFORMED
            integrity_offset = pos
            integrity = datagram[value_start:value_end]
        elif attr_type == ATTR_USERNAME and username is None:
            username = datagram[value_start:value_end]
        pos = next_pos

    if fingerprint_offset is not None and fingerprint != message_fingerprint(
        datagram[:fingerprint_offset]
    ):
        return StunFault.BAD_FINGERPRINT
    return BindingRequest(
        datagram=datagram,
        username=username,
        integrity_offset=integrity_offset,
        integrity=integrity,
        has_fingerprint=fingerprint_offset is not None,
    )
