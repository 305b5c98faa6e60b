"""VP9 RTP depacketizer (RFC 9628), sans-IO; output a VP9 frame or superframe.

RFC 9628 rules applied:

- 4.2 payload descriptor, first octet ``I P L F B E V Z``: I, a picture ID follows (M
  set: 15 bits, else 7); P, the frame is inter-picture predicted; L, layer indices
  follow (``TID(3) U SID(3) D``); F, flexible mode; B and E, the start and end of a
  layer frame; V, a scalability structure (SS) follows; Z, not a reference for upper
  spatial layers.
- Flexible mode (F=1) with P=1: 1 to 3 reference indices ``P_DIFF(7) N`` (N: another
  follows; a fourth is ``too_many_p_diff``, a P_DIFF of 0 is ``bad_p_diff``).
  Non-flexible mode (F=0) with L=1: the TL0PICIDX octet.
- 4.2.1 SS: ``N_S(3) Y G``, then with Y, N_S+1 pairs of 16-bit width and height; with G,
  N_G and N_G picture-group entries ``T(3) U R(2)`` each followed by R P_DIFF octets.
  The latest SS seen is kept (:attr:`Vp9Depacketizer.scalability`).
- Any field past the payload is ``truncated``; a descriptor with no frame data after it
  is ``no_payload``.
- 4.1 / 4.4: a picture is every layer frame of one RTP timestamp, the marker bit is on
  its last packet. With spatial layers a picture has several frames; the frame step
  returns them as one superframe (VP9 Annex B: the frames back to back, then the
  superframe index), which both FFmpeg's ``vp9`` decoder (its superframe-split filter)
  and libvpx take. A layer frame that is itself a superframe is split first; more than 8
  frames in one picture is ``superframe_too_large``. One layer frame is returned as is.
- ``keyframe``: P clear on the first packet (B) of the base spatial layer (SID 0, or no
  layer indices). ``frame_start``: B on the base spatial layer. The flag is the sender's
  claim: FFmpeg's packetizer (``rtpenc_vp9.c``) never sets P, so every picture it sends
  claims it; the intake must use :func:`pipeline.keyframes.vp9_is_keyframe`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.rtp_payload.depacketizer import (
    DEFAULT_MAX_FRAME_BYTES,
    AssembledFrame,
    DepacketizedPacket,
    Depacketizer,
)
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.fragments import CONTINUED, CONTINUES, KEY, element, join_units

I_BIT = 0x80
P_BIT = 0x40
L_BIT = 0x20
F_BIT = 0x10
B_BIT = 0x08
E_BIT = 0x04
V_BIT = 0x02
Z_BIT = 0x01
MAX_P_DIFFS = 3
SUPERFRAME_MAX_FRAMES = 8


@dataclass(frozen=True, slots=True)
class PictureGroupEntry:
    """One picture of the SS picture group (non-flexible mode's reference pattern)."""

    temporal_id: int
    switching_up: bool
    reference_diffs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ScalabilityStructure:
    """RFC 9628 4.2.1 SS."""

    spatial_layers: int
    resolutions: tuple[tuple[int, int], ...]
    """``(width, height)`` per spatial layer, lowest first; empty when Y is clear."""
    picture_group: tuple[PictureGroupEntry, ...]


@dataclass(frozen=True, slots=True)
class Vp9Descriptor:
    """RFC 9628 4.2 payload descriptor of one packet."""

    picture_id: int | None
    inter_predicted: bool
    flexible: bool
    begins: bool
    ends: bool
    not_upper_reference: bool
    temporal_id: int | None
    switching_up: bool
    spatial_id: int | None
    inter_layer_dependency: bool
    tl0_picture_index: int | None
    reference_diffs: tuple[int, ...]
    scalability: ScalabilityStructure | None
    size: int
    """Bytes of the descriptor: the frame data starts there."""


def _byte(payload: bytes, offset: int) -> int:
    if offset >= len(payload):
        raise PayloadError("truncated", "descriptor past the payload")
    return payload[offset]


def _scalability(payload: bytes, offset: int) -> tuple[ScalabilityStructure, int]:
    head = _byte(payload, offset)
    offset += 1
    layers = (head >> 5) + 1
    resolutions: list[tuple[int, int]] = []
    if head & 0x10:
        if offset + 4 * layers > len(payload):
            raise PayloadError("truncated", "SS resolutions past the payload")
        for _ in range(layers):
            width = int.from_bytes(payload[offset : offset + 2])
            height = int.from_bytes(payload[offset + 2 : offset + 4])
            resolutions.append((width, height))
            offset += 4
    group: list[PictureGroupEntry] = []
    if head & 0x08:
        count = _byte(payload, offset)
        offset += 1
        for _ in range(count):
            entry = _byte(payload, offset)
            references = (entry >> 2) & 0x03
            if offset + 1 + references > len(payload):
                raise PayloadError("truncated", "SS picture group past the payload")
            diffs = tuple(payload[offset + 1 : offset + 1 + references])
            group.append(PictureGroupEntry(entry >> 5, bool(entry & 0x10), diffs))
            offset += 1 + references
    return ScalabilityStructure(layers, tuple(resolutions), tuple(group)), offset


def parse_descriptor(payload: bytes) -> Vp9Descriptor:
    """The payload descriptor of one VP9 RTP payload (rules in the module docstring)."""
    first = _byte(payload, 0)
    offset = 1
    picture_id: int | None = None
    if first & I_BIT:
        high = _byte(payload, offset)
        if high & 0x80:
            picture_id = ((high & 0x7F) << 8) | _byte(payload, offset + 1)
            offset += 2
        else:
            picture_id = high
            offset += 1
    flexible = bool(first & F_BIT)
    temporal_id: int | None = None
    spatial_id: int | None = None
    switching_up = dependency = False
    tl0: int | None = None
    if first & L_BIT:
        layers = _byte(payload, offset)
        offset += 1
        temporal_id = layers >> 5
        switching_up = bool(layers & 0x10)
        spatial_id = (layers >> 1) & 0x07
        dependency = bool(layers & 0x01)
        if not flexible:
            tl0 = _byte(payload, offset)
            offset += 1
    diffs: list[int] = []
    if flexible and first & P_BIT:
        while True:
            if len(diffs) == MAX_P_DIFFS:
                raise PayloadError("too_many_p_diff", f"more than {MAX_P_DIFFS} P_DIFF")
            reference = _byte(payload, offset)
            offset += 1
            if reference >> 1 == 0:
                raise PayloadError("bad_p_diff", "P_DIFF 0")
            diffs.append(reference >> 1)
            if not reference & 0x01:
                break
    scalability: ScalabilityStructure | None = None
    if first & V_BIT:
        scalability, offset = _scalability(payload, offset)
    return Vp9Descriptor(
        picture_id=picture_id,
        inter_predicted=bool(first & P_BIT),
        flexible=flexible,
        begins=bool(first & B_BIT),
        ends=bool(first & E_BIT),
        not_upper_reference=bool(first & Z_BIT),
        temporal_id=temporal_id,
        switching_up=switching_up,
        spatial_id=spatial_id,
        inter_layer_dependency=dependency,
        tl0_picture_index=tl0,
        reference_diffs=tuple(diffs),
        scalability=scalability,
        size=offset,
    )


def split_superframe(data: bytes) -> list[bytes]:
    """The frames of a VP9 superframe (VP9 Annex B), or ``[data]`` when it has no index.
    Raises :class:`PayloadError` (``bad_superframe_index``) when the index's sizes do
    not fit the data."""
    if not data:
        return [data]
    marker = data[-1]
    if marker & 0xE0 != 0xC0:
        return [data]
    count = (marker & 0x07) + 1
    width = ((marker >> 3) & 0x03) + 1
    index_size = 2 + width * count
    if len(data) < index_size or data[-index_size] != marker:
        return [data]
    frames: list[bytes] = []
    offset = 0
    position = len(data) - index_size + 1
    for _ in range(count):
        size = int.from_bytes(data[position : position + width], "little")
        position += width
        if size > len(data) - index_size - offset:
            raise PayloadError("bad_superframe_index", f"a frame of {size} bytes")
        if size:
            frames.append(data[offset : offset + size])
        offset += size
    return frames


def build_superframe(frames: list[bytes]) -> bytes:
    """One superframe of ``frames`` (2..8 frames), with the shortest size field."""
    largest = max(len(frame) for frame in frames)
    width = 1 if largest < 1 << 8 else 2 if largest < 1 << 16 else 3 if largest < 1 << 24 else 4
    marker = bytes((0xC0 | (width - 1) << 3 | (len(frames) - 1),))
    sizes = b"".join(len(frame).to_bytes(width, "little") for frame in frames)
    return b"".join((*frames, marker, sizes, marker))


class Vp9Depacketizer(Depacketizer):
    """RFC 9628 payloads to VP9 frames or superframes (see the module rules)."""

    codec = "VP9"

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        super().__init__(max_frame_bytes=max_frame_bytes)
        self.scalability: ScalabilityStructure | None = None
        """The latest SS a packet carried (spatial layers and their resolutions)."""

    def _packet(self, payload: bytes) -> DepacketizedPacket:
        descriptor = parse_descriptor(payload)
        if descriptor.size >= len(payload):
            raise PayloadError("no_payload", "a descriptor with no frame data")
        if descriptor.scalability is not None:
            self.scalability = descriptor.scalability
        begins = descriptor.begins
        base = begins and not descriptor.spatial_id
        key = base and not descriptor.inter_predicted
        flags = (0 if begins else CONTINUES) | (0 if descriptor.ends else CONTINUED)
        if key:
            flags |= KEY
        data = element(flags, payload[descriptor.size :])
        return DepacketizedPacket(data, begins, descriptor.ends, base, key)

    def _frame(self, data: bytes) -> AssembledFrame:
        units = join_units(data, self.max_frame_bytes)
        hint = bool(units[0].flags & KEY)
        if len(units) == 1:
            return AssembledFrame(units[0].body, hint)
        frames = [frame for unit in units for frame in split_superframe(unit.body)]
        if len(frames) > SUPERFRAME_MAX_FRAMES:
            raise PayloadError("superframe_too_large", f"{len(frames)} frames in one picture")
        if len(frames) == 1:
            return AssembledFrame(frames[0], hint)
        return AssembledFrame(build_superframe(frames), hint)
