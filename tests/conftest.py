"""Shared fixtures.

``no_blocking_on_loop`` (autouse) fails any test in which ``fsync``/``fdatasync`` or a
PyAV decode run on a thread that is running an asyncio event loop: durable I/O belongs to
the WAL writer thread or ``asyncio.to_thread``, decoding to the pipeline's worker
threads, never to the loop (tests/support/loop_guard.py says how each is caught).

Every test also runs under the hang watchdog (tests/support/hang_watchdog.py): stuck past
its pytest-timeout where the signal cannot reach it, it ends its worker with every
thread's stack on the console, instead of hanging the run.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from registry.timeline import Timeline, TimelineConfig
from registry.wal import WalFaults
from tests.support.chromium import (
    Chromium,
    ChromiumPage,
    PublishPage,
    open_publisher,
    require_chromium,
)
from tests.support.loop_guard import DecodeWatch, guard_sync_calls
from tests.support.postgres import PostgresServer
from tests.support.servers import ServerPool
from whip.eventloop import DEFAULT_EVENT_LOOP, EventLoopKind, new_event_loop
from whip.webhooks.child_priority import reset_to_normal_policy

pytest_plugins = ["tests.support.hang_watchdog"]

TEST_LOOP: EventLoopKind = (
    "asyncio" if os.environ.get("WHIP_TEST_LOOP") == "asyncio" else DEFAULT_EVENT_LOOP
)
"""The loop the async tests run on: the server's default (``WHIP_TEST_LOOP=asyncio``
for the standard library's)."""


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """pytest-asyncio's hook: every async test and fixture runs on :data:`TEST_LOOP`."""
    return {TEST_LOOP: lambda: new_event_loop(TEST_LOOP)}


@pytest.fixture(scope="session")
def decode_watch() -> Iterator[DecodeWatch]:
    """The session's one PyAV decode watch (a ``sys.monitoring`` tool)."""
    watch = DecodeWatch()
    watch.install()
    yield watch
    watch.uninstall()


@pytest.fixture(autouse=True)
def normal_scheduling_after() -> Iterator[None]:
    """After each test, every thread of this worker back at ``SCHED_OTHER``: a SVT-AV1
    encoder opened as root puts the opening thread at ``SCHED_FIFO`` 99, and every process
    a later test starts from it (servers, busy loops, delivery children) would inherit it
    (``whip.webhooks.child_priority.reset_to_normal_policy``)."""
    yield
    reset_to_normal_policy()


@pytest.fixture(autouse=True)
def no_blocking_on_loop(
    monkeypatch: pytest.MonkeyPatch, decode_watch: DecodeWatch
) -> Iterator[list[str]]:
    """The offences of this test (module doc); a test that provokes one on purpose
    clears the list itself."""
    offences: list[str] = []
    guard_sync_calls(monkeypatch, offences)
    with decode_watch.recording(offences):
        yield offences
    assert not offences, f"blocking calls on the event loop thread: {offences}"


@pytest.fixture
def timeline_factory(tmp_path: Path) -> Iterator[Callable[..., Timeline]]:
    """Open timelines on ``tmp_path`` (or another dir); all are closed at teardown."""
    opened: list[Timeline] = []

    def factory(
        data_dir: Path | None = None, *, faults: WalFaults | None = None, **kwargs: Any
    ) -> Timeline:
        config = TimelineConfig(data_dir or tmp_path / "data", **kwargs)
        timeline = Timeline.open(config, faults=faults)
        opened.append(timeline)
        return timeline

    yield factory
    for timeline in reversed(opened):
        timeline.close()


@pytest.fixture
async def whip_servers(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[TestServer]]]:
    """``await whip_servers(**section__key)``: a real server on 127.0.0.1 port 0; all are
    closed at teardown."""
    pool = ServerPool(tmp_path / "servers")
    yield pool.start
    await pool.close()


@pytest.fixture
async def chromium() -> AsyncIterator[Callable[..., Awaitable[ChromiumPage]]]:
    """``await chromium(*flags)``: a headless Chromium (extra ``flags``) with the WHIP
    publisher page loaded (tests/support/chromium.py); every browser is stopped at
    teardown. Skips when Chromium is not installed, fails instead under ``CI=true``."""
    binary = require_chromium()
    page_server = PublishPage()
    await page_server.start()
    browsers: list[Chromium] = []

    async def launch(*flags: str) -> ChromiumPage:
        browser = Chromium(binary, flags)
        browsers.append(browser)
        return await open_publisher(browser, page_server)

    try:
        yield launch
    finally:
        for browser in reversed(browsers):
            await browser.stop()
        await page_server.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL 18 for the session (tests/support/postgres.py): started once,
    only its own PID stopped at the end. Never skips: a missing wheel fails."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def cluster_store(postgres: PostgresServer) -> str:
    """A fresh database on the session's PostgreSQL: the ``[cluster] store`` URL."""
    return postgres.create_database()
