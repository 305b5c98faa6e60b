#!/usr/bin/env python3
"""Benchmark of the operator dashboard in headless Chromium against the real server process.

Prints exactly one JSON document on stdout; progress goes to stderr.

The server is ``python -m whip serve`` (:class:`bench.support.server_process.ServerProcess`:
loopback, anonymous mode, its PID recorded, SIGINT then SIGKILL), with
``limits.connect_timeout_s = 600`` and a media budget that admits every session. The
browser is Debian's Chromium under chromedriver (:mod:`bench.support.selenium_chrome`).

Sections:

1. ``idle_100``: 100 live sessions, made by 100 real WHIP POSTs of an aiortc offer whose peer
   never connects (the API has no way to make a run without an offer; a session stays live
   until ``connect_timeout_s``). Their runs read as ``starting`` (no media, so no thumbnail:
   each thumbnail request answers 404 ``no_thumbnail``, which the page re-asks every list
   refresh: the worst case for its request count). Figures:

   - ``first_paint``: over ``--loads`` page loads, the browser's own
     ``first-contentful-paint`` (Paint Timing) and ``rows_ms``: the time from navigation
     start until the page holds all 100 session rows and 100 run rows (checked every
     animation frame in the page); median, min, max.
   - ``requests``: the page left open ``--window`` seconds with one run's timeline selected
     (its long-poll running); every request it made in that window, counted by the browser's
     Resource Timing (each fetch, the long-poll included once it answers), by path kind;
     ``per_s`` and ``per_s_per_session``; ``visible_sessions`` (session rows whose
     thumbnail is in the browser's viewport at the end of the window: the page fetches
     thumbnails for those only), ``per_s_per_visible_session`` (the issue's figure), and
     ``thumbnail_requests_off_screen`` (thumbnail requests for the other rows: 0).

2. ``one_push``: one real aiortc push (test pattern, default ``pipeline`` settings: stats
   every 5 s, a thumbnail every 10 s) with its timeline selected: the same request count over
   ``--window`` seconds; with one session this is the tightest per-session figure.

The target (issue 15): below one request per second per visible session.

Usage::

    .venv/bin/python bench/dashboard.py            # about 2 min
    .venv/bin/python bench/dashboard.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if sys.path[0] != str(REPO):
    sys.path.insert(0, str(REPO))  # `python bench/dashboard.py` puts bench/ first

import aiohttp  # noqa: E402
from aiortc import RTCPeerConnection  # noqa: E402
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack  # noqa: E402

from bench.support import selenium_chrome  # noqa: E402
from bench.support.publisher import AiortcPublisher  # noqa: E402
from bench.support.server_process import ServerProcess, log, media_budget_env  # noqa: E402
from whip.rtc.peer import new_peer_connection  # noqa: E402

SESSIONS = 100

ROWS_READY_JS = """
const [sessions, runs, done] = arguments;
function check() {
  const s = document.querySelectorAll('tr[data-session-id]').length;
  const r = document.querySelectorAll('tr[data-run-id]').length;
  if (s >= sessions && r >= runs) {
    const paint = performance.getEntriesByName('first-contentful-paint')[0];
    done({rows_ms: performance.now(), fcp_ms: paint ? paint.startTime : null});
  } else {
    requestAnimationFrame(check);
  }
}
check();
"""

COUNT_JS = """
const [from, to] = arguments;
return performance.getEntriesByType('resource')
  .filter((e) => e.startTime >= from && e.startTime < to)
  .map((e) => new URL(e.name).pathname);
"""

VISIBLE_RUNS_JS = """
return [...document.querySelectorAll('tr[data-session-id]')]
  .filter((row) => {
    const box = row.querySelector('img[data-thumbnail]').getBoundingClientRect();
    return box.bottom > 0 && box.top < window.innerHeight && box.width > 0;
  })
  .map((row) => row.dataset.sessionRun);
"""


def say(message: str) -> None:
    log("dashboard", message)


def kind_of(path: str) -> str:
    """A request's kind, for the breakdown."""
    if path.endswith("/thumbnail.jpg"):
        return "thumbnail"
    if path.endswith("/events"):
        return "events"
    if path.endswith("/recordings"):
        return "recordings"
    if path in ("/v1/sessions", "/v1/runs"):
        return path.rsplit("/", 1)[-1]
    return "other"


async def post_never_connected(
    http: aiohttp.ClientSession, base: str, count: int
) -> list[RTCPeerConnection]:
    """``count`` WHIP POSTs of one aiortc offer whose peer never connects; their peers (kept
    open until the end, so nothing is sent that would close the sessions)."""
    pcs = []
    for index in range(count):
        pc = new_peer_connection()
        pc.addTransceiver(VideoStreamTrack(), direction="sendonly")
        pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
        await pc.setLocalDescription(await pc.createOffer())
        pcs.append(pc)
        async with http.post(
            f"{base}/whip/idle-{index:03d}",
            data=pc.localDescription.sdp,
            headers={"Content-Type": "application/sdp"},
        ) as response:
            await response.read()
            if response.status != 201:
                raise RuntimeError(f"WHIP POST {index} answered {response.status}")
    return pcs


async def in_thread(function: Any, *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


async def first_paint(chrome: selenium_chrome.Chrome, url: str, loads: int) -> dict[str, Any]:
    """Page loads until all rows are in the page (module doc, section 1)."""
    driver = chrome.driver
    driver.set_script_timeout(60)
    rows, fcps = [], []
    for _ in range(loads):
        await in_thread(driver.get, "about:blank")
        await in_thread(driver.get, url)
        found = await in_thread(driver.execute_async_script, ROWS_READY_JS, SESSIONS, SESSIONS)
        rows.append(found["rows_ms"])
        if found["fcp_ms"] is not None:
            fcps.append(found["fcp_ms"])

    def summary(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {
            "median": round(statistics.median(values), 1),
            "min": round(min(values), 1),
            "max": round(max(values), 1),
        }

    return {"loads": loads, "first_contentful_paint_ms": summary(fcps), "rows_ms": summary(rows)}


async def request_rate(
    chrome: selenium_chrome.Chrome, url: str, window_s: float, sessions: int
) -> dict[str, Any]:
    """Open the page, select the first run's timeline, count requests over ``window_s``."""
    driver = chrome.driver
    await in_thread(driver.get, "about:blank")
    await in_thread(driver.get, url)
    await in_thread(
        driver.execute_async_script,
        "const done = arguments[0]; performance.setResourceTimingBufferSize(100000);"
        "(function wait() { const b = document.querySelector("
        "'tr[data-run-id] button[data-action=\"timeline\"]');"
        " if (b) { b.click(); done(true); } else { setTimeout(wait, 50); } })();",
    )
    start_ms = await in_thread(driver.execute_script, "return performance.now();")
    await asyncio.sleep(window_s)
    end_ms = await in_thread(driver.execute_script, "return performance.now();")
    paths = await in_thread(driver.execute_script, COUNT_JS, start_ms, end_ms)
    visible = set(await in_thread(driver.execute_script, VISIBLE_RUNS_JS))
    off_screen = sum(
        1 for path in paths if path.endswith("/thumbnail.jpg") and path.split("/")[3] not in visible
    )
    kinds: dict[str, int] = {}
    for path in paths:
        kinds[kind_of(path)] = kinds.get(kind_of(path), 0) + 1
    seconds = (end_ms - start_ms) / 1000
    per_s = len(paths) / seconds
    return {
        "window_s": round(seconds, 2),
        "sessions": sessions,
        "requests": len(paths),
        "by_kind": dict(sorted(kinds.items())),
        "per_s": round(per_s, 3),
        "per_s_per_session": round(per_s / max(sessions, 1), 3),
        "below_1_per_s_per_session": per_s / max(sessions, 1) < 1,
        "visible_sessions": len(visible),
        "per_s_per_visible_session": round(per_s / max(len(visible), 1), 3),
        "below_1_per_s_per_visible_session": per_s / max(len(visible), 1) < 1,
        "thumbnail_requests_off_screen": off_screen,
    }


async def idle_section(
    chrome: selenium_chrome.Chrome, root: Path, loads: int, window_s: float
) -> dict[str, Any]:
    server = ServerProcess(
        "dashboard",
        root / "idle-data",
        root / "idle-server.log",
        SESSIONS,
        {"WHIP_INGEST_LIMITS_CONNECT_TIMEOUT_S": "600", **media_budget_env(SESSIONS)},
    )
    pcs: list[RTCPeerConnection] = []
    try:
        await server.wait_ready()
        async with aiohttp.ClientSession() as http:
            started = time.monotonic()
            pcs = await post_never_connected(http, server.base, SESSIONS)
            say(f"{SESSIONS} sessions admitted in {time.monotonic() - started:.1f} s")
            async with http.get(f"{server.base}/v1/sessions") as response:
                live = len((await response.json())["items"])
        url = f"{server.base}/"
        paint = await first_paint(chrome, url, loads)
        say(f"first paint: {paint}")
        rate = await request_rate(chrome, url, window_s, live)
        say(f"requests: {rate}")
        return {
            "live_sessions": live,
            "runs_made_by": "WHIP POST of an aiortc offer, peer never connected (no media)",
            "first_paint": paint,
            "requests": rate,
        }
    finally:
        for pc in pcs:
            await pc.close()
        server.shutdown()


async def push_section(
    chrome: selenium_chrome.Chrome, root: Path, window_s: float
) -> dict[str, Any]:
    server = ServerProcess("dashboard", root / "push-data", root / "push-server.log", 4, {})
    publisher = AiortcPublisher()
    try:
        await server.wait_ready()
        async with aiohttp.ClientSession() as http:
            response = await publisher.publish(http, f"{server.base}/whip/bench-push")
            if response.status != 201:
                raise RuntimeError(f"WHIP POST answered {response.status}")
            await asyncio.wait_for(publisher.connected.wait(), 20)
        rate = await request_rate(chrome, f"{server.base}/", window_s, 1)
        say(f"one push: {rate}")
        return {"requests": rate}
    finally:
        await publisher.close()
        server.shutdown()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer loads, a short window")
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--window", type=float, default=30.0, help="seconds the page stays open")
    args = parser.parse_args()
    loads, window_s = (2, 8.0) if args.quick else (args.loads, args.window)
    browser, chromedriver = selenium_chrome.binaries()
    if browser is None or chromedriver is None:
        raise SystemExit("needs Debian's chromium and chromium-driver (apt-get install ...)")
    out: dict[str, Any] = {
        "bench": "dashboard",
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": {"loads": loads, "window_s": window_s, "sessions": SESSIONS},
    }
    chrome = await in_thread(selenium_chrome.start, browser, chromedriver)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
            root = Path(tmp)
            out["idle_100"] = await idle_section(chrome, root, loads, window_s)
            out["one_push"] = await push_section(chrome, root, window_s)
    finally:
        await in_thread(chrome.quit)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    asyncio.run(main())
