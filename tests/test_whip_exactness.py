"""Exact admission limits, faults at each step of the session transaction, close races.

Every test drives the real server (``create_app`` under aiohttp's ``TestServer`` on
127.0.0.1) with real SDP offers from aiortc peers and then checks three things at once:
the HTTP answers, the durable events (read back from the WAL), and that nothing leaked
(stream slots, media budget, session table, server-side peer connections, runs left in
``starting``).

Server-side peer connections are observed through the session manager's injected peer
factory (:class:`whip.session_manager.SessionSeams`): a subclass of aiortc's
``RTCPeerConnection`` that records every instance; nothing in ``whip/`` or ``registry/`` is
modified. WAL faults are injected through
the documented seam: ``Wal.faults`` is read by the writer thread on every batch, so the
test sets it on the running server's timeline.
"""

from __future__ import annotations

import asyncio
import errno
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from aiortc import RTCConfiguration, RTCPeerConnection

from registry.events import Event
from registry.timeline import Timeline
from tests.support.peers import AiortcPublisher
from tests.support.servers import wait_for_type
from whip.app import create_app
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.auth import hash_token
from whip.cli import configure_ice
from whip.config import Config, MiB, build_config
from whip.ids import IdFactory, new_id
from whip.live_session import CloseReason, LiveSession
from whip.negotiation import Negotiator
from whip.session_manager import SessionManager, SessionSeams

UNKNOWN_SESSION = "/whip/sessions/s_AAAAAAAAAAAAAAAAAAAAAA"
"""Well-formed (``s_`` + 22 url-safe chars) but never issued."""

HIGH_BUDGET = {"media_budget_bytes": 1 << 40, "media_budget_threads": 4096}
"""A media budget that is never the binding limit here."""


# ------------------------------------------------------------------ instrumentation


class PeerConnections:
    """Every RTCPeerConnection the session transaction created, in creation order.

    ``fail_next_close``: the next N ``close()`` calls close the connection for real and
    then raise, as an aiortc teardown error would.
    """

    def __init__(self) -> None:
        self.created: list[RTCPeerConnection] = []
        self.fail_next_close = 0

    def open(self) -> list[RTCPeerConnection]:
        """The ones not closed."""
        return [pc for pc in self.created if pc.connectionState != "closed"]

    def factory(self) -> RTCPeerConnection:
        """The server's peer-connection factory: records each one, no ICE servers."""
        pc = RecordingPeerConnection(self, RTCConfiguration(iceServers=[]))
        self.created.append(pc)
        return pc


class RecordingPeerConnection(RTCPeerConnection):  # type: ignore[misc]
    """A server-side peer connection whose close can be made to fail after closing."""

    def __init__(self, record: PeerConnections, configuration: RTCConfiguration) -> None:
        super().__init__(configuration)
        self.record = record

    async def close(self) -> None:
        await super().close()
        if self.record.fail_next_close > 0:
            self.record.fail_next_close -= 1
            raise RuntimeError("injected peer-connection teardown failure")


@pytest.fixture
def server_pcs() -> PeerConnections:
    return PeerConnections()


class InjectedFaults:
    """A :class:`registry.wal.WalFaults`: fail batches on the writer thread on demand.

    ``fail_writes(n, from_seq)``: the next ``n`` batches whose first seq is at least
    ``from_seq`` fail before ``pwrite`` (the WAL rolls them back and stays usable).
    ``fail_fsyncs(n)``: the next ``n`` batches fail before ``fdatasync`` (the WAL breaks).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writes_left = 0
        self._from_seq = 0
        self._fsyncs_left = 0
        self.failed_writes: list[int] = []
        self.failed_fsyncs = 0

    def fail_writes(self, count: int, from_seq: int = 0) -> None:
        with self._lock:
            self._writes_left, self._from_seq = count, from_seq

    def fail_fsyncs(self, count: int) -> None:
        with self._lock:
            self._fsyncs_left = count

    def before_write(self, first_seq: int, count: int) -> None:
        with self._lock:
            if self._writes_left <= 0 or first_seq < self._from_seq:
                return
            self._writes_left -= 1
            self.failed_writes.append(first_seq)
        raise OSError(errno.EIO, f"injected write failure at seq {first_seq}")

    def before_fsync(self) -> None:
        with self._lock:
            if self._fsyncs_left <= 0:
                return
            self._fsyncs_left -= 1
            self.failed_fsyncs += 1
        raise OSError(errno.EIO, "injected fsync failure")


# ------------------------------------------------------------------ the harness


@dataclass(frozen=True)
class Reply:
    """A fully read HTTP answer."""

    status: int
    headers: dict[str, str]
    body: str

    def error_code(self) -> str:
        """The code of a contract-shaped JSON error; fails on any other shape."""
        assert self.headers.get("Content-Type", "").startswith("application/json"), self
        payload = json.loads(self.body)
        assert set(payload) == {"error"}, payload
        assert set(payload["error"]) == {"code", "message"}, payload
        assert isinstance(payload["error"]["message"], str), payload
        code = payload["error"]["code"]
        assert isinstance(code, str)
        return code


@dataclass
class Harness:
    """One running server and an HTTP client without a connection-pool limit."""

    server: TestServer
    http: aiohttp.ClientSession
    pcs: PeerConnections

    @property
    def manager(self) -> SessionManager:
        return self.server.app[SESSIONS_KEY]

    @property
    def timeline(self) -> Timeline:
        return self.server.app[TIMELINE_KEY]

    async def post(self, offer: str, path: str = "/whip", token: str | None = None) -> Reply:
        headers = {"Content-Type": "application/sdp"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        async with self.http.post(self.server.make_url(path), data=offer, headers=headers) as r:
            return Reply(r.status, dict(r.headers), await r.text())

    async def delete(self, location: str, token: str | None = None) -> Reply:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        async with self.http.delete(self.server.make_url(location), headers=headers) as r:
            return Reply(r.status, dict(r.headers), await r.text())

    def budget_reserved(self) -> tuple[int, int]:
        figures = self.manager.budget.figures()
        return figures.bytes_reserved, figures.threads_reserved

    def assert_nothing_held(self) -> None:
        """No slot, no permit, no live session, no open server peer connection."""
        manager = self.manager
        assert len(manager.table) == 0
        assert manager.slots.reserved() == 0
        figures = manager.budget.figures()
        assert (figures.bytes_reserved, figures.threads_reserved) == (0, 0)
        assert (figures.bytes_kept, figures.threads_kept) == (0, 0)
        assert self.pcs.open() == []
        assert [r.run_id for r in self.timeline.runs.list_runs() if r.state == "starting"] == []


def make_config(
    data_dir: Path, principals: list[dict[str, str]] | None = None, **sections: dict[str, Any]
) -> Config:
    """A validated config: ``limits={...}`` etc. per TOML section."""
    document: dict[str, Any] = {
        "server": {"data_dir": str(data_dir)},
        "ice": {"tcp_port": 0},  # a free port: the default, 8189, is one per machine
    }
    for section, values in sections.items():
        document.setdefault(section, {}).update(values)
    if principals:
        document["principals"] = principals
    return build_config(document, {}, {})


@pytest.fixture
async def serve(tmp_path: Path, server_pcs: PeerConnections) -> AsyncIterator[Callable[..., Any]]:
    harnesses: list[Harness] = []

    async def start(
        principals: list[dict[str, str]] | None = None,
        *,
        new_id: IdFactory = new_id,
        **sections: dict[str, Any],
    ) -> Harness:
        config = make_config(tmp_path / f"s{len(harnesses)}", principals, **sections)
        configure_ice(config)
        seams = SessionSeams(
            negotiator=lambda c: Negotiator(c, peer_factory=server_pcs.factory), new_id=new_id
        )
        server = TestServer(create_app(config, seams=seams), host="127.0.0.1")
        await server.start_server()
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        harness = Harness(server, http, server_pcs)
        harnesses.append(harness)
        return harness

    yield start
    for harness in reversed(harnesses):
        await harness.http.close()
        await harness.server.close()
    assert server_pcs.open() == [], "server cleanup left peer connections open"


@pytest.fixture
async def publishers() -> AsyncIterator[Callable[[], AiortcPublisher]]:
    """Make publishers; every one is closed at teardown."""
    made: list[AiortcPublisher] = []

    def make() -> AiortcPublisher:
        publisher = AiortcPublisher()
        made.append(publisher)
        return publisher

    yield make
    await asyncio.gather(*(p.close() for p in made))


async def make_offers(
    make: Callable[[], AiortcPublisher], count: int, *, audio: bool = False, batch: int = 50
) -> tuple[list[AiortcPublisher], list[str]]:
    """``count`` distinct real offers (gathering done), created ``batch`` at a time."""
    peers = [make() for _ in range(count)]
    offers: list[str] = []
    for start in range(0, count, batch):
        chunk = peers[start : start + batch]
        offers += await asyncio.gather(*(p.offer(audio=audio) for p in chunk))
    return peers, offers


async def wal_events(timeline: Timeline) -> list[Event]:
    """Every durable event, straight from the segment files (off the loop)."""
    return await asyncio.to_thread(timeline.wal.read_all)


def by_run(events: Iterable[Event]) -> dict[str, list[Event]]:
    runs: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        runs[event.run_id].append(event)
    return runs


def session_of(harness: Harness, reply: Reply) -> LiveSession:
    session_id = reply.headers["Location"].rsplit("/", 1)[1]
    session = harness.manager.table.get(session_id)
    assert session is not None
    assert session.run_id == reply.headers["X-Run-Id"]
    return session


# ------------------------------------------------------------------ 1. exactness


async def test_session_cap_is_exact_under_300_concurrent_posts(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher]
) -> None:
    """300 concurrent POSTs, max_sessions=100: exactly 100 x 201, 200 x 503 session_cap.
    The peers never connect: the connect deadline is far past the burst, so no session is
    reclaimed (which frees its place) while POSTs are still arriving on a loaded machine."""
    harness = await serve(
        limits={
            "max_sessions": 100,
            "stream_limit": 10_000,
            "connect_timeout_s": 600.0,
            **HIGH_BUDGET,
        }
    )
    manager, timeline = harness.manager, harness.timeline
    peers, offers = await make_offers(publishers, 300)
    assert len(set(offers)) == 300

    started = time.monotonic()
    replies = await asyncio.gather(*(harness.post(offer) for offer in offers))
    elapsed = time.monotonic() - started

    statuses = Counter(r.status for r in replies)
    assert statuses == {201: 100, 503: 200}, (statuses, elapsed)
    accepted = [r for r in replies if r.status == 201]
    for reply in replies:
        if reply.status == 503:
            assert reply.error_code() == "session_cap"
            assert int(reply.headers["Retry-After"]) > 0
    locations = {r.headers["Location"] for r in accepted}
    accepted_runs = {r.headers["X-Run-Id"] for r in accepted}
    assert len(locations) == len(accepted_runs) == 100
    assert len(manager.table) == 100
    assert {session_of(harness, r).run_id for r in accepted} == accepted_runs
    assert manager.slots.reserved() == 0, "every reservation became a committed run"
    assert harness.budget_reserved() == (100 * 16 * MiB, 100 * 2)

    # The cap is taken at insert time, after run_created is durable (ARCHITECTURE.md,
    # step 4): each refused POST left a run that is tombstoned in the background.
    refused_runs = {r.run_id for r in timeline.runs.list_runs()} - accepted_runs
    assert len(refused_runs) == 200
    tombstones = await asyncio.gather(
        *(wait_for_type(timeline, run_id, "run_deleted") for run_id in refused_runs)
    )
    assert all(t.data == {"reason": "admission_failed"} for t in tombstones)

    await asyncio.gather(*(p.close() for p in peers))
    deletes = await asyncio.gather(*(harness.delete(location) for location in locations))
    assert [d.status for d in deletes] == [200] * 100
    await manager.shutdown()
    harness.assert_nothing_held()
    assert manager.table.tombstones == 100
    assert len(harness.pcs.created) == 300

    runs = by_run(await wal_events(timeline))
    assert set(runs) == accepted_runs | refused_runs
    assert sum(e.type == "run_created" for events in runs.values() for e in events) == 300
    reasons: Counter[str] = Counter()
    for run_id in accepted_runs:
        types = [e.type for e in runs[run_id]]
        assert types[0] == "run_created" and types.count("run_created") == 1
        closed = [e for e in runs[run_id] if e.type == "session_closed"]
        assert len(closed) == 1, types
        assert "run_deleted" not in types
        reasons[closed[0].data["reason"]] += 1
        view = timeline.runs.get(run_id)
        assert view is not None and view.state == "ended"
    assert set(reasons) <= {"deleted", "peer_closed", "peer_gone"}, reasons
    for run_id in refused_runs:
        assert [e.type for e in runs[run_id]] == ["run_created", "run_deleted"]
        view = timeline.runs.get(run_id)
        assert view is not None and view.state == "deleted"
    assert timeline.runs.count_active_runs_for_principal("anonymous") == 0


async def test_stream_limit_is_exact_per_principal_under_60_concurrent_posts(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher]
) -> None:
    """60 concurrent POSTs of one principal: exactly ``limit`` x 201; another is unaffected."""
    limit = 7
    principals = [
        {"name": "studio-a", "role": "publisher", "token_sha256": hash_token("token-a")},
        {"name": "studio-b", "role": "publisher", "token_sha256": hash_token("token-b")},
    ]
    harness = await serve(
        principals, limits={"max_sessions": 200, "stream_limit": limit, **HIGH_BUDGET}
    )
    manager, timeline = harness.manager, harness.timeline
    peers, offers = await make_offers(publishers, 60 + limit)
    tokens = ["token-a"] * 60 + ["token-b"] * limit

    replies = await asyncio.gather(
        *(harness.post(offer, token=token) for offer, token in zip(offers, tokens, strict=True))
    )
    of_a, of_b = replies[:60], replies[60:]
    assert Counter(r.status for r in of_a) == {201: limit, 409: 60 - limit}
    assert all(r.error_code() == "stream_limit" for r in of_a if r.status == 409)
    assert [r.status for r in of_b] == [201] * limit, "studio-b has its own limit"
    assert len(manager.table) == 2 * limit
    assert manager.slots.reserved() == 0
    for name in ("studio-a", "studio-b"):
        assert timeline.runs.count_active_runs_for_principal(name) == limit
    # Refused at step 1: no peer connection was negotiated and no run_created written.
    assert len(harness.pcs.created) == 2 * limit
    created = [e for e in await wal_events(timeline) if e.type == "run_created"]
    assert Counter(e.principal for e in created) == {"studio-a": limit, "studio-b": limit}

    again = await harness.post(offers[-1], token="token-b")
    assert again.status == 409 and again.error_code() == "stream_limit"

    accepted = [(r, t) for r, t in zip(replies, tokens, strict=True) if r.status == 201]
    wrong = await harness.delete(accepted[0][0].headers["Location"], token="token-b")
    assert wrong.status == 404, "another principal's session is not found"
    deletes = await asyncio.gather(*(harness.delete(r.headers["Location"], t) for r, t in accepted))
    assert [d.status for d in deletes] == [200] * (2 * limit)
    await asyncio.gather(*(p.close() for p in peers))
    harness.assert_nothing_held()
    for name in ("studio-a", "studio-b"):
        assert timeline.runs.count_active_runs_for_principal(name) == 0
    closed = [e for e in await wal_events(timeline) if e.type == "session_closed"]
    assert sorted(e.run_id for e in closed) == sorted(r.headers["X-Run-Id"] for r, _ in accepted)
    assert {e.data["reason"] for e in closed} == {"deleted"}
    assert manager.table.tombstones == 2 * limit


# ------------------------------------------------------------------ 2. faults per step


async def test_refused_stream_slot_takes_nothing(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher]
) -> None:
    harness = await serve(limits={"stream_limit": 1})
    manager, timeline = harness.manager, harness.timeline
    _, (first_offer, second_offer) = await make_offers(publishers, 2)
    first = await harness.post(first_offer)
    assert first.status == 201
    held = harness.budget_reserved()

    refused = await harness.post(second_offer)
    assert refused.status == 409 and refused.error_code() == "stream_limit"
    assert len(manager.table) == 1 and manager.slots.reserved() == 0
    assert harness.budget_reserved() == held
    assert len(harness.pcs.created) == 1, "refused before any peer connection"
    events = await wal_events(timeline)
    assert [(e.run_id, e.type) for e in events] == [(first.headers["X-Run-Id"], "run_created")]

    assert (await harness.delete(first.headers["Location"])).status == 200
    harness.assert_nothing_held()


@pytest.mark.parametrize(
    ("limits", "audio"),
    [
        pytest.param({"media_budget_threads": 3}, False, id="threads"),
        pytest.param({"media_budget_bytes": 32 * MiB}, True, id="bytes"),
    ],
)
async def test_refused_media_budget_is_503_without_run_created(
    serve: Callable[..., Any],
    publishers: Callable[[], AiortcPublisher],
    limits: dict[str, int],
    audio: bool,
) -> None:
    # threads: 3 fit one session of 2 workers; bytes: 32 MiB fit one audio+video session
    # (2 tracks x 16 x 1 MiB), the smallest budget the config accepts.
    harness = await serve(limits=limits)
    manager, timeline = harness.manager, harness.timeline
    _, offers = await make_offers(publishers, 3, audio=audio)
    first = await harness.post(offers[0])
    assert first.status == 201
    held = harness.budget_reserved()

    refused = await harness.post(offers[1])
    assert refused.status == 503 and refused.error_code() == "budget"
    assert int(refused.headers["Retry-After"]) > 0
    assert len(manager.table) == 1 and manager.slots.reserved() == 0
    assert harness.budget_reserved() == held
    assert len(harness.pcs.created) == 1, "refused before any peer connection"
    events = await wal_events(timeline)
    assert [(e.run_id, e.type) for e in events] == [(first.headers["X-Run-Id"], "run_created")]

    assert (await harness.delete(first.headers["Location"])).status == 200
    harness.assert_nothing_held()
    third = await harness.post(offers[2])
    assert third.status == 201, "the first session's permit was returned"
    assert (await harness.delete(third.headers["Location"])).status == 200
    harness.assert_nothing_held()


@pytest.mark.parametrize("where", ["write", "fsync"])
async def test_failed_run_created_append_is_500_and_releases_everything(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher], where: str
) -> None:
    harness = await serve()
    manager, timeline = harness.manager, harness.timeline
    faults = InjectedFaults()
    timeline.wal.faults = faults
    _, offers = await make_offers(publishers, 2)

    if where == "write":
        faults.fail_writes(1)
    else:
        faults.fail_fsyncs(1)
    failed = await harness.post(offers[0])
    assert failed.status == 500
    assert failed.error_code() == ("append_failed" if where == "write" else "timeline_broken")
    assert len(faults.failed_writes) + faults.failed_fsyncs == 1
    assert len(harness.pcs.created) == 1, "the offer was negotiated before the append"
    harness.assert_nothing_held()
    assert manager.table.tombstones == 0
    assert timeline.runs.list_runs() == [], "the refused run_created is not a run"
    on_disk = [e.type for e in await wal_events(timeline)]
    if where == "write":
        assert on_disk == [], "the failed write was rolled back"
    else:
        # Written but never confirmed: registry/wal.py documents that such an append
        # "may or may not be found after a restart" (the page cache still has it).
        assert on_disk in ([], ["run_created"])

    after = await harness.post(offers[1])
    if where == "write":
        assert after.status == 201, "the log rolled the batch back and stays usable"
        events = await wal_events(timeline)
        assert [(e.run_id, e.type) for e in events] == [(after.headers["X-Run-Id"], "run_created")]
        assert events[0].seq == 1, "the failed batch's seq is reused"
        assert (await harness.delete(after.headers["Location"])).status == 200
    else:
        assert not timeline.ready and timeline.wal.broken is not None
        assert after.status == 500 and after.error_code() == "timeline_broken"
        assert [e.type for e in await wal_events(timeline)] == on_disk
    harness.assert_nothing_held()


async def test_failed_insert_at_the_session_cap_tombstones_the_run(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher]
) -> None:
    harness = await serve(limits={"max_sessions": 1})
    manager, timeline = harness.manager, harness.timeline
    _, offers = await make_offers(publishers, 3)
    first = await harness.post(offers[0])
    assert first.status == 201
    first_session = session_of(harness, first)
    held = harness.budget_reserved()

    refused = await harness.post(offers[1])
    assert refused.status == 503 and refused.error_code() == "session_cap"
    assert int(refused.headers["Retry-After"]) > 0
    assert "Location" not in refused.headers and "X-Run-Id" not in refused.headers
    (orphan,) = {r.run_id for r in timeline.runs.list_runs()} - {first.headers["X-Run-Id"]}
    stone = await wait_for_type(timeline, orphan, "run_deleted")
    assert stone.data == {"reason": "admission_failed"}
    assert [e.type for e in await timeline.read_events(orphan)] == ["run_created", "run_deleted"]
    view = timeline.runs.get(orphan)
    assert view is not None and view.state == "deleted"
    assert timeline.runs.count_active_runs_for_principal("anonymous") == 1
    assert manager.table.live() == [first_session], "the live session is untouched"
    assert manager.table.tombstones == 0, "a session never visible leaves no URL tombstone"
    assert manager.slots.reserved() == 0 and harness.budget_reserved() == held
    assert harness.pcs.created[1].connectionState == "closed"
    assert harness.pcs.open() == [first_session.pc]

    assert (await harness.delete(first.headers["Location"])).status == 200
    harness.assert_nothing_held()
    third = await harness.post(offers[2])
    assert third.status == 201, "the cap slot came back"
    await manager.shutdown()
    harness.assert_nothing_held()


async def test_session_id_collision_releases_and_tombstones(
    serve: Callable[..., Any],
    publishers: Callable[[], AiortcPublisher],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed = new_id("s_")

    def colliding_new_id(prefix: str) -> str:
        return fixed if prefix == "s_" else new_id(prefix)

    harness = await serve(new_id=colliding_new_id)
    manager, timeline = harness.manager, harness.timeline
    _, offers = await make_offers(publishers, 2)
    first = await harness.post(offers[0])
    assert first.status == 201 and first.headers["Location"] == f"/whip/sessions/{fixed}"
    first_session = session_of(harness, first)
    held = harness.budget_reserved()

    collided = await harness.post(offers[1])
    assert collided.status == 503 and collided.error_code() == "session_cap"
    assert collided.headers["Retry-After"] == "1"
    (orphan,) = {r.run_id for r in timeline.runs.list_runs()} - {first.headers["X-Run-Id"]}
    stone = await wait_for_type(timeline, orphan, "run_deleted")
    assert stone.data == {"reason": "admission_failed"}
    assert manager.table.get(fixed) is first_session, "the owner keeps its id"
    assert manager.slots.reserved() == 0 and harness.budget_reserved() == held
    assert harness.pcs.open() == [first_session.pc]

    assert (await harness.delete(first.headers["Location"])).status == 200
    harness.assert_nothing_held()
    closed = [e for e in await wal_events(timeline) if e.type == "session_closed"]
    assert [(e.run_id, e.data) for e in closed] == [(first_session.run_id, {"reason": "deleted"})]


async def test_tombstone_write_that_fails_is_retried_until_durable(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher]
) -> None:
    harness = await serve(limits={"max_sessions": 1})
    manager, timeline = harness.manager, harness.timeline
    faults = InjectedFaults()
    timeline.wal.faults = faults
    _, offers = await make_offers(publishers, 2)
    first = await harness.post(offers[0])
    assert first.status == 201
    # Nothing else writes meanwhile (the first peer never connects): the refused POST's
    # run_created gets the next seq and its tombstone the one after; fail that twice.
    tombstone_seq = timeline.wal.next_seq + 1
    faults.fail_writes(2, from_seq=tombstone_seq)

    refused = await harness.post(offers[1])
    assert refused.status == 503 and refused.error_code() == "session_cap"
    (orphan,) = {r.run_id for r in timeline.runs.list_runs()} - {first.headers["X-Run-Id"]}
    stone = await wait_for_type(timeline, orphan, "run_deleted", wait_s=10)
    assert faults.failed_writes == [tombstone_seq, tombstone_seq]
    assert stone.seq == tombstone_seq and stone.data == {"reason": "admission_failed"}
    events = await wal_events(timeline)
    assert [(e.seq, e.type) for e in events if e.run_id == orphan] == [
        (tombstone_seq - 1, "run_created"),
        (tombstone_seq, "run_deleted"),
    ]
    view = timeline.runs.get(orphan)
    assert view is not None and view.state == "deleted"
    assert manager.slots.reserved() == 0
    assert (await harness.delete(first.headers["Location"])).status == 200
    harness.assert_nothing_held()


@pytest.mark.parametrize("step", ["append", "insert"])
async def test_peer_close_error_on_a_failure_path_still_releases(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher], step: str
) -> None:
    """Regression: ``_transaction`` once awaited ``pc.close()`` unguarded before releasing
    the permit (and slot, and scheduling the tombstone)."""
    harness = await serve(limits={"max_sessions": 1})
    manager, timeline = harness.manager, harness.timeline
    faults = InjectedFaults()
    timeline.wal.faults = faults
    _, offers = await make_offers(publishers, 2)
    held: tuple[int, int] = (0, 0)
    live: list[RTCPeerConnection] = []
    if step == "insert":
        first = await harness.post(offers[0])  # stays live: the next insert hits the cap
        assert first.status == 201
        held, live = harness.budget_reserved(), [session_of(harness, first).pc]
    else:
        faults.fail_writes(1)
    runs_before = {r.run_id for r in timeline.runs.list_runs()}
    harness.pcs.fail_next_close = 1

    failed = await harness.post(offers[1])
    assert failed.status >= 500
    assert harness.pcs.fail_next_close == 0, "the injected close error happened"
    assert harness.pcs.open() == live
    assert manager.slots.reserved() == 0, "stream slot leaked"
    assert harness.budget_reserved() == held, "media permit leaked"
    if step == "insert":
        (orphan,) = {r.run_id for r in timeline.runs.list_runs()} - runs_before
        stone = await wait_for_type(timeline, orphan, "run_deleted", wait_s=5)
        assert stone.data == {"reason": "admission_failed"}


# ------------------------------------------------------------------ 3. close races


@dataclass(frozen=True)
class Contest:
    """How one round starts its three closers (varied so that each can win).

    ``rotate``: which closer is started (and released by the gate) first.
    ``after_peer``: DELETE and shutdown start only once the server's peer connection has
    reported the peer gone, so they race the reclaimer's own close.
    ``shutdown_lag``: loop turns the shutdown closer yields before calling ``close``.
    """

    rotate: int
    after_peer: bool
    shutdown_lag: int


CONTESTS = [
    Contest(rotate, after_peer, lag)
    for after_peer, lag in ((False, 0), (False, 64), (True, 0), (True, 64))
    for rotate in range(4)
]


async def race_closers(
    harness: Harness, publisher: AiortcPublisher, location: str, contest: Contest
) -> tuple[Reply, bool]:
    """DELETE of ``location`` vs the peer closing vs ``manager.close(SHUTDOWN)`` vs an
    operator stop of the run (``manager.runs.request_stop``).

    Returns the DELETE answer and what ``manager.close`` returned. Bounded: 20 s.
    """
    session = harness.manager.table.get(location.rsplit("/", 1)[1])
    assert session is not None
    go, peer_gone = asyncio.Event(), asyncio.Event()

    def on_server_state() -> None:
        if session.pc.connectionState in ("failed", "closed"):
            peer_gone.set()

    session.pc.on("connectionstatechange", on_server_state)
    gate = peer_gone if contest.after_peer else go

    async def by_delete() -> Reply:
        await gate.wait()
        return await harness.delete(location)

    async def by_peer() -> None:
        await go.wait()
        await publisher.close()

    async def by_shutdown() -> bool:
        await gate.wait()
        for _ in range(contest.shutdown_lag):
            await asyncio.sleep(0)  # a loop turn, not a delay: lets other closers go first
        return await harness.manager.close(session, CloseReason.SHUTDOWN)

    async def by_stop() -> int:
        await gate.wait()
        for _ in range(contest.shutdown_lag // 2):
            await asyncio.sleep(0)  # a loop turn, not a delay
        return await harness.manager.runs.request_stop(session.run_id, session.principal)

    closers = [by_delete, by_peer, by_shutdown, by_stop]
    closers = closers[contest.rotate :] + closers[: contest.rotate]
    async with asyncio.timeout(20), asyncio.TaskGroup() as group:
        tasks = {c.__name__: group.create_task(c(), name=c.__name__) for c in closers}
        go.set()
    return tasks["by_delete"].result(), tasks["by_shutdown"].result()


async def test_delete_vs_peer_close_vs_shutdown_vs_stop_has_one_winner(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher]
) -> None:
    """32 fresh sessions, four closers each: one session_closed, one tombstone, 200s.

    The operator stop appends stop_requested durably before it tries to close, so here it
    rarely wins; it contends all the same, and a lost close must leave no second
    session_closed. (That it closes on its own is tested below.)"""
    rounds = 2 * len(CONTESTS)
    harness = await serve()
    manager, timeline = harness.manager, harness.timeline
    winners: dict[str, list[int]] = defaultdict(list)
    run_ids: list[str] = []
    for round_no in range(rounds):
        publisher = publishers()
        reply = await harness.post(await publisher.offer(audio=False))
        assert reply.status == 201
        await publisher.answer(reply.body)
        location, run_id = reply.headers["Location"], reply.headers["X-Run-Id"]
        run_ids.append(run_id)
        session = session_of(harness, reply)
        await asyncio.wait_for(publisher.connected.wait(), 20)
        await wait_for_type(timeline, run_id, "session_connected")
        assert manager.table.tombstones == round_no

        deleted, shutdown_won = await race_closers(
            harness, publisher, location, CONTESTS[round_no % len(CONTESTS)]
        )
        assert deleted.status == 200

        closed = await wait_for_type(timeline, run_id, "session_closed")
        reason = closed.data["reason"]
        assert reason in {"deleted", "peer_closed", "shutdown", "stopped"}
        assert shutdown_won == (reason == "shutdown")
        stone = manager.table.tombstone(session.session_id)
        assert stone is not None and (stone.run_id, stone.reason) == (run_id, reason)
        assert manager.table.tombstones == round_no + 1
        assert manager.table.get(session.session_id) is None
        assert session.closing and session.permit.settled
        assert session.pc.connectionState == "closed"
        assert session.state_history[-2:] == ["connected", "closed"], session.state_history
        for _ in range(2):
            assert (await harness.delete(location)).status == 200, "answered from the tombstone"
        winners[reason].append(round_no)

    unknown = await harness.delete(UNKNOWN_SESSION)
    assert unknown.status == 404 and unknown.error_code() == "not_found"
    malformed = await harness.delete("/whip/sessions/not-a-session-id")
    assert malformed.status == 404 and malformed.error_code() == "not_found"
    await manager.shutdown()  # waits for detached closes: a late duplicate would show below
    harness.assert_nothing_held()
    assert manager.table.tombstones == rounds
    runs = by_run(await wal_events(timeline))
    for run_id in run_ids:
        closes = [e.data for e in runs[run_id] if e.type == "session_closed"]
        assert len(closes) == 1, (run_id, closes)
        view = timeline.runs.get(run_id)
        assert view is not None and view.state == "ended"
    print("close race winners by round:", dict(winners))


async def test_operator_stop_and_run_delete_close_the_live_session(
    serve: Callable[..., Any], publishers: Callable[[], AiortcPublisher]
) -> None:
    """stop_run: stop_requested then session_closed{stopped}; delete_run: run_deleted
    once (repeats synthesized) then session_closed{stopped}; nothing held after."""
    harness = await serve()
    manager, timeline = harness.manager, harness.timeline
    for action in ("stop", "delete"):
        publisher = publishers()
        reply = await harness.post(await publisher.offer(audio=False))
        assert reply.status == 201
        await publisher.answer(reply.body)
        run_id = reply.headers["X-Run-Id"]
        await asyncio.wait_for(publisher.connected.wait(), 20)
        await wait_for_type(timeline, run_id, "session_connected")
        if action == "stop":
            seq = await manager.runs.request_stop(run_id, "operator")
            assert seq > 0
        else:
            results = await asyncio.gather(
                *(manager.runs.request_delete(run_id, "operator") for _ in range(8))
            )
            assert sum(not r.synthesized for r in results) == 1
        closed = await wait_for_type(timeline, run_id, "session_closed")
        assert closed.data == {"reason": "stopped"}
        types = [e.type for e in by_run(await wal_events(timeline))[run_id]]
        expected = "stop_requested" if action == "stop" else "run_deleted"
        assert types.count(expected) == 1
        assert types.index(expected) < types.index("session_closed")
        view = timeline.runs.get(run_id)
        assert view is not None
        assert view.state == ("ended" if action == "stop" else "deleted")
    harness.assert_nothing_held()
