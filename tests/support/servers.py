"""Real in-process servers for tests: a config builder and the start/stop helper that
the ``whip_servers`` fixture (tests/conftest.py) wraps."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from registry.events import Event
from registry.timeline import Timeline
from tests.support.peers import AiortcPublisher
from whip.app import create_app
from whip.appkeys import TIMELINE_KEY
from whip.cli import configure_ice
from whip.config import Config, build_config
from whip.session_manager import SessionSeams


def make_config(
    tmp_path: Path, principals: list[dict[str, str]] | None = None, **overrides: Any
) -> Config:
    """A config for ``tmp_path``; ``section__key=value`` keyword overrides."""
    document: dict[str, Any] = {"server": {"data_dir": str(tmp_path / "data")}}
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        document.setdefault(section, {})[key] = value
    if principals:
        document["principals"] = principals
    return build_config(document, {}, {})


class ServerPool:
    """Starts real servers on 127.0.0.1 (port 0) under one directory; closes them all."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: list[TestServer] = []

    async def start(
        self,
        principals: list[dict[str, str]] | None = None,
        *,
        seams: SessionSeams | None = None,
        **overrides: Any,
    ) -> TestServer:
        """A started server (``section__key`` overrides, optional principals, the
        session manager's injected parts)."""
        config = make_config(self.root / f"s{len(self.servers)}", principals, **overrides)
        configure_ice(config)
        server = TestServer(create_app(config, seams=seams), host="127.0.0.1")
        await server.start_server()
        self.servers.append(server)
        return server

    async def close(self) -> None:
        """Close every server, newest first."""
        for server in reversed(self.servers):
            await server.close()


async def wait_for_type(timeline: Timeline, run_id: str, etype: str, wait_s: float = 20) -> Event:
    """The first ``etype`` event of ``run_id``, long-polling the timeline (bounded)."""
    seen = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while (remaining := deadline - loop.time()) > 0:
        batch = await timeline.wait_for_events(run_id, seen, wait_s=min(remaining, 60))
        for event in batch:
            if event.type == etype:
                return event
        if batch:
            seen = batch[-1].seq
    raise AssertionError(f"no {etype} for {run_id} within {wait_s}s")


async def normal_push(server: TestServer, stream: str) -> AiortcPublisher:
    """A well-behaved aiortc publisher on ``/whip/{stream}``: admitted (201), connected,
    its first frame decoded, then DELETEd (200) and closed. Returns it (``run_id``).

    Cancellation: the publisher is closed; the server closes the session on its own.
    """
    publisher = AiortcPublisher()
    timeline: Timeline = server.app[TIMELINE_KEY]
    try:
        async with aiohttp.ClientSession() as http:
            response = await publisher.publish(http, str(server.make_url(f"/whip/{stream}")))
            assert response.status == 201
            await asyncio.wait_for(publisher.connected.wait(), 15)
            await wait_for_type(timeline, publisher.run_id, "first_frame")
            assert (await http.delete(server.make_url(publisher.location))).status == 200
    finally:
        await publisher.close()
    return publisher


def serve_argv(port: int, data_dir: Path, *extra: str) -> list[str]:
    """The command line of a real server process on 127.0.0.1 (tests that kill,
    signal or restart the server need a separate process)."""
    return [
        sys.executable,
        "-m",
        "whip",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *extra,
    ]


async def metric_values(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """Every sample of the server's ``/metrics`` as ``{"name{labels}": value}`` (raises
    on a non-200 answer)."""
    async with http.get(f"{base}/metrics") as response:
        response.raise_for_status()
        text = await response.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                values[name] = float(value)
    return values
