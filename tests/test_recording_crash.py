"""A recording cut by SIGKILL: the file plays up to its last complete fragment, and the next
start closes it as it is and records it (real server processes, a real push).

The server is killed once the segment being written holds two complete fragments, while
the publisher is still sending; the second process on the same data directory must list
the segment, give it its ``recording_segment`` (``recovered``), with the frames the
truncated file really holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import aiohttp
import av

from bench.support.server_process import free_port, wait_ready
from pipeline.recording.fmp4 import complete_length, top_level_boxes
from tests.support.eventually import eventually
from tests.support.peers import ffmpeg_whip_push
from tests.support.servers import serve_argv

ENV = {
    "WHIP_INGEST_RECORDING_ENABLED": "true",
    "WHIP_INGEST_RECORDING_SEGMENT_S": "60",
}


class ServerProcess:
    """``whip serve`` on a free port over ``data``, its output in ``log``."""

    def __init__(self, data: Path, log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("WHIP_INGEST_")}
        with log.open("ab") as sink:
            self.proc = subprocess.Popen(
                serve_argv(self.port, data),
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**env, **ENV},
            )

    def end(self, signum: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _fragments(path: Path) -> int:
    """Complete ``moof`` + ``mdat`` pairs in the file so far (0 when it is not there)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    kinds = [kind for kind, _, _ in top_level_boxes(data)]
    return sum(1 for pair in itertools.pairwise(kinds) if pair == (b"moof", b"mdat"))


def _decoded_frames(path: Path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def _push(url: str, done: threading.Event) -> None:
    """Push until the bound; the server dies under it, so the muxer's closing DELETE
    fails (that is expected here)."""
    with contextlib.suppress(OSError, av.FFmpegError):
        ffmpeg_whip_push(url, 6.0, size=(320, 180), stop=done.is_set)
    done.set()


async def test_sigkill_mid_segment_then_restart_records_the_cut_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "server.log"
    first = ServerProcess(data, log)
    stop_push = threading.Event()
    pusher: asyncio.Future[None] | None = None
    try:
        await wait_ready(first.base, first.proc.poll)
        pusher = asyncio.ensure_future(
            asyncio.to_thread(_push, f"{first.base}/whip/cut", stop_push)
        )
        root = data / "recordings"

        def segment() -> Path | None:
            files = list(root.glob("*/0.mp4")) if root.is_dir() else []
            return files[0] if files and _fragments(files[0]) >= 2 else None

        path = await eventually(
            lambda: asyncio.to_thread(segment), within=20, awaiting="two complete fragments"
        )
        first.end(signal.SIGKILL)
    finally:
        stop_push.set()
        await asyncio.to_thread(first.end, signal.SIGKILL)
        if pusher is not None:
            await pusher
    run_id = path.parent.name
    cut = await asyncio.to_thread(path.read_bytes)
    whole = complete_length(cut)
    assert 0 < whole <= len(cut)
    # The cut file as the crash left it opens and plays its complete fragments.
    assert await asyncio.to_thread(_decoded_frames, path) >= 30

    second = ServerProcess(data, log)
    try:
        await wait_ready(second.base, second.proc.poll)
        async with aiohttp.ClientSession() as http:
            listed = await (await http.get(f"{second.base}/v1/runs/{run_id}/recordings")).json()
            run = await (await http.get(f"{second.base}/v1/runs/{run_id}")).json()
            events = await (
                await http.get(f"{second.base}/v1/runs/{run_id}/events?limit=1000")
            ).json()
        items: list[dict[str, Any]] = listed["items"]
        assert [(i["name"], i["bytes"]) for i in items] == [("0.mp4", whole)]
        assert run["state"] == "interrupted" and run["recording_bytes"] == whole
        recorded = [e["data"] for e in events["items"] if e["type"] == "recording_segment"]
        assert len(recorded) == 1 and recorded[0]["recovered"] is True
        assert recorded[0]["bytes"] == whole
        assert recorded[0]["truncated_bytes"] == len(cut) - whole
        frames = await asyncio.to_thread(_decoded_frames, path)
        assert recorded[0]["video_frames"] == frames >= 30
        assert items[0]["duration_ms"] == recorded[0]["duration_ms"] > 0
    finally:
        await asyncio.to_thread(second.end, signal.SIGINT)
