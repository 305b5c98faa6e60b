"""Three real node processes on one real PostgreSQL: the issue's "What must hold" end to end.

The nodes are ``python -m whip serve`` processes (tests/support/cluster_nodes.py: PIDs
recorded, only they are signalled) in cluster mode on one database, lease 4 s, anonymous
mode on loopback, ``stream_limit`` 4 (and 4 sessions per node). The POSTs carry one aiortc
offer made once: a 201 needs the answer, not a connected peer (the connect deadline is
raised past the module's life), which keeps 300 POSTs cheap. Proved once each:

- 300 concurrent POSTs over the three nodes: exactly 4 accepted, 296 refused (409); the
  4 session URLs DELETEd through *other* nodes (carried to the owner): every run ends
  ``deleted``, nothing holds a slot after;
- 500 concurrent run DELETEs over the three nodes: one ``run_deleted``, the owner closes
  the session with reason ``stopped``;
- a reconnect to a stream whose live session is on another node supersedes it there, and
  a session PATCH through another node gets the owner's answer;
- the internal route answers 404 to an unsigned, mis-signed or stale-signed request, and
  the owner's own answer to a signed one; ``/readyz`` names
  the node and ``/metrics`` carries the cluster figures;
- SIGKILL of a node with live sessions: each of its runs gets exactly one
  ``run_interrupted`` (``node_lost``) read from another node, a push of the same stream to
  a survivor is admitted, and the node restarted with the same id joins without
  interrupting anything again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from bench.support.publisher import AiortcPublisher
from tests.support.cluster_nodes import (
    LEASE_S,
    NODE_IDS,
    SECRET,
    Cluster,
    active_runs,
    created,
    events,
    of_type,
    post,
    ready,
)
from tests.support.eventually import eventually
from tests.support.postgres import PostgresServer
from whip.auth import Principal, Role
from whip.cluster_node import (
    AUTH_HEADER,
    PRINCIPAL_HEADER,
    ROLE_HEADER,
    TIME_HEADER,
    carry_signature,
)


@pytest.fixture(scope="module")
def cluster_processes(
    postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    cluster = Cluster(postgres.create_database(), root, {}, "")
    try:
        for node_id in NODE_IDS:
            cluster.start(node_id)
        yield cluster
    finally:
        for proc in cluster.nodes.values():
            proc.shutdown()


@pytest.fixture
async def cluster(cluster_processes: Cluster) -> AsyncIterator[Cluster]:
    """The module's three nodes, ready; the shared offer made once."""
    await asyncio.gather(*(ready(proc) for proc in cluster_processes.nodes.values()))
    if not cluster_processes.offer:
        publisher = AiortcPublisher()
        try:
            cluster_processes.offer = await publisher.offer(audio=False)
        finally:
            await publisher.close()
    yield cluster_processes
    # A test that failed half-way leaves no run holding a stream slot for the next one.
    async with aiohttp.ClientSession() as http:
        base = next(p.base for p in cluster_processes.nodes.values() if p.proc.poll() is None)
        for run_id in await active_runs(http, base):
            async with http.delete(f"{base}/v1/runs/{run_id}") as gone:
                assert gone.status == 200, await gone.text()

        async def none_active() -> bool:
            return not await active_runs(http, base)

        await eventually(none_active, within=30, awaiting="the left-over runs to end")


async def test_stream_limit_is_exact_over_three_nodes_and_session_urls_work_anywhere(
    cluster: Cluster,
) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        answers = await asyncio.gather(
            *(post(http, f"{cluster.base(i % 3)}/whip", cluster.offer) for i in range(300))
        )
        assert Counter(a.status for a in answers) == {201: 4, 409: 296}, (
            f"{Counter((a.status, a.code) for a in answers)}\n{cluster.problems()}"
        )
        accepted = [(a.location, a.run_id) for a in answers if a.status == 201]
        for location, run_id in accepted:
            owner = next(i for i in range(3) if location.startswith(cluster.base(i) + "/whip/"))
            other = cluster.base((owner + 1) % 3)
            # A load balancer sends the DELETE anywhere: carried to the owner.
            async with http.delete(other + location.removeprefix(cluster.base(owner))) as gone:
                assert gone.status == 200, await gone.text()
            closed = of_type(await events(http, other, run_id), "session_closed")
            assert [c["data"] for c in closed] == [{"reason": "deleted"}]
        async with http.get(f"{cluster.base(2)}/v1/runs/{accepted[0][1]}") as run:
            body = await run.json()
            assert body["state"] == "ended" and body["node"] in NODE_IDS
        assert await active_runs(http, cluster.base(1)) == []
        async with http.get(f"{cluster.base(0)}/v1/nodes") as nodes:
            listed = (await nodes.json())["items"]
            assert [n["id"] for n in listed] == list(NODE_IDS)


async def test_500_deletes_over_three_nodes_append_one_and_the_owner_closes(
    cluster: Cluster,
) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        run_id = (await created(http, f"{cluster.base(0)}/whip", cluster)).run_id

        async def delete(i: int) -> tuple[int, bool]:
            async with http.delete(f"{cluster.base(i % 3)}/v1/runs/{run_id}") as answer:
                body = await answer.json()
                return answer.status, bool(body.get("repeat"))

        answers = await asyncio.gather(*(delete(i) for i in range(500)))
        assert Counter(answers) == {(200, False): 1, (200, True): 499}

        async def closed() -> list[dict[str, object]] | None:
            items = await events(http, cluster.base(2), run_id)
            return of_type(items, "session_closed") or None

        closes = await eventually(closed, within=10, awaiting="the owner's session_closed")
        assert [c["data"] for c in closes] == [{"reason": "stopped"}]
        items = await events(http, cluster.base(1), run_id)
        assert len(of_type(items, "run_deleted")) == 1


async def test_the_internal_route_refuses_unsigned_requests_and_a_node_reports_itself(
    cluster: Cluster,
) -> None:
    path = "/internal/v1/sessions/s_0123456789abcdef"
    operator = Principal("anonymous", Role.OPERATOR)

    def signed(sent_s: int, secret: str = SECRET) -> dict[str, str]:
        return {
            AUTH_HEADER: carry_signature(secret, "DELETE", path, operator, sent_s),
            PRINCIPAL_HEADER: operator.name,
            ROLE_HEADER: operator.role.value,
            TIME_HEADER: str(sent_s),
        }

    now = int(time.time())
    refused = ({}, signed(now, "another-secret-of-16+"), signed(now - 120))
    async with aiohttp.ClientSession() as http:
        for headers in refused:
            async with http.delete(cluster.base(1) + path, headers=headers) as answer:
                assert (answer.status, (await answer.json())["error"]["message"]) == (
                    404,
                    "no such route",
                )
        # Signed now with the cluster's secret: the owner's own answer (no such session).
        async with http.delete(cluster.base(1) + path, headers=signed(now)) as answer:
            assert (answer.status, (await answer.json())["error"]["message"]) == (
                404,
                "no such session",
            )
        async with http.get(f"{cluster.base(1)}/readyz") as ready:
            assert (ready.status, (await ready.json())["node"]) == (200, "n1")
        async with http.get(f"{cluster.base(1)}/metrics") as metrics:
            text = await metrics.text()
        assert "whip_cluster_lease_held 1.0" in text
        assert "whip_cluster_commit_seconds_bucket" in text


async def test_a_reconnect_supersedes_the_old_session_on_another_node_and_patches_carry(
    cluster: Cluster,
) -> None:
    async with aiohttp.ClientSession() as http:
        old_run = (await created(http, f"{cluster.base(0)}/whip/rc", cluster)).run_id
        location = (await created(http, f"{cluster.base(1)}/whip/rc", cluster)).location
        closed = of_type(await events(http, cluster.base(2), old_run), "session_closed")
        assert [c["data"] for c in closed] == [{"reason": "superseded"}]

        # A PATCH of the new session through node 2 is answered as node 1 answers it.
        path = location.removeprefix(cluster.base(1))
        fragment = {"Content-Type": "application/trickle-ice-sdpfrag"}
        answers = []
        for base in (cluster.base(1), cluster.base(2)):
            async with http.patch(
                base + path, data=b"a=end-of-candidates\r\n", headers=fragment
            ) as r:
                answers.append((r.status, await r.read()))
        assert answers[0] == answers[1] and answers[0][0] != 404


async def test_a_killed_nodes_runs_are_interrupted_once_and_it_rejoins(
    cluster: Cluster,
) -> None:
    async with aiohttp.ClientSession() as http:
        runs = []
        for stream in ("cam-a", "cam-b"):
            runs.append((await created(http, f"{cluster.base(1)}/whip/{stream}", cluster)).run_id)
        victim = cluster.nodes["n1"]
        victim.proc.kill()  # SIGKILL, its PID only
        victim.proc.wait(10)

        async def interrupted() -> bool:
            for run_id in runs:
                if not of_type(await events(http, cluster.base(0), run_id), "run_interrupted"):
                    return False
            return True

        # The contract's bound (2 x lease_s) plus the polling slack of a loaded machine.
        await eventually(interrupted, within=2 * LEASE_S + 3, awaiting="run_interrupted")
        await created(http, f"{cluster.base(2)}/whip/cam-a", cluster)

        restarted = cluster.start("n1")
        await ready(restarted)
        async with http.get(f"{cluster.base(0)}/v1/nodes") as nodes:
            assert [n["id"] for n in (await nodes.json())["items"]] == list(NODE_IDS)
        for run_id in runs:
            interrupts = of_type(await events(http, restarted.base, run_id), "run_interrupted")
            assert [i["data"] for i in interrupts] == [{"reason": "node_lost", "node": "n1"}]
