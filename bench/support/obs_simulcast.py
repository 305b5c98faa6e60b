"""An OBS-shaped simulcast push: libdatachannel (through libdatachannel-py) offering and
sending H.264 layers the way OBS 32.1's WHIP output offers them.

The offer: a sendonly Opus track on mid ``0`` (with its SSRC, as OBS writes it) and one
sendonly video track on mid ``1`` with payload type 96, the RTP stream id header extension,
``a=rid:<n> send`` per layer and ``a=simulcast:send 0;1;2`` (libdatachannel writes both from
``add_rid``), and no ``a=ssrc`` line for video: the layers can be told apart by RID only.
The ICE and DTLS attributes are hoisted to session level by
:func:`bench.support.obs_like.obs_shape`, as for the single-layer publisher.

Sending: each layer has its own SSRC, its own :class:`libdatachannel.RtpPacketizationConfig`
(with ``rid`` and ``rid_id`` set, so libdatachannel's packetizer writes the RID extension
into every packet) and its own packetizer chain (RTCP sender reports, NACK responder).
libdatachannel gives a track one media handler chain, so :meth:`ObsSimulcastPublisher.push`
makes a layer's chain the track's handler before it sends that layer's frame
(``Track.set_media_handler`` takes the track's lock); RTCP that arrives meanwhile goes to
whichever chain is current, which on loopback (no loss, no NACK) changes nothing.

Frames: :meth:`ObsSimulcastPublisher.push` encodes noise per layer as it sends (the
tests); :meth:`ObsSimulcastPublisher.send` replays frames encoded beforehand, one
sequence per layer (``bench/capacity.py --codecs simulcast``: the clip encoded once per
layer at :data:`REPLAY_LAYERS`, so that no publisher spends the CPU the server is
measured with on encoding).

Threads: no callbacks into Python (the peer's states are polled, as in
:mod:`bench.support.obs_like`). ``push`` and ``send`` block (encoding, real-time pacing):
run them with ``asyncio.to_thread``.
"""

from __future__ import annotations

import fractions
import random
import string
from collections.abc import Iterable, Iterator, Sequence

import aiohttp
import av
import libdatachannel as ldc
import numpy as np

from bench.support.obs_like import (
    MAX_FRAGMENT,
    VIDEO_PT,
    PeerStates,
    close_peer,
    obs_peer,
    obs_shape,
    opus_track,
    paced,
    send_silence,
    wait_tracks_open,
)

RID_URI = "urn:ietf:params:rtp-hdrext:sdes:rtp-stream-id"
RID_EXTENSION_ID = 4
"""The ``a=extmap`` id the offer gives the RTP stream id."""
LAYER_SIZES: tuple[tuple[int, int], ...] = ((160, 90), (320, 180), (640, 360))
"""Per RID ``0``, ``1``, ``2``: lowest first."""
REPLAY_LAYERS: tuple[tuple[int, int, int], ...] = (
    (320, 180, 300_000),
    (640, 360, 800_000),
    (1280, 720, 2_500_000),
)
"""``(width, height, bits per second)`` per RID, lowest first: the capacity bench's 720p
simulcast, at about the rates libwebrtc gives a 720p camera's three layers (the top one
at the bench's single-layer 720p rate)."""


def _token(length: int = 16) -> str:
    return "".join(random.choices(string.ascii_letters + string.digits, k=length))


def _h264_frames(size: tuple[int, int], fps: int, gop: int, count: int) -> Iterator[bytes]:
    """``count`` Annex B access units of noise at ``size`` (libx264, no B-frames)."""
    width, height = size
    encoder = av.CodecContext.create("libx264", "w")
    assert isinstance(encoder, av.VideoCodecContext)
    encoder.width, encoder.height = width, height
    encoder.pix_fmt = "yuv420p"
    encoder.time_base = fractions.Fraction(1, fps)
    encoder.framerate = fractions.Fraction(fps, 1)
    encoder.gop_size = gop
    # crf 40 keeps the noise to a few hundred kb/s; the rate still grows with the size.
    encoder.options = {"preset": "ultrafast", "tune": "zerolatency", "bf": "0", "crf": "40"}
    rng = np.random.default_rng(width)
    for index in range(count):
        # Noise: the bitrate grows with the picture, as OBS's per-layer rates do.
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        frame.pts = index
        for packet in encoder.encode(frame):
            yield bytes(packet)
    for packet in encoder.encode(None):
        yield bytes(packet)


class ObsSimulcastPublisher:
    """One OBS-shaped simulcast push of H.264 layers (module doc)."""

    def __init__(
        self, sizes: Sequence[tuple[int, int]] = LAYER_SIZES, *, fps: int = 30, gop: int = 30
    ) -> None:
        self.sizes = tuple(sizes)
        self.rids = [str(i) for i in range(len(self.sizes))]
        self.fps = fps
        self.gop = gop
        self.pc = obs_peer()
        self.peer_states = PeerStates(self.pc)
        stream_id, cname = _token(), _token()
        base_ssrc = random.randrange(1, 1 << 30)
        self.audio_track, self._audio_packetizer = opus_track(self.pc, base_ssrc, cname, stream_id)

        video = ldc.Description.Video("1", ldc.Description.Direction.SendOnly)
        video.add_h264_codec(VIDEO_PT)
        video.add_ext_map(ldc.Description.Media.ExtMap(RID_EXTENSION_ID, RID_URI))
        for rid in self.rids:
            video.add_rid(rid)
        self.video_track = self.pc.add_track(video)
        self.layer_ssrcs: dict[str, int] = {}
        self._layers: list[ldc.H264RtpPacketizer] = []
        separator = ldc.NalUnit.Separator.StartSequence
        for index, rid in enumerate(self.rids):
            ssrc = base_ssrc + 1 + index
            layer_config = ldc.RtpPacketizationConfig(ssrc, cname, VIDEO_PT, 90000)
            layer_config.rid = rid
            layer_config.rid_id = RID_EXTENSION_ID
            packetizer = ldc.H264RtpPacketizer(separator, layer_config, MAX_FRAGMENT)
            packetizer.add_to_chain(ldc.RtcpSrReporter(layer_config))
            packetizer.add_to_chain(ldc.RtcpNackResponder())
            self._layers.append(packetizer)
            self.layer_ssrcs[rid] = ssrc
        self.video_track.set_media_handler(self._layers[-1])

        self.pc.set_local_description()
        description = self.pc.local_description()
        assert description is not None
        self.offer = obs_shape(str(description))

    async def publish(self, http: aiohttp.ClientSession, url: str) -> tuple[str, str]:
        """POST the offer to ``url`` (asserting 201; the session's URL is kept in
        :attr:`location`), apply the answer, gather: ``(run_id, answer)``."""
        async with http.post(
            url, data=self.offer, headers={"Content-Type": "application/sdp"}
        ) as response:
            answer = await response.text()
            assert response.status == 201, answer
            run_id = response.headers["X-Run-Id"]
            self.location: str = response.headers["Location"]
        self.pc.set_remote_description(ldc.Description(answer, "answer"))
        self.pc.gather_local_candidates()
        return run_id, answer

    def push(self, seconds: float) -> int:
        """Send ``seconds`` of every layer (and Opus silence) in real time once the tracks
        are open (waits up to 10 s for them), encoding as it goes. Returns the frames sent
        per layer. Blocking."""
        count = int(seconds * self.fps)
        layers = [_h264_frames(size, self.fps, self.gop, count) for size in self.sizes]
        return self.send([enumerate(frames) for frames in layers])

    def send(self, layers: Sequence[Iterable[tuple[int, bytes]]]) -> int:
        """Send ``layers`` (one sequence of ``(presentation index, Annex B access unit)``
        per RID, lowest first, no B-frames, all of one length) in real time at
        ``self.fps``, with Opus silence, once the tracks are open (waits up to 10 s for
        them). Returns the frames sent per layer. Blocking."""
        if len(layers) != len(self._layers):
            raise ValueError(f"{len(layers)} layers of frames for {len(self._layers)} RIDs")
        wait_tracks_open((self.video_track, self.audio_track), self.peer_states)
        sent = 0
        for index, frames in paced(zip(*layers, strict=True), self.fps):
            for packetizer, (pts, data) in zip(self._layers, frames, strict=True):
                self.video_track.set_media_handler(packetizer)
                self.video_track.send_frame(data, ldc.FrameInfo(pts * 90000 // self.fps))
            sent += 1
            send_silence(self.audio_track, index, self.fps)
        return sent

    def close(self) -> None:
        """Close the peer (:func:`close_peer`)."""
        close_peer(self.pc, (self.video_track, self.audio_track), self.peer_states)
