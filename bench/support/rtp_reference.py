"""A reference RTP packetizer: real frames encoded with PyAV, packetized by FFmpeg's ``rtp``
muxer (PyAV's bundled FFmpeg: ``rtpenc_h264_hevc.c``, ``rtpenc_av1.c``, ``rtpenc_vp9.c``).

Rules:

- Encoding is deterministic for a given (codec, size, count): a synthetic moving
  pattern, no timestamps from the clock. The encoders are configured so the streams
  exercise what the depacketizers must handle: an SPS and PPS on every IDR, which the
  muxer puts in a STAP-A, alone or in FU-A fragments as ``mtu`` allows (libx264),
  B-frames and CRA pictures (libx265), hidden frames and ``show_existing_frame``
  (libsvtav1's random-access structure), superframes with hidden alt-ref frames
  (libvpx-vp9 ``auto-alt-ref``).
- The muxer writes through a Python file object whose buffer is ``mtu`` bytes; FFmpeg's
  RTP muxer flushes after each packet, so each ``write`` is exactly one RTP or RTCP
  packet (RTCP, payload types 200..204, is left out). :func:`parse_rtp` checks the
  version and lengths, so a coalesced write fails loudly instead of passing as one packet.
- :func:`jitter_frames` joins per-packet outputs the way aiortc's jitter buffer does: one
  frame per run of consecutive packets with one RTP timestamp, ``packet._data`` joined.
- Used by ``tests/test_rtp_payload_*.py``, ``tests/test_rtc_layer_size.py``,
  ``bench/rtp_payload.py`` and ``bench/simulcast.py`` (one copy, here:
  bench/ never imports tests/).
"""

from __future__ import annotations

import fractions
import functools
import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import av
import numpy as np

RTCP_TYPES = range(200, 205)


@dataclass(frozen=True, slots=True)
class RtpPacket:
    """The RTP fields a depacketizer test needs."""

    sequence: int
    timestamp: int
    marker: bool
    payload_type: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class EncoderSetup:
    """How one codec is encoded, packetized and decoded here."""

    encoder: str
    muxer_codec: str
    decoder: str
    options: dict[str, str]


SETUPS: dict[str, EncoderSetup] = {
    "H264": EncoderSetup(
        "libx264",
        "h264",
        "h264",
        {"preset": "ultrafast", "tune": "zerolatency", "bf": "0", "g": "10"},
    ),
    "H265": EncoderSetup(
        "libx265",
        "hevc",
        "hevc",
        {"preset": "ultrafast", "x265-params": "log-level=error:keyint=10:bframes=3"},
    ),
    "AV1": EncoderSetup(
        "libsvtav1",
        "av1",
        "libdav1d",
        {"preset": "12", "g": "10", "svtav1-params": "keyint=10"},
    ),
    "VP9": EncoderSetup(
        "libvpx-vp9",
        "vp9",
        "vp9",
        {"deadline": "good", "cpu-used": "8", "auto-alt-ref": "1", "lag-in-frames": "8", "g": "10"},
    ),
}


def pattern(index: int, width: int, height: int) -> av.VideoFrame:
    """Frame ``index`` of a deterministic moving pattern (gradients, a moving block)."""
    ys, xs = np.mgrid[0:height, 0:width]
    rgb = np.empty((height, width, 3), np.uint8)
    rgb[:, :, 0] = (xs * 255 // max(width - 1, 1) + index * 7) % 256
    rgb[:, :, 1] = (ys * 255 // max(height - 1, 1) + index * 3) % 256
    rgb[:, :, 2] = ((xs // 16 + ys // 16 + index) % 2) * 200
    x0 = (index * 11) % max(width - width // 4, 1)
    rgb[height // 3 : height // 3 + height // 4, x0 : x0 + width // 4] = (250, 250, 40)
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
    frame.pts = index
    frame.time_base = fractions.Fraction(1, 30)
    return frame


def encode(codec: str, count: int, width: int, height: int) -> list[av.Packet]:
    """``count`` frames of :func:`pattern` encoded for ``codec`` (``H264``, ``H265``,
    ``AV1``, ``VP9``), in decoding order, flushed."""
    setup = SETUPS[codec]
    context = av.CodecContext.create(setup.encoder, "w")
    context.width = width
    context.height = height
    context.pix_fmt = "yuv420p"
    context.time_base = fractions.Fraction(1, 30)
    context.framerate = fractions.Fraction(30, 1)
    context.options = dict(setup.options)
    packets: list[av.Packet] = []
    for index in range(count):
        packets += context.encode(pattern(index, width, height))
    packets += context.encode(None)
    return packets


Buffer = bytes | bytearray | memoryview


class _Writes(io.RawIOBase):
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Buffer) -> int:  # type: ignore[override]
        chunk = bytes(data)
        self.writes.append(chunk)
        return len(chunk)


def parse_rtp(datagram: bytes) -> RtpPacket | None:
    """One RTP packet (None for RTCP). Raises ``ValueError`` for anything else."""
    if len(datagram) < 12 or datagram[0] >> 6 != 2:
        raise ValueError(f"not an RTP/RTCP packet: {datagram[:4].hex()}")
    if datagram[1] in RTCP_TYPES:
        return None
    offset = 12 + 4 * (datagram[0] & 0x0F)
    if datagram[0] & 0x10:
        words = int.from_bytes(datagram[offset + 2 : offset + 4])
        offset += 4 + 4 * words
    end = len(datagram)
    if datagram[0] & 0x20:
        end -= datagram[-1]
    if offset > end:
        raise ValueError("RTP header past the datagram")
    return RtpPacket(
        sequence=int.from_bytes(datagram[2:4]),
        timestamp=int.from_bytes(datagram[4:8]),
        marker=bool(datagram[1] & 0x80),
        payload_type=datagram[1] & 0x7F,
        payload=datagram[offset:end],
    )


def packetize(
    codec: str,
    packets: Sequence[av.Packet],
    width: int,
    height: int,
    mtu: int = 1200,
    pix_fmt: str = "yuv420p",
) -> list[RtpPacket]:
    """``packets`` (from :func:`encode`, or encoded as ``pix_fmt``) through FFmpeg's RTP
    muxer, ``mtu``-byte packets."""
    sink = _Writes()
    setup = SETUPS[codec]
    container = av.open(
        sink, "w", format="rtp", buffer_size=mtu, options={"strict": "experimental"}
    )
    stream = container.add_stream(setup.muxer_codec)
    stream.time_base = fractions.Fraction(1, 90000)
    stream.width = width
    stream.height = height
    stream.pix_fmt = pix_fmt
    for packet in packets:
        copy = av.Packet(bytes(packet))
        copy.pts = packet.pts
        copy.dts = packet.dts
        copy.time_base = packet.time_base
        copy.stream = stream
        container.mux(copy)
    container.close()
    parsed = [parse_rtp(write) for write in sink.writes]
    return [packet for packet in parsed if packet is not None]


def jitter_frames(
    packets: Iterable[RtpPacket], depayload: Callable[[bytes], bytes]
) -> list[tuple[int, bytes]]:
    """``(timestamp, joined per-packet outputs)`` per run of packets with one timestamp,
    as aiortc's jitter buffer joins them (every run, the last one too)."""
    frames: list[tuple[int, bytes]] = []
    current: list[bytes] = []
    timestamp: int | None = None
    for packet in packets:
        if timestamp is not None and packet.timestamp != timestamp:
            frames.append((timestamp, b"".join(current)))
            current = []
        timestamp = packet.timestamp
        current.append(depayload(packet.payload) if packet.payload else b"")
    if timestamp is not None:
        frames.append((timestamp, b"".join(current)))
    return frames


def decode(codec: str, frames: Iterable[bytes]) -> list[tuple[int, int, bytes]]:
    """``(width, height, yuv420p bytes)`` of every picture the codec's PyAV decoder makes
    of ``frames``, flushed at the end."""
    context = av.CodecContext.create(SETUPS[codec].decoder, "r")
    pictures: list[tuple[int, int, bytes]] = []

    def keep(decoded: Iterable[av.VideoFrame]) -> None:
        for picture in decoded:
            array = picture.to_ndarray(format="yuv420p")
            pictures.append((picture.width, picture.height, array.tobytes()))

    for data in frames:
        keep(context.decode(av.Packet(data)))
    keep(context.decode(None))
    return pictures


@dataclass(frozen=True, slots=True)
class ReferenceStream:
    """One encoded clip and FFmpeg's packetization of it."""

    codec: str
    width: int
    height: int
    frames: tuple[bytes, ...]
    """The encoder's packets, in decoding order."""
    keyframes: tuple[bool, ...]
    """The encoder's keyframe flag per packet."""
    rtp: tuple[RtpPacket, ...]


@functools.cache
def reference_stream(
    codec: str, count: int = 30, width: int = 320, height: int = 240, mtu: int = 1200
) -> ReferenceStream:
    """:func:`encode` then :func:`packetize`, cached per argument set (a test session
    encodes each clip once)."""
    packets = encode(codec, count, width, height)
    rtp = packetize(codec, packets, width, height, mtu)
    return ReferenceStream(
        codec,
        width,
        height,
        tuple(bytes(packet) for packet in packets),
        tuple(bool(packet.is_keyframe) for packet in packets),
        tuple(rtp),
    )
