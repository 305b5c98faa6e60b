"""Media of a real WHIP push goes through our bounded intake and decode threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from tests.support.eventually import eventually
from tests.support.peers import ffmpeg_whip_push
from tests.support.servers import make_config
from whip.app import create_app
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.cli import configure_ice
from whip.session_manager import SessionManager


@pytest.fixture
async def server(whip_servers: Callable[..., Awaitable[TestServer]]) -> TestServer:
    return await whip_servers()


async def test_ffmpeg_push_is_decoded_by_our_threads_not_aiortcs(server: TestServer) -> None:
    manager: SessionManager = server.app[SESSIONS_KEY]
    timeline = server.app[TIMELINE_KEY]
    push = asyncio.create_task(
        asyncio.to_thread(ffmpeg_whip_push, str(server.make_url("/whip/decoded")), 4.0)
    )

    def decoded_while_live() -> dict[str, object] | None:  # sampled while it streams
        if push.done():
            assert push.result() == 120
            raise AssertionError("no decoded video while the push was live")
        live = manager.table.live()
        if live and live[0].supervisor is not None:
            video = live[0].supervisor.stats().get("decode-video")
            if video is not None and video.frames_decoded >= 30:
                return {
                    "size": (video.width, video.height),
                    "errors": video.decode_errors,
                    "threads": sorted(t.name for t in threading.enumerate()),
                    "intake_depth_max": max(i.stats().max_depth for i in live[0].intakes),
                }
        return None

    seen = await eventually(
        decoded_while_live,
        within=20,
        awaiting="30 frames decoded while the push was live",
        every=0.05,
    )
    assert await push == 120
    assert seen, "no decoded video while the push was live"
    assert seen["size"] == (320, 180) and seen["errors"] == 0
    depth_max = seen["intake_depth_max"]
    assert isinstance(depth_max, int) and depth_max <= manager.config.pipeline.queue_depth
    threads = seen["threads"]
    assert isinstance(threads, list)
    assert not any(name in ("video-decoder", "audio-decoder") for name in threads)
    assert any(name.startswith("decode-video-") for name in threads)
    (run,) = timeline.runs.list_runs()
    events = await timeline.read_events(run.run_id, 0, 100)
    first = [e.data for e in events if e.type == "first_frame"]
    assert len(first) == 1
    assert (first[0]["codec"], first[0]["width"], first[0]["height"]) == ("H264", 320, 180)
    assert 0 < first[0]["ms_since_post"] < 2000
    closed = await timeline.wait_for_events(run.run_id, 2, wait_s=10)
    assert [e.data for e in closed if e.type == "session_closed"] == [{"reason": "deleted"}]
    assert manager.budget.figures().bytes_reserved == 0
    assert not any(t.name.startswith("decode-") for t in threading.enumerate())


async def test_thumbnail_route_live_then_from_disk(tmp_path: Path) -> None:
    import io

    import aiohttp
    import av

    config = make_config(tmp_path, pipeline__thumbnail_interval_s=1)
    configure_ice(config)
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    try:
        manager: SessionManager = server.app[SESSIONS_KEY]
        push = asyncio.create_task(
            asyncio.to_thread(ffmpeg_whip_push, str(server.make_url("/whip/thumbs")), 3.0)
        )
        async with aiohttp.ClientSession() as http:

            async def live_thumbnail() -> bytes:  # sampled while the session is live
                if push.done():
                    await push
                    raise AssertionError("a JPEG served while the session was live")
                live = manager.table.live()
                if live:
                    url = server.make_url(f"/v1/runs/{live[0].run_id}/thumbnail.jpg")
                    answer = await http.get(url)
                    if answer.status == 200:
                        assert answer.headers["Content-Type"] == "image/jpeg"
                        return await answer.read()
                    assert answer.status == 404
                    assert (await answer.json())["error"]["code"] == "no_thumbnail"
                return b""

            live_jpeg = await eventually(
                live_thumbnail, within=20, awaiting="a live thumbnail", every=0.1
            )
            await push
            assert live_jpeg[:2] == b"\xff\xd8", "a JPEG served while the session was live"

            def jpeg_size(data: bytes) -> tuple[int, int]:  # a decode: off the loop
                with av.open(io.BytesIO(data)) as picture:
                    frame = next(picture.decode(video=0))
                    return frame.width, frame.height

            assert await asyncio.to_thread(jpeg_size, live_jpeg) == (320, 180)
            (run,) = manager.timeline.runs.list_runs()
            on_disk = await http.get(server.make_url(f"/v1/runs/{run.run_id}/thumbnail.jpg"))
            assert on_disk.status == 200 and (await on_disk.read())[:2] == b"\xff\xd8"
            for path, status in (
                ("/v1/runs/r_unknown/thumbnail.jpg", 404),
                ("/v1/runs/..%2F..%2Fetc%2Fpasswd/thumbnail.jpg", 400),
                ("/v1/runs/.hidden/thumbnail.jpg", 400),
            ):
                answer = await http.get(server.make_url(path))
                assert answer.status == status, (path, answer.status)
    finally:
        await server.close()
