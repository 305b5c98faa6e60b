"""A webhook's hand-over after a real SIGKILL: two ``python -m whip serve`` node processes
on one real PostgreSQL (tests/support/cluster_nodes.py: PIDs recorded, only they are
signalled), one webhook configured on both (a TOML file through ``WHIP_INGEST_CONFIG``),
one receiver that verifies every signature with the ``standardwebhooks`` package.

Proved once: the delivering node has a backlog (the receiver took a few of its events,
then refused the rest while that node retried), it is SIGKILLed, and the other node takes
the webhook once the dead node's lease expired and delivers every wanted event of every
run (the backlog, and the ``run_interrupted`` it appends when it reaps the dead node's
live runs), in order per run; a duplicate only ever comes with the same ``webhook-id`` and
the same body. The hand-over time (SIGKILL to the survivor's first delivery) is printed,
not asserted: what is left of the dead node's lease (renewed every ``lease_s / 3``, 4 s
here) plus up to one poll (1 s).
"""

from __future__ import annotations

import base64
import os
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.support.publisher import AiortcPublisher
from tests.support.cluster_nodes import LEASE_S, Cluster, created, events, of_type, ready
from tests.support.eventually import eventually
from tests.support.postgres import PostgresServer
from tests.support.webhook_receivers import Endpoint, Receivers
from whip.webhooks.config import parse_webhooks

NODES = ("k0", "k1")
BACKLOG_RUNS = 8
"""Runs created and deleted on the delivering node while the receiver refuses."""


@pytest.fixture
async def receivers() -> AsyncIterator[Receivers]:
    receiver = Receivers()
    await receiver.start()
    yield receiver
    await receiver.close()


async def deliverer(http: aiohttp.ClientSession, base: str) -> str | None:
    async with http.get(f"{base}/v1/webhooks") as answer:
        assert answer.status == 200, await answer.text()
        (item,) = (await answer.json())["items"]
        owner: str | None = item["deliverer"]
        return owner


def first_seqs_per_run(endpoint: Endpoint) -> dict[str, list[int]]:
    per_run: dict[str, list[int]] = defaultdict(list)
    for msg_id in endpoint.first_ids():
        run_id, seq = msg_id.rsplit(":", 1)
        per_run[run_id].append(int(seq))
    return per_run


async def test_a_sigkilled_deliverer_hands_its_backlog_to_the_survivor(
    postgres: PostgresServer, tmp_path: Path, receivers: Receivers
) -> None:
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    endpoint = receivers.add("kill", secret, accept_first=10**9)  # well until told
    entry: dict[str, Any] = {
        "name": "kill",
        "url": receivers.url("/flaky/kill"),
        "secret": secret,
        "retry_min_s": 0.05,
        "retry_max_s": 0.2,
    }
    (webhook,) = parse_webhooks([entry])
    config = tmp_path / "webhooks.toml"
    config.write_text(
        "[[webhooks]]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in entry.items())
    )
    root = tmp_path / "nodes"
    root.mkdir()
    cluster = Cluster(postgres.create_database(), root, {}, "", {"WHIP_INGEST_CONFIG": str(config)})
    try:
        for node_id in NODES:
            cluster.start(node_id)
        for node_id in NODES:
            await ready(cluster.nodes[node_id])
        publisher = AiortcPublisher()
        try:
            cluster.offer = await publisher.offer(audio=False)
        finally:
            await publisher.close()

        async with aiohttp.ClientSession() as http:
            bases = {node_id: cluster.nodes[node_id].base for node_id in NODES}
            owner = await eventually(
                lambda: deliverer(http, bases["k0"]), within=30, awaiting="a node delivers"
            )
            assert owner in NODES
            survivor = next(n for n in NODES if n != owner)
            victim = cluster.nodes[owner]

            # Two live runs on the delivering node, delivered while the receiver is well.
            live = [(await created(http, f"{victim.base}/whip", cluster)).run_id for _ in "ab"]
            await eventually(
                lambda: {f"{r}:1" for r in live} <= set(endpoint.first_ids()),
                within=30,
                awaiting="the live runs' run_created",
            )

            # The backlog: runs made and deleted on that node; the receiver takes a few more
            # (their cursor may or may not be saved when the node dies), then refuses.
            endpoint.accept_first, endpoint.refuse = len(endpoint.delivered) + 5, 10**9
            backlog = []
            for _ in range(BACKLOG_RUNS):
                run_id = (await created(http, f"{victim.base}/whip", cluster)).run_id
                async with http.delete(f"{victim.base}/v1/runs/{run_id}") as gone:
                    assert gone.status == 200, await gone.text()
                backlog.append(run_id)

            async def closed() -> bool:
                items = await events(http, victim.base, backlog[-1])
                return bool(of_type(items, "session_closed"))

            await eventually(closed, within=30, awaiting="the last backlog run closed")
            await eventually(
                lambda: len(endpoint.refused) >= 3, within=30, awaiting="retries of a refusal"
            )
            received_before = len(endpoint.delivered)
            victim.proc.kill()  # SIGKILL, its recorded PID only
            victim.proc.wait(10)
            killed_at = time.monotonic()
            endpoint.refuse = 0  # well again

            # The survivor reaps the dead node's live runs, then every wanted event of every
            # run is delivered.
            async def interrupted() -> bool:
                for run_id in live:
                    if not of_type(await events(http, bases[survivor], run_id), "run_interrupted"):
                        return False
                return True

            await eventually(interrupted, within=4 * LEASE_S, awaiting="the reaped runs")
            expected = set()
            for run_id in live + backlog:
                for item in await events(http, bases[survivor], run_id):
                    if webhook.wants(str(item["type"]), str(item["principal"])):
                        expected.add(f"{run_id}:{item['seq']}")
            assert len(expected) >= 2 * 2 + BACKLOG_RUNS * 2
            await eventually(
                lambda: set(endpoint.first_ids()) >= expected,
                within=30,
                awaiting=lambda: (
                    f"every event, missing {expected - set(endpoint.first_ids())}"
                    f"\n{cluster.problems()}"
                ),
            )
            assert await deliverer(http, bases[survivor]) == survivor

        delivered = endpoint.delivered
        assert {d.msg_id for d in delivered} == expected  # none skipped, nothing else
        bodies: dict[str, bytes] = {}
        for d in delivered:  # a duplicate is the same message under the same webhook-id
            assert bodies.setdefault(d.msg_id, d.body) == d.body
        for run_id, seqs in first_seqs_per_run(endpoint).items():
            assert seqs == sorted(seqs), (run_id, seqs)
        after_kill = delivered[received_before:]
        assert after_kill and all(d.received_at > killed_at for d in after_kill)
        handover_s = after_kill[0].received_at - killed_at
        duplicates = len(delivered) - len(expected)
        print(
            f"\nwebhook hand-over after SIGKILL: {handover_s:.2f} s to the survivor's first "
            f"delivery (lease {LEASE_S} s), {len(after_kill)} delivered after the kill, "
            f"{duplicates} duplicates"
        )
    finally:
        for proc in cluster.nodes.values():
            proc.shutdown()
