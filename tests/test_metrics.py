"""/metrics after a scripted scenario says exactly what happened."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from tests.support.peers import AiortcPublisher
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.session_manager import SessionManager


@pytest.fixture
async def server(whip_servers: Callable[..., Awaitable[TestServer]]) -> TestServer:
    return await whip_servers(limits__stream_limit=2)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_two_runs_one_rejected_one_deleted(server: TestServer) -> None:
    manager: SessionManager = server.app[SESSIONS_KEY]
    timeline = server.app[TIMELINE_KEY]
    first, second, third = AiortcPublisher(), AiortcPublisher(), AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        for publisher, stream in ((first, "a"), (second, "b")):
            response = await publisher.publish(http, str(server.make_url(f"/whip/{stream}")))
            assert response.status == 201
        await asyncio.wait_for(first.connected.wait(), 20)
        refused = await third.publish(http, str(server.make_url("/whip/c")))
        assert refused.status == 409
        result = await manager.runs.request_delete(second.run_id, "anonymous")
        assert not result.synthesized
        scrape = await http.get(server.make_url("/metrics"))
        assert scrape.status == 200
        assert scrape.headers["Content-Type"].startswith("text/plain")
        metrics = _samples(await scrape.text())
        (live,) = manager.table.live()
    for publisher in (first, second, third):
        await publisher.close()

    def value(name: str, **labels: str) -> float:
        return metrics[(name, tuple(sorted(labels.items())))]

    assert value("whip_admissions_total", outcome="accepted") == 2
    assert value("whip_admissions_total", outcome="stream_limit") == 1
    assert value("whip_admissions_total", outcome="budget") == 0
    assert value("whip_runs_created_total") == 2
    assert value("whip_runs_deleted_total") == 1
    assert value("whip_runs_interrupted_total") == 0
    assert value("whip_sessions_live") == 1
    assert value("whip_sessions_max") == 100
    assert value("whip_stream_slots_in_use") == 1
    one_session = manager.config.pipeline.media_bytes(2)
    assert value("whip_media_budget_bytes_reserved") == one_session
    workers = manager.config.pipeline.workers_per_session
    assert value("whip_media_budget_threads_reserved") == workers
    assert value("whip_forced_shutdown_bytes_kept") == 0
    # Media events keep landing after the scrape: the counter is a prefix of the log.
    on_disk = await asyncio.to_thread(timeline.wal.read_all)
    at_scrape = int(value("whip_events_appended_total"))
    assert 4 <= at_scrape <= len(on_disk)
    lifecycle = [e.type for e in on_disk[:at_scrape]]
    assert lifecycle.count("run_created") == 2 and lifecycle.count("run_deleted") == 1
    assert 1 <= value("whip_fsyncs_total") <= at_scrape
    assert value("whip_post_seconds_count") == 2
    assert value("whip_wal_batch_events_count") == value("whip_fsyncs_total")
    # Histograms are read after the counters, and each fdatasync is timed before it counts.
    assert value("whip_wal_fsync_seconds_count") >= value("whip_fsyncs_total")
    assert value("whip_wal_fsync_seconds_sum") > 0
    per_session = {k for k in metrics if k[0] == "whip_session_bytes_in_total"}
    assert per_session == {
        (
            "whip_session_bytes_in_total",
            (("principal", "anonymous"), ("run_id", live.run_id), ("session_id", live.session_id)),
        ),
    }, "only the live session has series"


async def test_rate_limited_requests_are_counted(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await whip_servers(limits__rate_per_address_per_s=0.001, limits__burst_per_address=2)
    url = server.make_url("/whip/sessions/s_AAAAAAAAAAAAAAAAAAAAAA")
    async with aiohttp.ClientSession() as http:
        statuses = [(await http.delete(url)).status for _ in range(4)]
        assert statuses == [404, 404, 429, 429]
        metrics = _samples(await (await http.get(server.make_url("/metrics"))).text())
    assert metrics[("whip_requests_rate_limited_total", ())] == 2
    assert metrics[("whip_request_body_timeouts_total", ())] == 0
