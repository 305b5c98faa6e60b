"""The operator dashboard in a real browser: headless Chromium driven by Selenium
(tests/support/dashboard_browser.py), against a real server and a real aiortc push.

One browser for the whole module (its start is the expensive part); each test has its own
server, so its own origin and a fresh ``sessionStorage``. The page is loaded with
``?refresh_s=1`` (its shortest list refresh) and every wait is on page state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from registry.events import NewEvent
from registry.timeline import Timeline
from tests.support.dashboard_browser import DashboardBrowser, require_chromedriver
from tests.support.media_processors import HOSTILE_TEXT
from tests.support.peers import AiortcPublisher
from tests.support.servers import wait_for_type
from whip.appkeys import TIMELINE_KEY
from whip.auth import hash_token

Servers = Callable[..., Awaitable[TestServer]]

WAIT_S = 30.0
OPERATOR_TOKEN = "dashboard-operator-token"
PUBLISHER_TOKEN = "dashboard-publisher-token"
PRINCIPALS = [
    {"name": "ops", "role": "operator", "token_sha256": hash_token(OPERATOR_TOKEN)},
    {"name": "studio-a", "role": "publisher", "token_sha256": hash_token(PUBLISHER_TOKEN)},
]


@pytest.fixture(scope="module")
def browser() -> Iterator[DashboardBrowser]:
    """The module's one browser (fails under ``CI=true`` when it cannot run)."""
    chromium, chromedriver = require_chromedriver()
    dashboard = DashboardBrowser(chromium, chromedriver)
    dashboard.start()
    try:
        yield dashboard
    finally:
        dashboard.quit()


async def test_a_live_push_is_shown_stopped_and_deleted_and_markup_stays_text(
    whip_servers: Servers, browser: DashboardBrowser, tmp_path: Path
) -> None:
    server = await whip_servers(
        pipeline__thumbnail_interval_s=0.5,
        pipeline__stats_interval_s=0.5,
        pipeline__processors=["tests.support.media_processors:HostileLabel"],
        recording__enabled=True,
        recording__segment_s=1,
    )
    timeline: Timeline = server.app[TIMELINE_KEY]
    publisher = AiortcPublisher()
    try:
        async with aiohttp.ClientSession() as http:
            # The hostile stream name is refused by the stream-name rule (so the
            # page's hostile text comes from a frame processor's event instead).
            async with http.post(
                server.make_url("/whip/" + quote(HOSTILE_TEXT, safe="")),
                data="v=0\r\n",
                headers={"Content-Type": "application/sdp"},
            ) as refused:
                assert refused.status == 400
                assert (await refused.json())["error"]["code"] == "bad_stream"
            response = await publisher.publish(http, str(server.make_url("/whip/cam-1")))
            assert response.status == 201
        run_id = publisher.run_id
        session_id = publisher.location.rsplit("/", 1)[-1]
        await asyncio.wait_for(publisher.connected.wait(), WAIT_S)

        await browser.open(str(server.make_url("/?refresh_s=1")))
        session_row = f'tr[data-session-id="{session_id}"]'
        run_row = f'tr[data-run-id="{run_id}"]'
        await browser.until(
            "document.querySelector(arguments[0] + ' img[data-thumbnail]')?.naturalWidth > 0",
            session_row,
            within=WAIT_S,
            awaiting="the live session's thumbnail, loaded",
        )
        figures = await browser.until(
            "(() => { const row = document.querySelector(arguments[0]);"
            " const cells = Object.fromEntries([...row.querySelectorAll('td[data-field]')]"
            "   .map((cell) => [cell.dataset.field, cell.textContent]));"
            " return cells.fps !== '-' && cells.bitrate !== '-' ? cells : null; })()",
            session_row,
            within=WAIT_S,
            awaiting="the session's fps and bitrate",
        )
        assert figures["stream"] == "cam-1"
        assert figures["size"] == "640x480"
        assert figures["codec"] in {"VP8", "H264"}
        assert figures["queue"].isdigit()
        assert (
            await browser.js(
                "return document.getElementById('token-form').checkVisibility()"
                " || document.body.dataset.state"
            )
            == "ready"
        )  # no principals

        # The run's timeline, live: first_frame, then the processor's markup as text.
        await browser.click(f'{run_row} button[data-action="timeline"]')
        await browser.until(
            "document.querySelector('#timeline li[data-type=\"first_frame\"]')",
            within=WAIT_S,
            awaiting="first_frame in the page's timeline",
        )
        label = await browser.until(
            "document.querySelector('#timeline li[data-type=\"label\"]')?.textContent",
            within=WAIT_S,
            awaiting="the hostile label event in the page's timeline",
        )
        assert label.count(HOSTILE_TEXT) == 2  # its value and its key, both as text
        assert (
            await browser.js("return document.querySelectorAll('img:not([data-thumbnail])').length")
            == 0
        )
        assert await browser.alert_text() is None
        # The CSP holds in the page: a script element with inline code does not run.
        assert (
            await browser.js(
                "const s = document.createElement('script');"
                "s.textContent = 'window.inlineRan = true';"
                "document.body.append(s); return window.inlineRan === true;"
            )
            is False
        )
        # A segment completes while the push goes on: the panel lists it (reloaded on the
        # recording_segment event) and its player loads the file, fetched with the API.
        await wait_for_type(timeline, run_id, "recording_segment", wait_s=WAIT_S)
        segment = await browser.until(
            "document.querySelector('#recordings li[data-recording]')?.dataset.recording",
            within=WAIT_S,
            awaiting="a recording segment listed",
        )
        assert await browser.js("return document.getElementById('recordings-empty').hidden")
        await browser.click(
            f'#recordings li[data-recording="{segment}"] button[data-action="play"]'
        )
        size = await browser.until(
            "(() => { const p = document.getElementById('player');"
            " return p.dataset.recording === arguments[0] && p.readyState >= 1"
            " ? [p.videoWidth, p.videoHeight] : null; })()",
            segment,
            within=WAIT_S,
            awaiting="the segment's metadata loaded in the player",
        )
        assert size == [640, 480]

        # Filters: a stream that has no run empties the list; clearing it brings it back.
        await browser.type_into("#filter-stream", "no-such-stream")
        await browser.click('#run-filters button[type="submit"]')
        await browser.until(
            "!document.querySelector(arguments[0])", run_row, within=WAIT_S, awaiting="filtered"
        )
        await browser.type_into("#filter-stream", "cam-1")
        await browser.click('#run-filters button[type="submit"]')
        await browser.until(
            "document.querySelector(arguments[0])", run_row, within=WAIT_S, awaiting="unfiltered"
        )

        screenshot = tmp_path / "dashboard.png"
        await browser.screenshot(screenshot)
        assert screenshot.stat().st_size > 0

        # Stop: durable stop_requested, the session closed (stopped), the row says ended.
        await browser.click(f'{run_row} button[data-action="stop"]')
        closed = await wait_for_type(timeline, run_id, "session_closed", wait_s=WAIT_S)
        assert closed.data["reason"] == "stopped"
        await browser.until(
            "document.querySelector(arguments[0])?.dataset.state === 'ended'"
            " && !document.querySelector(arguments[1])",
            run_row,
            session_row,
            within=WAIT_S,
            awaiting="the run row ended and the session row gone",
        )
        assert await browser.js(
            "return document.querySelector(arguments[0] + ' button[data-action=\"stop\"]')"
            ".disabled",
            run_row,
        )

        # Delete: the run is soft-deleted and leaves the list.
        await browser.click(f'{run_row} button[data-action="delete"]')
        await wait_for_type(timeline, run_id, "run_deleted", wait_s=WAIT_S)
        await browser.until(
            "!document.querySelector(arguments[0])", run_row, within=WAIT_S, awaiting="row gone"
        )
        async with (
            aiohttp.ClientSession() as http,
            http.get(server.make_url(f"/v1/runs/{run_id}")) as answer,
        ):
            assert (await answer.json())["state"] == "deleted"
    finally:
        await publisher.close()


async def test_with_principals_the_page_asks_for_a_token_and_keeps_it_per_tab(
    whip_servers: Servers, browser: DashboardBrowser
) -> None:
    server = await whip_servers(PRINCIPALS)
    timeline: Timeline = server.app[TIMELINE_KEY]
    run_id = "r_dashboardseededrun00001"
    await timeline.append(NewEvent(run_id, "run_created", "studio-a", {"stream": "cam-a"}))

    await browser.open(str(server.make_url("/?refresh_s=1")))
    await browser.until(
        "document.body.dataset.state === 'auth'"
        " && document.getElementById('token-form').checkVisibility()"
        " && !document.getElementById('dashboard').checkVisibility()",
        within=WAIT_S,
        awaiting="the token prompt",
    )
    await browser.type_into("#token-input", "not-a-token")
    await browser.click('#token-form button[type="submit"]')
    await browser.until(
        "document.body.dataset.state === 'auth'"
        " && document.getElementById('token-error').textContent === 'that token was refused'",
        within=WAIT_S,
        awaiting="the wrong token refused",
    )
    assert await browser.js("return sessionStorage.length") == 0

    await browser.type_into("#token-input", OPERATOR_TOKEN)
    await browser.click('#token-form button[type="submit"]')
    run_row = f'tr[data-run-id="{run_id}"]'
    principal = await browser.until(
        "document.querySelector(arguments[0] + ' td[data-field=\"principal\"]')?.textContent",
        run_row,
        within=WAIT_S,
        awaiting="the seeded run listed with the operator token",
    )
    assert principal == "studio-a"
    stored = await browser.js(
        "return [Object.keys(sessionStorage), localStorage.length, document.cookie,"
        " document.body.innerText.includes(arguments[0])]",
        OPERATOR_TOKEN,
    )
    assert stored == [["whip-ingest.token"], 0, "", False]
    # A run without recordings (the route answers an empty list): the panel says so.
    await browser.click(f'{run_row} button[data-action="timeline"]')
    await browser.until(
        "!document.getElementById('recordings-empty').hidden"
        " && document.querySelectorAll('#recordings li').length === 0",
        within=WAIT_S,
        awaiting="no recordings shown",
    )

    # A reload in the same tab keeps the token: no prompt, the run listed again.
    await browser.open(str(server.make_url("/?refresh_s=1")))
    await browser.until(
        "document.body.dataset.state === 'ready' && document.querySelector(arguments[0])"
        " && !document.getElementById('token-form').checkVisibility()",
        run_row,
        within=WAIT_S,
        awaiting="the run listed after a reload, without a prompt",
    )


THUMBNAIL_PATHS_JS = """
return performance.getEntriesByType('resource')
  .map((e) => new URL(e.name).pathname)
  .filter((p) => p.endsWith('/thumbnail.jpg'))
  .map((p) => p.split('/')[3]);
"""
OFF_SCREEN_RUNS_JS = """
return [...document.querySelectorAll('tr[data-session-id]')]
  .filter((row) => row.querySelector('img[data-thumbnail]').getBoundingClientRect().top
    >= window.innerHeight)
  .map((row) => row.dataset.sessionRun);
"""


async def _post_unconnected(http: aiohttp.ClientSession, url: str) -> AiortcPublisher:
    """A WHIP session whose peer never connects: live (no media) until connect_timeout_s."""
    idle = AiortcPublisher()
    offer = await idle.offer()
    async with http.post(url, data=offer, headers={"Content-Type": "application/sdp"}) as answer:
        assert answer.status == 201
        idle.run_id = answer.headers["X-Run-Id"]
    return idle


async def test_thumbnails_are_fetched_only_for_rows_in_view(
    whip_servers: Servers, browser: DashboardBrowser
) -> None:
    """More live sessions than the (shrunk) window shows: the rows below the fold make no
    thumbnail request over several list refreshes, the rows in view do; scrolling the
    pushing session's row (listed last) into view loads its thumbnail."""
    server = await whip_servers(
        pipeline__thumbnail_interval_s=0.5, limits__connect_timeout_s=120, limits__stream_limit=20
    )
    peers: list[AiortcPublisher] = []
    size = await browser.js("return [window.outerWidth, window.outerHeight]")
    try:
        async with aiohttp.ClientSession() as http:
            for index in range(5):
                peers.append(await _post_unconnected(http, str(server.make_url(f"/whip/i{index}"))))
            pushing = AiortcPublisher()
            peers.append(pushing)
            assert (await pushing.publish(http, str(server.make_url("/whip/cam")))).status == 201
        await asyncio.wait_for(pushing.connected.wait(), WAIT_S)
        await browser.call(browser.driver.set_window_size, 1000, 520)
        await browser.open(str(server.make_url("/?refresh_s=1")))
        await browser.until(
            "document.querySelectorAll('tr[data-session-id]').length === 6",
            within=WAIT_S,
            awaiting="the six session rows",
        )
        off_screen = set(await browser.js(OFF_SCREEN_RUNS_JS))
        in_view = {p.run_id for p in peers} - off_screen
        assert pushing.run_id in off_screen and in_view, (off_screen, in_view)
        # Three list refreshes later, each row in view has asked (its 404 no_thumbnail,
        # re-asked every refresh); none below the fold has.
        await browser.until(
            "performance.getEntriesByType('resource')"
            ".filter((e) => new URL(e.name).pathname === '/v1/sessions').length >= 4",
            within=WAIT_S,
            awaiting="four session list refreshes",
        )
        asked = await browser.js(THUMBNAIL_PATHS_JS)
        assert in_view <= set(asked), (in_view, asked)
        assert not off_screen & set(asked), (off_screen, asked)

        await browser.js(
            "document.querySelector(arguments[0]).scrollIntoView()",
            f'tr[data-session-run="{pushing.run_id}"]',
        )
        await browser.until(
            "document.querySelector(arguments[0] + ' img[data-thumbnail]')?.naturalWidth > 0",
            f'tr[data-session-run="{pushing.run_id}"]',
            within=WAIT_S,
            awaiting="the scrolled-in session's thumbnail, loaded",
        )
    finally:
        await browser.call(browser.driver.set_window_size, *size)
        for peer in peers:
            await peer.close()
