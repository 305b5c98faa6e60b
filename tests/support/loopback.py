"""Real aiortc peers on 127.0.0.1, for the tests of the aiortc adapter and the session modules.

Rules:

- Every peer connection is made by :func:`whip.rtc.peer.new_peer_connection` (no ICE
  servers) and gathers host candidates on 127.0.0.1 only: :func:`loopback_peers`
  restricts aioice with :func:`whip.rtc.host_addresses.restrict_host_addresses` for its
  duration and then puts back whatever was there before. The restriction is
  process-wide, and the servers' ``configure_ice`` sets it too (and never undoes it).
- Waits are on events, never sleeps: :class:`ConnectionStates` records every
  ``connectionState`` a peer goes through and sets an event per state reached; each wait
  has a bound.
- Nothing of whip-ingest is replaced here. What these helpers touch is aiortc's side of
  a test (a publisher's tracks and codec preferences), through aiortc's public API.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator

import aioice.ice
from aiortc import RTCPeerConnection, RTCRtpSender
from aiortc.mediastreams import AudioStreamTrack, MediaStreamTrack, VideoStreamTrack

from whip.rtc.host_addresses import restrict_host_addresses
from whip.rtc.peer import close_quietly, new_peer_connection

CONNECT_WAIT_S = 15.0
"""Bound of a wait for a loopback connection state (a connection takes ~50 ms)."""


def is_dtls(datagram: bytes) -> bool:
    """A DTLS record (RFC 7983 demultiplexing: first byte 20-63)."""
    return bool(datagram) and 19 < datagram[0] < 64


class ConnectionStates:
    """Every ``connectionState`` of one peer connection, in order, and an event per state."""

    def __init__(self, pc: RTCPeerConnection) -> None:
        self.pc = pc
        self.history: list[str] = []
        self._reached: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        pc.on("connectionstatechange", self._changed)

    def _changed(self) -> None:
        state = str(self.pc.connectionState)
        self.history.append(state)
        self._reached[state].set()

    async def reached(self, state: str, within: float = CONNECT_WAIT_S) -> None:
        """Return once the peer has been in ``state`` (at once if it already was)."""
        try:
            async with asyncio.timeout(within):
                await self._reached[state].wait()
        except TimeoutError:
            raise AssertionError(
                f"peer never reached {state!r} within {within}s (history {self.history})"
            ) from None


class LoopbackPeers:
    """The peer connections of one test; :func:`loopback_peers` closes them all."""

    def __init__(self) -> None:
        self.pcs: list[RTCPeerConnection] = []

    def new(self) -> RTCPeerConnection:
        """A fresh peer connection (:func:`whip.rtc.peer.new_peer_connection`)."""
        return self.adopt(new_peer_connection())

    def adopt(self, pc: RTCPeerConnection) -> RTCPeerConnection:
        """Close ``pc`` with the others at the end of the test."""
        self.pcs.append(pc)
        return pc

    async def publisher_offer(
        self,
        pc: RTCPeerConnection,
        *,
        video: bool = True,
        audio: bool = True,
        media: bool = False,
        audio_codecs: tuple[str, ...] | None = None,
    ) -> str:
        """Give ``pc`` sendonly transceivers (with aiortc's test tracks when ``media``,
        else none: the peer then sends RTCP only) and return its offer (gathering done).
        ``audio_codecs`` (mime types, e.g. ``"audio/PCMU"``) narrows the audio codecs
        offered, in that order."""
        if video:
            track: MediaStreamTrack | str = VideoStreamTrack() if media else "video"
            pc.addTransceiver(track, direction="sendonly")
        if audio:
            track = AudioStreamTrack() if media else "audio"
            transceiver = pc.addTransceiver(track, direction="sendonly")
            if audio_codecs is not None:
                known = RTCRtpSender.getCapabilities("audio").codecs
                transceiver.setCodecPreferences(
                    [c for name in audio_codecs for c in known if c.mimeType == name]
                )
        await pc.setLocalDescription(await pc.createOffer())
        return str(pc.localDescription.sdp)

    async def close(self) -> None:
        """Close every peer connection, newest first."""
        for pc in reversed(self.pcs):
            await close_quietly(pc, "test peer")


@contextlib.asynccontextmanager
async def loopback_peers() -> AsyncIterator[LoopbackPeers]:
    """Peers that gather on 127.0.0.1 only; afterwards all are closed and aioice's host
    address lookup is what it was before (module doc)."""
    saved = aioice.ice.get_host_addresses
    restrict_host_addresses(["127.0.0.1"])
    peers = LoopbackPeers()
    try:
        yield peers
    finally:
        try:
            await peers.close()
        finally:
            aioice.ice.get_host_addresses = saved
