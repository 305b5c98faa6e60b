"""The blocking-call guard (tests/support/loop_guard.py, the ``no_blocking_on_loop`` fixture).

Each test here provokes offences on purpose, checks the fixture recorded exactly them, and
clears the list so that the fixture's own teardown check passes.
"""

from __future__ import annotations

import asyncio
import fractions
import io
import os
import time
from pathlib import Path

import av

from pipeline.decoder import DecodeStats, decoder_worker, open_decoder
from pipeline.frame import EncodedFrame
from pipeline.intake import FrameIntake
from tests.support.loop_guard import pyav_decode_owner

HERE = Path(__file__).name


def _mulaw_packet() -> av.Packet:
    return av.Packet(b"\xff" * 160)  # 20 ms of G.711 silence: any bytes decode


def _jpeg() -> bytes:
    encoder = av.CodecContext.create("mjpeg", "w")
    encoder.width, encoder.height, encoder.pix_fmt = 16, 16, "yuvj420p"
    encoder.time_base = fractions.Fraction(1, 25)
    picture = av.VideoFrame(16, 16, "yuvj420p")
    picture.pts = 0
    return b"".join(bytes(p) for p in [*encoder.encode(picture), *encoder.encode(None)])


async def test_a_decode_on_the_loop_is_an_offence(no_blocking_on_loop: list[str]) -> None:
    decoder = open_decoder("PCMU", 1, None)  # the pipeline's own entry point
    frames = decoder.decode(_mulaw_packet())
    assert frames and frames[0].samples == 160
    (offence,) = no_blocking_on_loop
    assert offence.startswith("PyAV AudioCodecContext.decode in ")
    assert HERE in offence
    no_blocking_on_loop.clear()


async def test_the_decode_worker_run_on_the_loop_is_an_offence(
    no_blocking_on_loop: list[str],
) -> None:
    """The mistake the guard is for: the pipeline's worker function called on the loop."""
    intake = FrameIntake("audio", depth=4, payload_limit=1 << 16)
    intake.put(EncodedFrame("audio", "PCMU", b"\xff" * 160, 0, True, time.monotonic()))
    intake.close()
    stats = DecodeStats("audio")
    decoder_worker(intake, stats)
    assert stats.frames_decoded == 1
    assert no_blocking_on_loop and all("decoder_worker" in o for o in no_blocking_on_loop)
    assert all("pipeline/decoder.py" in o for o in no_blocking_on_loop)
    no_blocking_on_loop.clear()


async def test_a_decode_in_a_thread_is_not_but_the_same_call_on_the_loop_is(
    no_blocking_on_loop: list[str],
) -> None:
    decoder = open_decoder("PCMU", 1, None)

    def decode_one() -> int:
        return len(decoder.decode(_mulaw_packet()))

    assert await asyncio.to_thread(decode_one) == 1
    assert no_blocking_on_loop == []  # seen on a worker thread: allowed
    assert decode_one() == 1  # the very same call site, watched still, now on the loop
    assert len(no_blocking_on_loop) == 1 and "decode_one" in no_blocking_on_loop[0]
    no_blocking_on_loop.clear()


async def test_a_container_decode_on_the_loop_is_an_offence(
    no_blocking_on_loop: list[str],
) -> None:
    data = _jpeg()
    with av.open(io.BytesIO(data), mode="r", format="mjpeg") as container:
        (picture,) = list(container.decode(video=0))
    assert (picture.width, picture.height) == (16, 16)
    assert [o.split(" in ")[0] for o in no_blocking_on_loop] == ["PyAV InputContainer.decode"]
    no_blocking_on_loop.clear()

    def in_a_thread() -> int:
        with av.open(io.BytesIO(data), mode="r", format="mjpeg") as container:
            return len(list(container.decode(video=0)))

    assert await asyncio.to_thread(in_a_thread) == 1
    assert no_blocking_on_loop == []


def test_a_decode_outside_any_loop_is_not_an_offence(no_blocking_on_loop: list[str]) -> None:
    decoder = open_decoder("PCMU", 1, None)
    assert len(decoder.decode(_mulaw_packet())) == 1
    assert no_blocking_on_loop == []


async def test_fsync_on_the_loop_is_an_offence_and_in_a_thread_is_not(
    tmp_path: Path, no_blocking_on_loop: list[str]
) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"x")
        await asyncio.to_thread(os.fsync, fd)
        assert no_blocking_on_loop == []
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    assert no_blocking_on_loop == ["fsync", "fdatasync"]
    no_blocking_on_loop.clear()


def test_only_pyav_decodes_count() -> None:
    decoder = open_decoder("PCMU", 1, None)
    assert pyav_decode_owner(type(decoder).decode) is av.codec.context.CodecContext
    assert pyav_decode_owner(decoder.decode) is type(decoder)
    assert pyav_decode_owner(av.container.InputContainer.decode) is av.container.InputContainer
    assert pyav_decode_owner(bytes.decode) is None
    assert pyav_decode_owner(b"x".decode) is None
    assert pyav_decode_owner(decoder.encode) is None
    assert pyav_decode_owner(print) is None
