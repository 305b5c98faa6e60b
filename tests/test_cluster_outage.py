"""A store outage under a live push: a real server in cluster mode, a real aiortc publisher,
a PostgreSQL of its own that the test stops and starts (its PID only).

One story, in order: the publisher is connected and ``stats`` events are durable; the
store stops for less than the fencing bound (``2 * lease_s / 3``) and comes back: the
session kept decoding, the node never fenced, and the run's events are gap-free and
duplicate-free (nothing confirmed lost, nothing written twice). Then the store stops for
longer: the node fences (its session closes with reason ``fenced``, ``/readyz`` and a new
push answer 503 with ``Retry-After``); when the store is back the node takes a new lease,
is ready again, and the run that was live gets exactly one ``run_interrupted``
(``node_lost``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from registry.events import Event
from registry.pg.batches import StoreUnavailableError
from registry.pg.timeline import ClusterTimeline
from tests.support.eventually import eventually
from tests.support.peers import AiortcPublisher
from tests.support.postgres import PostgresServer
from whip.appkeys import CLUSTER_KEY, SESSIONS_KEY

LEASE_S = 4.5
SECRET = "outage-test-secret-0123"


async def all_events(cluster: ClusterTimeline, run_id: str) -> list[Event]:
    return await cluster.read_events(run_id, 0, 1000)


async def test_a_store_outage_mid_push_loses_nothing_and_a_long_one_fences(
    postgres: PostgresServer, whip_servers: Callable[..., Awaitable[TestServer]]
) -> None:
    store_server = PostgresServer(copy_of=postgres)
    try:
        store_server.start()
        await outage_story(store_server, store_server.create_database(), whip_servers)
    finally:
        store_server.close()


async def outage_story(
    store_server: PostgresServer,
    store: str,
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    overrides: dict[str, Any] = {
        "cluster__store": store,
        "cluster__secret": SECRET,
        "cluster__node_id": "solo",
        "cluster__lease_s": LEASE_S,
        "pipeline__stats_interval_s": 0.2,
    }
    server = await whip_servers(**overrides)
    cluster = server.app[CLUSTER_KEY]
    manager = server.app[SESSIONS_KEY]
    publisher = AiortcPublisher()
    try:
        async with aiohttp.ClientSession() as http:
            answer = await publisher.publish(http, str(server.make_url("/whip/cam")))
            assert answer.status == 201
            await asyncio.wait_for(publisher.connected.wait(), 20)
            run_id = publisher.run_id

            async def stats_count() -> int:
                try:
                    return sum(e.type == "stats" for e in await all_events(cluster, run_id))
                except StoreUnavailableError:
                    return 0  # the pool's first use of a connection the restart broke

            before = await eventually(
                lambda: _at_least(stats_count, 2), within=20, awaiting="stats before"
            )

            # A short outage: less than the fencing bound.
            await asyncio.to_thread(store_server.stop)
            await asyncio.to_thread(store_server.start)
            await eventually(
                lambda: _at_least(stats_count, before + 3), within=20, awaiting="stats after"
            )
            assert cluster.lease.fenced_count == 0
            assert manager.find_by_run(run_id) is not None, "the session kept running"
            events = await all_events(cluster, run_id)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            decoded = [e.data["frames_decoded"] for e in events if e.type == "stats"]
            assert decoded == sorted(decoded), "no stats event written twice or out of order"

            # A long outage: the node fences itself.
            await asyncio.to_thread(store_server.stop)
            await eventually(
                lambda: manager.totals.closed_by_reason["fenced"] == 1,
                within=3 * LEASE_S,
                awaiting="the node to fence and close its session",
            )
            assert cluster.lease.fenced_count == 1 and manager.find_by_run(run_id) is None
            async with http.get(server.make_url("/readyz")) as ready:
                assert ready.status == 503
            second = AiortcPublisher()
            try:
                refused = await second.publish(http, str(server.make_url("/whip/cam2")))
            finally:
                await second.close()
            assert refused.status == 503 and "Retry-After" in refused.headers

            await asyncio.to_thread(store_server.start)
            await eventually(lambda: cluster.ready, within=3 * LEASE_S, awaiting="a new lease")
            async with http.get(server.make_url("/readyz")) as ready:
                assert ready.status == 200
            events = await all_events(cluster, run_id)
            interrupts = [e.data for e in events if e.type == "run_interrupted"]
            assert interrupts == [{"reason": "node_lost", "node": "solo"}]
    finally:
        await publisher.close()
        await server.close()  # before its store stops: a clean leave, no drain wait


async def _at_least(count: Callable[[], Awaitable[int]], wanted: int) -> int | None:
    have = await count()
    return have if have >= wanted else None
