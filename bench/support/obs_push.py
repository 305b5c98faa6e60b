"""One OBS-shaped publisher process for ``bench/capacity.py --codec``: replays encoded frames.

Usage (a subprocess; its last stdout line is the JSON report ``bench/capacity.py`` reads)::

    python bench/support/obs_push.py <whip-url> <frames-file> <push-seconds> <codec>

The frames file is what :func:`bench.support.obs_like.save_frames` wrote (encoded once by
the bench, so that no publisher spends the CPU the server is measured with on encoding);
they are sent looped, in real time at 30 fps, by an :class:`ObsLikePublisher` (libdatachannel,
OBS's offer shape). With the codec ``simulcast`` the frames file is one per layer, lowest
first, joined by commas (H.264 each, of one length), sent by an
:class:`bench.support.obs_simulcast.ObsSimulcastPublisher` (one RID per file). At the end
the session is DELETEd, as OBS does when the user stops. The report has the fields of the
FFmpeg publisher's: ``frames_sent`` (per layer with simulcast), ``keyframes_sent``,
``connect_s``, ``push_s``, ``cpu_s``, ``wall_s``, and ``error`` when something failed;
with simulcast also ``layers`` (how many).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

import aiohttp

from bench.support.obs_like import ObsLikePublisher, VideoCodec, load_frames, looped
from bench.support.obs_simulcast import REPLAY_LAYERS, ObsSimulcastPublisher


async def publish(url: str, frames_file: Path, push_s: float, codec: str) -> dict[str, Any]:
    report: dict[str, Any] = {"frames_sent": 0, "keyframes_sent": 0}
    frames = load_frames(frames_file)
    publisher = ObsLikePublisher(cast(VideoCodec, codec))
    count = int(push_s * publisher.fps)
    keyframes = sum(keyframe for _, _, keyframe in looped(frames, count))
    t0 = time.monotonic()
    try:
        async with aiohttp.ClientSession() as http:
            _run_id, location, _answer = await publisher.publish(http, url)
            report["connect_s"] = round(time.monotonic() - t0, 3)
            started = time.monotonic()
            replay = ((pts, data) for pts, data, _ in looped(frames, count))
            report["frames_sent"] = await asyncio.to_thread(publisher.send, replay)
            report["keyframes_sent"] = keyframes
            report["push_s"] = round(time.monotonic() - started, 3)
            report["delete_status"] = await delete(http, url, location)
    finally:
        publisher.close()
    return report


async def publish_simulcast(url: str, frames_files: list[Path], push_s: float) -> dict[str, Any]:
    report: dict[str, Any] = {"frames_sent": 0, "keyframes_sent": 0, "layers": len(frames_files)}
    layers = [load_frames(path) for path in frames_files]
    if len(layers) != len(REPLAY_LAYERS):
        raise ValueError(f"{len(layers)} frames files for {len(REPLAY_LAYERS)} layers")
    publisher = ObsSimulcastPublisher([(width, height) for width, height, _ in REPLAY_LAYERS])
    count = int(push_s * publisher.fps)
    keyframes = sum(keyframe for _, _, keyframe in looped(layers[-1], count))
    t0 = time.monotonic()
    try:
        async with aiohttp.ClientSession() as http:
            await publisher.publish(http, url)
            report["connect_s"] = round(time.monotonic() - t0, 3)
            started = time.monotonic()
            replays = [[(pts, data) for pts, data, _ in looped(f, count)] for f in layers]
            report["frames_sent"] = await asyncio.to_thread(publisher.send, replays)
            report["keyframes_sent"] = keyframes
            report["push_s"] = round(time.monotonic() - started, 3)
            report["delete_status"] = await delete(http, url, publisher.location)
    finally:
        publisher.close()
    return report


async def delete(http: aiohttp.ClientSession, url: str, location: str) -> int:
    """DELETE the session at ``location`` (relative to ``url``'s server): the status."""
    base = url.split("/whip", 1)[0]
    target = location if location.startswith("http") else base + location
    async with http.delete(target) as gone:
        return gone.status


def main() -> int:
    url, frames_file, push_s, codec = (
        sys.argv[1],
        Path(sys.argv[2]),
        float(sys.argv[3]),
        sys.argv[4],
    )
    t0 = time.monotonic()
    try:
        if codec == "simulcast":
            files = [Path(part) for part in sys.argv[2].split(",")]
            report = asyncio.run(publish_simulcast(url, files, push_s))
        else:
            report = asyncio.run(publish(url, frames_file, push_s, codec))
    except Exception as exc:
        report = {
            "frames_sent": 0,
            "keyframes_sent": 0,
            "error": f"{type(exc).__name__}: {exc}"[:300],
        }
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
    report["wall_s"] = round(time.monotonic() - t0, 3)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
