"""One OBS-shaped publisher process for ``bench/capacity.py --codec``: replays encoded frames.

Usage (a subprocess; its last stdout line is the JSON report ``bench/capacity.py`` reads)::

    python bench/support/obs_push.py <whip-url> <frames-file> <push-seconds> <codec>

The frames file is what :func:`bench.support.obs_like.save_frames` wrote (encoded once by
the bench, so that no publisher spends the CPU the server is measured with on encoding);
they are sent looped, in real time at 30 fps, by an :class:`ObsLikePublisher` (libdatachannel,
OBS's offer shape). At the end the session is DELETEd, as OBS does when the user stops. The
report has the fields of the FFmpeg publisher's: ``frames_sent``, ``keyframes_sent``,
``connect_s``, ``push_s``, ``cpu_s``, ``wall_s``, and ``error`` when something failed.
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
            base = url.split("/whip", 1)[0]
            target = location if location.startswith("http") else base + location
            async with http.delete(target) as gone:
                report["delete_status"] = gone.status
    finally:
        publisher.close()
    return report


def main() -> int:
    url, frames_file, push_s, codec = (
        sys.argv[1],
        Path(sys.argv[2]),
        float(sys.argv[3]),
        sys.argv[4],
    )
    t0 = time.monotonic()
    try:
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
