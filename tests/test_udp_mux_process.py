"""One UDP socket for every session, read from a real server process's ``/proc``; a port
already taken at start is a clear message and exit status 3, no traceback.

Ten concurrent publishers, seven aiortc peers (this process) and three FFmpeg WHIP
muxers (PyAV's bundled FFmpeg, in threads), push to a ``whip-ingest serve`` process with
the mux on (``--udp-port 0``). The process's UDP sockets are the inodes of
``/proc/<pid>/fd`` found in ``/proc/<pid>/net/udp`` and ``udp6``: exactly one, on the
port ``/readyz`` names, while all ten decode. DELETE closes each; closing one leaves the
others decoding.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.support.server_process import free_port, wait_ready
from tests.support.eventually import eventually
from tests.support.ice_udp import udp_socket
from tests.support.media_push import MEDIA, push_file
from tests.support.peers import AiortcPublisher
from tests.support.servers import serve_argv

AIORTC_PUBLISHERS = 7
FFMPEG_PUBLISHERS = 3
CLIP = MEDIA / "two_scenes_360p.mp4"

pytestmark = pytest.mark.skipif(not Path("/proc/self/net/udp").exists(), reason="needs /proc")


def udp_sockets_of(pid: int) -> list[int]:
    """Local ports of the UDP sockets process ``pid`` holds (``/proc``, IPv4 and IPv6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = []
    for table in ("udp", "udp6"):
        with open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class Server:
    """A server process on free ports, its output in ``log``; SIGINT on the way out."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("WHIP_INGEST_")}
        argv = serve_argv(
            self.port,
            tmp_path / "data",
            "--udp-mux",
            "--max-sessions",
            "16",
            "--stream-limit",
            "16",
        )
        with self.log.open("wb") as sink:
            self.proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    process = Server(tmp_path)
    try:
        await wait_ready(process.base, process.proc.poll)
        yield process
    finally:
        await asyncio.to_thread(process.stop)


async def _sessions(http: aiohttp.ClientSession, base: str) -> dict[str, dict[str, Any]]:
    body = await (await http.get(f"{base}/v1/sessions")).json()
    return {item["stream"]: item for item in body["items"]}


def _decoded(item: dict[str, Any]) -> int:
    return sum(t["frames_decoded"] for t in item["tracks"] if t["kind"] == "video")


async def test_ten_publishers_share_one_udp_socket(server: Server) -> None:
    async with aiohttp.ClientSession() as http:
        ready = await (await http.get(f"{server.base}/readyz")).json()
        (port,) = ready["udp_ports"]
        stop_ffmpeg = threading.Event()
        ffmpeg = [
            asyncio.ensure_future(
                asyncio.to_thread(
                    push_file,
                    f"{server.base}/whip/ffmpeg-{i}",
                    CLIP,
                    loops=10,
                    max_seconds=60,
                    stop=stop_ffmpeg.is_set,
                )
            )
            for i in range(FFMPEG_PUBLISHERS)
        ]
        aiortc = [AiortcPublisher() for _ in range(AIORTC_PUBLISHERS)]
        try:
            answers = await asyncio.gather(
                *(p.publish(http, f"{server.base}/whip/aiortc-{i}") for i, p in enumerate(aiortc))
            )
            assert [a.status for a in answers] == [201] * AIORTC_PUBLISHERS
            streams = {f"aiortc-{i}" for i in range(AIORTC_PUBLISHERS)} | {
                f"ffmpeg-{i}" for i in range(FFMPEG_PUBLISHERS)
            }

            async def all_decoding() -> dict[str, dict[str, Any]] | None:
                for push in ffmpeg:
                    if push.done():
                        push.result()
                        raise AssertionError("an FFmpeg push ended early")
                live = await _sessions(http, server.base)
                if set(live) == streams and all(_decoded(item) > 0 for item in live.values()):
                    return live
                return None

            live = await eventually(
                all_decoding, within=60, awaiting="ten sessions decoding", every=0.2
            )
            assert udp_sockets_of(server.proc.pid) == [port]

            # Close one: the nine others keep decoding.
            first = aiortc[0]
            assert (await http.delete(f"{server.base}{first.location}")).status == 200
            await first.close()

            async def others_advance() -> bool:
                now = await _sessions(http, server.base)
                return set(now) == streams - {"aiortc-0"} and all(
                    _decoded(now[s]) > _decoded(live[s]) + 5 for s in now
                )

            await eventually(
                others_advance, within=30, awaiting="the other nine still decoding", every=0.2
            )
            assert udp_sockets_of(server.proc.pid) == [port]

            for publisher in aiortc[1:]:
                assert (await http.delete(f"{server.base}{publisher.location}")).status == 200
            stop_ffmpeg.set()  # each muxer DELETEs its session as it closes
            await asyncio.gather(*ffmpeg)

            async def none_left() -> bool:
                return await _sessions(http, server.base) == {}

            await eventually(none_left, within=30, awaiting="every session closed", every=0.2)
            metrics = await (await http.get(f"{server.base}/metrics")).text()
            assert "whip_ice_udp_sessions_registered 0.0" in metrics
            assert "whip_ice_udp_addresses_learned 0.0" in metrics
        finally:
            stop_ffmpeg.set()
            await asyncio.gather(*ffmpeg, return_exceptions=True)
            for publisher in aiortc:
                await publisher.close()


def test_a_taken_udp_port_is_exit_3_with_a_clear_message(tmp_path: Path) -> None:
    holder = udp_socket()
    try:
        taken = holder.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("WHIP_INGEST_")}
        argv = serve_argv(free_port(), tmp_path / "data", "--udp-mux", "--udp-port", str(taken))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    finally:
        holder.close()
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert f"cannot start: cannot bind the ICE UDP port 127.0.0.1 {taken}" in line
    assert "Address already in use" in line
