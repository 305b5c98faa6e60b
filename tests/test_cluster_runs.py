"""Cluster mode's run reads over real HTTP: in-process nodes (the real aiohttp app in
cluster mode, principals with tokens) on one real PostgreSQL.

Proved once each:

- ``GET /v1/runs`` pages in the store: 1,150 runs (more than one page and more than the
  1,000 the listing used to read), written through the node's timeline with created-ms
  ties and mixed-case ids; every run is listed exactly once across pages, in the
  embedded registry's order (``(created_ms, run_id)`` descending, ids compared by code
  point), with the state, principal and stream filters and a publisher's isolation
  respected, and a run created mid-walk shifts no page;
- ``GET /v1/nodes`` is in ``/v1/openapi.json`` with its schema, and every public route a
  cluster node serves is documented;
- a run's thumbnail is served by any node: the request is carried to the owner (live
  session in memory, then its disk after the session ended); another principal's run is
  404 on the carrying node and, signed for it, on the owner; the internal route refuses an
  unsigned request (404); once the owner left the cluster, the other node answers
  ``no_thumbnail``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from bench.support.server_process import free_port
from registry.events import EventType, NewEvent
from registry.pg.timeline import ClusterTimeline
from tests.support.eventually import eventually
from tests.support.openapi_routes import CLUSTER_ONLY, documented_operations, public_operations
from tests.support.peers import AiortcPublisher
from tests.support.postgres import PostgresServer
from whip.appkeys import CLUSTER_KEY, SESSIONS_KEY
from whip.auth import Principal, Role, hash_token
from whip.cluster_node import (
    AUTH_HEADER,
    PRINCIPAL_HEADER,
    ROLE_HEADER,
    TIME_HEADER,
    carry_signature,
)

SECRET = "a-test-cluster-secret-runs"
LEASE_S = 6.0
TOKENS = {"a": "token-a", "b": "token-b", "op": "token-op"}
PRINCIPALS = [
    {"name": "studio-a", "role": "publisher", "token_sha256": hash_token(TOKENS["a"])},
    {"name": "studio-b", "role": "publisher", "token_sha256": hash_token(TOKENS["b"])},
    {"name": "ops", "role": "operator", "token_sha256": hash_token(TOKENS["op"])},
]
OPENAPI = Path(__file__).parent.parent / "whip" / "openapi.json"
ServerFactory = Callable[..., Awaitable[TestServer]]


def auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who]}"}


async def cluster_node(
    whip_servers: ServerFactory, store: str, node_id: str, **overrides: Any
) -> TestServer:
    """A node of the test's cluster, its ``advertise_url`` the port it listens on."""
    port = free_port()
    return await whip_servers(
        PRINCIPALS,
        port=port,
        cluster__store=store,
        cluster__secret=SECRET,
        cluster__node_id=node_id,
        cluster__lease_s=LEASE_S,
        cluster__advertise_url=f"http://127.0.0.1:{port}",
        **overrides,
    )


def signed_headers(path: str, principal: Principal) -> dict[str, str]:
    """The headers a node carrying a GET of ``path`` for ``principal`` sends."""
    sent_s = int(time.time())
    return {
        AUTH_HEADER: carry_signature(SECRET, "GET", path, principal, sent_s),
        PRINCIPAL_HEADER: principal.name,
        ROLE_HEADER: principal.role.value,
        TIME_HEADER: str(sent_s),
    }


@dataclass(frozen=True)
class Seeded:
    run_id: str
    principal: str
    stream: str
    created_ms: int
    state: str


async def seed_runs(cluster: ClusterTimeline, count: int) -> list[Seeded]:
    """``count`` runs through the node's own timeline: three per millisecond (ids whose
    first letters sort differently by code point and by a locale), every fifth live,
    every fifth ended, every seventh deleted."""
    base_ms = 1_700_000_000_000
    seeded = []
    appends = []
    for i in range(count):
        run_id = f"{'AbCdEf'[i % 6]}{i:05d}"
        principal = "studio-b" if i % 3 == 0 else "studio-a"
        stream = f"cam{i % 4}"
        created_ms = base_ms + i // 3
        created = {"stream": stream, "session_id": f"s{i}"}
        event = NewEvent(run_id, EventType.RUN_CREATED, principal, created, ts_ms=created_ms)
        appends.append(cluster.append(event))
        state = "starting"
        if i % 5 in (0, 1):
            appends.append(cluster.append(NewEvent(run_id, EventType.SESSION_CONNECTED, principal)))
            state = "live"
        if i % 5 == 1:
            closed = NewEvent(run_id, EventType.SESSION_CLOSED, principal, {"reason": "deleted"})
            appends.append(cluster.append(closed))
            state = "ended"
        seeded.append(Seeded(run_id, principal, stream, created_ms, state))
    await asyncio.gather(*appends)
    deleted = [run for i, run in enumerate(seeded) if i % 7 == 0]
    for run in deleted:
        await cluster.delete_run(run.run_id, run.principal)
    gone = {run.run_id for run in deleted}
    return [
        Seeded(r.run_id, r.principal, r.stream, r.created_ms, "deleted") if r.run_id in gone else r
        for r in seeded
    ]


async def walk(
    http: aiohttp.ClientSession, base: str, who: str, limit: int, **filters: str
) -> list[str]:
    """Every run id of ``GET /v1/runs`` with ``filters``, following ``next`` to the end."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        params = {"limit": str(limit), **filters, **({"cursor": cursor} if cursor else {})}
        async with http.get(f"{base}/v1/runs", params=params, headers=auth(who)) as answer:
            assert answer.status == 200, await answer.text()
            page = await answer.json()
        assert len(page["items"]) <= limit
        ids += [item["id"] for item in page["items"]]
        cursor = page["next"]
        if cursor is None:
            return ids


def newest_first(runs: list[Seeded]) -> list[str]:
    """The embedded registry's order (code-point ids)."""
    return [r.run_id for r in sorted(runs, key=lambda r: (r.created_ms, r.run_id), reverse=True)]


async def test_runs_page_in_the_store_every_run_once_in_order_with_filters(
    postgres: PostgresServer, whip_servers: ServerFactory
) -> None:
    # No stream TTL: the seeded runs are years old (expiry is proved in test_cluster_store).
    node = await cluster_node(
        whip_servers, postgres.create_database(), "list-node", limits__stream_ttl_s=0
    )
    cluster = node.app[CLUSTER_KEY]
    seeded = await seed_runs(cluster, 1150)
    base = str(node.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as http:
        # The whole cluster, 97 a page; a run created after the first page is newer than
        # every cursor, so it shifts nothing.
        first = await http.get(f"{base}/v1/runs", params={"limit": "97"}, headers=auth("op"))
        page = await first.json()
        late = NewEvent("late-run", EventType.RUN_CREATED, "studio-a", {"stream": "cam0"})
        await cluster.append(late)
        rest = await walk(http, base, "op", 97, cursor=page["next"])
        listed = [item["id"] for item in page["items"]] + rest
        assert listed == newest_first(seeded)

        assert await walk(http, base, "op", 100, state="deleted") == newest_first(
            [r for r in seeded if r.state == "deleted"]
        )
        assert await walk(http, base, "op", 50, principal="studio-b", stream="cam1") == (
            newest_first([r for r in seeded if r.principal == "studio-b" and r.stream == "cam1"])
        )
        # A publisher sees its own runs only, whatever it asks for.
        assert await walk(http, base, "a", 200, state="live") == newest_first(
            [r for r in seeded if r.principal == "studio-a" and r.state == "live"]
        )
        assert await walk(http, base, "op", 100, state="expired") == []


async def test_nodes_are_documented_and_every_public_cluster_route_is(
    postgres: PostgresServer, whip_servers: ServerFactory
) -> None:
    node = await cluster_node(whip_servers, postgres.create_database(), "doc-node")
    doc = json.loads(OPENAPI.read_bytes())
    documented = documented_operations(doc)
    routed = public_operations(node.app)
    assert routed - documented == set(), "cluster routes missing from whip/openapi.json"
    assert routed >= CLUSTER_ONLY
    schema = doc["components"]["schemas"]["Node"]
    async with aiohttp.ClientSession() as http:
        async with http.get(node.make_url("/v1/nodes"), headers=auth("op")) as answer:
            assert answer.status == 200
            body = await answer.json()
        assert [item["id"] for item in body["items"]] == ["doc-node"] and body["next"] is None
        assert set(body["items"][0]) == set(schema["properties"]) == set(schema["required"])
        async with http.get(node.make_url("/v1/nodes?x=1"), headers=auth("op")) as answer:
            assert answer.status == 400
        async with http.get(node.make_url("/v1/nodes"), headers=auth("a")) as answer:
            assert answer.status == 404


async def test_a_thumbnail_is_carried_to_the_owner_with_isolation(
    postgres: PostgresServer, whip_servers: ServerFactory
) -> None:
    store = postgres.create_database()
    owner = await cluster_node(
        whip_servers, store, "thumb-owner", pipeline__thumbnail_interval_s=0.3
    )
    other = await cluster_node(whip_servers, store, "thumb-other")
    publisher = AiortcPublisher()
    try:
        async with aiohttp.ClientSession() as http:
            pushed = await publisher.publish(http, str(owner.make_url("/whip/cam")), auth("a"))
            assert pushed.status == 201
            await asyncio.wait_for(publisher.connected.wait(), 20)
            run_id = publisher.run_id
            url = other.make_url(f"/v1/runs/{run_id}/thumbnail.jpg")

            async def carried(who: str) -> bytes | None:
                async with http.get(url, headers=auth(who)) as answer:
                    if answer.status == 404 and (await answer.json())["error"]["code"] == (
                        "no_thumbnail"
                    ):
                        return None
                    assert answer.status == 200, await answer.text()
                    assert answer.content_type == "image/jpeg"
                    return await answer.read()

            live = await eventually(
                lambda: carried("a"), within=20, awaiting="a live thumbnail via the other node"
            )
            assert live.startswith(b"\xff\xd8")
            assert other.app[SESSIONS_KEY].find_by_run(run_id) is None, "not served locally"
            async with http.get(url, headers=auth("b")) as answer:
                assert answer.status == 404
                assert (await answer.json())["error"]["code"] == "not_found"
            path = f"/internal/v1/runs/{run_id}/thumbnail.jpg"
            async with http.get(owner.make_url(path), headers=auth("op")) as answer:
                assert answer.status == 404, "unsigned"
            # Signed for another principal: the owner checks the isolation again.
            for name, status in (("studio-b", 404), ("studio-a", 200)):
                signed = signed_headers(path, Principal(name, Role.PUBLISHER))
                async with http.get(owner.make_url(path), headers=signed) as answer:
                    assert answer.status == status, name

            # The session ends: the owner's disk still has the newest one.
            async with http.delete(publisher.location, headers=auth("a")) as gone:
                assert gone.status == 200
            kept = await carried("op")
            assert kept is not None and kept.startswith(b"\xff\xd8")

            # The owner leaves the cluster: nobody can ask it any more.
            await owner.close()
            async with http.get(url, headers=auth("op")) as answer:
                assert answer.status == 404
                assert (await answer.json())["error"]["code"] == "no_thumbnail"
    finally:
        await publisher.close()
