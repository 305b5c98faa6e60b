"""A VP9 RTP packetizer (RFC 9628) for the OBS-shaped publisher: libdatachannel has none.

What it writes, as libwebrtc does for a single spatial and temporal layer:

- **Payload descriptor** (RFC 9628 4.2), non-flexible mode: ``I`` set with a 15-bit
  picture id (``M`` set), incremented per frame from a random start; ``P`` on inter
  frames (not on a key frame); ``L`` clear (one layer: no layer indices, no TL0PICIDX);
  ``F`` clear; ``B`` on a frame's first packet, ``E`` on its last; ``Z`` clear.
- **Scalability structure** (``V``, 4.2.1) on the first packet of each key frame: one
  spatial layer (``N_S = 0``), ``Y`` with the key frame's width and height (read from its
  uncompressed header, VP9 spec 6.2; omitted, ``Y`` clear, when the header cannot be read)
  and ``G`` with a one-picture group (``T = 0``, ``U`` clear, one reference, ``P_DIFF =
  1``: libwebrtc's single temporal layer structure).
- **RTP header**: version 2, no extensions or CSRCs, the marker bit on the frame's last
  packet, the sequence number from a random start, the timestamp ``timestamp_base +
  timestamp`` (90 kHz). Each packet's payload (descriptor and frame bytes) is at most
  ``max_payload`` bytes.

A frame is one encoder packet: a VP9 frame or a superframe (frames and their index, VP9
Annex B), which RFC 9628 carries whole like a frame. The packets are sent through a
libdatachannel track whose media handler chain has no packetizer (an RTCP sender reporter
and a NACK responder): libdatachannel sends each ``Track.send`` as one RTP packet.
"""

from __future__ import annotations

import random
import struct

from pipeline.bitreader import BitstreamError
from pipeline.stream_profile import read_vp9_keyframe_size

I_BIT, P_BIT, B_BIT, E_BIT, V_BIT = 0x80, 0x40, 0x08, 0x04, 0x02
RTP_HEADER = struct.Struct("!BBHII")


def keyframe_size(frame: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of a VP9 key frame's uncompressed header, or None when ``frame``
    does not start with a readable key frame (the server's reader:
    :func:`pipeline.stream_profile.read_vp9_keyframe_size`)."""
    try:
        return read_vp9_keyframe_size(frame)
    except BitstreamError:
        return None


class Vp9Packetizer:
    """RTP packets of VP9 frames (module doc) for one SSRC."""

    def __init__(
        self,
        ssrc: int,
        payload_type: int,
        *,
        max_payload: int = 1200,
        timestamp_base: int | None = None,
        sequence: int | None = None,
        picture_id: int | None = None,
    ) -> None:
        self.ssrc = ssrc
        self.payload_type = payload_type
        self.max_payload = max_payload
        self.timestamp_base = (
            random.randrange(1 << 32) if timestamp_base is None else timestamp_base
        )
        self.sequence = random.randrange(1 << 16) if sequence is None else sequence
        self.picture_id = random.randrange(1 << 15) if picture_id is None else picture_id

    def rtp_timestamp(self, timestamp: int) -> int:
        """The RTP timestamp a frame stamped ``timestamp`` (90 kHz) is sent with."""
        return (self.timestamp_base + timestamp) & 0xFFFFFFFF

    def descriptor(self, size: tuple[int, int] | None, inter: bool, first: bool) -> bytearray:
        """The payload descriptor of one packet, without ``E`` (the caller sets it)."""
        flags = I_BIT | (P_BIT if inter else 0) | (B_BIT if first else 0)
        out = bytearray([flags, 0x80 | (self.picture_id >> 8), self.picture_id & 0xFF])
        if first and not inter:
            out[0] |= V_BIT
            # N_S = 0 (one spatial layer), Y when the size is known, G
            out.append((0x10 if size is not None else 0) | 0x08)
            if size is not None:
                out += struct.pack("!HH", *size)
            out += bytes([1, 0x04, 1])  # N_G = 1: T=0 U=0 R=1, P_DIFF 1
        return out

    def packetize(self, frame: bytes, timestamp: int) -> list[bytes]:
        """The RTP packets of one frame (decode order), stamped ``timestamp`` (90 kHz)."""
        if not frame:
            raise ValueError("an empty VP9 frame")
        size = keyframe_size(frame)
        inter = size is None
        stamp = self.rtp_timestamp(timestamp)
        packets: list[bytes] = []
        at = 0
        while at < len(frame):
            descriptor = self.descriptor(size, inter, first=at == 0)
            room = self.max_payload - len(descriptor)
            if room <= 0:
                raise ValueError("max_payload leaves no room for frame data")
            chunk = frame[at : at + room]
            at += len(chunk)
            last = at >= len(frame)
            if last:
                descriptor[0] |= E_BIT
            header = RTP_HEADER.pack(
                0x80,
                (0x80 if last else 0) | self.payload_type,
                self.sequence,
                stamp,
                self.ssrc,
            )
            packets.append(header + bytes(descriptor) + chunk)
            self.sequence = (self.sequence + 1) & 0xFFFF
        self.picture_id = (self.picture_id + 1) & 0x7FFF
        return packets
