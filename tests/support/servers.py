"""Real servers for tests: in-process ones (a config builder and the start/stop helper
that the ``whip_servers`` fixture in tests/conftest.py wraps), a wait for a run's event,
a well-behaved push, and the command line of a server process.

:func:`serve_argv` is the benches' own (``bench/support/server_process.py``: the system
crash loop starts servers with it in both), plus ``--no-udp-mux`` when
:data:`TEST_UDP_MUX` is off, so server processes follow the suite's switch too.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from bench.support import server_process
from registry.events import Event
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.peers import AiortcPublisher
from whip.app import create_app
from whip.appkeys import TIMELINE_KEY
from whip.cli import configure_ice
from whip.config import Config, build_config
from whip.session_manager import SessionSeams

TEST_UDP_MUX = os.environ.get("WHIP_TEST_ICE_UDP_MUX", "1") != "0"
"""Whether the test servers share one UDP port (the default) or open a socket per session
(``WHIP_TEST_ICE_UDP_MUX=0``: the suite's run with ``ice.udp_mux = false``)."""


def serve_argv(port: int, data_dir: Path, *extra: str) -> list[str]:
    """The command line of a real server process on 127.0.0.1 (module doc)."""
    switch = () if TEST_UDP_MUX else ("--no-udp-mux",)
    return server_process.serve_argv(port, data_dir, *switch, *extra)


def make_config(
    tmp_path: Path,
    principals: list[dict[str, str]] | None = None,
    *,
    webhooks: list[dict[str, Any]] | None = None,
    **overrides: Any,
) -> Config:
    """A config for ``tmp_path``; ``section__key=value`` keyword overrides, optional
    ``[[principals]]`` and ``[[webhooks]]`` entries. The UDP mux
    and ICE-TCP take free ports (``ice.udp_port = 0``, ``ice.tcp_port = 0``: tests run in
    parallel, the defaults are one per machine); the mux follows :data:`TEST_UDP_MUX`."""
    document: dict[str, Any] = {
        "server": {"data_dir": str(tmp_path / "data")},
        "ice": {"udp_port": 0, "udp_mux": TEST_UDP_MUX, "tcp_port": 0},
    }
    for dotted, value in overrides.items():
        section, _, key = dotted.partition("__")
        document.setdefault(section, {})[key] = value
    if principals:
        document["principals"] = principals
    if webhooks:
        document["webhooks"] = webhooks
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
        webhooks: list[dict[str, Any]] | None = None,
        port: int | None = None,
        **overrides: Any,
    ) -> TestServer:
        """A started server (``section__key`` overrides, optional principals and
        webhooks, the session manager's injected parts; ``port``: a port chosen before,
        for a config that names it, else a free one)."""
        config = make_config(
            self.root / f"s{len(self.servers)}", principals, webhooks=webhooks, **overrides
        )
        configure_ice(config)
        server = TestServer(create_app(config, seams=seams), host="127.0.0.1", port=port)
        try:
            await server.start_server()
        except BaseException:
            # The contexts that did start (a cluster store's connections, the UDP mux)
            # are cleaned up now: left open they would outlive the test's event loop.
            await server.close()
            raise
        self.servers.append(server)
        return server

    async def close(self) -> None:
        """Close every server, newest first."""
        for server in reversed(self.servers):
            await server.close()


async def wait_for_type(timeline: Timeline, run_id: str, etype: str, wait_s: float = 20) -> Event:
    """The first ``etype`` event of ``run_id``, long-polling the timeline (bounded: each
    long-poll is cut off at the bound)."""
    seen = 0

    async def arrived() -> Event | None:
        nonlocal seen
        batch = await timeline.wait_for_events(run_id, seen, wait_s=60)
        for event in batch:
            if event.type == etype:
                return event
        if batch:
            seen = batch[-1].seq
        return None

    return await eventually(arrived, within=wait_s, awaiting=f"a {etype} of {run_id}", every=0)


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


__all__ = [
    "TEST_UDP_MUX",
    "ServerPool",
    "make_config",
    "normal_push",
    "serve_argv",
    "wait_for_type",
]
