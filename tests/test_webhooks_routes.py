"""``GET /v1/webhooks``: operators only, no parameters, no secret; a new webhook's cursor
starts at the log's end and is saved before anything else."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp.test_utils import TestServer

from registry.events import NewEvent
from registry.timeline import Timeline
from tests.support.eventually import eventually
from whip.appkeys import TIMELINE_KEY
from whip.webhooks.cursor import CursorState, FileCursorStore

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
PRINCIPALS = [
    {"name": "ops", "role": "operator", "token_sha256": hashlib.sha256(b"ops-token").hexdigest()},
    {"name": "cam", "role": "publisher", "token_sha256": hashlib.sha256(b"cam-token").hexdigest()},
]


async def test_operators_only_and_the_secret_never_shown(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    # nothing listens on port 9: every attempt fails, which the listing shows
    url = "http://127.0.0.1:9/hook?token=receiver-secret"
    server = await whip_servers(
        PRINCIPALS,
        webhooks=[{"name": "crm", "url": url, "secret": SECRET, "timeout_s": 0.5}],
    )
    timeline: Timeline = server.app[TIMELINE_KEY]
    store = FileCursorStore(timeline.config.data_dir / "webhooks")
    assert await store.load("crm") == CursorState(0)
    seq = await timeline.append(NewEvent("r1", "run_created", "cam", {"stream": "x"}))

    async def get(token: str | None, query: str = "") -> tuple[int, dict[str, object]]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as http,
            http.get(server.make_url("/v1/webhooks" + query), headers=headers) as r,
        ):
            return r.status, await r.json()

    assert (await get(None))[0] == 401
    assert (await get("cam-token"))[0] == 403
    status, body = await get("ops-token", "?limit=1")
    assert status == 400 and body["error"]["code"] == "invalid_parameter"  # type: ignore[index]

    async def failed_once() -> dict[str, object] | None:
        status, body = await get("ops-token")
        assert status == 200
        (item,) = body["items"]  # type: ignore[misc]
        return item if item["last_error"] else None  # type: ignore[no-any-return]

    item = await eventually(failed_once, within=10, awaiting="a failed attempt in the listing")
    assert item["url"] == "http://127.0.0.1:9/hook"
    assert "whsec" not in str(item) and "receiver-secret" not in str(item)
    assert item["cursor"] == 0 and item["last_seq"] == seq and item["lag_events"] == seq
    assert item["state"] == "active" and item["in_flight"] == 1
    assert "error" in item["deliveries"] and "success" not in item["deliveries"]  # type: ignore[operator]
