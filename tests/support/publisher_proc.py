"""A WHIP publisher in its own process, for tests that kill it (SIGKILL) mid-stream.

Usage (from the repository root)::

    python -m tests.support.publisher_proc [--kind aiortc|ffmpeg] URL SECONDS

Publishes test media to ``URL`` for ``SECONDS`` seconds, prints ``connected`` on stdout
(flushed) as soon as media can flow, then DELETEs its session URL and exits 0. Exit 1
when the server refuses the POST or no connection comes within the deadline. ICE host
candidates are limited to 127.0.0.1 (loopback only).

- ``aiortc``: :class:`tests.support.peers.AiortcPublisher`; answers ICE consent checks.
- ``ffmpeg``: FFmpeg's WHIP muxer through PyAV (H.264 only), which never answers
  consent checks; its handshake completes inside the first ``mux()``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from fractions import Fraction
from pathlib import Path
from urllib.parse import urljoin

CONNECT_DEADLINE_S = 20.0


def announce() -> None:
    """Tell the parent that media is flowing."""
    print("connected", flush=True)


async def aiortc_publish(url: str, seconds: float) -> int:
    """Offer, connect, stream for ``seconds``, DELETE, close."""
    import aiohttp

    from tests.support.peers import AiortcPublisher
    from whip.rtc.host_addresses import restrict_host_addresses

    restrict_host_addresses(["127.0.0.1"])
    publisher = AiortcPublisher()
    try:
        async with aiohttp.ClientSession() as http:
            response = await publisher.publish(http, url)
            if response.status != 201:
                print(f"refused {response.status}", flush=True)
                return 1
            try:
                await asyncio.wait_for(publisher.connected.wait(), CONNECT_DEADLINE_S)
            except TimeoutError:
                print(f"not connected: {publisher.states}", flush=True)
                return 1
            announce()
            await asyncio.sleep(seconds)  # the tracks' own timers pace the media
            await http.delete(urljoin(url, publisher.location))
    finally:
        await publisher.close()
    return 0


def ffmpeg_publish(url: str, seconds: float, fps: int = 30) -> int:
    """H.264 320x180 at ``fps``, paced in real time; closing the muxer DELETEs."""
    import av
    import numpy as np

    from whip.publish import open_whip_output

    width, height = 320, 180
    out, video, _ = open_whip_output(
        url,
        width=width,
        height=height,
        fps=fps,
        audio=False,
        preset="ultrafast",
        handshake_timeout_ms=int(CONNECT_DEADLINE_S * 1000),
    )
    try:
        announced = False
        started = time.monotonic()
        for index in range(int(seconds * fps)):
            delay = started + index / fps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            image = np.full((height, width, 3), (index * 5) % 256, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            frame.pts = index
            frame.time_base = Fraction(1, fps)
            for packet in video.encode(frame):
                out.mux(packet)  # the first one runs the WHIP handshake (ICE + DTLS)
                if not announced:
                    announce()
                    announced = True
    finally:
        out.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("aiortc", "ffmpeg"), default="aiortc")
    parser.add_argument("url")
    parser.add_argument("seconds", type=float)
    args = parser.parse_args(argv)
    if args.kind == "ffmpeg":
        return ffmpeg_publish(args.url, args.seconds)
    return asyncio.run(aiortc_publish(args.url, args.seconds))


if __name__ == "__main__":
    if not __package__:  # run as a script: make ``tests`` and ``whip`` importable
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
