"""An OBS-shaped WHIP publisher: libdatachannel (the WebRTC library OBS's WHIP output is
built on, through libdatachannel-py) with PyAV-encoded video.

The offer is made the way OBS's ``plugins/obs-webrtc`` makes it: a sendonly audio track on
mid ``0`` (Opus, payload type 111) and a sendonly video track on mid ``1`` (payload type
96: H.264, H.265, AV1 or VP9, whichever the encoder is), each with its SSRC and one cname and
media stream id, no RTX; the local description is read right after it is set, so it has
no candidates, and libdatachannel writes the ICE and DTLS attributes at session level
with ``a=group:LS`` and BUNDLE. Video goes through libdatachannel's own packetizers (H.264
and H.265 with the start-sequence separator, AV1 by temporal unit, 1200-byte fragments,
as OBS configures them), with an RTCP sender reporter and a NACK responder chained.
VP9 (not an OBS codec: the shape of a browser's VP9 in OBS's offer, for the codec
sweep) has no libdatachannel packetizer: :class:`bench.support.vp9_rtp.Vp9Packetizer`
writes its RTP packets (RFC 9628, as libwebrtc does) and the track sends them through a
chain of only the sender reporter and the NACK responder.

Threads: nothing of Python's is handed to libdatachannel to call (no callbacks; the
peer's states are polled, :class:`PeerStates`), so its threads never wait for the GIL.
They hold its locks meanwhile, and some of its calls (``set_media_handler``) take those
locks without releasing the GIL: a state callback made that a deadlock in one full-suite
run (``py-spy`` showed the caller in ``set_media_handler``). Everything runs on the
caller's thread. ``push`` blocks (encoding, real-time
pacing): run it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import fractions
import random
import string
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import aiohttp
import av
import libdatachannel as ldc
import numpy as np

from bench.support.vp9_rtp import Vp9Packetizer
from whip.webhooks.child_priority import reset_to_normal_policy

VideoCodec = Literal["h264", "h265", "av1", "vp9"]
AUDIO_PT = 111
VIDEO_PT = 96
MAX_FRAGMENT = 1200
ENCODERS: dict[VideoCodec, tuple[str, dict[str, str]]] = {
    "h264": ("libx264", {"preset": "ultrafast", "tune": "zerolatency", "bf": "0"}),
    "h265": ("libx265", {"preset": "ultrafast", "x265-params": "log-level=none:bframes=0"}),
    "av1": ("libsvtav1", {"preset": "12", "svtav1-params": "pred-struct=1:lp=1"}),
    "vp9": (
        "libvpx-vp9",
        {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0", "auto-alt-ref": "0"},
    ),
}
"""PyAV encoder and options per codec: no B-frames, no hidden (alt-ref) VP9 frames
(frames leave in decode order, one shown picture each)."""

EncodedFrame = tuple[int, bytes, bool]
"""One encoded video frame: presentation index (in frames), bytes, keyframe."""
_RECORD = struct.Struct("<i?I")


OPUS_SILENCE = bytes([0xF8, 0xFF, 0xFE])
"""An Opus DTX frame: 20 ms of silence (what the publishers send beside their video)."""


class PeerStates:
    """A peer's connection states as seen from Python: :meth:`poll` reads
    ``pc.state()`` (an atomic in libdatachannel, no lock) and records each change, so the
    list holds the states seen, in order, not necessarily every one (a brief
    ``Connecting`` can fall between two polls)."""

    def __init__(self, pc: ldc.PeerConnection) -> None:
        self._pc = pc
        self.seen: list[str] = []

    def poll(self) -> str:
        """The peer's state now (recorded in :attr:`seen` if it changed)."""
        state = self._pc.state().name
        if not self.seen or self.seen[-1] != state:
            self.seen.append(state)
        return state


def wait_tracks_open(
    tracks: Sequence[ldc.Track], states: PeerStates, timeout_s: float = 10
) -> None:
    """Block until every track is open; TimeoutError after ``timeout_s`` or once the peer
    is ``Failed``."""
    deadline = time.monotonic() + timeout_s
    while not all(track.is_open() for track in tracks):
        if states.poll() == "Failed" or time.monotonic() > deadline:
            raise TimeoutError(f"tracks never opened; peer states {states.seen}")
        time.sleep(0.01)


def paced[T](items: Iterable[T], fps: int) -> Iterator[tuple[int, T]]:
    """``(index, item)`` for each item, each at its frame time (``index / fps`` seconds
    after the first): real-time pacing by sleeping (blocking)."""
    started = time.monotonic()
    for index, item in enumerate(items):
        delay = started + index / fps - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield index, item


def send_silence(audio_track: ldc.Track, index: int, fps: int) -> None:
    """Opus silence beside video frame ``index``: on every second frame (~20 ms of audio
    per 33 ms frame at 30 fps, near enough)."""
    if index % 2 == 0:
        audio_track.send_frame(OPUS_SILENCE, ldc.FrameInfo(index * 48000 // fps))


CLOSE_WAIT_S = 5.0


def close_peer(pc: ldc.PeerConnection, tracks: Sequence[ldc.Track], states: PeerStates) -> None:
    """Close the peer, wait (at most :data:`CLOSE_WAIT_S`, polling with the GIL released)
    until it is ``Closed``, then drop the media handlers: libdatachannel's closing threads
    use the tracks' handlers meanwhile."""
    pc.close()
    deadline = time.monotonic() + CLOSE_WAIT_S
    while states.poll() != "Closed" and time.monotonic() < deadline:
        time.sleep(0.01)
    for track in tracks:
        track.set_media_handler(None)


def save_frames(path: Path, frames: Iterable[EncodedFrame]) -> int:
    """Write encoded frames to ``path`` (records of pts, keyframe, length, bytes): encode
    once, replay from many publishers (``bench/capacity.py --codec``). Returns the count."""
    count = 0
    with path.open("wb") as out:
        for pts, data, keyframe in frames:
            out.write(_RECORD.pack(pts, keyframe, len(data)))
            out.write(data)
            count += 1
    return count


def load_frames(path: Path) -> list[EncodedFrame]:
    """What :func:`save_frames` wrote."""
    blob = path.read_bytes()
    frames: list[EncodedFrame] = []
    at = 0
    while at < len(blob):
        pts, keyframe, length = _RECORD.unpack_from(blob, at)
        at += _RECORD.size
        frames.append((pts, blob[at : at + length], keyframe))
        at += length
    return frames


def looped(frames: Sequence[EncodedFrame], count: int) -> Iterator[EncodedFrame]:
    """The first ``count`` frames of ``frames`` repeated end to end, presentation indexes
    continuing (the clip must start with a keyframe and hold no B-frames)."""
    span = max(pts for pts, _, _ in frames) + 1
    for index in range(count):
        pts, data, keyframe = frames[index % len(frames)]
        yield pts + (index // len(frames)) * span, data, keyframe


def _pts(packet: av.Packet) -> int:
    if packet.pts is None:
        raise ValueError("the encoder gave a packet without pts")
    return int(packet.pts)


def _token(length: int = 16) -> str:
    return "".join(random.choices(string.ascii_letters + string.digits, k=length))


def obs_peer() -> ldc.PeerConnection:
    """A libdatachannel peer as OBS makes one: no ICE servers, gathering after the answer
    (:meth:`ObsLikePublisher.answer`). No callbacks (module doc): poll it with
    :class:`PeerStates`."""
    config = ldc.Configuration()
    config.ice_servers = []
    config.disable_auto_gathering = True
    return ldc.PeerConnection(config)


def opus_track(
    pc: ldc.PeerConnection, ssrc: int, cname: str, stream_id: str
) -> tuple[ldc.Track, ldc.RtpPacketizer]:
    """OBS's sendonly Opus track on mid ``0`` (payload type 111), with its packetizer,
    RTCP sender reporter and NACK responder chained; the packetizer is returned so the
    caller keeps the Python side alive."""
    audio = ldc.Description.Audio("0", ldc.Description.Direction.SendOnly)
    audio.add_opus_codec(AUDIO_PT)
    audio.add_ssrc(ssrc, cname, stream_id, f"{stream_id}-audio")
    track = pc.add_track(audio)
    config = ldc.RtpPacketizationConfig(ssrc, cname, AUDIO_PT, 48000)
    packetizer = ldc.OpusRtpPacketizer(config)
    packetizer.add_to_chain(ldc.RtcpSrReporter(config))
    packetizer.add_to_chain(ldc.RtcpNackResponder())
    track.set_media_handler(packetizer)
    return track, packetizer


class ObsLikePublisher:
    """One OBS-shaped push (module doc)."""

    def __init__(
        self, codec: VideoCodec, *, fps: int = 30, gop: int = 30, b_frames: int = 0
    ) -> None:
        """``b_frames`` (H.264 only): libx264 with that many B-frames (OBS's x264 with
        ``bframes=N``): frames leave in decode order, each stamped with its own
        presentation time."""
        self.codec: VideoCodec = codec
        self.fps = fps
        self.gop = gop
        self.b_frames = b_frames
        if b_frames and codec != "h264":
            raise ValueError("b_frames is for H.264 only")
        self.pc = obs_peer()
        self.peer_states = PeerStates(self.pc)
        stream_id, cname = _token(), _token()
        ssrc = random.randrange(1, 1 << 30)
        self.audio_track, self._audio_packetizer = opus_track(self.pc, ssrc, cname, stream_id)

        video = ldc.Description.Video("1", ldc.Description.Direction.SendOnly)
        video.add_ssrc(ssrc + 1, cname, stream_id, f"{stream_id}-video")
        self.video_config = ldc.RtpPacketizationConfig(ssrc + 1, cname, VIDEO_PT, 90000)
        packetizer: ldc.MediaHandler
        separator = ldc.NalUnit.Separator.StartSequence
        self._vp9: Vp9Packetizer | None = None
        if codec == "vp9":
            video.add_vp9_codec(VIDEO_PT)
            # No packetizer: the chain's head is the sender reporter, so each send is
            # one RTP packet (Vp9Packetizer's), counted into the sender reports.
            packetizer = ldc.RtcpSrReporter(self.video_config)
            self._vp9 = Vp9Packetizer(
                ssrc + 1,
                VIDEO_PT,
                max_payload=MAX_FRAGMENT,
                timestamp_base=self.video_config.start_timestamp,
            )
        elif codec == "av1":
            video.add_av1_codec(VIDEO_PT)
            packetizer = ldc.AV1RtpPacketizer(
                ldc.AV1RtpPacketizer.Packetization.TemporalUnit, self.video_config, MAX_FRAGMENT
            )
        elif codec == "h265":
            video.add_h265_codec(VIDEO_PT)
            packetizer = ldc.H265RtpPacketizer(separator, self.video_config, MAX_FRAGMENT)
        else:
            video.add_h264_codec(VIDEO_PT)
            packetizer = ldc.H264RtpPacketizer(separator, self.video_config, MAX_FRAGMENT)
        if codec != "vp9":
            packetizer.add_to_chain(ldc.RtcpSrReporter(self.video_config))
        packetizer.add_to_chain(ldc.RtcpNackResponder())
        self.video_track = self.pc.add_track(video)
        self.video_track.set_media_handler(packetizer)
        self._packetizer = packetizer  # libdatachannel holds it too; keep the Python side

        self.pc.set_local_description()
        description = self.pc.local_description()
        assert description is not None
        self.offer = obs_shape(str(description))

    async def publish(self, http: aiohttp.ClientSession, url: str) -> tuple[str, str, str]:
        """POST the offer to ``url`` (asserting 201), apply the answer: ``(run_id,
        location, answer)``."""
        async with http.post(
            url, data=self.offer, headers={"Content-Type": "application/sdp"}
        ) as response:
            answer = await response.text()
            assert response.status == 201, answer
            run_id, location = response.headers["X-Run-Id"], response.headers["Location"]
        self.answer(answer)
        return run_id, location, answer

    def answer(self, sdp: str) -> None:
        """Apply the server's answer and gather (ICE starts). OBS reads its offer before
        libdatachannel has gathered anything; libdatachannel-py gathers host candidates
        inside ``set_local_description``, so gathering waits for the answer here
        (``disable_auto_gathering``): the offer OBS sends, the same connectivity checks."""
        self.pc.set_remote_description(ldc.Description(sdp, "answer"))
        self.pc.gather_local_candidates()

    def encoded(self, seconds: float, size: tuple[int, int]) -> Iterator[EncodedFrame]:
        """Encoded video frames (Annex B for H.264/H.265, a temporal unit for AV1, a VP9
        frame) of a moving pattern, ``seconds`` long at ``self.fps``, in decode order,
        each with its presentation index (``pts``, in frames) and whether it is a
        keyframe."""
        name, options = ENCODERS[self.codec]
        if self.b_frames:
            options = {"preset": "ultrafast", "bf": str(self.b_frames)}  # not zerolatency
        width, height = size
        encoder = av.CodecContext.create(name, "w")
        assert isinstance(encoder, av.VideoCodecContext)
        encoder.width, encoder.height = width, height
        encoder.pix_fmt = "yuv420p"
        encoder.time_base = fractions.Fraction(1, self.fps)
        encoder.framerate = fractions.Fraction(self.fps, 1)
        encoder.gop_size = self.gop
        encoder.options = dict(options)
        encoder.open()
        reset_to_normal_policy()  # libsvtav1 opened as root: SCHED_FIFO 99 otherwise
        ramp = np.arange(width, dtype=np.uint16)
        for index in range(int(seconds * self.fps)):
            luma = ((ramp[None, :] + index * 4) % 256).astype(np.uint8)
            image = np.repeat(np.broadcast_to(luma, (height, width))[:, :, None], 3, axis=2)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            frame.pts = index
            for packet in encoder.encode(frame):
                yield _pts(packet), bytes(packet), packet.is_keyframe
        for packet in encoder.encode(None):
            yield _pts(packet), bytes(packet), packet.is_keyframe

    def frames(self, seconds: float, size: tuple[int, int]) -> Iterator[tuple[int, bytes]]:
        """:meth:`encoded` without the keyframe flags."""
        for pts, data, _keyframe in self.encoded(seconds, size):
            yield pts, data

    def push(self, seconds: float, size: tuple[int, int] = (320, 180)) -> int:
        """Send ``seconds`` of video (and Opus silence) in real time once the tracks are
        open (waits up to 10 s for them). Returns the video frames sent. Blocking."""
        return self.send(self.frames(seconds, size))

    def send(self, frames: Iterable[tuple[int, bytes]]) -> int:
        """Send ``frames`` (decode order, presentation index in frames) in real time at
        ``self.fps``, with Opus silence, once the tracks are open (waits up to 10 s for
        them). Returns the video frames sent. Blocking."""
        wait_tracks_open((self.video_track, self.audio_track), self.peer_states)
        sent = 0
        for index, (pts, data) in paced(frames, self.fps):
            # The RTP timestamp is the frame's presentation time (RFC 6184), a frame of
            # delay ahead so that a B-frame's stays above 0.
            stamp = (pts + self.b_frames) * 90000 // self.fps
            if self._vp9 is not None:
                # What a packetizer does for the sender reporter: the frame's timestamp.
                self.video_config.timestamp = self._vp9.rtp_timestamp(stamp)
                for packet in self._vp9.packetize(data, stamp):
                    self.video_track.send(packet)
            else:
                self.video_track.send_frame(data, ldc.FrameInfo(stamp))
            sent += 1
            send_silence(self.audio_track, index, self.fps)
        return sent

    def close(self) -> None:
        """Close the peer (:func:`close_peer`)."""
        close_peer(self.pc, (self.video_track, self.audio_track), self.peer_states)


_SESSION_LEVEL = ("a=setup:", "a=ice-ufrag:", "a=ice-pwd:")


def obs_shape(sdp: str) -> str:
    """libdatachannel-py's offer written as OBS's libdatachannel writes it: ``a=setup``,
    ``a=ice-ufrag`` and ``a=ice-pwd`` once at session level (before ``a=ice-options`` and
    the fingerprint), not repeated in each media section; ``a=ice-options:ice2,trickle``.
    Raises ``ValueError`` if the sections disagree on them (nothing to hoist)."""
    lines = [line for line in sdp.replace("\r\n", "\n").split("\n") if line]
    first_media = next(i for i, line in enumerate(lines) if line.startswith("m="))
    session, media = lines[:first_media], lines[first_media:]
    hoisted: list[str] = []
    for prefix in _SESSION_LEVEL:
        found = {line for line in media if line.startswith(prefix)}
        if len(found) != 1:
            raise ValueError(f"media sections disagree on {prefix}: {sorted(found)}")
        hoisted.extend(found)
    media = [line for line in media if not line.startswith(_SESSION_LEVEL)]
    session = [
        "a=ice-options:ice2,trickle" if line.startswith("a=ice-options:") else line
        for line in session
    ]
    at = next(i for i, line in enumerate(session) if line.startswith("a=ice-options:"))
    return "\r\n".join([*session[:at], *hoisted, *session[at:], *media]) + "\r\n"
