"""A hostile WHIP publisher for tests: a real aiortc peer that, once DTLS/SRTP is up,
sends hand-crafted RTP through its own SRTP context.

aiortc's sender never runs here (the transceiver has no track): every RTP packet the
server sees is one this module built, with whatever SSRC, payload type, sequence number,
timestamp, marker and payload the test chose. Real H.264 comes from aiortc's own encoder
(:class:`aiortc.codecs.h264.H264Encoder`, libx264 through PyAV) so a well-formed stream
is exactly what an aiortc or browser publisher would packetize.

aiortc private names touched, on the *client* side only (the server is never reached
into): ``RTCDtlsTransport._send_rtp`` (SRTP-protects and sends one RTP packet),
``RTCDtlsTransport._handle_rtcp_data`` and ``._send_rtp`` (shadowed to read the
server's receiver reports and to count what goes out),
``RTCRtpTransceiver._codecs`` (the negotiated codecs), ``RTCRtpSender._ssrc``,
``RTCIceTransport._connection`` (``._nominated``: the selected pair, whose address is
the server's media socket; ``._protocols``: the UDP sockets, closed by :meth:`vanish`).
"""

from __future__ import annotations

import asyncio
import fractions
import random
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import av
from aiortc import RTCSessionDescription
from aiortc.codecs.h264 import H264Encoder
from aiortc.rtcrtpsender import RTCRtpSender
from aiortc.rtp import RtcpPacket, RtcpRrPacket, RtpPacket

from whip.rtc.peer import new_peer_connection

VIDEO_CLOCK_HZ = 90_000
FRAME_TICKS = VIDEO_CLOCK_HZ // 30
"""RTP timestamp step of one frame at 30 fps."""
WINDOW = 48
"""Packets a sender may have in flight (sent, not yet unprotected by the server). The
server runs in this same event loop and reads one datagram per socket per loop turn:
unpaced, a burst overflows its UDP receive buffer (about 90 datagrams of 1.3 kB) and the
kernel drops the rest, which would make exact counts flaky."""
STALL_S = 2.0
"""How long a paced sender waits for the server to make progress before sending on
anyway (a datagram the kernel dropped is never acknowledged)."""


def h264_frames(count: int, size: tuple[int, int] = (320, 176), gop: int = 30) -> list[list[bytes]]:
    """``count`` frames of a moving pattern over a fixed noise band, H.264 (constrained
    baseline, aiortc's encoder), each as its RTP payloads (STAP-A / FU-A / single NAL).
    Frame 0 and every ``gop``-th are IDR frames (SPS and PPS in front); the noise makes
    an IDR frame span several packets while the other frames stay small."""
    import numpy as np

    encoder = H264Encoder()
    width, height = size
    noise = np.random.default_rng(7).integers(0, 256, (height // 4, width, 3), dtype=np.uint8)
    frames: list[list[bytes]] = []
    for index in range(count):
        image = np.zeros((height, width, 3), dtype=np.uint8)
        image[:, :, 0] = (index * 7) % 256
        image[(index * 3) % height, :, 1] = 255
        image[: height // 4] = noise
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        frame.pts = index * FRAME_TICKS
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK_HZ)
        payloads, _ = encoder.encode(frame, force_keyframe=index % gop == 0)
        frames.append(payloads)
    return frames


@dataclass
class RtpStream:
    """One RTP stream's header state (what an encoder keeps per SSRC).

    SRTP keeps a replay window per SSRC on both ends: once packets went out on an SSRC,
    a stream that goes on with it must continue forward from its sequence number
    (libsrtp refuses to protect an index it considers too old)."""

    ssrc: int
    payload_type: int
    sequence: int = field(default_factory=lambda: random.randrange(1 << 16))
    timestamp: int = field(default_factory=lambda: random.randrange(1 << 32))
    count: int = 0
    """Packets made so far (sent, once the sender is done with them)."""

    def packets(self, payloads: Sequence[bytes], *, marker: bool = True) -> list[RtpPacket]:
        """One frame: ``payloads`` in consecutive packets sharing one timestamp, the marker
        bit on the last (unless ``marker`` is False: a frame cut short). The stream's
        timestamp then advances one frame."""
        packets = []
        for index, payload in enumerate(payloads):
            last = index == len(payloads) - 1
            packets.append(
                RtpPacket(
                    payload_type=self.payload_type,
                    marker=int(marker and last),
                    sequence_number=self.sequence,
                    timestamp=self.timestamp,
                    ssrc=self.ssrc,
                    payload=payload,
                )
            )
            self.sequence = (self.sequence + 1) & 0xFFFF
            self.count += 1
        self.timestamp = (self.timestamp + FRAME_TICKS) & 0xFFFFFFFF
        return packets


class HostilePublisher:
    """A WHIP publisher with one video transceiver (H.264 only, or ``video_mime``'s
    format: e.g. ``video/H265``, which aiortc offers once the server's app has added it,
    :mod:`whip.rtc.codec_table`) and no track.

    ``publish`` offers, POSTs and applies the answer; ``connected`` is set once the peer
    connection (DTLS/SRTP) is up. Then ``send`` puts hand-made packets on the wire.
    """

    def __init__(
        self,
        *,
        audio: bool = False,
        video_mime: str = "video/H264",
        offer_edit: Callable[[str], str] | None = None,
    ) -> None:
        self.pc = new_peer_connection()
        self.audio = audio
        self.video_mime = video_mime
        self.offer_edit = offer_edit
        """Rewrites the offer before it is POSTed (e.g. into OBS's simulcast shape)."""
        self.states: list[str] = []
        self.connected = asyncio.Event()
        self.location = ""
        self.run_id = ""
        self.sent = 0
        self.sent_bytes = 0
        self.wire = 0
        """SRTP and SRTCP packets this peer sent: ours and aiortc's own RTCP."""
        self.receiver_reports: list[int] = []
        """Per RTCP receiver report the server sent us: how many sources it reported."""

    async def publish(self, http: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
        """Offer, POST and (on 201) apply the answer; returns the response (body read)."""

        def on_change() -> None:
            self.states.append(self.pc.connectionState)
            if self.pc.connectionState == "connected":
                self.connected.set()

        self.pc.on("connectionstatechange", on_change)
        video = self.pc.addTransceiver("video", direction="sendonly")
        chosen = [
            c
            for c in RTCRtpSender.getCapabilities("video").codecs
            if c.mimeType == self.video_mime
            and (c.mimeType != "video/H264" or c.parameters.get("packetization-mode") == "1")
        ]
        video.setCodecPreferences(chosen[:1])
        if self.audio:
            self.pc.addTransceiver("audio", direction="sendonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = self.pc.localDescription.sdp
        if self.offer_edit is not None:
            offer = self.offer_edit(offer)
        response = await http.post(url, data=offer, headers={"Content-Type": "application/sdp"})
        body = await response.text()
        if response.status == 201:
            self.location = response.headers["Location"]
            self.run_id = response.headers["X-Run-Id"]
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
            self._watch_rtcp()
        return response

    def _watch_rtcp(self) -> None:
        """Count what goes out (:attr:`wire`) and record the server's receiver reports
        (they stop if its RTCP task dies)."""
        transport = self._transceiver("video").sender.transport
        handle = transport._handle_rtcp_data
        send_rtp = transport._send_rtp

        async def counted_send_rtp(data: bytes) -> None:
            await send_rtp(data)
            self.wire += 1

        async def handle_rtcp_data(data: bytes) -> None:
            try:
                packets = RtcpPacket.parse(data)
            except ValueError:
                packets = []
            for packet in packets:
                if isinstance(packet, RtcpRrPacket):
                    self.receiver_reports.append(len(packet.reports))
            await handle(data)

        transport._handle_rtcp_data = handle_rtcp_data
        transport._send_rtp = counted_send_rtp

    # ------------------------------------------------------------ what was negotiated

    def _transceiver(self, kind: str) -> Any:
        return next(t for t in self.pc.getTransceivers() if t.kind == kind)

    @property
    def video_payload_type(self) -> int:
        """The negotiated H.264 payload type."""
        name = self.video_mime.split("/")[1]
        codec = next(c for c in self._transceiver("video")._codecs if c.name == name)
        return int(codec.payloadType)

    @property
    def negotiated_payload_types(self) -> set[int]:
        """Every payload type negotiated on any m-line (RTX included)."""
        return {int(c.payloadType) for t in self.pc.getTransceivers() for c in t._codecs}

    @property
    def video_ssrc(self) -> int:
        """The SSRC the offer announced for video (``a=ssrc``)."""
        return int(self._transceiver("video").sender._ssrc)

    def stream(self, ssrc: int | None = None, payload_type: int | None = None) -> RtpStream:
        """A fresh RTP stream: the announced video SSRC and H.264 payload type unless
        given, random initial sequence number and timestamp (so: once per SSRC; see
        :class:`RtpStream`)."""
        return RtpStream(
            ssrc if ssrc is not None else self.video_ssrc,
            payload_type if payload_type is not None else self.video_payload_type,
        )

    # ------------------------------------------------------------ the wire

    async def send(
        self, packets: Iterable[RtpPacket], acked: Callable[[], int] | None = None
    ) -> None:
        """SRTP-protect and send each packet.

        ``acked()``, when given, reads how many packets the server has taken so far (a
        count that grows by one per SRTP or SRTCP packet it unprotects, to compare with
        :attr:`wire`): at most :data:`WINDOW` are then in flight. Without it there is no
        flow control: the sender only yields to the loop after each packet.
        """
        transport = self._transceiver("video").sender.transport
        loop = asyncio.get_running_loop()
        base_wire, base_acked = self.wire, acked() if acked is not None else 0
        for packet in packets:
            if acked is not None:
                stalled_at, seen = loop.time(), acked()
                while (self.wire - base_wire) - (acked() - base_acked) >= WINDOW:
                    if acked() != seen:
                        stalled_at, seen = loop.time(), acked()
                    elif loop.time() - stalled_at > STALL_S:
                        break  # a datagram was lost: send on
                    await asyncio.sleep(0.001)
            data = packet.serialize()
            await transport._send_rtp(data)  # counted in self.wire by _watch_rtcp
            self.sent += 1
            self.sent_bytes += len(data)
            await asyncio.sleep(0)

    async def send_frames(
        self,
        stream: RtpStream,
        frames: Iterable[Sequence[bytes]],
        acked: Callable[[], int] | None = None,
    ) -> None:
        """Send whole frames on ``stream``, back to back."""
        for payloads in frames:
            await self.send(stream.packets(payloads), acked)

    @property
    def media_address(self) -> tuple[str, int]:
        """The server's end of the selected ICE pair (where its media socket listens)."""
        connection = self._transceiver("video").sender.transport.transport._connection
        pair = connection._nominated[1]
        return str(pair.remote_addr[0]), int(pair.remote_addr[1])

    def send_raw(self, datagrams: Iterable[bytes], *, stranger: bool = True) -> None:
        """Send raw UDP datagrams (no SRTP) to the server's media socket: from a fresh
        socket (``stranger``, any host on the network could) or from this peer's own."""
        if stranger:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                for datagram in datagrams:
                    sock.sendto(datagram, self.media_address)
            return
        connection = self._transceiver("video").sender.transport.transport._connection
        pair = connection._nominated[1]
        for datagram in datagrams:
            pair.protocol.transport.sendto(datagram, pair.remote_addr)

    def vanish(self) -> None:
        """Drop off the network without a word: close the UDP sockets (no RTCP BYE, no
        DTLS close_notify). The server only learns it from the silence."""
        transport = self._transceiver("video").sender.transport
        for protocol in list(transport.transport._connection._protocols):
            if protocol.transport is not None:
                protocol.transport.close()

    async def close(self) -> None:
        """Close the peer connection (idempotent)."""
        await self.pc.close()
