"""The cluster store (registry/pg/) on a real PostgreSQL, with several nodes in one process.

Each ``ClusterTimeline`` here is one node: its own pool, lease, group commit and LISTEN
connection, exactly as a node process holds them; the store is shared. What the issue's
"What must hold" asks of the store itself is proved once each: exact stream slots across
nodes, single-winner deletion across nodes, the cursor property under concurrent writers
and pollers on every node, leases (reaping, restart, fencing of a late writer), a store
outage, a batch whose COMMIT answer was lost (a proxy on loopback that cuts the connection
after the server committed, tests/support/pg_commit_cutter.py: every append confirmed and
stored once), deleted-run retention (the oldest deleted runs evicted, active ones pinned,
one sweep at a time), run expiry derived at read time (a silent run reads ``expired`` and
holds no slot; its next event revives it), an event the store refuses, and a node process
refusing a newer schema (exit 2). Leases are 2 s (the outage test: 8 s for the node that
must ride it out).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from bench.support.server_process import free_port
from registry.errors import AppendFailedError, UnknownRunError
from registry.events import Event, EventType, NewEvent, now_ms
from registry.pg.batches import FencedError
from registry.pg.schema import MIGRATIONS, SchemaTooNewError, migrate
from registry.pg.timeline import ClusterTimeline, ClusterTimelineConfig
from registry.pg.webhook_store import RunKey, WebhookStore
from registry.runs import DEFAULT_DELETED_RETENTION, ClaimKind
from tests.support.eventually import eventually
from tests.support.pg_commit_cutter import CommitCutter, proxied_url
from tests.support.postgres import PostgresServer
from tests.support.servers import serve_argv

LEASE_S = 2.0

NodeFactory = Callable[..., Awaitable[ClusterTimeline]]


@pytest.fixture
async def nodes(cluster_store: str) -> AsyncIterator[NodeFactory]:
    """``await nodes(node_id, lease_s=...)``: a node on the test's database; every node
    still open is closed (leaving the cluster) at teardown."""
    opened: list[ClusterTimeline] = []

    async def open_node(
        node_id: str,
        lease_s: float = LEASE_S,
        store: str = cluster_store,
        deleted_retention: int = DEFAULT_DELETED_RETENTION,
        stream_ttl_s: float = 0.0,
    ) -> ClusterTimeline:
        url = f"http://127.0.0.1:9/{node_id}"
        config = ClusterTimelineConfig(
            store,
            node_id,
            url,
            lease_s,
            deleted_retention=deleted_retention,
            stream_ttl_s=stream_ttl_s,
        )
        node = await ClusterTimeline.open(config)
        opened.append(node)
        return node

    try:
        yield open_node
    finally:
        for node in reversed(opened):
            await node.aclose()


async def kill(node: ClusterTimeline) -> None:
    """What SIGKILL leaves behind: a lease row nobody renews, connections dropped."""
    await node.lease.close(leave=False)
    await node.committer.close(drain_s=0)
    await node.listener.close()
    node._closed = True
    await node._pool.close()


async def start_run(node: ClusterTimeline, run_id: str, principal: str = "studio-a") -> None:
    created = {"stream": run_id, "session_id": f"s-{run_id}"}
    await node.append(NewEvent(run_id, EventType.RUN_CREATED, principal, created))
    await node.append(NewEvent(run_id, EventType.SESSION_CONNECTED, principal))


async def all_events(node: ClusterTimeline, run_id: str) -> list[Event]:
    return await node.read_events(run_id, 0, 1000)


async def test_schema_is_created_once_migrates_forward_and_refuses_a_newer_one(
    cluster_store: str, nodes: NodeFactory
) -> None:
    conns = [await asyncpg.connect(cluster_store) for _ in range(3)]
    try:
        assert await asyncio.gather(*(migrate(c) for c in conns)) == [len(MIGRATIONS)] * 3
        newer = (*MIGRATIONS, "CREATE TABLE whip_later (x integer)")
        assert await migrate(conns[0], newer) == len(MIGRATIONS) + 1
        with pytest.raises(SchemaTooNewError, match="upgrade this node"):
            await migrate(conns[1])
        with pytest.raises(SchemaTooNewError):
            await nodes("a")
        version = await conns[2].fetchval("SELECT version FROM whip_schema_version")
        assert version == len(MIGRATIONS) + 1
    finally:
        for conn in conns:
            await conn.close()


async def test_version_5_gives_every_run_row_its_own_incarnation_and_each_cursor_its_runs(
    cluster_store: str,
) -> None:
    """A store at version 4 with runs and webhook cursors, migrated to 5: every run row gets
    an incarnation no other row has, every cursor row its run row's (so no cursor stops
    counting, and nothing is sent again), and a cursor row whose run is gone gets 0; a row
    written without the column (a node still on version 4) counts for its run."""
    conn = await asyncpg.connect(cluster_store)
    try:
        assert await migrate(conn, MIGRATIONS[:4]) == 4
        await conn.execute(
            "INSERT INTO whip_runs (run_id, principal, created_ms, last_activity_ms, last_seq)"
            " SELECT 'r' || i, 'p', i, i, 3 FROM generate_series(1, 50) AS i"
        )
        await conn.execute("INSERT INTO whip_webhooks (name, url, created_ms) VALUES ('w', 'u', 1)")
        await conn.execute(
            "INSERT INTO whip_webhook_cursors (webhook, run_id, done_seq)"
            " SELECT 'w', 'r' || i, 2 FROM generate_series(1, 50) AS i"
            " UNION ALL SELECT 'w', 'evicted', 7"
        )
        assert await migrate(conn) == len(MIGRATIONS)
        runs = await conn.fetch("SELECT run_id, incarnation FROM whip_runs")
        incarnations = {row["run_id"]: row["incarnation"] for row in runs}
        assert len(set(incarnations.values())) == 50 and min(incarnations.values()) > 0
        cursors = await conn.fetch("SELECT run_id, done_seq, incarnation FROM whip_webhook_cursors")
        assert {row["run_id"]: (row["done_seq"], row["incarnation"]) for row in cursors} == {
            **{run_id: (2, incarnation) for run_id, incarnation in incarnations.items()},
            "evicted": (7, 0),
        }
        # A row made after the migration takes the next number.
        await conn.execute(
            "INSERT INTO whip_runs (run_id, principal, created_ms, last_activity_ms, last_seq)"
            " VALUES ('later', 'p', 1, 1, 3), ('lagging', 'p', 1, 1, 3)"
        )
        later = await conn.fetchval("SELECT incarnation FROM whip_runs WHERE run_id = 'later'")
        assert later > max(incarnations.values())
        # A node still on version 4 (a rolling upgrade) writes cursor rows without the
        # column: they count for their runs, as before (no history sent again).
        await conn.execute(
            "INSERT INTO whip_webhook_cursors (webhook, run_id, done_seq)"
            " VALUES ('w', 'later', 3), ('w', 'lagging', 1)"
        )
        pool = await asyncpg.create_pool(cluster_store, min_size=1, max_size=1)
        try:
            behind = await WebhookStore(pool).behind("w", 100)
        finally:
            await pool.close()
        lagging = await conn.fetchval("SELECT incarnation FROM whip_runs WHERE run_id = 'lagging'")
        new_runs = {key: done for key, done in behind.items() if key.run_id in ("later", "lagging")}
        assert new_runs == {RunKey("lagging", lagging): 1}
    finally:
        await conn.close()


async def test_stream_slots_are_exact_across_nodes(nodes: NodeFactory) -> None:
    cluster = [await nodes(name) for name in ("a", "b", "c")]
    answers = await asyncio.gather(
        *(cluster[i % 3].reserve_slot("studio-a", 4) for i in range(300))
    )
    granted = [r for r in answers if r is not None]
    assert len(granted) == 4
    assert await cluster[1].slots_in_use("studio-a") == (0, 4)

    # Two reservations become runs: counted once each after their release.
    for index, reservation in enumerate(granted[:2]):
        await start_run(cluster[index], f"run-{index}")
        await cluster[index].release_slot(reservation)
    assert await cluster[2].slots_in_use("studio-a") == (2, 2)
    assert await cluster[2].reserve_slot("studio-a", 4) is None
    assert await cluster[2].reserve_slot("studio-b", 4) is not None

    for reservation in granted[2:]:
        await cluster[2].release_slot(reservation)
    for index in range(2):
        await cluster[0].delete_run(f"run-{index}", "operator")
    assert await cluster[0].slots_in_use("studio-a") == (0, 0)


async def test_one_run_deleted_however_many_nodes_delete(nodes: NodeFactory) -> None:
    cluster = [await nodes(name) for name in ("a", "b", "c")]
    await start_run(cluster[0], "run-d")
    results = await asyncio.gather(
        *(cluster[i % 3].delete_run("run-d", "operator", {"by": "op"}) for i in range(500))
    )
    outcomes = Counter(result.outcome for result in results)
    assert outcomes == {ClaimKind.CLAIMED: 1, ClaimKind.ALREADY_DELETED: 499}
    assert {result.event.seq for result in results} == {3}
    types = [event.type for event in await all_events(cluster[2], "run-d")]
    assert types == ["run_created", "session_connected", "run_deleted"]
    run = await cluster[1].get_run("run-d")
    assert run is not None and run.to_json()["state"] == "deleted"
    assert run.to_json()["node"] == "a" and run.node_id == "a"
    # A delete of a run never seen appends too (single winner as well).
    never = await asyncio.gather(*(cluster[i].delete_run("run-never", "op") for i in range(3)))
    assert sorted(r.outcome for r in never) == sorted(
        [ClaimKind.MISSING, ClaimKind.ALREADY_DELETED, ClaimKind.ALREADY_DELETED]
    )


async def test_deleted_runs_past_retention_are_evicted_once_cluster_wide(
    nodes: NodeFactory,
) -> None:
    keep = 4
    a, b = await nodes("a", deleted_retention=keep), await nodes("b", deleted_retention=keep)
    runs = [f"ret-{i:02d}" for i in range(10)]
    for run_id in runs:
        await start_run(a, run_id)
    # ret-00 is deleted first but stays live (its session still closing): pinned.
    await b.delete_run(runs[0], "operator")
    for index, run_id in enumerate(runs[1:8], start=1):
        await a.append(NewEvent(run_id, EventType.SESSION_CLOSED, "studio-a", {"reason": "x"}))
        await (a, b)[index % 2].delete_run(run_id, "operator")

    async def retained() -> list[str] | None:
        left = [r for r in runs if await a.get_run(r) is not None]
        return left if len(left) == 1 + keep + 2 else None

    # Kept: the pinned one, the newest `keep` deletions, the two runs never deleted.
    assert await eventually(retained, within=10, awaiting="the sweep") == [
        runs[0], *runs[8 - keep : 8], *runs[8:],
    ]  # fmt: skip
    with pytest.raises(UnknownRunError):
        await b.read_events(runs[1])
    assert a.retention.evicted + b.retention.evicted == 7 - keep

    # Once the pinned run ends, the next sweep takes it; two nodes sweeping at once
    # evict it once between them.
    await a.append(NewEvent(runs[0], EventType.SESSION_CLOSED, "studio-a", {"reason": "x"}))
    swept = await asyncio.gather(a.retention.sweep(), b.retention.sweep())
    assert sorted(swept[0] + swept[1]) == [runs[0]]
    assert await a.get_run(runs[0]) is None
    # A DELETE of an evicted run is one for a run never seen.
    assert (await a.delete_run(runs[1], "operator")).outcome == ClaimKind.MISSING


async def test_a_silent_run_reads_expired_holds_no_slot_and_an_event_revives_it(
    nodes: NodeFactory,
) -> None:
    node = await nodes("ttl", stream_ttl_s=5.0)
    silent_since = now_ms() - 10_000
    created = {"stream": "quiet", "session_id": "s-quiet"}
    await node.append(
        NewEvent("quiet", EventType.RUN_CREATED, "studio-t", created, ts_ms=silent_since)
    )
    await node.append(
        NewEvent("quiet", EventType.SESSION_CONNECTED, "studio-t", ts_ms=silent_since)
    )
    view = await node.get_run("quiet")
    assert view is not None and view.state == "expired"
    assert [r.run_id for r in (await node.runs_page(10, state="expired")).runs] == ["quiet"]
    assert await node.slots_in_use("studio-t") == (0, 0)
    reservation = await node.reserve_slot("studio-t", 1)
    assert reservation is not None, "an expired run holds no stream slot"
    await node.release_slot(reservation)

    await node.append(NewEvent("quiet", EventType.STATS, "studio-t", {"fps": 30}))
    view = await node.get_run("quiet")
    assert view is not None and view.state == "live"
    assert (await node.runs_page(10, state="expired")).runs == []
    assert await node.reserve_slot("studio-t", 1) is None


async def test_every_poller_on_every_node_sees_every_event_once_in_order(
    nodes: NodeFactory,
) -> None:
    cluster = [await nodes(name) for name in ("a", "b", "c")]
    runs = ["run-x", "run-y", "run-z"]
    per_writer = 40
    for run_id in runs:
        await cluster[0].append(NewEvent(run_id, EventType.RUN_CREATED, "studio-a"))
    total = 1 + 2 * per_writer * len(cluster)

    async def poll(node: ClusterTimeline, run_id: str) -> list[Event]:
        seen: list[Event] = []
        while len(seen) < total:
            cursor = seen[-1].seq if seen else 0
            seen.extend(await node.wait_for_events(run_id, cursor, 7, 10.0))
        return seen

    async def write(node: ClusterTimeline, run_id: str) -> None:
        for i in range(per_writer):
            await node.append(NewEvent(run_id, "stats", "studio-a", {"w": node.identity.node_id}))
            # The analyzers' flavour from a worker thread, interleaved with the awaited one.
            future = await asyncio.to_thread(
                node.append_nowait, NewEvent(run_id, "scene_change", "studio-a", {"i": i})
            )
            await asyncio.wrap_future(future)

    pollers = [asyncio.create_task(poll(n, r)) for n in cluster for r in runs]
    await asyncio.gather(*(write(n, r) for n in cluster for r in runs))
    seen_by_poller = await asyncio.gather(*pollers)
    for seen in seen_by_poller:
        assert [event.seq for event in seen] == list(range(1, total + 1))
    for run_index, run_id in enumerate(runs):
        stored = await all_events(cluster[1], run_id)
        for poller in range(len(cluster)):
            assert seen_by_poller[poller * len(runs) + run_index] == stored
        writers = Counter(e.data["w"] for e in stored if e.type == "stats")
        assert writers == {"a": per_writer, "b": per_writer, "c": per_writer}


async def test_a_dead_nodes_runs_are_interrupted_once_and_its_restart_adds_nothing(
    nodes: NodeFactory,
) -> None:
    a, b, c = [await nodes(name) for name in ("a", "b", "c")]
    runs = ["run-1", "run-2", "run-3"]
    for run_id in runs:
        await start_run(a, run_id)
    reservation = await a.reserve_slot("studio-a", 10)
    assert reservation is not None
    await kill(a)

    def interrupted_count() -> int:
        return b.lease.reaped_runs + c.lease.reaped_runs

    await eventually(
        lambda: interrupted_count() == len(runs),
        within=2 * LEASE_S + 5,
        awaiting=lambda: f"the survivors to interrupt {runs} ({interrupted_count()} so far)",
    )
    # Two more renewal ticks of each survivor: nobody interrupts a second time.
    marks = (b.lease.renewals, c.lease.renewals)
    await eventually(
        lambda: b.lease.renewals >= marks[0] + 2 and c.lease.renewals >= marks[1] + 2,
        within=10,
        awaiting="two more renewals of each survivor",
    )
    for run_id in runs:
        interrupts = [e for e in await all_events(c, run_id) if e.type == "run_interrupted"]
        assert [e.data for e in interrupts] == [{"reason": "node_lost", "node": "a"}]
    assert await b.slots_in_use() == (0, 0)
    assert [n.node_id for n in await c.nodes()] == ["b", "c"]

    restarted = await nodes("a")
    assert restarted.interrupted == []
    assert [n.node_id for n in await b.nodes()] == ["a", "b", "c"]
    for run_id in runs:
        types = [e.type for e in await all_events(b, run_id)]
        assert types == ["run_created", "session_connected", "run_interrupted"]


async def test_a_restart_interrupts_its_previous_incarnation_and_fences_it(
    nodes: NodeFactory,
) -> None:
    old = await nodes("a")
    await start_run(old, "run-r")
    new = await nodes("a")
    assert new.interrupted == ["run-r"]
    events = await all_events(new, "run-r")
    assert events[-1].data == {"reason": "server_restart", "node": "a"}

    # The old incarnation still believes it owns run-r: its write is refused by the store
    # (its epoch ended), and its own next renewal fences it.
    late = old.append(NewEvent("run-r", "stats", "studio-a", {"late": True}))
    with pytest.raises(FencedError):
        await asyncio.wait_for(late, 5 * LEASE_S)
    # Fenced, it tries to take its id back and is refused while the new one holds it:
    # nothing of the new incarnation is interrupted.
    await start_run(new, "run-n")
    await eventually(
        lambda: old.lease.renewal_failures >= 1, within=5 * LEASE_S, awaiting="a refused retake"
    )
    assert not old.ready and new.ready
    assert [e.type for e in await all_events(new, "run-r")][-1] == "run_interrupted"
    assert [e.type for e in await all_events(new, "run-n")] == ["run_created", "session_connected"]


async def test_a_node_that_cannot_renew_fences_itself_before_its_lease_expires(
    nodes: NodeFactory,
) -> None:
    node = await nodes("a")
    fenced = asyncio.Event()

    async def on_fenced() -> None:
        fenced.set()

    node.set_owner_hooks(lambda action, run_id: None, asyncio.sleep, on_fenced)
    assert node._pool is not None
    # Renewals stop (a stuck loop): the fence timer alone must fence.
    assert node.lease._task is not None
    node.lease._task.cancel()
    await asyncio.wait_for(fenced.wait(), 2 * LEASE_S)
    assert not node.ready
    with pytest.raises(FencedError):
        node.append(NewEvent("run-f", EventType.RUN_CREATED, "studio-a"))
    with pytest.raises(FencedError):
        await node.reserve_slot("studio-a", 4)
    # The lease row is still unexpired in the store when the node fenced itself.
    (info,) = await node.nodes()
    assert info.node_id == "a"


async def test_one_renewal_that_cannot_finish_is_retried_before_the_fence(
    nodes: NodeFactory, cluster_store: str
) -> None:
    """A renewal blocked past its attempt bound (a row lock held from another connection,
    one that lets the reaper's lease check through) fails once; the retry that follows
    lands before the fence, so the node never fences."""
    lease_s = 9.0
    node = await nodes("slow", lease_s=lease_s)
    lease = node.lease
    before = lease.renewals
    await eventually(lambda: lease.renewals > before, within=lease_s, awaiting="a renewal")
    blocker = await asyncpg.connect(cluster_store)
    try:
        held = blocker.transaction()
        await held.start()
        await blocker.execute("SELECT 1 FROM whip_nodes WHERE node_id = 'slow' FOR NO KEY UPDATE")
        failures = lease.renewal_failures
        await eventually(
            lambda: lease.renewal_failures > failures,
            within=lease_s,
            awaiting="the blocked renewal to time out",
        )
        renewed = lease.renewals
        await held.rollback()
    finally:
        await blocker.close()
    await eventually(lambda: lease.renewals > renewed, within=lease_s, awaiting="the retry")
    assert lease.fenced_count == 0 and node.ready


async def test_store_outage_loses_nothing_confirmed_and_fences_short_leased_nodes(
    postgres: PostgresServer,
) -> None:
    server = PostgresServer(copy_of=postgres)
    try:
        server.start()
        store = server.create_database()
        steady = await ClusterTimeline.open(ClusterTimelineConfig(store, "steady", "http://x", 8.0))
        short = await ClusterTimeline.open(
            ClusterTimelineConfig(store, "short", "http://y", LEASE_S)
        )
        try:
            await outage_story(server, steady, short)
        finally:
            await steady.aclose()
            await short.aclose()
    finally:
        server.close()


async def outage_story(
    server: PostgresServer, steady: ClusterTimeline, short: ClusterTimeline
) -> None:
    await start_run(steady, "run-o")
    await start_run(short, "run-s")
    fenced = asyncio.Event()

    async def on_fenced() -> None:
        fenced.set()

    short.set_owner_hooks(lambda action, run_id: None, asyncio.sleep, on_fenced)
    confirmed: dict[int, int] = {}
    stop_writing = threading.Event()

    async def writer() -> None:
        i = 0
        while not stop_writing.is_set():
            seq = await steady.append(NewEvent("run-o", "stats", "studio-a", {"i": i}))
            confirmed[i] = seq
            i += 1

    task = asyncio.create_task(writer())
    await eventually(lambda: len(confirmed) >= 20, within=10, awaiting="appends before")
    await asyncio.to_thread(server.stop)
    await asyncio.wait_for(fenced.wait(), 5 * LEASE_S)
    before_restart = len(confirmed)
    await asyncio.to_thread(server.start)
    await eventually(
        lambda: len(confirmed) >= before_restart + 20, within=15, awaiting="appends after"
    )
    stop_writing.set()
    await asyncio.wait_for(task, 10)
    assert steady.ready and steady.lease.fenced_count == 0

    stats = [e for e in await all_events(steady, "run-o") if e.type == "stats"]
    assert [e.data["i"] for e in stats] == list(range(len(stats)))
    assert {e.data["i"]: e.seq for e in stats} == confirmed

    # The short-leased node fenced, then holds a new lease; its old epoch's run is
    # interrupted once (by itself or by the steady node, whichever came first).
    await eventually(lambda: short.ready, within=10, awaiting="the fenced node to re-acquire")
    interrupts = [e for e in await all_events(steady, "run-s") if e.type == "run_interrupted"]
    assert [e.data for e in interrupts] == [{"reason": "node_lost", "node": "short"}]


async def test_a_lost_commit_answer_is_confirmed_from_the_batch_row_exactly_once(
    cluster_store: str, nodes: NodeFactory
) -> None:
    cutter = CommitCutter(urlsplit(cluster_store).port or 5432, b"INSERT INTO whip_batches")
    await cutter.start()
    try:
        node = await nodes("cut", store=proxied_url(cluster_store, cutter.port))
        await start_run(node, "cut-run")
        seqs: list[int] = []
        for wave in range(3):
            cuts = cutter.cuts
            cutter.arm(1)
            stats = [
                NewEvent("cut-run", EventType.STATS, "studio-a", {"wave": wave, "i": i})
                for i in range(40)
            ]
            seqs += await asyncio.gather(*(node.append(event) for event in stats))
            assert cutter.cuts == cuts + 1, "the batch's COMMIT answer was lost"
        await node.aclose()  # before its proxy goes: a clean leave
    finally:
        await cutter.close()
    assert sorted(seqs) == list(range(3, 3 + 120)), "every append confirmed once, in order"
    conn = await asyncpg.connect(cluster_store)
    try:
        stored = await conn.fetch(
            "SELECT seq, data::text AS data FROM whip_events WHERE run_id = 'cut-run'"
            " AND type = 'stats' ORDER BY seq"
        )
    finally:
        await conn.close()
    assert [row["seq"] for row in stored] == sorted(seqs), "stored once each"
    assert len({row["data"] for row in stored}) == 120


async def test_an_event_the_store_refuses_fails_alone_and_the_node_goes_on(
    nodes: NodeFactory,
) -> None:
    node = await nodes("a")
    await start_run(node, "run-b")
    # PostgreSQL's jsonb refuses a NUL character: one bad event among good ones.
    appends = [
        node.append(NewEvent("run-b", "stats", "studio-a", {"s": "\u0000" if i == 2 else i}))
        for i in range(5)
    ]
    results = await asyncio.gather(*appends, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert [type(r) for r in failed] == [AppendFailedError]
    assert node.committer.refused == 1
    await node.append(NewEvent("run-b", "stats", "studio-a", {"after": True}))
    stats = [e.data for e in await all_events(node, "run-b") if e.type == "stats"]
    assert stats == [{"s": 0}, {"s": 1}, {"s": 3}, {"s": 4}, {"after": True}]


async def test_a_node_refuses_to_start_on_a_newer_schema_with_a_clear_error(
    cluster_store: str, tmp_path: Path
) -> None:
    conn = await asyncpg.connect(cluster_store)
    try:
        await migrate(conn)
        await conn.execute("UPDATE whip_schema_version SET version = 99")
    finally:
        await conn.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHIP_INGEST_")}
    env["WHIP_INGEST_CLUSTER_SECRET"] = "a-test-cluster-secret"
    argv = serve_argv(free_port(), tmp_path / "data", "--store", cluster_store)
    done = await asyncio.to_thread(
        subprocess.run, argv, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot start: the cluster store is at schema version 99" in done.stderr
