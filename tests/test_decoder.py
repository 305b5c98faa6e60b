"""Keyframe detection and the decode worker, on frames real encoders made (PyAV).

The encoded samples are produced in-process by libx264, libvpx and libopus, and the
helpers here (no ``test_`` prefix) are shared with ``test_intake.py`` and
``test_supervisor.py``.
"""

from __future__ import annotations

import fractions
import functools
import random
import threading
import time
from collections.abc import Sequence

import av
import numpy as np
import pytest
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from hypothesis import given
from hypothesis import strategies as st

from pipeline.decoder import DecodeStats, FrameMeta, decoder_worker, open_decoder
from pipeline.intake import FrameIntake
from pipeline.keyframes import (
    H264_NAL_IDR,
    h264_is_keyframe,
    h264_nal_types,
    is_keyframe,
    vp8_is_keyframe,
)
from tests.support.eventually import eventually_blocking

WIDTH, HEIGHT, GOP, FRAMES = 320, 180, 30, 90
TICKS_PER_FRAME = 3000  # 90 kHz RTP clock at 30 fps
H264 = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)
VP8 = RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90000, payloadType=96)
OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)

needs_libx264 = pytest.mark.skipif("libx264" not in av.codecs_available, reason="no libx264")
needs_libvpx = pytest.mark.skipif("libvpx" not in av.codecs_available, reason="no libvpx")
needs_libopus = pytest.mark.skipif("libopus" not in av.codecs_available, reason="no libopus")


# ---------------------------------------------------------------- shared helpers


def _picture(index: int) -> av.VideoFrame:
    """A moving gradient, so P-frames carry real motion."""
    x = np.arange(WIDTH, dtype=np.uint16)[None, :]
    y = np.arange(HEIGHT, dtype=np.uint16)[:, None]
    luma = ((x + y * 2 + index * 4) % 256).astype(np.uint8)
    image = np.stack([luma, np.roll(luma, index, axis=1), 255 - luma], axis=2)
    frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
    frame.pts = index
    return frame


def _encode_video(
    encoder: str, frames: int, options: dict[str, str], gop: int = GOP
) -> tuple[bytes, ...]:
    context = av.CodecContext.create(encoder, "w")
    assert isinstance(context, av.VideoCodecContext)
    context.width, context.height, context.pix_fmt = WIDTH, HEIGHT, "yuv420p"
    context.time_base = fractions.Fraction(1, 30)
    context.framerate = fractions.Fraction(30, 1)
    context.gop_size = gop
    context.max_b_frames = 0
    context.options = options
    packets = [bytes(p) for i in range(frames) for p in context.encode(_picture(i))]
    packets += [bytes(p) for p in context.encode(None)]
    return tuple(packets)


@functools.cache
def h264_frames(frames: int = FRAMES) -> tuple[bytes, ...]:
    """libx264 Annex-B access units, IDR every GOP frames, no B-frames, no delay."""
    return _encode_video(
        "libx264",
        frames,
        {"preset": "ultrafast", "tune": "zerolatency", "profile": "baseline", "keyint_min": "30"},
    )


VP8_FRAMES, VP8_GOP = 21, 10  # libvpx is slow here (~35 ms a frame): keep it short


@functools.cache
def vp8_frames(frames: int = VP8_FRAMES) -> tuple[bytes, ...]:
    """libvpx VP8 frames, a key frame every VP8_GOP frames."""
    return _encode_video("libvpx", frames, {"deadline": "realtime", "cpu-used": "16"}, gop=VP8_GOP)


@functools.cache
def opus_frames(frames: int = 50) -> tuple[bytes, ...]:
    """libopus 20 ms stereo frames of a 440 Hz tone."""
    context = av.CodecContext.create("libopus", "w")
    assert isinstance(context, av.AudioCodecContext)
    context.sample_rate, context.layout, context.format = 48000, "stereo", "s16"
    context.time_base = fractions.Fraction(1, 48000)
    out: list[bytes] = []
    for i in range(frames):
        t = (np.arange(960) + i * 960) / 48000
        tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
        samples = np.repeat(tone, 2)[None, :]
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="stereo")
        frame.sample_rate, frame.pts = 48000, i * 960
        frame.time_base = fractions.Fraction(1, 48000)
        out += [bytes(p) for p in context.encode(frame)]
    out += [bytes(p) for p in context.encode(None)]
    return tuple(out)


def jitter(data: bytes, index: int, ticks: int = TICKS_PER_FRAME) -> JitterFrame:
    """aiortc's own frame object, as its jitter buffer would hand it over."""
    return JitterFrame(data=data, timestamp=index * ticks)


class Recorder:
    """An ``on_frame`` that records metadata and can be made to block (a slow analyzer).

    ``entered`` is set when a frame is being handled; while ``gate`` is clear the callback
    waits on it. Waiters use :meth:`wait_for` (a thread; wrap in ``asyncio.to_thread``).
    """

    def __init__(self, block: bool = False, raise_on: int | None = None) -> None:
        self.metas: list[FrameMeta] = []
        self.sizes: list[tuple[int, int]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        if not block:
            self.gate.set()
        self.raise_on = raise_on
        self._cond = threading.Condition()

    def __call__(self, frame: av.VideoFrame | av.AudioFrame, meta: FrameMeta) -> None:
        self.entered.set()
        if not self.gate.wait(10):
            raise AssertionError("gate never opened")
        if self.raise_on is not None and meta.index >= self.raise_on:
            raise ValueError(f"analyzer failed on frame {meta.index}")
        with self._cond:
            self.metas.append(meta)
            if isinstance(frame, av.VideoFrame):
                self.sizes.append((frame.width, frame.height))
            self._cond.notify_all()

    def wait_for(self, count: int, timeout: float = 5.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.metas) >= count, timeout):
                raise AssertionError(f"{len(self.metas)} frames handled, expected {count}")

    def timestamps(self) -> list[int]:
        with self._cond:
            return [m.timestamp for m in self.metas]


def run_worker(
    intake: FrameIntake, stats: DecodeStats, name: str, **kwargs: object
) -> threading.Thread:
    """``decoder_worker`` on a named thread, as the runtime would start it."""
    thread = threading.Thread(
        target=decoder_worker, args=(intake, stats), kwargs=kwargs, name=name, daemon=True
    )
    thread.start()
    return thread


def queued(
    codec: RTCRtpCodecParameters, frames: Sequence[bytes], ticks: int = TICKS_PER_FRAME
) -> FrameIntake:
    """A closed intake holding all of ``frames`` (each offered as the tap would, ``ticks``
    apart, and accepted): a whole push, waiting for a decode worker."""
    kind = codec.mimeType.partition("/")[0]
    limit = 1 << 20 if kind == "video" else 4096
    intake = FrameIntake(kind, depth=len(frames), payload_limit=limit)
    for index, data in enumerate(frames):
        assert intake.offer(codec, jitter(data, index, ticks))
    intake.close()
    return intake


# ---------------------------------------------------------------- keyframes


@needs_libx264
def test_h264_keyframes_match_the_encoder() -> None:
    frames = h264_frames()
    assert len(frames) == FRAMES
    flags = [h264_is_keyframe(f) for f in frames]
    assert [i for i, key in enumerate(flags) if key] == [0, 30, 60]
    assert h264_nal_types(frames[0])[:2] == [7, 8]  # SPS, PPS, then SEI/IDR slices
    assert H264_NAL_IDR in h264_nal_types(frames[0])
    assert all(is_keyframe("H264", f) == k for f, k in zip(frames, flags, strict=True))


@needs_libx264
def test_h264_three_byte_start_codes_and_parameter_sets_alone() -> None:
    idr = h264_frames()[0]
    short = idr.replace(b"\x00\x00\x00\x01", b"\x00\x00\x01")
    assert h264_is_keyframe(short)
    # Only the parameter sets (cut before the SEI that follows them): not a keyframe.
    params = idr[: idr.index(b"\x00\x00\x01\x06")]
    assert h264_nal_types(params) == [7, 8]
    assert not h264_is_keyframe(params)
    assert not h264_is_keyframe(h264_frames()[1])  # a P-frame (non-IDR slice)


def test_h264_garbage_is_not_a_keyframe() -> None:
    for data in (
        b"",
        b"\x00\x00\x01",  # start code, no header
        b"\x00\x00\x00\x01",
        b"\x65\x88\x84",  # an IDR header without a start code
        b"\x00\x00\x01\x85",  # IDR type with the forbidden bit set
        b"\x00\x00\x01\x41\x9a",  # non-IDR slice
    ):
        assert not h264_is_keyframe(data), data
    assert h264_is_keyframe(b"\x00\x00\x01\x65\x88")


@given(st.binary(max_size=512))
def test_h264_detection_agrees_with_the_nal_walk(data: bytes) -> None:
    assert h264_is_keyframe(data) == (H264_NAL_IDR in h264_nal_types(data))


@needs_libvpx
def test_vp8_keyframes_match_the_encoder() -> None:
    frames = vp8_frames()
    keys = [i for i, f in enumerate(frames) if vp8_is_keyframe(f)]
    assert keys[0] == 0
    assert keys == [i for i in range(len(frames)) if i % VP8_GOP == 0]
    assert all(is_keyframe("VP8", f) == vp8_is_keyframe(f) for f in frames)


def test_vp8_garbage_is_not_a_keyframe() -> None:
    rng = random.Random(7)
    assert not vp8_is_keyframe(b"")
    assert not vp8_is_keyframe(b"\x00")  # P bit clear but far too short
    assert not vp8_is_keyframe(b"\x00" * 10)  # no start code
    for _ in range(200):
        data = bytearray(rng.randbytes(rng.randrange(1, 64)))
        if len(data) >= 6 and data[3:6] == b"\x9d\x01\x2a":
            continue
        assert not vp8_is_keyframe(bytes(data))


def test_audio_frames_are_keyframes_and_unknown_video_is_not() -> None:
    assert is_keyframe("opus", b"\xfc\xff\xfe")
    assert not is_keyframe("opus", b"")
    assert not is_keyframe("H263", b"\x00\x00\x01\x65")


# ---------------------------------------------------------------- decoding


@needs_libx264
def test_h264_frames_decode_one_for_one() -> None:
    intake = queued(H264, h264_frames())
    stats = DecodeStats("video")
    recorder = Recorder()
    started = time.monotonic()
    run_worker(intake, stats, "decode-video-t1", on_frame=recorder).join(10)
    assert time.monotonic() - started < 5
    # libx264 with zerolatency has no encoder delay: every access unit is one picture.
    assert stats.frames_in == stats.frames_decoded == FRAMES
    assert (stats.width, stats.height, stats.pix_fmt) == (WIDTH, HEIGHT, "yuv420p")
    assert (stats.decode_errors, stats.skipped, stats.codec) == (0, 0, "H264")
    assert recorder.timestamps() == [i * TICKS_PER_FRAME for i in range(FRAMES)]
    assert [m.index for m in recorder.metas] == list(range(FRAMES))
    assert [m.keyframe for m in recorder.metas].count(True) == 3
    assert set(recorder.sizes) == {(WIDTH, HEIGHT)}


@needs_libx264
def test_h264_with_codec_threads_flushes_every_frame() -> None:
    intake = queued(H264, h264_frames())
    stats = DecodeStats("video")
    run_worker(intake, stats, "decode-video-t2", codec_threads=4).join(10)
    # Frame threading delays output; the end-of-stream flush returns the rest.
    assert stats.frames_decoded == FRAMES and stats.decode_errors == 0


@needs_libx264
def test_keyframes_only_mode() -> None:
    intake = queued(H264, h264_frames())
    stats = DecodeStats("video")
    recorder = Recorder()
    run_worker(intake, stats, "decode-video-t3", keyframes_only=True, on_frame=recorder).join(10)
    assert recorder.timestamps() == [0, 30 * TICKS_PER_FRAME, 60 * TICKS_PER_FRAME]
    assert (stats.frames_decoded, stats.skipped, stats.decode_errors) == (3, FRAMES - 3, 0)


@needs_libvpx
def test_vp8_frames_decode() -> None:
    frames = vp8_frames()
    intake = queued(VP8, frames)
    stats = DecodeStats("video")
    run_worker(intake, stats, "decode-video-t4").join(10)
    assert stats.frames_decoded == len(frames) and stats.decode_errors == 0
    assert (stats.width, stats.height, stats.codec) == (WIDTH, HEIGHT, "VP8")


@needs_libopus
def test_opus_frames_decode_at_48k_stereo() -> None:
    frames = opus_frames()
    intake = queued(OPUS, frames, ticks=960)
    stats = DecodeStats("audio")
    run_worker(intake, stats, "decode-audio-t5").join(10)
    assert stats.frames_decoded == len(frames) and stats.decode_errors == 0
    assert (stats.sample_rate, stats.channels, stats.codec) == (48000, 2, "opus")
    assert intake.keyframes == len(frames)


@needs_libx264
def test_garbage_is_counted_and_decoding_recovers_at_the_next_keyframe() -> None:
    rng = random.Random(1234)
    good = h264_frames()
    requests: list[int] = []
    intake = FrameIntake(
        "video", depth=256, payload_limit=1 << 20, on_need_keyframe=lambda: requests.append(1)
    )
    stats = DecodeStats("video")
    recorder = Recorder()
    stream: list[tuple[int, bytes]] = [(-1, rng.randbytes(300))]  # before any keyframe
    stream += [(i, good[i]) for i in range(10)]
    stream.append((10, good[10][: len(good[10]) // 2]))  # a truncated NAL unit
    stream.append((11, rng.randbytes(500)))  # random bytes
    stream.append((12, b"\x00\x00\x00\x01\x65" + rng.randbytes(400)))  # a fake IDR
    stream += [(i, good[i]) for i in range(13, FRAMES)]
    for index, data in stream:
        intake.offer(H264, jitter(data, max(index, 0)))
    intake.close()
    run_worker(intake, stats, "decode-video-t6", on_frame=recorder).join(10)

    decoded = {t // TICKS_PER_FRAME for t in recorder.timestamps()}
    assert stats.decode_errors >= 1, "garbage must count as decode errors"
    assert "Invalid data" in (stats.last_error or "")
    assert set(range(10)) <= decoded  # before the damage
    assert decoded.isdisjoint(range(13, 30))  # inter frames after an error are skipped
    assert set(range(30, FRAMES)) <= decoded  # recovery at the next IDR, all of it
    assert recorder.metas[-60].keyframe and recorder.metas[-60].timestamp == 30 * TICKS_PER_FRAME
    # The worker asked the intake for a keyframe; the intake's next offer would send the
    # PLI (all frames were already queued here, so none was offered after the request).
    assert stats.skipped >= 17


@needs_libx264
def test_decode_errors_ask_the_producer_for_a_keyframe() -> None:
    """Online: the worker's request reaches the loop side as one on_need_keyframe."""
    good = h264_frames()
    requests: list[int] = []
    intake = FrameIntake(
        "video", depth=64, payload_limit=1 << 20, on_need_keyframe=lambda: requests.append(1)
    )
    stats = DecodeStats("video")
    recorder = Recorder()
    thread = run_worker(intake, stats, "decode-video-t7", on_frame=recorder)
    for i in range(5):
        intake.offer(H264, jitter(good[i], i))
    recorder.wait_for(5)
    intake.offer(H264, jitter(b"\x00\x00\x00\x01\x65" + bytes(range(256)) * 2, 5))
    eventually_blocking(
        lambda: stats.decode_errors, within=5, awaiting="the decode error counted", every=0.001
    )
    assert stats.decode_errors == 1
    for i in range(6, 40):  # the next offer makes the request; P-frames are dropped
        intake.offer(H264, jitter(good[i], i))
    intake.close()
    thread.join(10)
    assert requests == [1]
    assert intake.dropped_frames == 24  # 6..29
    assert {t // TICKS_PER_FRAME for t in recorder.timestamps()} == {*range(5), *range(30, 40)}


def test_unknown_codec_is_the_workers_failure() -> None:
    with pytest.raises(ValueError, match="no decoder"):
        open_decoder("H261")
    assert open_decoder("opus").sample_rate == 48000


@pytest.mark.parametrize(
    ("codec", "decoder"),
    [("H265", "hevc"), ("HEVC", "hevc"), ("AV1", "libdav1d"), ("VP9", "vp9")],
)
def test_the_formats_aiortc_lacks_have_their_decoders(codec: str, decoder: str) -> None:
    context = open_decoder(codec, 1)
    assert (context.name, context.thread_count) == (decoder, 1)


# ---------------------------------------------------------------- picture size bound


@functools.cache
def h264_big_frames(width: int = 640, height: int = 360, frames: int = 60) -> tuple[bytes, ...]:
    """libx264 at ``width`` x ``height`` (IDR every GOP frames), noise so each frame is real."""
    context = av.CodecContext.create("libx264", "w")
    assert isinstance(context, av.VideoCodecContext)
    context.width, context.height, context.pix_fmt = width, height, "yuv420p"
    context.time_base = fractions.Fraction(1, 30)
    context.gop_size, context.max_b_frames = GOP, 0
    context.options = {"preset": "ultrafast", "tune": "zerolatency", "keyint_min": str(GOP)}
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    packets: list[bytes] = []
    for index in range(frames):
        image = np.roll(noise, index * 4, axis=1)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        frame.pts = index
        packets += [bytes(p) for p in context.encode(frame)]
    packets += [bytes(p) for p in context.encode(None)]
    return tuple(packets)


@needs_libx264
@pytest.mark.parametrize("max_pixels", [None, WIDTH * HEIGHT])
def test_pictures_over_max_pixels_are_refused_and_counted(max_pixels: int | None) -> None:
    """A publisher switches from 320x180 to 640x360 (230,400 pixels) and back. With
    ``max_pixels`` = 320 x 180 each 640x360 IDR frame is a decode error (FFmpeg refuses
    the picture before allocating it), the P-frames after it are skipped, none is
    delivered, and the same decoder goes on with the 320x180 stream: nothing faults.
    Without a bound (the control) all 150 frames decode."""
    small, big = h264_frames(), h264_big_frames()
    assert [h264_is_keyframe(f) for f in big].count(True) == 2  # IDR at 0 and 30
    stream = [*small[:30], *big, *small[30:]]
    intake = queued(H264, stream)
    stats = DecodeStats("video")
    recorder = Recorder()
    run_worker(intake, stats, "decode-video-t8", max_pixels=max_pixels, on_frame=recorder).join(10)
    decoded = {t // TICKS_PER_FRAME for t in recorder.timestamps()}
    print(f"\nmax_pixels={max_pixels}: {stats.as_dict()}")
    if max_pixels is None:
        assert (stats.frames_decoded, stats.decode_errors, stats.skipped) == (150, 0, 0)
        assert set(recorder.sizes) == {(WIDTH, HEIGHT), (640, 360)}
        return
    assert stats.frames_in == 150
    assert (stats.frames_decoded, stats.decode_errors, stats.skipped) == (90, 2, 58)
    assert "Invalid data" in (stats.last_error or "")
    assert set(recorder.sizes) == {(WIDTH, HEIGHT)}  # no 640x360 picture was delivered
    assert decoded == {*range(30), *range(90, 150)}
    assert (stats.width, stats.height) == (WIDTH, HEIGHT)


@needs_libvpx
def test_vp8_pictures_over_max_pixels_are_refused_and_counted() -> None:
    """VP8 too: every key frame (0, 10, 20) is refused, the inter frames are skipped."""
    frames = vp8_frames()
    intake = queued(VP8, frames)
    stats = DecodeStats("video")
    run_worker(intake, stats, "decode-video-t9", max_pixels=WIDTH * HEIGHT - 1).join(10)
    assert (stats.frames_decoded, stats.decode_errors) == (0, 3)
    assert stats.skipped == len(frames) - 3 and stats.width is None


@pytest.mark.parametrize(
    ("codec", "silence", "rate"),
    [("PCMU", b"\xff", 8000), ("PCMA", b"\xd5", 8000), ("G722", b"\x00", 16000)],
)
def test_g711_and_g722_decode(codec: str, silence: bytes, rate: int) -> None:
    """20 ms packets decode to mono at the RFC 3551 rate (G.711 used to fault the worker:
    the decoder did not open without a rate and layout)."""
    params = RTCRtpCodecParameters(mimeType=f"audio/{codec}", clockRate=8000, payloadType=0)
    intake = queued(params, [silence * 160] * 5, ticks=160)
    stats = DecodeStats("audio")
    run_worker(intake, stats, "decode-audio-t10").join(10)
    assert (stats.frames_decoded, stats.decode_errors) == (5, 0)
    assert (stats.sample_rate, stats.channels) == (rate, 1)


def test_max_pixels_is_set_on_video_decoders_only() -> None:
    assert open_decoder("H264", max_pixels=4096 * 2304).options == {"max_pixels": "9437184"}
    assert open_decoder("VP8").options == {}
    assert open_decoder("opus", max_pixels=100).options == {}
