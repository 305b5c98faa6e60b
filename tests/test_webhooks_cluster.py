"""Webhooks in cluster mode: two nodes on one real PostgreSQL, a real receiver that verifies
every signature with the ``standardwebhooks`` package.

Each node here is a ``ClusterTimeline`` (its own pool, lease, group commit, LISTEN) and a
``ClusterWebhookDeliverer`` on its own pool, as a server process holds them. Proved once each:
runs made on both nodes are all delivered by the one node holding the webhook's lease (the
other delivers nothing); killing that node (its lease left to expire, nothing saved) hands
the webhook over: every wanted event delivered, in order per run, duplicates only with the
same ``webhook-id``; a node fenced by its lease's end stops delivering and the webhook is
claimed once more; a 410 disables the webhook durably (a restarted deliverer stays
disabled, another URL re-enables it); and two in-process cluster servers with the webhook
configured deliver through one of them while ``GET /v1/webhooks`` on both names it; a
NOTIFY of new events wakes the deliverer long before its poll; the cursor rows of 60 runs
come back down to the 10 not deleted once the deleted ones are delivered (and an orphan's
goes too), and a restart after that prune sends nothing again and skips nothing; a webhook
no longer configured is forgotten (its cursors with it) only once no live node can deliver
it. Leases are 4 s (a loaded
machine must not fence a node by accident), polls 0.1 s
(the servers': a quarter of the lease).
"""

from __future__ import annotations

import base64
import os
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from registry.events import EventType, NewEvent
from registry.pg.batches import FencedError
from registry.pg.timeline import ClusterTimeline, ClusterTimelineConfig
from registry.pg.webhook_store import DeliveryLeaseLostError, Outcome, RunKey, WebhookStore
from tests.support.eventually import eventually
from tests.support.webhook_receivers import Endpoint, Receivers
from whip.appkeys import CLUSTER_KEY, WEBHOOKS_KEY
from whip.webhooks.cluster_delivery import ClusterWebhookDeliverer
from whip.webhooks.cluster_service import ClusterWebhooks
from whip.webhooks.config import WebhookConfig, parse_webhooks

LEASE_S = 4.0
POLL_S = 0.1
FAST_RETRY = {"retry_min_s": 0.05, "retry_max_s": 0.2}


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


class Node:
    """One node: its cluster timeline and the webhook deliverers it runs."""

    def __init__(self, timeline: ClusterTimeline, pool: asyncpg.Pool) -> None:
        self.timeline = timeline
        self.pool = pool
        self.store = WebhookStore(pool)
        self.deliverers: list[ClusterWebhookDeliverer] = []
        self.dead = False

    async def deliver(self, webhook: WebhookConfig) -> ClusterWebhookDeliverer:
        deliverer = ClusterWebhookDeliverer(
            webhook, self.store, self.timeline.lease.writer, poll_s=POLL_S
        )
        await deliverer.start()
        self.deliverers.append(deliverer)
        return deliverer

    async def kill(self) -> None:
        """What SIGKILL leaves: deliverers stop unsaved, the lease row is left to expire."""
        self.dead = True
        for deliverer in self.deliverers:
            await deliverer.abandon()
        timeline = self.timeline
        await timeline.lease.close(leave=False)
        await timeline.committer.close(drain_s=0)
        await timeline.listener.close()
        timeline._closed = True
        await timeline._pool.close()
        await self.pool.close()

    async def close(self) -> None:
        if self.dead:
            return
        for deliverer in reversed(self.deliverers):
            await deliverer.aclose()
        await self.timeline.aclose()
        await self.pool.close()


class NodeFactory(Protocol):
    def __call__(self, node_id: str, *, deleted_retention: int = ...) -> Awaitable[Node]: ...


@pytest.fixture
async def nodes(cluster_store: str) -> AsyncIterator[NodeFactory]:
    opened: list[Node] = []

    async def open_node(node_id: str, *, deleted_retention: int = 4096) -> Node:
        config = ClusterTimelineConfig(
            cluster_store,
            node_id,
            f"http://127.0.0.1:9/{node_id}",
            LEASE_S,
            deleted_retention=deleted_retention,
        )
        timeline = await ClusterTimeline.open(config)
        pool = await asyncpg.create_pool(cluster_store, min_size=1, max_size=4)
        node = Node(timeline, pool)
        opened.append(node)
        return node

    try:
        yield open_node
    finally:
        for node in reversed(opened):
            await node.close()


@pytest.fixture
async def receivers() -> AsyncIterator[Receivers]:
    receiver = Receivers()
    await receiver.start()
    yield receiver
    await receiver.close()


def webhook(name: str, url: str, secret: str) -> WebhookConfig:
    (config,) = parse_webhooks([{"name": name, "url": url, "secret": secret, **FAST_RETRY}])
    return config


async def push(node: Node, run_id: str, *types: str) -> None:
    for event_type in types:
        data = (
            {"stream": run_id, "session_id": f"s-{run_id}"} if event_type == "run_created" else {}
        )
        await node.timeline.append(NewEvent(run_id, event_type, "studio-a", data))


LIFE = (EventType.RUN_CREATED, EventType.SESSION_CONNECTED, "stats", EventType.FIRST_FRAME)


async def wanted_ids(node: Node, config: WebhookConfig, run_ids: list[str]) -> list[str]:
    ids = []
    for run_id in run_ids:
        for event in await node.timeline.read_events(run_id, 0, 1000):
            if config.wants(event.type, event.principal):
                ids.append(f"{run_id}:{event.seq}")
    return ids


def in_order_per_run(endpoint: Endpoint) -> dict[str, list[int]]:
    per_run: dict[str, list[int]] = defaultdict(list)
    for msg_id in endpoint.first_ids():
        run_id, seq = msg_id.rsplit(":", 1)
        per_run[run_id].append(int(seq))
    return per_run


async def test_one_node_delivers_and_a_dead_one_hands_over(
    nodes: NodeFactory, receivers: Receivers
) -> None:
    a, b = await nodes("a"), await nodes("b")
    await push(a, "before", *LIFE)  # committed before the webhook exists: not delivered
    endpoint = receivers.add("hook", new_secret())
    config = webhook("hook", receivers.url("/ok/hook"), endpoint.secret)
    on_a = await a.deliver(config)
    await eventually(lambda: on_a.delivering, within=20, awaiting="node a takes the lease")
    on_b = await b.deliver(config)

    runs = {"a1": a, "a2": a, "b1": b, "b2": b}
    for run_id, node in runs.items():
        await push(node, run_id, *LIFE)
    expected = await wanted_ids(a, config, list(runs))
    assert len(expected) == 4 * 3
    await eventually(
        lambda: set(endpoint.first_ids()) >= set(expected),
        within=20,
        awaiting=lambda: f"every event of both nodes' runs, got {endpoint.first_ids()}",
    )
    assert not any(i.startswith("before:") for i in endpoint.first_ids())
    # The receiver counts a delivery when it answers; the deliverer once the answer is back.
    await eventually(
        lambda: on_a.outcomes["success"] == len(endpoint.delivered),
        within=20,
        awaiting=lambda: f"{on_a.outcomes} for {len(endpoint.delivered)} received",
    )
    assert sum(on_b.outcomes.values()) == 0
    assert not on_b.delivering

    async def described_on_b() -> dict[str, object] | None:
        item = await on_b.describe()
        return item if item["lag_events"] == 0 else None

    # Every node shows who delivers and how far (the cursor counts the events at or below
    # the per-run cursors: the 'before' run's, where the webhook started, and the 16 since).
    item = await eventually(described_on_b, within=20, awaiting="node b sees the saved cursor")
    assert (item["deliverer"], item["state"], item["cursor"]) == ("a", "standby", 20)
    assert item["pending_runs"] == 0

    # A backlog the receiver refuses (503) while node a retries, then node a dies.
    endpoint.mode = "down"
    await push(a, "a1", EventType.STOP_REQUESTED, EventType.SESSION_CLOSED)
    await push(b, "b1", EventType.STOP_REQUESTED, EventType.SESSION_CLOSED)
    await eventually(lambda: endpoint.refused, within=20, awaiting="node a retrying a refusal")
    await a.kill()
    endpoint.mode = "ok"

    # Node b reaps node a (run_interrupted on a's live runs) and takes the webhook over.
    await eventually(lambda: on_b.delivering, within=20, awaiting="node b takes over")

    async def a2_interrupted() -> bool:
        events = await b.timeline.read_events("a2", 0, 100)
        return any(e.type == EventType.RUN_INTERRUPTED for e in events)

    await eventually(a2_interrupted, within=20, awaiting="node b reaps node a's live run")
    expected = await wanted_ids(b, config, list(runs))
    await eventually(
        lambda: set(endpoint.first_ids()) >= set(expected),
        within=20,
        awaiting=lambda: f"every event after the hand-over, got {endpoint.first_ids()}",
    )
    assert "a2:5" in expected  # a2's run_interrupted, appended by node b after the kill
    delivered = [d for d in endpoint.delivered if not d.msg_id.startswith("before:")]
    assert {d.msg_id for d in delivered} == set(expected)  # none skipped, nothing else
    bodies: dict[str, bytes] = {}
    for d in delivered:  # a duplicate is the same message under the same webhook-id
        assert bodies.setdefault(d.msg_id, d.body) == d.body
    for run_id, seqs in in_order_per_run(endpoint).items():
        assert seqs == sorted(seqs), (run_id, seqs)
    assert (on_b.handovers, on_b.outcomes["success"] > 0) == (1, True)
    item = await on_b.describe()
    assert (item["deliverer"], item["state"], item["disabled"]) == ("b", "delivering", None)


async def test_410_disables_the_webhook_durably(nodes: NodeFactory, receivers: Receivers) -> None:
    node = await nodes("a")
    secret = new_secret()
    gone = webhook("gone", receivers.url("/gone"), secret)
    first = await node.deliver(gone)
    await eventually(lambda: first.delivering, within=20, awaiting="the lease")
    await push(node, "r1", *LIFE)
    await eventually(lambda: first.disabled, within=20, awaiting="the 410")

    async def marked() -> bool:
        row = await node.store.describe("gone")
        return row is not None and row.disabled is not None and not row.owner_node

    await eventually(marked, within=20, awaiting="the mark in the store, the lease given up")
    item = await first.describe()
    assert item["state"] == "disabled"
    assert item["disabled"] == {
        "url": receivers.url("/gone"),
        "at_ms": first.disabled.at_ms,
        "reason": "410 Gone",
    }
    assert receivers.gone_hits == 1
    await first.aclose()

    # A restart (a new deliverer, same url) stays disabled and sends nothing.
    again = await node.deliver(gone)
    await push(node, "r2", *LIFE)
    assert again.disabled is not None and not again.delivering
    assert (await again.describe())["state"] == "disabled"
    await again.aclose()

    # Another url for the name re-enables it, from the cursor where it stopped.
    endpoint = receivers.add("back", secret)
    back = await node.deliver(webhook("gone", receivers.url("/ok/back"), secret))
    assert back.disabled is None
    await eventually(
        lambda: {"r1:1", "r2:1"} <= set(endpoint.first_ids()),
        within=20,
        awaiting=lambda: f"the runs left undelivered, got {endpoint.first_ids()}",
    )
    assert receivers.gone_hits == 1


async def test_two_cluster_servers_one_deliverer_any_node_shows_it(
    cluster_store: str,
    receivers: Receivers,
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    endpoint = receivers.add("app", new_secret())
    entry = {"name": "app", "url": receivers.url("/ok/app"), "secret": endpoint.secret}
    servers = [
        await whip_servers(
            webhooks=[{**entry, **FAST_RETRY}],
            cluster__store=cluster_store,
            cluster__secret="a-test-cluster-secret",
            cluster__node_id=node_id,
            cluster__lease_s=LEASE_S,
        )
        for node_id in ("n0", "n1")
    ]
    for index, server in enumerate(servers):
        created = {"stream": f"cam{index}", "session_id": f"s{index}"}
        await server.app[CLUSTER_KEY].append(
            NewEvent(f"run{index}", EventType.RUN_CREATED, "studio-a", created)
        )

    async def listings() -> list[dict[str, Any]] | None:
        items = []
        async with aiohttp.ClientSession() as http:
            for server in servers:
                async with http.get(server.make_url("/v1/webhooks")) as answer:
                    assert answer.status == 200
                    (item,) = (await answer.json())["items"]
                    items.append(item)
        done = all(item["lag_events"] == 0 and item["deliverer"] for item in items)
        return items if done and len(endpoint.first_ids()) == 2 else None

    items = await eventually(listings, within=20, awaiting="both runs delivered and saved")
    assert sorted(endpoint.first_ids()) == ["run0:1", "run1:1"]
    deliverer = items[0]["deliverer"]
    assert deliverer in ("n0", "n1") and items[1]["deliverer"] == deliverer
    states = [item["state"] for item in items]
    assert sorted(states) == ["delivering", "standby"], states
    assert all(item["cursor"] == 2 and "whsec" not in str(item) for item in items)
    # Each node makes its attempts in its own child process, as an embedded server does.
    made = []
    for server in servers:
        (node_deliverer,) = server.app[WEBHOOKS_KEY]
        assert isinstance(node_deliverer, ClusterWebhookDeliverer)
        sender = node_deliverer.sender
        assert sender is not None and sender.pid not in (None, os.getpid())
        made.append(sender.attempts)
        assert sender.attempts == node_deliverer.outcomes["success"]
    assert sorted(made) == [0, 2], made  # the delivering node's child made both


async def test_a_fenced_node_stops_delivering_and_the_webhook_moves_on(
    cluster_store: str, nodes: NodeFactory, receivers: Receivers
) -> None:
    a, b = await nodes("a"), await nodes("b")
    endpoint = receivers.add("fence", new_secret())
    config = webhook("fence", receivers.url("/ok/fence"), endpoint.secret)
    on_a = await a.deliver(config)
    await eventually(lambda: on_a.delivering, within=20, awaiting="node a takes the lease")
    on_b = await b.deliver(config)
    await push(b, "r1", EventType.RUN_CREATED)
    await eventually(lambda: endpoint.first_ids() == ["r1:1"], within=20, awaiting="r1 via a")

    async def saved() -> bool:
        return (await on_b.describe())["lag_events"] == 0

    await eventually(saved, within=20, awaiting="r1's cursor saved")  # no duplicate is due

    # Node a's lease ends in the store (as after a pause past it): node b reaps it, node a's
    # renewal finds it gone and fences; its deliverer stops under the old epoch.
    conn = await asyncpg.connect(cluster_store)
    try:
        await conn.execute(
            "UPDATE whip_nodes SET lease_expires_at = clock_timestamp() - interval '1 second'"
            " WHERE node_id = 'a'"
        )
    finally:
        await conn.close()
    await eventually(lambda: a.timeline.lease.fenced_count, within=20, awaiting="a fences")
    assert not on_a.delivering or on_a.handovers == 2  # stopped, or claimed again anew

    # Whoever claims the webhook next (b, or a under its new epoch), it is claimed once,
    # and what comes after is delivered once: the fenced epoch sends nothing more.
    await eventually(
        lambda: on_a.handovers + on_b.handovers == 2, within=20, awaiting="the next claim"
    )
    await push(b, "r2", EventType.RUN_CREATED)
    await eventually(
        lambda: sorted(endpoint.first_ids()) == ["r1:1", "r2:1"],
        within=20,
        awaiting=lambda: f"r2 after the fence, got {endpoint.first_ids()}",
    )
    item = await eventually(lambda: on_b.describe(), within=20, awaiting="the saved cursor")
    assert [d.msg_id for d in endpoint.delivered] == ["r1:1", "r2:1"]
    assert item["delivery_epoch"] == 2 and item["deliverer"] in ("a", "b")
    assert [on_a.delivering, on_b.delivering].count(True) == 1


async def test_a_notify_wakes_the_deliverer_long_before_its_poll(
    cluster_store: str, nodes: NodeFactory, receivers: Receivers
) -> None:
    node = await nodes("a")
    endpoint = receivers.add("wake", new_secret())
    group = ClusterWebhooks(cluster_store, node.timeline.lease.writer, poll_s=600)
    await group.start(parse_webhooks([{"name": "wake", "url": receivers.url("/ok/wake"),
                                       "secret": endpoint.secret}]))  # fmt: skip
    try:
        (deliverer,) = group.deliverers
        # claimed at its first tick, then it waits up to 600 s
        await eventually(lambda: deliverer.delivering, within=20, awaiting="the lease")
        await push(node, "r1", EventType.RUN_CREATED)
        await eventually(
            lambda: endpoint.first_ids() == ["r1:1"], within=20, awaiting="a wake-up by NOTIFY"
        )
    finally:
        await group.aclose()


async def cursor_rows(store: WebhookStore, name: str) -> int:
    return (await store.row_counts()).get(name, 0)


async def test_cursor_rows_of_deleted_delivered_runs_are_pruned_and_a_restart_sends_nothing(
    cluster_store: str, nodes: NodeFactory, receivers: Receivers
) -> None:
    node = await nodes("a")
    endpoint = receivers.add("prune", new_secret())
    config = webhook("prune", receivers.url("/ok/prune"), endpoint.secret)
    first = await node.deliver(config)
    first.prune_s = 0.0  # prune at every tick
    await eventually(lambda: first.delivering, within=20, awaiting="the lease")

    # 60 runs made, then 50 of them deleted (run_deleted is wanted: it is delivered first).
    runs = [f"r{i:02d}" for i in range(60)]
    for run_id in runs:
        await push(node, run_id, EventType.RUN_CREATED, "stats")
    await eventually(
        lambda: len(endpoint.first_ids()) == 60, within=30, awaiting="every run_created"
    )

    async def saved(count: int) -> bool:
        return await cursor_rows(node.store, "prune") >= count

    await eventually(lambda: saved(60), within=20, awaiting="a cursor row per run")
    deleted = runs[:50]
    for run_id in deleted:
        await node.timeline.delete_run(run_id, "studio-a")
    expected = await wanted_ids(node, config, runs)
    assert len(expected) == 60 + 50

    async def pruned() -> int | None:
        rows = await cursor_rows(node.store, "prune")
        return rows if rows == 10 and set(endpoint.first_ids()) == set(expected) else None

    # The row count comes back down to the runs that are not deleted.
    await eventually(
        pruned,
        within=30,
        awaiting=lambda: f"the deleted runs' rows pruned, {endpoint.first_ids()[-3:]}",
    )
    assert first.pruned >= 50
    conn = await asyncpg.connect(cluster_store)
    try:
        folded = await conn.fetchval("SELECT count(*) FROM whip_runs WHERE webhook_done ? 'prune'")
        # A row of a run that is no longer in the store (retention evicted it) goes too.
        await conn.execute(
            "INSERT INTO whip_webhook_cursors (webhook, run_id, done_seq)"
            " VALUES ('prune', 'gone', 7)"
        )
    finally:
        await conn.close()
    assert folded == 50

    async def orphan_gone() -> bool:
        return await cursor_rows(node.store, "prune") == 10

    await eventually(orphan_gone, within=20, awaiting="the orphan row pruned")
    await first.aclose()
    assert {d.msg_id for d in endpoint.delivered} == set(expected)

    # A restart after the prune sends nothing again, and skips nothing: new events of a
    # live run, of a new run, and a late one of a pruned deleted run are all delivered.
    delivered_before = len(endpoint.delivered)
    again = await node.deliver(config)
    await eventually(lambda: again.delivering, within=20, awaiting="the lease again")
    await push(node, "r55", EventType.STOP_REQUESTED)
    await push(node, "fresh", EventType.RUN_CREATED)
    await push(node, "r03", EventType.SESSION_CLOSED)  # after its run_deleted, after a prune
    new = {"r55:3", "fresh:1", "r03:4"}
    await eventually(
        lambda: set(endpoint.first_ids()) >= new,
        within=20,
        awaiting=lambda: f"the three new events, got {endpoint.first_ids()[delivered_before:]}",
    )
    assert sorted(d.msg_id for d in endpoint.delivered[delivered_before:]) == sorted(new)


async def test_a_webhook_no_longer_configured_is_forgotten_unless_a_live_node_delivers_it(
    cluster_store: str, nodes: NodeFactory, receivers: Receivers
) -> None:
    a, b = await nodes("a"), await nodes("b")
    endpoint = receivers.add("kept", new_secret())
    kept = webhook("kept", receivers.url("/ok/kept"), endpoint.secret)
    old = webhook("old", receivers.url("/ok/kept"), endpoint.secret)
    await push(a, "r1", EventType.RUN_CREATED)
    on_a = await a.deliver(old)  # registered with a cursor row for r1
    await eventually(lambda: on_a.delivering, within=20, awaiting="a delivers 'old'")
    assert await cursor_rows(a.store, "old") == 1

    # Node b starts without 'old' while node a delivers it, or while node a's lease (which
    # its delivery lease rides on) lives after its deliverer stopped: nothing is forgotten.
    lease = on_a.lease
    assert lease is not None
    assert await b.store.forget(["kept"]) == []
    await on_a.abandon()
    assert await b.store.forget(["kept"]) == []
    assert await b.store.describe("old") is not None

    # Node a's lease ends (as after a SIGKILL): node b forgets 'old', its cursors with it,
    # and node a's old delivery lease can write nothing more.
    conn = await asyncpg.connect(cluster_store)
    try:
        await conn.execute(
            "UPDATE whip_nodes SET lease_expires_at = clock_timestamp() - interval '1 second'"
            " WHERE node_id = 'a'"
        )
    finally:
        await conn.close()
    assert await b.store.forget(["kept"]) == ["old"]
    assert await b.store.describe("old") is None
    assert await cursor_rows(b.store, "old") == 0
    with pytest.raises((DeliveryLeaseLostError, FencedError)):
        await b.store.save("old", lease, {RunKey("r1", 1): 1}, Outcome(204, None, 1, 1))
    assert await cursor_rows(b.store, "old") == 0

    # The configured one is kept and delivered.
    on_b = await b.deliver(kept)
    assert await b.store.forget(["kept"]) == []
    await eventually(lambda: on_b.delivering, within=20, awaiting="b delivers 'kept'")


async def test_a_run_id_made_again_after_retention_evicted_it_is_delivered_under_its_own_id(
    cluster_store: str, nodes: NodeFactory, receivers: Receivers
) -> None:
    """Retention evicts a deleted run whose cursor row is not pruned yet; a DELETE of the same
    id makes a new run whose ``run_deleted`` is seq 1 again. The old row must not mark it
    done (it was never sent before incarnations), and its ``webhook-id`` must not be the
    first run's ``x:1``."""
    node = await nodes("a", deleted_retention=1)
    endpoint = receivers.add("again", new_secret())
    config = webhook("again", receivers.url("/ok/again"), endpoint.secret)
    deliverer = await node.deliver(config)
    await eventually(lambda: deliverer.delivering, within=20, awaiting="the lease")
    deliverer.prune_s = 3600.0  # the cursor row of the first "x" stays: what a prune leaves

    await push(node, "x", EventType.RUN_CREATED, EventType.SESSION_CLOSED)  # ended: evictable
    await node.timeline.delete_run("x", "studio-a")
    await eventually(
        lambda: endpoint.first_ids() == ["x:1", "x:2", "x:3"],
        within=20,
        awaiting="x's three events",
    )

    conn = await asyncpg.connect(cluster_store)

    async def first_x_row() -> tuple[int, int] | None:
        row = await conn.fetchrow(
            "SELECT done_seq, incarnation FROM whip_webhook_cursors"
            " WHERE webhook = 'again' AND run_id = 'x'"
        )
        return None if row is None else (int(row["done_seq"]), int(row["incarnation"]))

    try:
        await eventually(first_x_row, within=20, awaiting="x's cursor row saved")
        saved = await first_x_row()
        assert saved is not None and saved[0] == 3
        first_incarnation = saved[1]
        # Two later deletions: retention (keep 1) evicts "x", its row and events.
        for run_id in ("y", "z"):
            await node.timeline.delete_run(run_id, "studio-a")

        async def x_evicted() -> bool:
            return await conn.fetchval("SELECT count(*) FROM whip_runs WHERE run_id = 'x'") == 0

        await eventually(x_evicted, within=20, awaiting="retention to evict x")
        assert await first_x_row() == (3, first_incarnation)  # left over, not yet pruned

        await node.timeline.delete_run("x", "studio-a")
        incarnation = await conn.fetchval("SELECT incarnation FROM whip_runs WHERE run_id = 'x'")
        assert incarnation > first_incarnation
        new_id = f"x:1.{incarnation}"
        await eventually(
            lambda: new_id in endpoint.first_ids(),
            within=20,
            awaiting=lambda: f"the new x's run_deleted, got {endpoint.first_ids()}",
        )
        (again,) = [d for d in endpoint.delivered if d.msg_id == new_id]
        assert again.payload["type"] == "run_deleted" and again.payload["data"]["seq"] == 1

        async def new_row_saved() -> bool:
            return await first_x_row() == (1, incarnation)

        await eventually(new_row_saved, within=20, awaiting="the new x's cursor row")
        # A late save for the evicted incarnation (a run task that read before the
        # eviction) changes nothing: the row belongs to the newer run.
        lease = deliverer.lease
        assert lease is not None
        await node.store.save(
            "again", lease, {RunKey("x", first_incarnation): 9}, Outcome(204, None, 1, 1)
        )
        assert await first_x_row() == (1, incarnation)
    finally:
        await conn.close()
    await deliverer.aclose()
    # Every id once: "y" and "z" were made by DELETE too, and retention kept each of them
    # until its run_deleted was delivered.
    ids = [d.msg_id for d in endpoint.delivered]
    assert len(ids) == len(set(ids)) == 6
    assert [i for i in ids if i.startswith("x:")] == ["x:1", "x:2", "x:3", new_id]
    assert sorted(i.split(".")[0] for i in ids if not i.startswith("x:")) == ["y:1", "z:1"]


async def test_retention_keeps_deleted_runs_until_every_webhook_not_disabled_has_them(
    cluster_store: str, nodes: NodeFactory, receivers: Receivers
) -> None:
    """Eviction deletes a run's events: a deleted run a webhook has not delivered stays
    past the retention bound until it has; a webhook disabled by a 410 holds nothing."""
    node = await nodes("a", deleted_retention=2)
    slow = receivers.add("slow", new_secret(), mode="down")
    slow_config = webhook("slow", receivers.url("/ok/slow"), slow.secret)
    dead_config = webhook("dead", receivers.url("/gone"), new_secret())
    on_slow = await node.deliver(slow_config)
    on_dead = await node.deliver(dead_config)
    await eventually(
        lambda: on_slow.delivering and on_dead.delivering, within=20, awaiting="both leases"
    )
    runs = [f"d{i}" for i in range(6)]
    for run_id in runs:
        await push(node, run_id, EventType.RUN_CREATED, EventType.SESSION_CLOSED)
        await node.timeline.delete_run(run_id, "studio-a")
    await eventually(lambda: on_dead.disabled is not None, within=20, awaiting="the 410")
    await eventually(lambda: slow.requests >= 3, within=20, awaiting="refused attempts")

    conn = await asyncpg.connect(cluster_store)
    try:

        async def deleted_rows() -> int:
            return int(
                await conn.fetchval("SELECT count(*) FROM whip_runs WHERE deleted_seq IS NOT NULL")
            )

        # The receiver is down: every deleted run is held, four past the bound.
        assert await node.timeline.retention.sweep() == []
        assert await deleted_rows() == 6

        slow.mode = "ok"
        expected = {f"{run_id}:{seq}" for run_id in runs for seq in (1, 2, 3)}
        await eventually(
            lambda: set(slow.first_ids()) == expected,
            within=30,
            awaiting=lambda: f"every event, got {len(slow.first_ids())}",
        )

        async def evicted_to_the_bound() -> bool:
            await node.timeline.retention.sweep()
            return await deleted_rows() == 2

        # Once the saved cursors show them delivered, a sweep evicts down to the bound; the
        # disabled webhook, which delivered nothing, does not hold them.
        await eventually(evicted_to_the_bound, within=20, awaiting="eviction to 2 runs")
    finally:
        await conn.close()
