"""Real publishers for tests: an aiortc peer that pushes over WHIP on loopback."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack


@dataclass
class AiortcPublisher:
    """One aiortc publisher: offer, POST, apply the answer, stream test media."""

    pc: RTCPeerConnection = field(
        default_factory=lambda: RTCPeerConnection(RTCConfiguration(iceServers=[]))
    )
    states: list[str] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    location: str = ""
    run_id: str = ""

    async def offer(self, audio: bool = True, video: bool = True) -> str:
        """Create the offer SDP (gathering done)."""

        def on_change() -> None:
            self.states.append(self.pc.connectionState)
            if self.pc.connectionState == "connected":
                self.connected.set()

        self.pc.on("connectionstatechange", on_change)
        if video:
            self.pc.addTransceiver(VideoStreamTrack(), direction="sendonly")
        if audio:
            self.pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def answer(self, sdp: str) -> None:
        """Apply the server's answer."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))

    async def publish(
        self, http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """Offer, POST and (on 201) apply the answer; returns the response (body read)."""
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


def ffmpeg_whip_push(
    url: str,
    seconds: float,
    *,
    fps: int = 30,
    size: tuple[int, int] = (320, 180),
    audio: bool = True,
) -> int:
    """Push a generated pattern (H.264 + Opus) with FFmpeg's WHIP muxer through PyAV.

    Blocking and paced in real time; bounded by ``seconds``. Closing the container makes
    the muxer DELETE its session URL. Returns the number of video frames sent.
    """
    import fractions
    import time

    import av
    import numpy as np

    from whip.publish import open_whip_output

    width, height = size
    out, video, sound = open_whip_output(
        url, width=width, height=height, fps=fps, audio=audio, preset="ultrafast"
    )
    try:
        frames = int(seconds * fps)
        started = time.monotonic()
        for index in range(frames):
            delay = started + index / fps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            image = np.full((height, width, 3), (index * 3) % 256, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            frame.pts = index
            frame.time_base = fractions.Fraction(1, fps)
            for packet in video.encode(frame):
                out.mux(packet)
            if sound is not None and index % 3 == 0:
                for chunk in range(5):  # 100 ms of audio per 3 video frames at 30 fps
                    samples = np.zeros((1, 960 * 2), dtype=np.int16)
                    block = av.AudioFrame.from_ndarray(samples, format="s16", layout="stereo")
                    block.sample_rate = 48000
                    block.pts = (index // 3 * 5 + chunk) * 960
                    block.time_base = fractions.Fraction(1, 48000)
                    for packet in sound.encode(block):
                        out.mux(packet)
        return frames
    finally:
        out.close()
