"""Real in-process servers for tests: a config builder and the start/stop helper that
the ``whip_servers`` fixture (tests/conftest.py) wraps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer

from whip.app import create_app
from whip.cli import configure_ice
from whip.config import Config, build_config


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
        self, principals: list[dict[str, str]] | None = None, **overrides: Any
    ) -> TestServer:
        """A started server (``section__key`` overrides, optional principals)."""
        config = make_config(self.root / f"s{len(self.servers)}", principals, **overrides)
        configure_ice(config)
        server = TestServer(create_app(config), host="127.0.0.1")
        await server.start_server()
        self.servers.append(server)
        return server

    async def close(self) -> None:
        """Close every server, newest first."""
        for server in reversed(self.servers):
            await server.close()
