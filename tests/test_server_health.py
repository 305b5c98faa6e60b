"""The real aiohttp server: liveness, readiness, error shape."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from whip.app import create_app
from whip.config import build_config


async def test_healthz_readyz_and_json_404(tmp_path: Path) -> None:
    document = {"server": {"data_dir": str(tmp_path / "data")}, "ice": {"tcp_port": 0}}
    config = build_config(document, {}, {})
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            health = await http.get(server.make_url("/healthz"))
            assert health.status == 200
            assert await health.json() == {"status": "ok"}
            ready = await http.get(server.make_url("/readyz"))
            assert ready.status == 200
            assert (await ready.json())["status"] == "ready"
            missing = await http.get(server.make_url("/nope"))
            assert missing.status == 404
            assert (await missing.json())["error"]["code"] == "not_found"
    finally:
        await server.close()
