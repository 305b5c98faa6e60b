"""The operator REST API (whip/routes_api.py) over real HTTP on 127.0.0.1.

Runs that need no media are written straight into the production timeline (the same
durable events the session transaction writes); runs that need a live session come from
a real aiortc publisher over loopback UDP.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from openapi_spec_validator import validate as validate_openapi
from yarl import URL

from registry.events import NewEvent, now_ms
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.openapi_routes import CLUSTER_ONLY, documented_operations, routed_operations
from tests.support.peers import AiortcPublisher
from tests.support.servers import make_config
from whip.app import create_app
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.auth import hash_token
from whip.cli import configure_ice
from whip.session_manager import SessionManager

OPENAPI = Path(__file__).parent.parent / "whip" / "openapi.json"
NOT_YET_ROUTED = {("GET", "/metrics"), ("HEAD", "/metrics")}
"""Documented operations whose handler another change brings (the document is whole)."""

TOKENS = {"a": "token-a", "b": "token-b", "op": "token-op"}
PRINCIPALS = [
    {"name": "studio-a", "role": "publisher", "token_sha256": hash_token(TOKENS["a"])},
    {"name": "studio-b", "role": "publisher", "token_sha256": hash_token(TOKENS["b"])},
    {"name": "ops", "role": "operator", "token_sha256": hash_token(TOKENS["op"])},
]
CALLERS: dict[str, dict[str, str]] = {
    "a": {"Authorization": f"Bearer {TOKENS['a']}"},
    "b": {"Authorization": f"Bearer {TOKENS['b']}"},
    "op": {"Authorization": f"Bearer {TOKENS['op']}"},
    "none": {},
    "bad": {"Authorization": "Bearer not-a-token"},
}


@dataclass
class Api:
    """A running server and a client bound to it."""

    server: TestServer
    http: aiohttp.ClientSession

    @property
    def timeline(self) -> Timeline:
        return self.server.app[TIMELINE_KEY]

    @property
    def manager(self) -> SessionManager:
        return self.server.app[SESSIONS_KEY]

    def url(self, path: str) -> URL:
        """``path`` sent as written (percent-escapes and all)."""
        return URL(str(self.server.make_url("/")).rstrip("/") + path, encoded=True)

    async def call(self, method: str, path: str, who: str = "op", **kwargs: Any) -> tuple[int, Any]:
        async with self.http.request(
            method, self.url(path), headers=CALLERS[who], **kwargs
        ) as response:
            text = await response.text()
            if response.content_type == "application/json":
                return response.status, json.loads(text)
            return response.status, text

    async def seed(
        self,
        run_id: str,
        principal: str,
        stream: str = "",
        *,
        then: tuple[str, ...] = (),
        ts_ms: int | None = None,
    ) -> int:
        """A run as the session transaction writes it, then ``then`` events; last seq."""
        ts = now_ms() if ts_ms is None else ts_ms
        data = {"stream": stream, "session_id": f"s_{run_id}"}
        seq = await self.timeline.append(NewEvent(run_id, "run_created", principal, data, ts_ms=ts))
        for etype in then:
            payload = {"reason": "peer_gone"} if etype == "session_closed" else {}
            seq = await self.timeline.append(NewEvent(run_id, etype, principal, payload, ts_ms=ts))
        return seq


@pytest.fixture
async def api_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[TestServer, aiohttp.ClientSession]] = []

    async def start(principals: list[dict[str, str]] | None = PRINCIPALS, **overrides: Any) -> Api:
        overrides.setdefault("limits__stream_limit", 1000)
        config = make_config(tmp_path / f"s{len(opened)}", principals, **overrides)
        configure_ice(config)
        server = TestServer(create_app(config), host="127.0.0.1")
        await server.start_server()
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        opened.append((server, http))
        return Api(server, http)

    yield start
    for server, http in reversed(opened):
        await http.close()
        await server.close()


async def _publish(api: Api, who: str, stream: str) -> AiortcPublisher:
    publisher = AiortcPublisher()
    try:
        response = await publisher.publish(
            api.http, str(api.server.make_url(f"/whip/{stream}")), CALLERS[who]
        )
        assert response.status == 201
        await asyncio.wait_for(publisher.connected.wait(), 20)
    except BaseException:
        await publisher.close()
        raise
    return publisher


async def _types(timeline: Timeline, run_id: str) -> list[str]:
    return [e.type for e in await timeline.read_events(run_id, 0, 1000)]


# ---------------------------------------------------------------- the document


async def test_openapi_is_valid_served_and_documents_every_route(
    api_factory: Callable[..., Any],
) -> None:
    raw = OPENAPI.read_bytes()
    doc = json.loads(raw)
    validate_openapi(doc)  # OpenAPI 3.1 (openapi-spec-validator picks the version)
    assert doc["openapi"].startswith("3.1")
    api = await api_factory()
    routed = routed_operations(api.server.app)
    documented = documented_operations(doc)
    assert routed - documented == set(), "routes missing from whip/openapi.json"
    assert documented - routed <= NOT_YET_ROUTED | CLUSTER_ONLY, "documented, nobody serves"
    for (method, path), operation in (((m, p), doc["paths"][p][m.lower()]) for m, p in documented):
        assert operation.get("responses"), (method, path)
        assert "security" in operation, (method, path)
        if path.startswith("/v1/") and path != "/v1/openapi.json":
            assert {"400", "401"} <= set(operation["responses"]), (method, path)
            assert operation["security"] == [{"bearer": []}]
    for path, item in doc["paths"].items():
        for name in (seg[1:-1] for seg in path.split("/") if seg.startswith("{")):
            params = item.get("parameters", [])
            resolved = [
                doc["components"]["parameters"][p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p
                for p in params
            ]
            assert any(p["name"] == name and p["in"] == "path" for p in resolved), path
    status, served = await api.call("GET", "/v1/openapi.json", "none")
    assert status == 200 and served == doc


# ---------------------------------------------------------------- isolation


async def test_isolation_matrix_every_endpoint(api_factory: Callable[..., Any]) -> None:
    api = await api_factory()
    await api.seed("run-a", "studio-a", "cam-a")
    await api.seed("run-b", "studio-b", "cam-b")
    for who in CALLERS:
        await api.seed(f"stop-{who}", "studio-a", "cam-a")
        await api.seed(f"del-{who}", "studio-a", "cam-a")
    publisher = await _publish(api, "a", "live-a")
    try:
        session_id = publisher.location.rsplit("/", 1)[1]
        _, missing = await api.call("GET", "/v1/runs/never-seen")
        _, missing_session = await api.call("GET", "/v1/sessions/s_AAAAAAAAAAAAAAAAAAAAAA")

        expect: dict[str, dict[str, int]] = {
            "GET /v1/runs": {"a": 200, "b": 200, "op": 200, "none": 401, "bad": 401},
            "GET /v1/runs/run-a": {"a": 200, "b": 404, "op": 200, "none": 401, "bad": 401},
            "GET /v1/runs/run-a/events": {"a": 200, "b": 404, "op": 200, "none": 401, "bad": 401},
            "POST /v1/runs/stop-{who}/stop": {
                "a": 200,
                "b": 404,
                "op": 200,
                "none": 401,
                "bad": 401,
            },
            "DELETE /v1/runs/del-{who}": {"a": 200, "b": 404, "op": 200, "none": 401, "bad": 401},
            "GET /v1/sessions": {"a": 200, "b": 200, "op": 200, "none": 401, "bad": 401},
            f"GET /v1/sessions/{session_id}": {
                "a": 200,
                "b": 404,
                "op": 200,
                "none": 401,
                "bad": 401,
            },
            "GET /v1/runs?principal=studio-b": {
                "a": 403,
                "b": 200,
                "op": 200,
                "none": 401,
                "bad": 401,
            },
            "GET /v1/sessions?principal=studio-b": {
                "a": 403,
                "b": 200,
                "op": 200,
                "none": 401,
                "bad": 401,
            },
            "GET /v1/openapi.json": dict.fromkeys(CALLERS, 200),
            "GET /healthz": dict.fromkeys(CALLERS, 200),
            # The WHIP session URL follows the same isolation; the DELETEs come last.
            f"PATCH /whip/sessions/{session_id}": {"b": 404, "none": 401, "bad": 401},
            f"DELETE /whip/sessions/{session_id}": {
                "b": 404,
                "none": 401,
                "bad": 401,
                "a": 200,
                "op": 200,
            },
        }
        got: dict[str, dict[str, int]] = {}
        bodies: dict[tuple[str, str], Any] = {}
        for endpoint, by_caller in expect.items():
            method, template = endpoint.split(" ", 1)
            got[endpoint] = {}
            for who in by_caller:
                status, body = await api.call(method, template.format(who=who), who)
                got[endpoint][who] = status
                bodies[endpoint, who] = body
        assert got == expect

        for (endpoint, who), body in bodies.items():
            status = got[endpoint][who]
            if status >= 400:
                assert set(body["error"]) == {"code", "message"}, (endpoint, who)
            if status == 404:
                reference = missing_session if "sessions/" in endpoint else missing
                assert body == reference, "another principal's item must look missing"
            if status == 401:
                assert body["error"]["code"] == "unauthorized"

        def ids(endpoint: str, who: str) -> set[str]:
            return {item["id"] for item in bodies[endpoint, who]["items"]}

        runs_a = {"run-a", publisher.run_id} | {f"stop-{w}" for w in CALLERS}
        runs_a |= {f"del-{w}" for w in CALLERS}
        assert ids("GET /v1/runs", "a") == runs_a
        assert ids("GET /v1/runs", "b") == {"run-b"}
        assert ids("GET /v1/runs", "op") == runs_a | {"run-b"}
        assert ids("GET /v1/runs?principal=studio-b", "op") == {"run-b"}
        assert ids("GET /v1/sessions", "a") == {session_id}
        assert ids("GET /v1/sessions", "b") == set()
        assert ids("GET /v1/sessions", "op") == {session_id}
        status, own = await api.call("GET", "/v1/runs?principal=studio-a", "a")
        assert status == 200 and {r["id"] for r in own["items"]} == runs_a

        # What the refused callers asked for did not happen.
        for who in ("b", "none", "bad"):
            assert await _types(api.timeline, f"stop-{who}") == ["run_created"]
            assert await _types(api.timeline, f"del-{who}") == ["run_created"]
        for who in ("a", "op"):
            assert (await _types(api.timeline, f"stop-{who}"))[-1] == "stop_requested"
            assert (await _types(api.timeline, f"del-{who}"))[-1] == "run_deleted"
        stop_event = (await api.timeline.read_events("stop-a", 0, 10))[-1]
        assert stop_event.data == {"by": "studio-a"}
    finally:
        await publisher.close()


async def test_anonymous_mode_is_operator_without_a_token(api_factory: Callable[..., Any]) -> None:
    api = await api_factory(principals=None)
    await api.seed("run-x", "anonymous", "cam")
    await api.seed("run-y", "somebody", "cam")
    for who in ("none", "bad"):
        status, body = await api.call("GET", "/v1/runs", who)
        assert status == 200 and {r["id"] for r in body["items"]} == {"run-x", "run-y"}
        status, body = await api.call("GET", "/v1/runs?principal=somebody", who)
        assert status == 200 and [r["id"] for r in body["items"]] == ["run-y"]
    status, body = await api.call("POST", "/v1/runs/run-y/stop", "none")
    assert status == 200 and body["run"]["state"] == "stopping"


# ---------------------------------------------------------------- GET /v1/runs


async def test_list_runs_newest_first_filters_and_cursor_paging(
    api_factory: Callable[..., Any],
) -> None:
    api = await api_factory()
    base = now_ms()
    streams = ["cam-1", "cam-2", ""]
    for i in range(24):
        await api.seed(f"run-{i:02d}", "studio-a", streams[i % 3], ts_ms=base + i)
    await api.seed("tie-1", "studio-a", "cam-1", ts_ms=base + 30)
    await api.seed("tie-2", "studio-a", "cam-1", ts_ms=base + 30)
    await api.seed("live-1", "studio-a", "cam-9", then=("session_connected",), ts_ms=base + 40)
    await api.seed("stopping-1", "studio-a", "cam-9", then=("stop_requested",), ts_ms=base + 41)
    await api.seed("ended-1", "studio-a", "cam-9", then=("session_closed",), ts_ms=base + 42)
    await api.seed("intr-1", "studio-a", "cam-9", then=("run_interrupted",), ts_ms=base + 43)
    await api.seed("gone-1", "studio-a", "cam-9", ts_ms=base + 44)
    status, _ = await api.call("DELETE", "/v1/runs/gone-1")
    assert status == 200
    await api.seed(
        "old-live", "studio-a", "cam-9", then=("session_connected",), ts_ms=base - 3_600_000
    )

    status, full = await api.call("GET", "/v1/runs?limit=1000")
    assert status == 200 and full["next"] is None
    order = [r["id"] for r in full["items"]]
    keys = [(r["created_ms"], r["id"]) for r in full["items"]]
    assert keys == sorted(keys, reverse=True), "newest first, then id descending"
    assert order[:7] == ["gone-1", "intr-1", "ended-1", "stopping-1", "live-1", "tie-2", "tie-1"]
    assert order[-1] == "old-live" and len(order) == 32

    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        query = "/v1/runs?limit=7" + (f"&cursor={cursor}" if cursor else "")
        status, page = await api.call("GET", query)
        assert status == 200
        pages.append([r["id"] for r in page["items"]])
        if len(pages) == 2:  # a run created mid-way lands before the cursor, not in later pages
            await api.seed("newcomer", "studio-a", "cam-1", ts_ms=base + 100)
        cursor = page["next"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [7, 7, 7, 7, 4]
    assert [run_id for page in pages for run_id in page] == order

    status, default = await api.call("GET", "/v1/runs")
    assert len(default["items"]) == 33 and default["next"] is None

    async def ids(query: str) -> list[str]:
        status, body = await api.call("GET", "/v1/runs?" + query)
        assert status == 200, body
        return [r["id"] for r in body["items"]]

    assert await ids("state=live") == ["live-1"]
    assert await ids("state=expired") == ["old-live"], "a silent live run reads as expired"
    assert await ids("state=stopping") == ["stopping-1"]
    assert await ids("state=ended") == ["ended-1"]
    assert await ids("state=interrupted") == ["intr-1"]
    assert await ids("state=deleted") == ["gone-1"]
    starting = await ids("state=starting")
    assert len(starting) == 27 and "newcomer" in starting
    assert await ids("stream=cam-9&state=live") == ["live-1"]
    bare = await ids("stream=")
    assert bare == [f"run-{i:02d}" for i in range(23, -1, -1) if i % 3 == 2]
    assert await ids("stream=nothing-here") == []
    cam1 = await ids("stream=cam-1&limit=3")
    assert cam1 == ["newcomer", "tie-2", "tie-1"]
    status, body = await api.call("GET", "/v1/runs?stream=cam-1&limit=3")
    rest = await ids(f"stream=cam-1&limit=1000&cursor={body['next']}")
    assert rest == [f"run-{i:02d}" for i in range(23, -1, -1) if i % 3 == 0]
    assert await ids("principal=studio-b") == []
    deleted = (await api.call("GET", "/v1/runs/gone-1"))[1]
    assert deleted["state"] == "deleted" and deleted["session_id"] == "s_gone-1"


async def test_get_run_reads_no_history(
    api_factory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = await api_factory()
    await api.seed("long-run", "studio-a", "cam", then=("session_connected",))
    for i in range(0, 3000, 500):
        await asyncio.gather(
            *(
                api.timeline.append(NewEvent("long-run", "stats", "studio-a", {"n": n}))
                for n in range(i, i + 500)
            )
        )

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("GET /v1/runs/{id} must not read the run's events")

    for name in ("read_events", "read_run_events", "read_warm", "read_cold", "wait_for_events"):
        monkeypatch.setattr(api.timeline, name, forbidden)
    monkeypatch.setattr(api.timeline.wal, "read_positions", forbidden)
    status, run = await api.call("GET", "/v1/runs/long-run")
    assert status == 200 and run["state"] == "live"
    assert set(run) >= {
        "id",
        "principal",
        "stream",
        "state",
        "created_ms",
        "last_activity_ms",
        "session_id",
    }
    status, listed = await api.call("GET", "/v1/runs")
    assert status == 200 and listed["items"][0]["id"] == "long-run"


# ---------------------------------------------------------------- bad input


async def test_bad_input_is_400_json_never_500(api_factory: Callable[..., Any]) -> None:
    api = await api_factory()
    await api.seed("run-ok", "studio-a", "cam")
    junk_cursor = base64.urlsafe_b64encode(b"-5.run-ok").decode().rstrip("=")
    huge_cursor = base64.urlsafe_b64encode(f"{2**64}.run-ok".encode()).decode().rstrip("=")
    bad_id_cursor = base64.urlsafe_b64encode(b"5.../etc").decode().rstrip("=")
    cases = {
        # path ids that are not ids
        "/v1/runs/%2e%2e": "bad_id",
        "/v1/runs/..%2F..%2Fetc%2Fpasswd": "bad_id",
        "/v1/runs/a%2Fb": "bad_id",
        "/v1/runs/a%00b": "bad_id",
        "/v1/runs/%E2%82%AC": "bad_id",
        "/v1/runs/-leading-dash": "bad_id",
        "/v1/runs/" + "x" * 129: "bad_id",
        "/v1/runs/a%20b/events": "bad_id",
        "/v1/sessions/not-a-session": "bad_id",
        "/v1/sessions/s_%2e%2e%2F%2e%2e%2FAAAAAAAAAAAAAAAA": "bad_id",
        # limits and cursors
        "/v1/runs?limit=0": "invalid_parameter",
        "/v1/runs?limit=-1": "invalid_parameter",
        "/v1/runs?limit=1001": "invalid_parameter",
        "/v1/runs?limit=abc": "invalid_parameter",
        "/v1/runs?limit=1.5": "invalid_parameter",
        "/v1/runs?limit=": "invalid_parameter",
        "/v1/runs?limit=%2B5": "invalid_parameter",
        "/v1/runs?limit=" + "9" * 40: "invalid_parameter",
        "/v1/runs?limit=5&limit=6": "invalid_parameter",
        "/v1/runs?cursor=-1": "invalid_cursor",
        "/v1/runs?cursor=99999999999999999999999999": "invalid_cursor",
        "/v1/runs?cursor=%25%25%25%25": "invalid_cursor",
        "/v1/runs?cursor=": "invalid_cursor",
        f"/v1/runs?cursor={junk_cursor}": "invalid_cursor",
        f"/v1/runs?cursor={huge_cursor}": "invalid_cursor",
        f"/v1/runs?cursor={bad_id_cursor}": "invalid_cursor",
        "/v1/runs?cursor=" + "A" * 401: "invalid_cursor",
        "/v1/runs?state=running": "invalid_parameter",
        "/v1/runs?principal=..%2Fx": "invalid_parameter",
        "/v1/runs?stream=a%2Fb": "invalid_parameter",
        "/v1/sessions?stream=%00": "invalid_parameter",
        # events
        "/v1/runs/run-ok/events?after=-1": "invalid_parameter",
        "/v1/runs/run-ok/events?after=9223372036854775808": "invalid_parameter",
        "/v1/runs/run-ok/events?after=abc": "invalid_parameter",
        "/v1/runs/run-ok/events?limit=0": "invalid_parameter",
        "/v1/runs/run-ok/events?limit=1001": "invalid_parameter",
        "/v1/runs/run-ok/events?limit=1e3": "invalid_parameter",
        "/v1/runs/run-ok/events?wait=-1": "invalid_parameter",
        "/v1/runs/run-ok/events?wait=61": "invalid_parameter",
        "/v1/runs/run-ok/events?wait=nan": "invalid_parameter",
        "/v1/runs/run-ok/events?wait=inf": "invalid_parameter",
        "/v1/runs/run-ok/events?wait=1e400": "invalid_parameter",
        "/v1/runs/run-ok/events?wait=1_0": "invalid_parameter",
        "/v1/runs/run-ok/events?wait=%201": "invalid_parameter",
    }
    for path, code in cases.items():
        status, body = await api.call("GET", path)
        assert (status, body["error"]["code"]) == (400, code), (path, body)
    for method in ("POST", "DELETE"):
        suffix = "/stop" if method == "POST" else ""
        status, body = await api.call(method, f"/v1/runs/%2e%2e{suffix}")
        assert (status, body["error"]["code"]) == (400, "bad_id")
    # authentication comes first: a bad id from nobody is 401
    status, body = await api.call("GET", "/v1/runs/%2e%2e", "none")
    assert status == 401
    # edges that are valid
    assert (await api.call("GET", "/v1/runs?limit=1000"))[0] == 200
    assert (await api.call("GET", "/v1/runs/run-ok/events?after=9223372036854775807"))[0] == 200
    assert (await api.call("GET", "/v1/runs/run-ok/events?wait=0.001&after=99"))[0] == 200
    assert (await api.call("GET", "/v1/runs/run-ok/events?wait=1e-3&after=99"))[0] == 200
    # unknown methods on API paths: 405 JSON with Allow
    async with api.http.put(api.url("/v1/runs"), headers=CALLERS["op"]) as response:
        assert response.status == 405
        assert "GET" in response.headers["Allow"]
        assert (await response.json())["error"]["code"] == "method_not_allowed"


# ---------------------------------------------------------------- events and long-poll


async def test_events_ordered_paged_and_waited(api_factory: Callable[..., Any]) -> None:
    api = await api_factory()
    await api.seed("run-e", "studio-a", "cam")
    await api.seed("other", "studio-a", "cam")
    for n in range(9):
        await api.timeline.append(NewEvent("run-e", "stats", "studio-a", {"n": n}))
        await api.timeline.append(NewEvent("other", "stats", "studio-a", {"n": n}))
    status, body = await api.call("GET", "/v1/runs/run-e/events")
    assert status == 200
    seqs = [e["seq"] for e in body["items"]]
    assert len(seqs) == 10 and seqs == sorted(seqs)
    assert {e["run_id"] for e in body["items"]} == {"run-e"}
    assert body["items"][0]["type"] == "run_created"
    assert set(body["items"][1]) == {"seq", "run_id", "type", "ts_ms", "principal", "data"}
    assert body["next"] == seqs[-1]

    paged: list[int] = []
    after = 0
    while True:
        status, page = await api.call("GET", f"/v1/runs/run-e/events?after={after}&limit=4")
        paged += [e["seq"] for e in page["items"]]
        if not page["items"]:
            assert page["next"] == after
            break
        after = page["next"]
    assert paged == seqs

    started = time.monotonic()
    status, empty = await api.call("GET", f"/v1/runs/run-e/events?after={seqs[-1]}&wait=0.3")
    waited = time.monotonic() - started
    assert status == 200 and empty == {"items": [], "next": seqs[-1]}
    assert 0.25 <= waited < 5
    status, body = await api.call("GET", "/v1/runs/never-seen/events?wait=5")
    assert status == 404


async def test_long_poll_wakes_100_waiters_and_answers_at_once_when_behind(
    api_factory: Callable[..., Any],
) -> None:
    api = await api_factory()
    last = await api.seed("run-w", "studio-a", "cam")

    # An event appended just before the waiter starts: answered at once.
    early = await api.timeline.append(NewEvent("run-w", "stats", "studio-a", {"n": 1}))
    started = time.monotonic()
    status, body = await api.call("GET", f"/v1/runs/run-w/events?after={last}&wait=30")
    assert status == 200 and [e["seq"] for e in body["items"]] == [early]
    assert time.monotonic() - started < 2

    waiters = [
        asyncio.create_task(
            api.call("GET", f"/v1/runs/run-w/events?after={early}&wait=30", "a"),
            name=f"waiter-{i}",
        )
        for i in range(100)
    ]

    def all_parked() -> bool:  # a barrier on the waiter count, not a sleep
        assert not any(w.done() for w in waiters), [w.result() for w in waiters if w.done()]
        return api.timeline.waiters.waiting() >= 100

    await eventually(
        all_parked,
        within=20,
        awaiting=lambda: f"100 long-polls parked, {api.timeline.waiters.waiting()} are",
        every=0.01,
    )
    woke_at = time.monotonic()
    seq = await api.timeline.append(NewEvent("run-w", "stats", "studio-a", {"n": 2}))
    answers = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert time.monotonic() - woke_at < 5
    assert all(status == 200 for status, _ in answers)
    assert all([e["seq"] for e in body["items"]] == [seq] for _, body in answers)
    assert all(body["next"] == seq for _, body in answers)
    assert api.timeline.waiters.waiting() == 0


async def test_pending_long_polls_answer_at_once_at_shutdown(
    api_factory: Callable[..., Any],
) -> None:
    api = await api_factory()
    last = await api.seed("run-sd", "studio-a", "cam")
    waiters = [
        asyncio.create_task(
            api.call("GET", f"/v1/runs/run-sd/events?after={last}&wait=60"), name=f"poll-{i}"
        )
        for i in range(5)
    ]

    def all_parked() -> bool:
        assert not any(w.done() for w in waiters)
        return api.timeline.waiters.waiting() >= 5

    await eventually(all_parked, within=20, awaiting="5 long-polls parked", every=0.01)
    started = time.monotonic()
    await api.server.close()
    answers = await asyncio.gather(*waiters)
    assert time.monotonic() - started < 10, "shutdown is not held up by long-polls"
    assert answers == [(200, {"items": [], "next": last})] * 5


# ---------------------------------------------------------------- stop


async def test_stop_decisions_and_single_transaction(api_factory: Callable[..., Any]) -> None:
    api = await api_factory()
    await api.seed("run-s", "studio-a", "cam", then=("session_connected",))
    status, first = await api.call("POST", "/v1/runs/run-s/stop", "a")
    assert status == 200 and first["repeat"] is False
    assert first["run"]["state"] == "stopping", "no live session here to close"
    status, again = await api.call("POST", "/v1/runs/run-s/stop", "op")
    assert status == 200 and again["repeat"] is True and again["seq"] == first["seq"]
    assert (await _types(api.timeline, "run-s")).count("stop_requested") == 1

    for run_id, then in (
        ("run-ended", ("session_closed",)),
        ("run-intr", ("run_interrupted",)),
        ("run-del", ()),
    ):
        await api.seed(run_id, "studio-a", "cam", then=then)
        if run_id == "run-del":
            assert (await api.call("DELETE", f"/v1/runs/{run_id}"))[0] == 200
        status, body = await api.call("POST", f"/v1/runs/{run_id}/stop")
        assert (status, body["error"]["code"]) == (409, "not_live"), run_id
        assert "stop_requested" not in await _types(api.timeline, run_id)
    assert (await api.call("POST", "/v1/runs/never-seen/stop"))[0] == 404
    assert api.timeline.runs.get("never-seen") is None

    await api.seed("run-race", "studio-a", "cam")
    answers = await asyncio.gather(
        *(api.call("POST", "/v1/runs/run-race/stop", "op") for _ in range(10))
    )
    assert {status for status, _ in answers} == {200}
    assert len({body["seq"] for _, body in answers}) == 1
    assert sorted(body["repeat"] for _, body in answers) == [False] + [True] * 9
    assert (await _types(api.timeline, "run-race")).count("stop_requested") == 1


async def test_stop_and_delete_close_live_sessions(api_factory: Callable[..., Any]) -> None:
    api = await api_factory()
    stopped = await _publish(api, "a", "cam-stop")
    deleted = await _publish(api, "a", "cam-del")
    try:
        stopped_session = stopped.location.rsplit("/", 1)[1]
        status, body = await api.call("POST", f"/v1/runs/{stopped.run_id}/stop", "a")
        assert status == 200 and body["repeat"] is False
        assert body["run"]["state"] == "ended"
        assert body["run"]["session_id"] == stopped_session
        events = await api.timeline.read_events(stopped.run_id, 0, 100)
        lifecycle = [e for e in events if e.type not in ("first_frame", "stats")]
        assert [e.type for e in lifecycle] == [
            "run_created",
            "session_connected",
            "stop_requested",
            "session_closed",
        ]
        assert lifecycle[-1].data == {"reason": "stopped"}
        assert body["seq"] == lifecycle[2].seq
        assert (await api.call("GET", f"/v1/sessions/{stopped_session}", "a"))[0] == 404
        status, body = await api.call("POST", f"/v1/runs/{stopped.run_id}/stop", "a")
        assert (status, body["error"]["code"]) == (409, "not_live")

        status, body = await api.call("DELETE", f"/v1/runs/{deleted.run_id}", "op")
        assert status == 200 and body["repeat"] is False
        assert body["event"]["type"] == "run_deleted"
        events = await api.timeline.read_events(deleted.run_id, 0, 100)
        assert [e.data for e in events if e.type == "session_closed"] == [{"reason": "stopped"}]
        status, run = await api.call("GET", f"/v1/runs/{deleted.run_id}", "a")
        assert status == 200 and run["state"] == "deleted"
        assert len(api.manager.table) == 0
        assert (await api.call("GET", "/v1/sessions"))[1]["items"] == []
    finally:
        await stopped.close()
        await deleted.close()


# ---------------------------------------------------------------- delete


async def test_delete_single_winner_idempotent_and_404_for_unknown(
    api_factory: Callable[..., Any],
) -> None:
    api = await api_factory()
    await api.seed("run-d", "studio-a", "cam")
    status, first = await api.call("DELETE", "/v1/runs/run-d", "a")
    assert status == 200 and first["repeat"] is False
    assert first["event"]["type"] == "run_deleted" and first["event"]["run_id"] == "run-d"
    status, again = await api.call("DELETE", "/v1/runs/run-d", "op")
    assert status == 200 and again["repeat"] is True
    assert again["event"]["seq"] == first["event"]["seq"]
    assert again["event"]["data"]["already_deleted"] is True
    assert (await _types(api.timeline, "run-d")).count("run_deleted") == 1

    last_seq = api.timeline.snapshot.last_seq
    status, body = await api.call("DELETE", "/v1/runs/never-seen")
    assert (status, body["error"]["code"]) == (404, "not_found")
    assert api.timeline.snapshot.last_seq == last_seq, "nothing appended for an unknown id"
    assert api.timeline.runs.get("never-seen") is None
    assert "never-seen" not in {v.run_id for v in api.timeline.runs.list_runs()}

    await api.seed("run-race", "studio-b", "cam")
    answers = await asyncio.gather(
        *(api.call("DELETE", "/v1/runs/run-race", who) for who in ("b", "op") * 10)
    )
    assert {status for status, _ in answers} == {200}
    assert sorted(body["repeat"] for _, body in answers) == [False] + [True] * 19
    assert len({body["event"]["seq"] for _, body in answers}) == 1
    assert (await _types(api.timeline, "run-race")).count("run_deleted") == 1


# ---------------------------------------------------------------- sessions


async def test_session_statistics_from_a_real_push(api_factory: Callable[..., Any]) -> None:
    api = await api_factory()
    publisher = await _publish(api, "b", "stats-cam")
    try:
        session_id = publisher.location.rsplit("/", 1)[1]

        async def measured() -> dict[str, Any] | None:
            status, session = await api.call("GET", f"/v1/sessions/{session_id}", "b")
            assert status == 200
            if session["fps"] is not None and (session["packets_received"] or 0) > 0:
                return dict(session)
            return None

        session = await eventually(
            measured, within=20, awaiting="an fps and received packets", every=0.2
        )
        assert session["fps"] is not None, session
        assert session["id"] == session_id and session["run_id"] == publisher.run_id
        assert (session["principal"], session["stream"]) == ("studio-b", "stats-cam")
        assert session["state"] == "connected" and session["connected"] is True
        assert session["codec"] in ("VP8", "H264") and session["width"] == 640
        assert session["height"] == 480
        assert 1 <= session["fps"] <= 60
        assert session["bitrate_bps"] > 0
        assert session["packets_received"] > 0 and session["packets_lost"] >= 0
        assert session["jitter_ms"] is not None and session["jitter_ms"] >= 0
        assert session["workers"] >= 1 and session["workers_detached"] == 0
        assert session["queue_depth"] >= 0 and session["drops"] >= 0
        assert session["age_s"] > 0
        kinds = sorted(t["kind"] for t in session["tracks"])
        assert "video" in kinds
        video = next(t for t in session["tracks"] if t["kind"] == "video")
        assert video["frames_decoded"] > 0 and video["queue_limit"] > 0
        assert video["worker_alive"] is True and video["packets_received"] > 0

        status, listed = await api.call("GET", "/v1/sessions?stream=stats-cam", "op")
        assert status == 200 and [s["id"] for s in listed["items"]] == [session_id]
        assert listed["next"] is None
        status, listed = await api.call("GET", "/v1/sessions?stream=other", "op")
        assert listed["items"] == []
        status, listed = await api.call("GET", "/v1/sessions?principal=studio-a", "op")
        assert listed["items"] == []
    finally:
        await publisher.close()
