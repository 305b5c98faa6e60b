"""Headless Chromium publishes to the server from JavaScript (tests/support/chromium.py):
the browser's own WebRTC stack, its own offer, a cross-origin WHIP POST and DELETE.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from aiohttp.test_utils import TestServer

from registry.timeline import Timeline
from tests.support.chromium import ChromiumPage
from tests.support.eventually import eventually
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY

Launch = Callable[..., Awaitable[ChromiumPage]]


def _video_lines(sdp: str) -> list[str]:
    """The lines of the first video section."""
    lines = sdp.replace("\r\n", "\n").split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("m=video"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("m=")), None)
    return lines[start:end]


def _without_start_bitrate(fmtp: str) -> str | None:
    """``fmtp`` without ``x-google-start-bitrate``; None when nothing else is left."""
    head, _, params = fmtp.partition(" ")
    kept = [p for p in params.split(";") if p and not p.startswith("x-google-start-bitrate=")]
    return f"{head} {';'.join(kept)}" if kept else None


@pytest.mark.parametrize(
    ("mime_type", "codec"),
    [("video/VP8", "VP8"), ("video/H264", "H264"), ("video/VP9", "VP9"), ("video/AV1", "AV1")],
    ids=["vp8", "h264", "vp9", "av1"],
)
async def test_chromium_publishes_and_its_frames_are_decoded(
    whip_servers: Callable[..., Awaitable[TestServer]],
    chromium: Launch,
    mime_type: str,
    codec: str,
) -> None:
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    page = await chromium()
    endpoint = str(server.make_url("/whip/browser"))

    status = await page.evaluate(f"whipPublish({endpoint!r}, {{videoCodec: {mime_type!r}}})")
    assert status == 201
    state = await page.evaluate("window.whip")
    assert state["location"].startswith("/whip/sessions/")
    assert state["etag"]
    run_id: str = state["runId"]

    # The answer's video fmtp is the offer's, as offered (whip/sdp/codec_rules.py), plus
    # our pipeline.start_bitrate_bps (tests/test_rtc_congestion.py).
    answer_fmtp = [
        _without_start_bitrate(line)
        for line in _video_lines(state["answer"])
        if line.startswith("a=fmtp:") and "apt=" not in line
    ]
    assert set(answer_fmtp) - {None} <= set(_video_lines(state["offer"]))
    assert f" {codec}/90000" in next(
        line for line in _video_lines(state["answer"]) if line.startswith("a=rtpmap:")
    )

    first = await wait_for_type(timeline, run_id, "first_frame", wait_s=30)
    assert first.data["codec"] == codec
    assert (first.data["width"], first.data["height"]) == (640, 360)

    async def decoded_past(count: int) -> bool:
        events = await timeline.read_events(run_id, 0, limit=1000)
        return any(e.type == "stats" and e.data["frames_decoded"] > count for e in events)

    await eventually(
        lambda: decoded_past(30), within=30, awaiting="stats with more than 30 frames decoded"
    )
    assert await page.evaluate("whipStop()") == 200
    closed = await wait_for_type(timeline, run_id, "session_closed")
    assert closed.data["reason"] == "deleted"
    state = await page.evaluate("window.whip")
    assert state["connectionStates"][:2] == ["connecting", "connected"]
    assert state["error"] is None


async def test_chromium_trickles_its_candidates_by_patch_and_connects(
    whip_servers: Callable[..., Awaitable[TestServer]], chromium: Launch
) -> None:
    server = await whip_servers()
    timeline: Timeline = server.app[TIMELINE_KEY]
    page = await chromium()
    endpoint = str(server.make_url("/whip/browser"))

    status = await page.evaluate(f"whipPublish({endpoint!r}, {{trickle: true}})")
    assert status == 201
    state = await page.evaluate("window.whip")
    assert "a=candidate" not in state["offer"]  # sent before gathering: all by PATCH
    run_id: str = state["runId"]
    await wait_for_type(timeline, run_id, "first_frame", wait_s=30)

    async def patched() -> list[int] | None:
        patches: list[int] = await page.evaluate("window.whip.patches")
        return patches if patches else None

    patches = await eventually(patched, within=10, awaiting="the trickle PATCHes")
    assert set(patches) == {204}
    assert await page.evaluate("whipStop()") == 200


async def test_chromium_restarts_ice_mid_push_and_keeps_decoding(
    whip_servers: Callable[..., Awaitable[TestServer]], chromium: Launch
) -> None:
    """``pc.restartIce()`` + PATCH (``If-Match: "*"``) mid-push: 200 with a new ETag,
    ``ice_restarted`` completed, frames keep being decoded, one run, one session."""
    server = await whip_servers(pipeline__stats_interval_s=0.5)
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager = server.app[SESSIONS_KEY]
    page = await chromium()
    endpoint = str(server.make_url("/whip/browser"))
    assert await page.evaluate(f"whipPublish({endpoint!r})") == 201
    state = await page.evaluate("window.whip")
    run_id: str = state["runId"]
    await wait_for_type(timeline, run_id, "first_frame", wait_s=30)
    (session,) = manager.table.live()

    assert await page.evaluate("whipRestartIce()") == 200
    after = await page.evaluate("window.whip")
    assert after["etag"] != state["etag"] and after["etag"] == session.etag
    restarted = await wait_for_type(timeline, run_id, "ice_restarted", wait_s=30)
    assert restarted.data["outcome"] == "completed", restarted.data

    async def decoded_after_restart() -> bool:
        events = await timeline.read_events(run_id, restarted.seq, limit=1000)
        counts = [e.data["frames_decoded"] for e in events if e.type == "stats"]
        return len(counts) >= 2 and counts[-1] > counts[0]

    await eventually(
        decoded_after_restart, within=30, awaiting="stats with more frames after the restart"
    )
    assert manager.table.live() == [session] and len(timeline.runs.list_runs()) == 1
    assert await page.evaluate("whipStop()") == 200
    closed = await wait_for_type(timeline, run_id, "session_closed")
    assert closed.data["reason"] == "deleted"
    final = await page.evaluate("window.whip")
    assert final["error"] is None and final["restarts"] == [200]
    assert "failed" not in final["connectionStates"]


async def test_a_cross_origin_page_reads_what_eyevinns_client_reads(
    whip_servers: Callable[..., Awaitable[TestServer]], chromium: Launch
) -> None:
    """The publisher page is served from another origin, so this is the browser's own CORS
    at work: an OPTIONS answer's ``Access-Control-Allow-Methods`` and ``Accept-Post`` are
    readable (Eyevinn's whip-web-client decides whether to trickle from them); a trickle
    PATCH that carries its tag in an ``ETag`` request header passes the preflight and is
    204; the POST's ``ETag``, ``Location`` and ``X-Run-Id`` are readable."""
    server = await whip_servers()
    page = await chromium()
    endpoint = str(server.make_url("/whip/browser"))
    read = await page.evaluate(
        f"""(async () => {{
          const options = await fetch({endpoint!r}, {{ method: "OPTIONS" }});
          return {{
            status: options.status,
            methods: options.headers.get("Access-Control-Allow-Methods"),
            acceptPost: options.headers.get("Accept-Post"),
          }};
        }})()"""
    )
    assert read["status"] == 204
    assert "PATCH" in read["methods"].split(", ")
    assert read["acceptPost"] == "application/sdp"
    assert await page.evaluate(f"whipPublish({endpoint!r})") == 201
    headers = await page.evaluate(
        f"""(async () => {{
          const url = new URL(window.whip.location, {endpoint!r});
          const patch = await fetch(url, {{
            method: "PATCH",
            headers: {{
              "Content-Type": "application/trickle-ice-sdpfrag",
              "ETag": window.whip.etag,
            }},
            body: "a=end-of-candidates\\r\\n",
          }});
          const probe = await fetch(url, {{ method: "OPTIONS" }});
          return {{ patch: patch.status, acceptPatch: probe.headers.get("Accept-Patch") }};
        }})()"""
    )
    assert headers == {"patch": 204, "acceptPatch": "application/trickle-ice-sdpfrag"}
    state = await page.evaluate("window.whip")
    assert state["etag"] and state["location"] and state["runId"]
    assert await page.evaluate("whipStop()") == 200
