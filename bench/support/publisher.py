"""An aiortc WHIP publisher on loopback: offer, POST, apply the answer, stream test media.

The client side of the wire contract as the tests and the benches drive it: the POST's
201 gives the session URL (``Location``) and the run id (``X-Run-Id``); the peer
connection comes from :func:`whip.rtc.peer.new_peer_connection` (no ICE servers: nothing
leaves the machine). Its state history is recorded whole, and ``connected`` is set once
the connection is up. The media is aiortc's own test tracks (green frames, silence).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack

from whip.rtc.peer import new_peer_connection


@dataclass
class AiortcPublisher:
    """One aiortc publisher: offer, POST, apply the answer, stream test media."""

    pc: RTCPeerConnection = field(default_factory=new_peer_connection)
    states: list[str] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    location: str = ""
    run_id: str = ""
    video_track: Callable[[], MediaStreamTrack] = VideoStreamTrack
    """Makes the video track (aiortc's green frames unless told otherwise)."""
    audio_track: Callable[[], MediaStreamTrack] = AudioStreamTrack
    """Makes the audio track (aiortc's silence unless told otherwise)."""

    async def offer(self, audio: bool = True, video: bool = True) -> str:
        """Create the offer SDP (gathering done)."""

        def on_change() -> None:
            self.states.append(self.pc.connectionState)
            if self.pc.connectionState == "connected":
                self.connected.set()

        self.pc.on("connectionstatechange", on_change)
        if video:
            self.pc.addTransceiver(self.video_track(), direction="sendonly")
        if audio:
            self.pc.addTransceiver(self.audio_track(), direction="sendonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def answer(self, sdp: str) -> None:
        """Apply the server's answer."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))

    async def publish(
        self, http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """Offer, POST and (on 201) apply the answer; returns the response (body read).

        Cancellation: whatever was done stays done; :meth:`close` still closes the peer.
        """
        offer = await self.offer()
        response = await http.post(
            url, data=offer, headers={"Content-Type": "application/sdp", **(headers or {})}
        )
        body = await response.text()
        if response.status == 201:
            self.location = response.headers["Location"]
            self.run_id = response.headers["X-Run-Id"]
            await self.answer(body)
        return response

    async def close(self) -> None:
        """Close the peer connection."""
        await self.pc.close()
