"""The real aiohttp server: liveness, readiness, error shape."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient

from whip.app import ServerSettings, create_app


async def test_healthz_readyz_and_json_404(tmp_path: Path, aiohttp_client: object) -> None:
    client: TestClient = await aiohttp_client(create_app(ServerSettings(tmp_path / "data")))  # type: ignore[operator]
    health = await client.get("/healthz")
    assert health.status == 200
    assert await health.json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status == 200
    assert (await ready.json())["status"] == "ready"
    missing = await client.get("/nope")
    assert missing.status == 404
    assert (await missing.json())["error"]["code"] == "not_found"
