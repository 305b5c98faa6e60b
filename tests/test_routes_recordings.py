"""``GET /v1/runs/{id}/recordings`` paging (:mod:`whip.routes_recordings`), against a real
server: ``limit`` and the opaque keyset cursor, segments that complete or are evicted
between pages, and the 400s for a bad cursor or limit. The segments are entries of the
server's own recording store (what a recorder adds when a segment completes)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from pipeline.recording.store import SegmentEntry
from registry.events import NewEvent
from registry.timeline import Timeline
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY

Servers = Callable[..., Awaitable[TestServer]]
RUN = "r_recordingspagedrun00001"


async def test_the_recordings_list_is_paged_by_an_opaque_keyset_cursor(
    whip_servers: Servers,
) -> None:
    server = await whip_servers(recording__enabled=True)
    timeline: Timeline = server.app[TIMELINE_KEY]
    store = server.app[SESSIONS_KEY].recordings.store
    await timeline.append(NewEvent(RUN, "run_created", "anonymous", {"stream": "cam"}))
    for index in range(5):
        store.add(RUN, SegmentEntry(f"{index}.mp4", 100 + index, 1000, index * 1000))
    base = f"/v1/runs/{RUN}/recordings"

    async with aiohttp.ClientSession() as http:

        async def get(query: str) -> tuple[int, dict[str, Any]]:
            async with http.get(server.make_url(base + query)) as answer:
                return answer.status, await answer.json()

        status, whole = await get("")
        assert status == 200 and whole["next"] is None
        assert [i["index"] for i in whole["items"]] == [0, 1, 2, 3, 4]
        assert whole["recording_bytes"] == sum(100 + i for i in range(5))

        _, first = await get("?limit=2")
        assert [i["name"] for i in first["items"]] == ["0.mp4", "1.mp4"]
        assert isinstance(first["next"], str)
        # Between pages: segment 2 is evicted, segment 5 completes. The next pages go on
        # after segment 1: nothing repeated, nothing skipped that still exists.
        await asyncio.to_thread(store.delete_segment, RUN, "2.mp4")
        store.add(RUN, SegmentEntry("5.mp4", 105, 1000, 5000))
        _, second = await get(f"?limit=2&cursor={first['next']}")
        assert [i["index"] for i in second["items"]] == [3, 4]
        _, last = await get(f"?limit=2&cursor={second['next']}")
        assert ([i["index"] for i in last["items"]], last["next"]) == ([5], None)
        assert last["recording_bytes"] == whole["recording_bytes"] - 102 + 105

        forged = base64.urlsafe_b64encode(b"segment.-1").decode().rstrip("=")
        for query in ("?cursor=!!", "?cursor=abcd", f"?cursor={forged}", "?cursor=a&cursor=b"):
            status, error = await get(query)
            code = "invalid_parameter" if "&" in query else "invalid_cursor"
            assert (status, error["error"]["code"]) == (400, code), query
        for query in ("?limit=0", "?limit=1001", "?limit=x"):
            status, error = await get(query)
            assert (status, error["error"]["code"]) == (400, "invalid_parameter"), query
