"""Headless Chromium publishes 3-layer VP8 simulcast (RIDs q, h, f): every layer accepted
in the answer, the highest decoded at its full size, every layer measured."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp.test_utils import TestServer

from registry.timeline import Timeline
from tests.support.chromium import ChromiumPage
from tests.support.eventually import eventually
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.rtc.simulcast import simulcast_of

Launch = Callable[..., Awaitable[ChromiumPage]]


async def test_chromium_simulcast_highest_layer_is_decoded(
    whip_servers: Callable[..., Awaitable[TestServer]], chromium: Launch
) -> None:
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    page = await chromium()
    endpoint = str(server.make_url("/whip/browser"))
    options = "{videoCodec: 'video/VP8', simulcast: true, width: 1280, height: 720}"
    assert await page.evaluate(f"whipPublish({endpoint!r}, {options})") == 201
    state = await page.evaluate("window.whip")
    answer: str = state["answer"]
    assert "a=simulcast:recv q;h;f" in answer
    assert [line for line in answer.splitlines() if line.startswith("a=rid:")] == [
        "a=rid:q recv",
        "a=rid:h recv",
        "a=rid:f recv",
    ]
    assert "urn:ietf:params:rtp-hdrext:sdes:rtp-stream-id" in answer
    run_id: str = state["runId"]

    sessions = server.app[SESSIONS_KEY]
    session = sessions.find_by_run(run_id)
    assert session is not None
    demux = next(
        d for d in (simulcast_of(t.receiver) for t in session.pc.getTransceivers()) if d is not None
    )

    def all_layers_arrive() -> bool:
        return all(layer.frames_in > 10 for layer in demux.layers.values())

    await eventually(all_layers_arrive, within=30, awaiting="frames on every layer")

    async def decoded_full_size() -> bool:
        events = await timeline.read_events(run_id, 0, limit=1000)
        return any(
            e.type == "stats" and (e.data["width"], e.data["height"]) == (1280, 720) for e in events
        )

    await eventually(decoded_full_size, within=30, awaiting="stats at 1280x720")

    async def stats_with_three_layers() -> list[dict[str, object]] | None:
        events = await timeline.read_events(run_id, 0, limit=1000)
        for event in reversed(events):
            layers = event.data.get("layers") if event.type == "stats" else None
            if layers and all(layer["frames_in"] for layer in layers):
                return list(layers)
        return None

    layers = await eventually(
        stats_with_three_layers, within=30, awaiting="stats with frames on 3 layers"
    )
    assert [(la["rid"], la["width"], la["height"], la["decoding"]) for la in layers] == [
        ("q", 320, 180, False),
        ("h", 640, 360, False),
        ("f", 1280, 720, True),
    ]
    async with (
        aiohttp.ClientSession() as http,
        http.get(server.make_url("/v1/sessions")) as response,
    ):
        assert response.status == 200
        listed = await response.json()
    (item,) = listed["items"]
    (video,) = [track for track in item["tracks"] if track["kind"] == "video"]
    assert [layer["rid"] for layer in video["layers"]] == ["q", "h", "f"]
    assert item["simulcast"]["unknown_rid"] == 0
    assert demux.decoding == "f"
    sizes = {f["rid"]: (f["width"], f["height"]) for f in demux.figures()}
    assert sizes == {"q": (320, 180), "h": (640, 360), "f": (1280, 720)}
    assert demux.counters()["unknown_rid"] == 0
    assert await page.evaluate("whipStop()") == 200
    await wait_for_type(timeline, run_id, "session_closed")


async def test_chromium_simulcast_all_decodes_every_layer(
    whip_servers: Callable[..., Awaitable[TestServer]], chromium: Launch
) -> None:
    server = await whip_servers(pipeline__simulcast="all")
    page = await chromium()
    endpoint = str(server.make_url("/whip/browser"))
    options = "{videoCodec: 'video/VP8', simulcast: true, width: 1280, height: 720}"
    assert await page.evaluate(f"whipPublish({endpoint!r}, {options})") == 201
    run_id: str = (await page.evaluate("window.whip"))["runId"]
    session = server.app[SESSIONS_KEY].find_by_run(run_id)
    assert session is not None and session.supervisor is not None
    assert session.permit.threads == 4  # audio and three video layers
    supervisor = session.supervisor

    def decoded_sizes() -> set[tuple[int | None, int | None]] | None:
        video = [w.stats for w in supervisor.workers if w.intake.kind == "video"]
        if len(video) == 3 and all(s.frames_decoded > 10 for s in video):
            return {(s.width, s.height) for s in video}
        return None

    sizes = await eventually(decoded_sizes, within=30, awaiting="three layers decoded")
    assert sizes == {(320, 180), (640, 360), (1280, 720)}
    demux = next(
        d for d in (simulcast_of(t.receiver) for t in session.pc.getTransceivers()) if d is not None
    )
    assert all(layer["decoding"] for layer in demux.figures())
    assert sum(path.malformed for path in demux.paths.values()) == 0
    assert await page.evaluate("whipStop()") == 200


async def test_chromium_layer_paused_switches_down_and_back(
    whip_servers: Callable[..., Awaitable[TestServer]], chromium: Launch
) -> None:
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    page = await chromium()
    endpoint = str(server.make_url("/whip/browser"))
    options = "{videoCodec: 'video/VP8', simulcast: true, width: 1280, height: 720}"
    assert await page.evaluate(f"whipPublish({endpoint!r}, {options})") == 201
    run_id: str = (await page.evaluate("window.whip"))["runId"]
    session = server.app[SESSIONS_KEY].find_by_run(run_id)
    assert session is not None
    demux = next(
        d for d in (simulcast_of(t.receiver) for t in session.pc.getTransceivers()) if d is not None
    )
    await eventually(lambda: demux.decoding == "f", within=30, awaiting="f decoded")
    assert await page.evaluate("whipSetLayerActive('f', false)") == [
        ["q", True],
        ["h", True],
        ["f", False],
    ]
    await eventually(lambda: demux.decoding == "h", within=30, awaiting="switch down to h")
    await page.evaluate("whipSetLayerActive('f', true)")
    await eventually(lambda: demux.decoding == "f", within=30, awaiting="switch back to f")

    async def layer_changes() -> list[tuple[str, str]] | None:
        # The demux reports a change at once; its event is appended durably after.
        events = await timeline.read_events(run_id, 0, limit=1000)
        found = [(e.data["change"], e.data["rid"]) for e in events if e.type == "simulcast_layer"]
        return found if len(found) >= 5 else None

    changes = await eventually(layer_changes, within=10, awaiting="five layer events")
    assert changes == [
        ("layer_decoded", "f"),
        ("layer_stopped", "f"),
        ("layer_decoded", "h"),
        ("layer_resumed", "f"),
        ("layer_decoded", "f"),
    ]
    events = await timeline.read_events(run_id, 0, limit=1000)
    assert "b_frames" not in [e.data["warning"] for e in events if e.type == "stream_warning"]
    assert await page.evaluate("whipStop()") == 200
