"""The aiortc encoded-frame tap (:mod:`whip.rtc.tap`).

The tap tests run aiortc for real: a receiver fed RTP packets that aiortc's own H.264
packetizer made, and a publisher over loopback UDP. ``test_aiortc_internals_*`` fail
loudly when an aiortc upgrade moves what the tap relies on.
"""

from __future__ import annotations

import asyncio
import fractions
import inspect
import queue
import threading
from collections.abc import AsyncIterator, Callable

import aiortc
import aiortc.rtcrtpreceiver
import av
import pytest
from aiortc import (
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.codecs.h264 import H264Encoder
from aiortc.mediastreams import VideoStreamTrack
from aiortc.rtcrtpparameters import (
    RTCRtcpFeedback,
    RTCRtpCodecParameters,
    RTCRtpReceiveParameters,
)
from aiortc.rtcrtpreceiver import RemoteStreamTrack, RTCRtpReceiver
from aiortc.rtp import RtpPacket

from pipeline.decoder import DecodeStats, FrameMeta
from pipeline.intake import FrameIntake, payload_limit_for
from pipeline.supervisor import Supervisor
from tests.support.peers import AiortcPublisher
from tests.test_decoder import (
    H264,
    h264_frames,
    needs_libx264,
    run_worker,
)
from whip.rtc.compat import check_internals
from whip.rtc.peer import new_peer_connection
from whip.rtc.pli import pli_negotiated, remote_media_ssrcs, schedule_pli, send_pli
from whip.rtc.tap import TapNotInstalledError, install_tap

# ---------------------------------------------------------------- aiortc internals


def test_aiortc_internals_the_tap_relies_on() -> None:
    """Fails loudly on an aiortc upgrade that moves anything whip/rtc/tap.py touches."""
    check_internals()
    assert aiortc.__version__ == "1.16.0"
    module = aiortc.rtcrtpreceiver
    assert module.threading is threading  # type: ignore[attr-defined]
    assert inspect.isfunction(module.decoder_worker)
    assert list(inspect.signature(module.decoder_worker).parameters) == [
        "loop",
        "input_q",
        "output_q",
        "decode_error",
    ]
    assert inspect.iscoroutinefunction(RTCRtpReceiver.receive)
    assert inspect.iscoroutinefunction(RTCRtpReceiver._handle_rtp_packet)
    assert list(inspect.signature(RTCRtpReceiver._send_rtcp_pli).parameters) == [
        "self",
        "media_ssrc",
    ]
    assert callable(RTCRtpReceiver._RTCRtpReceiver__stop_decoder)  # type: ignore[attr-defined]


async def test_aiortc_receiver_instance_shape() -> None:
    pc = new_peer_connection()
    try:
        receiver = pc.addTransceiver("video", direction="recvonly").receiver
        assert isinstance(receiver._RTCRtpReceiver__decoder_queue, queue.Queue)
        assert receiver._RTCRtpReceiver__decoder_thread is None
        assert receiver._RTCRtpReceiver__started is False
        for name in ("remote_streams", "rtx_ssrc", "codecs"):
            assert isinstance(getattr(receiver, f"_RTCRtpReceiver__{name}"), dict), name
        assert receiver._RTCRtpReceiver__rtcp_ssrc is not None  # PLI needs it
    finally:
        await pc.close()


# ---------------------------------------------------------------- the tap, RTP in


def _recvonly_receiver(pc: RTCPeerConnection, kind: str = "video") -> RTCRtpReceiver:
    """A receiver as setRemoteDescription leaves it (aiortc gives it its track there)."""
    receiver: RTCRtpReceiver = pc.addTransceiver(kind, direction="recvonly").receiver
    receiver._track = RemoteStreamTrack(kind=kind)
    return receiver


async def _feed_rtp(receiver: RTCRtpReceiver, frames: tuple[bytes, ...], ssrc: int) -> None:
    """Packetize with aiortc's own H.264 packetizer and hand the packets to the receiver."""
    encoder = H264Encoder()
    seq = 0
    for index, data in enumerate(frames):
        packet = av.Packet(data)
        packet.pts, packet.time_base = index, fractions.Fraction(1, 30)
        payloads, timestamp = encoder.pack(packet)
        for n, payload in enumerate(payloads):
            rtp = RtpPacket(
                payload_type=H264.payloadType,
                sequence_number=seq,
                timestamp=timestamp + 123456,
                ssrc=ssrc,
                payload=payload,
                marker=n == len(payloads) - 1,
            )
            seq += 1
            await receiver._handle_rtp_packet(rtp, arrival_time_ms=index * 33)


@needs_libx264
async def test_tap_takes_depayloaded_frames_and_no_decoder_thread_starts() -> None:
    pc = new_peer_connection()
    try:
        receiver = _recvonly_receiver(pc)
        intake = FrameIntake("video", depth=64, payload_limit=1 << 20)
        errors: list[BaseException] = []
        tap = install_tap(receiver, intake.offer, on_end=intake.close, on_error=errors.append)
        assert not tap.receiving
        h264 = RTCRtpCodecParameters(
            mimeType="video/H264",
            clockRate=90000,
            payloadType=102,
            rtcpFeedback=[RTCRtcpFeedback(type="nack", parameter="pli")],
        )
        await receiver.receive(RTCRtpReceiveParameters(codecs=[h264]))
        assert tap.receiving and errors == []
        assert receiver._RTCRtpReceiver__decoder_thread is tap.stand_in
        assert aiortc.rtcrtpreceiver.threading is threading  # type: ignore[attr-defined]
        assert not [t.name for t in threading.enumerate() if t.name.endswith("-decoder")]
        assert pli_negotiated(receiver)

        await _feed_rtp(receiver, h264_frames()[:31], ssrc=4242)
        # The jitter buffer releases a frame when the next one starts: the last waits.
        assert (intake.frames_in, tap.frames, intake.keyframes) == (30, 30, 1)
        assert receiver.track._queue.qsize() == 0  # aiortc's unbounded queue stays empty
        assert remote_media_ssrcs(receiver) == [4242]
        assert await send_pli(receiver) == 1  # unconnected: aiortc swallows the send

        await receiver.stop()  # __stop_decoder: end of stream
        assert tap.ended and intake.closed
        stats = DecodeStats("video")
        run_worker(intake, stats, "decode-video-tap").join(10)
        assert (stats.frames_decoded, stats.decode_errors) == (30, 0)
        assert (stats.width, stats.height) == (320, 180)
    finally:
        await pc.close()


async def test_tap_refuses_a_second_tap_and_a_started_receiver() -> None:
    pc = new_peer_connection()
    try:
        receiver = _recvonly_receiver(pc)
        intake = FrameIntake("video", depth=4, payload_limit=1 << 20)
        install_tap(receiver, intake.offer)
        with pytest.raises(TapNotInstalledError, match="already tapped"):
            install_tap(receiver, intake.offer)
        await receiver.receive(RTCRtpReceiveParameters(codecs=[H264]))
        late = _recvonly_receiver(pc)
        await late.receive(RTCRtpReceiveParameters(codecs=[H264]))  # stock: a real thread
        with pytest.raises(TapNotInstalledError, match="already started"):
            install_tap(late, intake.offer)
        await late.stop()
        await receiver.stop()
    finally:
        await pc.close()


async def test_tap_that_cannot_take_effect_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pc = new_peer_connection()
    try:
        # 1. Our sink queue was replaced after installation (aiortc re-creating it).
        receiver = _recvonly_receiver(pc)
        errors: list[BaseException] = []
        tap = install_tap(receiver, lambda codec, frame: None, on_error=errors.append)
        receiver._RTCRtpReceiver__decoder_queue = queue.Queue()
        with pytest.raises(TapNotInstalledError, match="decoder queue was replaced"):
            await receiver.receive(RTCRtpReceiveParameters(codecs=[H264]))
        assert not tap.receiving and isinstance(tap.error, TapNotInstalledError)
        assert errors == [tap.error]
        await receiver.stop()

        # 2. A receive() that suspends (an aiortc that awaits before starting its thread).
        stock = RTCRtpReceiver.receive

        async def suspending(self: RTCRtpReceiver, parameters: RTCRtpReceiveParameters) -> None:
            await asyncio.sleep(0)
            await stock(self, parameters)

        monkeypatch.setattr(RTCRtpReceiver, "receive", suspending)
        other = _recvonly_receiver(pc)
        errors.clear()
        install_tap(other, lambda codec, frame: None, on_error=errors.append)
        with pytest.raises(TapNotInstalledError, match="suspended"):
            await other.receive(RTCRtpReceiveParameters(codecs=[H264]))
        assert len(errors) == 1
        assert aiortc.rtcrtpreceiver.threading is threading  # type: ignore[attr-defined]
        assert not [t.name for t in threading.enumerate() if t.name.endswith("-decoder")]
    finally:
        await pc.close()


async def test_a_failing_sink_never_reaches_aiortc() -> None:
    pc = new_peer_connection()
    try:
        receiver = _recvonly_receiver(pc)
        errors: list[BaseException] = []

        def sink(codec: object, frame: object) -> None:
            raise RuntimeError("sink broke")

        tap = install_tap(receiver, sink, on_error=errors.append)
        await receiver.receive(RTCRtpReceiveParameters(codecs=[H264]))
        await _feed_rtp(receiver, h264_frames()[:5], ssrc=7)
        assert (tap.frames, tap.sink_errors, len(errors)) == (4, 4, 1)
        await receiver.stop()
    finally:
        await pc.close()


# ---------------------------------------------------------------- loopback publisher


class LoopRecorder:
    """``on_frame`` for the loopback test: metas per kind; wakes the loop on each frame."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self.metas: dict[str, list[FrameMeta]] = {"video": [], "audio": []}
        self.sizes: set[tuple[int, int]] = set()
        self.changed = asyncio.Event()

    def __call__(self, frame: av.VideoFrame | av.AudioFrame, meta: FrameMeta) -> None:
        with self._lock:
            self.metas[meta.kind].append(meta)
            if isinstance(frame, av.VideoFrame):
                self.sizes.add((frame.width, frame.height))
        self._loop.call_soon_threadsafe(self.changed.set)

    async def until(self, predicate: Callable[[], bool], within: float = 8.0) -> None:
        async with asyncio.timeout(within):
            while True:
                self.changed.clear()
                with self._lock:
                    if predicate():
                        return
                await self.changed.wait()


@pytest.fixture
async def peers() -> AsyncIterator[list[RTCPeerConnection]]:
    opened: list[RTCPeerConnection] = []
    yield opened
    for pc in reversed(opened):
        await pc.close()


async def _publisher_offer(codec: str, pcs: list[RTCPeerConnection]) -> str:
    publisher = AiortcPublisher()
    pcs.append(publisher.pc)
    if codec == "VP8":
        return await publisher.offer()
    transceiver = publisher.pc.addTransceiver(VideoStreamTrack(), direction="sendonly")
    transceiver.setCodecPreferences(
        [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType == "video/H264"]
    )
    return await publisher.offer(video=False)


@pytest.mark.parametrize("codec", ["H264", "VP8"])
async def test_loopback_publisher_frames_reach_the_intake(
    codec: str, peers: list[RTCPeerConnection]
) -> None:
    loop = asyncio.get_running_loop()
    publisher_sdp = await _publisher_offer(codec, peers)
    publisher = peers[0]
    answerer = new_peer_connection()
    peers.append(answerer)
    await answerer.setRemoteDescription(RTCSessionDescription(sdp=publisher_sdp, type="offer"))
    intakes: dict[str, FrameIntake] = {}
    taps = {}
    tap_errors: list[BaseException] = []
    for transceiver in answerer.getTransceivers():
        transceiver.direction = "recvonly"
        kind = transceiver.kind
        intakes[kind] = FrameIntake(
            kind,
            depth=16,
            payload_limit=payload_limit_for(2 * 16 * 256 * 1024, tracks=2, depth=16),
            on_need_keyframe=schedule_pli(transceiver.receiver),
            label=f"it-{kind}",
        )
        taps[kind] = install_tap(
            transceiver.receiver,
            intakes[kind].offer,
            on_end=intakes[kind].close,
            on_error=tap_errors.append,
        )
    await answerer.setLocalDescription(await answerer.createAnswer())
    await publisher.setRemoteDescription(
        RTCSessionDescription(sdp=answerer.localDescription.sdp, type="answer")
    )
    recorder = LoopRecorder(loop)
    faults: list[tuple[str, BaseException]] = []
    runtime = Supervisor(
        f"loop{codec}", loop=loop, on_fault=lambda s, e: faults.append((s, e)), on_frame=recorder
    )
    runtime.start([intakes["video"], intakes["audio"]])
    try:
        await recorder.until(lambda: len(recorder.metas["video"]) >= 10)
        await recorder.until(lambda: len(recorder.metas["audio"]) >= 10)
        names = {t.name for t in threading.enumerate()}
        assert "video-decoder" not in names and "audio-decoder" not in names
        assert {f"decode-video-loop{codec}", f"decode-audio-loop{codec}"} <= names
        assert all(tap.receiving for tap in taps.values()) and tap_errors == []
        for kind in ("video", "audio"):  # aiortc's own unbounded queues stay empty
            assert answerer_track_queue(taps[kind].receiver) == 0
        stats = runtime.stats()
        video, audio = stats["decode-video"], stats["decode-audio"]
        assert (video.codec, video.width, video.height, video.decode_errors) == (
            codec,
            640,
            480,
            0,
        )
        assert (audio.codec, audio.sample_rate, audio.decode_errors) == ("opus", 48000, 0)
        assert recorder.sizes == {(640, 480)}
        assert recorder.metas["video"][0].keyframe

        # A PLI reaches aiortc's sender, which forces a keyframe (its GOP is huge).
        assert pli_negotiated(taps["video"].receiver)
        keyframes = intakes["video"].keyframes
        assert await send_pli(taps["video"].receiver) == 1
        await recorder.until(lambda: any(m.keyframe for m in recorder.metas["video"][1:]))
        assert intakes["video"].keyframes > keyframes
    finally:
        await answerer.close()  # receivers stop: end of stream into every intake
        missed = await runtime.stop_async(2.0)
    assert missed == [] and faults == [] and runtime.faults == []
    assert all(tap.ended for tap in taps.values())
    assert all(intake.closed for intake in intakes.values())
    assert intakes["video"].dropped_frames == 0


def answerer_track_queue(receiver: RTCRtpReceiver) -> int:
    track = receiver.track
    assert isinstance(track, RemoteStreamTrack)
    return track._queue.qsize()
