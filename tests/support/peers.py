"""Real publishers for tests: an aiortc peer and FFmpeg's WHIP muxer, on loopback.

:class:`AiortcPublisher` is the benches' own (``bench/support/publisher.py``: the system
crash loop runs it in both), named here for the tests; :func:`ffmpeg_whip_push` is the
tests' alone; :func:`server_dtls` is the server side's DTLS transport of a session, whatever
peer published it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.support.publisher import AiortcPublisher
from whip.live_session import LiveSession

__all__ = ["AiortcPublisher", "ffmpeg_whip_push", "server_dtls"]


def server_dtls(session: LiveSession) -> Any:
    """The session's one (BUNDLE) DTLS transport."""
    transports = {
        id(t.receiver.transport): t.receiver.transport for t in session.pc.getTransceivers()
    }
    assert len(transports) == 1, "BUNDLE: one transport for audio and video"
    return next(iter(transports.values()))


def ffmpeg_whip_push(
    url: str,
    seconds: float,
    *,
    fps: int = 30,
    size: tuple[int, int] = (320, 180),
    audio: bool = True,
    profile: str = "baseline",
    preset: str = "ultrafast",
    token: str | None = None,
    on_packet: Callable[[str, bytes], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> int:
    """Push a generated pattern (H.264 of libx264's ``profile`` + Opus) with FFmpeg's WHIP
    muxer through PyAV. (libx264's ``profile`` is a ceiling: ``ultrafast`` turns CABAC and
    8x8 transforms off, so its stream is constrained baseline whatever the profile; a
    main or high stream needs ``preset="veryfast"`` or slower.)

    Blocking and paced in real time; bounded by ``seconds``. Closing the container makes
    the muxer DELETE its session URL. Returns the number of video frames sent.
    ``on_packet(kind, data)`` sees every packet the encoders produced (``"video"`` or
    ``"audio"``), as they produced it, before the muxer sends it, and first the video
    encoder's extradata (``"video-extradata"``: the SPS and PPS, which the WHIP muxer
    puts before every keyframe it sends; the recording tests compare with these).
    ``stop()`` (checked before every frame) ends the push early.
    """
    import fractions
    import time

    import av
    import numpy as np

    from whip.publish import open_whip_output

    width, height = size
    out, video, sound = open_whip_output(
        url,
        width=width,
        height=height,
        fps=fps,
        audio=audio,
        preset=preset,
        profile=profile,
        token=token,
    )
    try:
        frames = int(seconds * fps)
        sent_extradata = False
        started = time.monotonic()
        for index in range(frames):
            if stop is not None and stop():
                return index
            delay = started + index / fps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            image = np.full((height, width, 3), (index * 3) % 256, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            frame.pts = index
            frame.time_base = fractions.Fraction(1, fps)
            for packet in video.encode(frame):
                if on_packet is not None:
                    if index == 0 or not sent_extradata:
                        sent_extradata = True
                        on_packet("video-extradata", bytes(video.codec_context.extradata or b""))
                    on_packet("video", bytes(packet))
                out.mux(packet)
            if sound is not None and index % 3 == 0:
                for chunk in range(5):  # 100 ms of audio per 3 video frames at 30 fps
                    samples = np.zeros((1, 960 * 2), dtype=np.int16)
                    block = av.AudioFrame.from_ndarray(samples, format="s16", layout="stereo")
                    block.sample_rate = 48000
                    block.pts = (index // 3 * 5 + chunk) * 960
                    block.time_base = fractions.Fraction(1, 48000)
                    for packet in sound.encode(block):
                        if on_packet is not None:
                            on_packet("audio", bytes(packet))
                        out.mux(packet)
        return frames
    finally:
        out.close()
