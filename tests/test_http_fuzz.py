"""Property-based fuzzing (Hypothesis) of every HTTP route with bad input, over raw sockets.

A real server runs on 127.0.0.1 (the test's event loop); Hypothesis runs in a worker
thread and speaks HTTP/1.1 over plain blocking sockets, so nothing normalises the
hostility away: raw request targets (``..``, ``%2e%2e``, ``%2f``, backslashes, NULs, bad
percent-encoding), header bytes a client library would refuse, duplicated framing
headers, bad chunking, broken content codings, bodies sent after a pause.

Properties, for every case:

- the answer is never a 5xx;
- every 4xx the application produces is the JSON error shape of ARCHITECTURE.md
  (``{"error": {"code", "message"}}``, ``Content-Type: application/json``, UTF-8 without
  lone surrogates);
- a 4xx that is *not* JSON must be one of aiohttp's parser rejections (below), and only
  for a request this test deliberately malformed at the HTTP/1.1 level;
- ``GET /healthz`` answers 200 after every case (the server stays up), and ``/readyz``
  is still 200 at the end;
- no answer ever carries the bytes of a file planted next to the data directory's
  thumbnails (path tricks cannot reach the filesystem).

What aiohttp rejects before the application (``RequestHandler.handle_error``: 400,
``text/plain``, status line ``HTTP/1.0``, connection closed; no middleware, signal or
route runs, because the request never became a ``Request`` with a match): an invalid
method token (``BREW``, ``get``); a byte outside ``0x21-0x7e`` in the request target (NUL,
space, raw UTF-8); a request line or header field longer than
``limits.max_header_bytes``; more than 128 header fields; a control character in a
header value, a separator in a header name; obs-fold; LF-only line ends; an unknown
HTTP version; no ``Host`` on HTTP/1.1; a header aiohttp takes once (``Content-Type``,
``Host``, ``User-Agent``, ``Content-Length``, ...) given twice; ``Content-Length`` that is
negative, not a number or overflows, or comes with ``Transfer-Encoding``; a
``Transfer-Encoding`` that does not end in ``chunked``; a bad chunk size or framing, or a
body that fails its ``Content-Encoding``, found in the same read as the headers; a
``Content-Encoding`` aiohttp cannot decode at all (``br``/``zstd`` without their
packages); bytes after the body that cannot start a request, or any bytes after a
``Connection: close`` request, in the same read (the complete request before them is
dropped with the rest). The application cannot make these JSON short of replacing
aiohttp's protocol handler (there is no public hook), and should not: the peer is not
speaking HTTP/1.1, and the connection is closed. They are counted per test and printed.

Found after the request was dispatched (the body arrives in a later read), a content
coding error fails the body stream: 400 ``bad_body`` (JSON). Broken chunk framing at that
point does not (aiohttp queues its own 400 behind the request): the body deadline
answers 408 ``request_timeout``.

Each test states how many cases it ran (printed, and asserted against its
``max_examples``); examples are derandomized, so the counts are reproducible.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import socket
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote_plus

import aiohttp
import pytest
from aiohttp.http_parser import SINGLETON_HEADERS
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from registry.events import NewEvent
from tests.support.peers import AiortcPublisher
from tests.support.servers import make_config
from whip.app import create_app
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.auth import hash_token
from whip.cli import configure_ice
from whip.rtc.ice_restart import bundle_ice_transport, ice_connection

pytestmark = pytest.mark.filterwarnings(
    # The live server (aiortc on the loop, concurrently) draws from `random` while
    # Hypothesis generates in its thread; Hypothesis takes that for the strategy's use.
    "ignore:Do not use the `random` module inside strategies"
    ":hypothesis.errors.HypothesisDeprecationWarning"
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sdp"
OPERATOR = "fuzz-operator-token"
PUBLISHER = "fuzz-publisher-token"
PRINCIPALS = [
    {"name": "ops", "role": "operator", "token_sha256": hash_token(OPERATOR)},
    {"name": "studio-a", "role": "publisher", "token_sha256": hash_token(PUBLISHER)},
]
SEEDED_RUNS = ("r_fuzzseededrun000000001", "r_fuzzseededrun000000002", "r_fuzz.seeded:run-3")
THUMBNAIL = b"\xff\xd8\xff\xe0fuzz-thumbnail\xff\xd9"
SECRET = b"SECRET-" + b"0123456789abcdef" * 4
MAX_WAIT_S = 0.05
"""Long-polls are capped at this (a valid ``wait`` on a real run would block the case)."""
SPLIT_PAUSE_S = 0.005
"""Pause between the headers and the body of a "split" case (the body then arrives after
aiohttp has dispatched the request)."""
SDP_LIMIT = 32 * 1024
LIVE_STREAM = "fuzz-live-publisher"

# ------------------------------------------------------------------ the routes

# fmt: off
ROUTES: dict[tuple[str, str], str] = {
    ("POST", "/whip"): "offer", ("OPTIONS", "/whip"): "empty", ("GET", "/whip"): "empty",
    ("HEAD", "/whip"): "empty", ("PUT", "/whip"): "offer", ("POST", "/whip/{stream}"): "offer",
    ("OPTIONS", "/whip/{stream}"): "empty", ("GET", "/whip/{stream}"): "empty",
    ("HEAD", "/whip/{stream}"): "empty", ("PUT", "/whip/{stream}"): "offer",
    ("DELETE", "/whip/sessions/{session_id}"): "empty",
    ("PATCH", "/whip/sessions/{session_id}"): "trickle",
    ("OPTIONS", "/whip/sessions/{session_id}"): "empty",
    ("GET", "/whip/sessions/{session_id}"): "empty",
    ("HEAD", "/whip/sessions/{session_id}"): "empty",
    ("POST", "/whip/sessions/{session_id}"): "offer",
    ("PUT", "/whip/sessions/{session_id}"): "offer", ("GET", "/healthz"): "empty",
    ("HEAD", "/healthz"): "empty", ("GET", "/readyz"): "empty", ("HEAD", "/readyz"): "empty",
    ("GET", "/metrics"): "empty", ("HEAD", "/metrics"): "empty",
    ("GET", "/v1/openapi.json"): "empty", ("GET", "/v1/runs"): "empty",
    ("GET", "/v1/runs/{run_id}"): "empty", ("DELETE", "/v1/runs/{run_id}"): "json",
    ("GET", "/v1/runs/{run_id}/events"): "empty", ("POST", "/v1/runs/{run_id}/stop"): "json",
    ("GET", "/v1/runs/{run_id}/thumbnail.jpg"): "empty", ("GET", "/v1/sessions"): "empty",
    ("GET", "/v1/runs/{run_id}/recordings"): "empty",
    ("GET", "/v1/runs/{run_id}/recordings/{name}"): "empty",
    ("DELETE", "/v1/runs/{run_id}/recordings"): "empty",
    ("GET", "/v1/sessions/{session_id}"): "empty", ("GET", "/"): "empty",
    ("GET", "/ui/"): "empty", ("GET", "/ui/{name}"): "empty",
    ("GET", "/v1/webhooks"): "empty",
}
# fmt: on
"""Every routed (method, path) and the body kind it takes; the fuzz draws from this table
and ``test_every_route_is_fuzzed`` checks it against the router, both ways."""

OTHER_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND")
"""Methods sent to any path besides the routed ones (405 or 404 answers)."""

DESTRUCTIVE = {
    ("DELETE", "/whip/sessions/{session_id}"),
    ("DELETE", "/v1/runs/{run_id}"),
    ("POST", "/v1/runs/{run_id}/stop"),
}
"""Operations that would end the live session: they get seeded or made-up ids only."""


def routed(app: Any) -> set[tuple[str, str]]:
    """(method, path template) of every route of ``app``."""
    found = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        found.add((route.method, str(info.get("path") or info.get("formatter"))))
    return found


# ------------------------------------------------------------------ raw HTTP/1.1


@dataclass(frozen=True, repr=False)
class Req:
    """One request as bytes on the wire. ``malformed`` names what in it is invalid at the
    HTTP/1.1 level (aiohttp's parser may reject it before the application); empty for a
    well-formed request, which the application itself must answer."""

    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes = b""
    malformed: frozenset[str] = frozenset()
    version: bytes = b"HTTP/1.1"
    eol: bytes = b"\r\n"
    split: int | None = None
    """Send the body from this offset on after a pause (it then arrives after aiohttp
    has dispatched the request to the application)."""
    raw_body: bytes | None = None
    """Sent instead of ``body`` (already framed, e.g. chunked); ``body`` stays the payload."""
    route: tuple[str, str] | None = None
    """The (method, path template) this request was drawn for."""
    expect: str | None = None
    """The error code this request must get (explicit regression examples)."""

    def wire(self) -> list[bytes]:
        head = self.method + b" " + self.target + b" " + self.version + self.eol
        head += b"".join(name + b": " + value + self.eol for name, value in self.headers)
        payload = self.body if self.raw_body is None else self.raw_body
        if self.split is not None and payload:
            return [head + self.eol + payload[: self.split], payload[self.split :]]
        return [head + self.eol + payload]

    def with_header(self, name: bytes, value: bytes, *why: str) -> Req:
        return replace(
            self, headers=(*self.headers, (name, value)), malformed=self.malformed | set(why)
        )

    def without(self, name: bytes) -> Req:
        lower = name.lower()
        return replace(self, headers=tuple(h for h in self.headers if h[0].lower() != lower))

    def bad(self, *why: str, **changes: Any) -> Req:
        return replace(self, malformed=self.malformed | set(why), **changes)

    def show(self) -> str:
        text = b"".join(self.wire())
        return repr(text[:600]) + (f" ... ({len(text)} bytes)" if len(text) > 600 else "")

    def __repr__(self) -> str:
        return f"<Req {self.show()} malformed={sorted(self.malformed)}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # Hypothesis prints failing cases: no multi-kB bodies


@dataclass(frozen=True)
class Reply:
    version: str
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        lower = name.lower()
        return next((v for k, v in self.headers if k == lower), None)

    @property
    def media_type(self) -> str:
        return (self.header("content-type") or "").split(";")[0].strip().lower()


class NoReplyError(AssertionError):
    pass


def _parse(buffer: bytes, head_only: bool, eof: bool) -> Reply | None:
    """The first final response in ``buffer`` (1xx skipped), or None if incomplete."""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = buffer[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        status = int(rest[:3])
        headers = tuple(
            (k.strip().lower(), v.strip())
            for k, _, v in (line.partition(":") for line in lines[1:])
        )
        buffer = buffer[end + 4 :]
        if 100 <= status < 200:
            continue
        reply = Reply(version, status, headers, b"")
        if head_only or status in (204, 304):
            return reply
        length = reply.header("content-length")
        if length is not None:
            if len(buffer) < int(length):
                return None
            return replace(reply, body=buffer[: int(length)])
        if "chunked" in (reply.header("transfer-encoding") or "").lower():
            body = _dechunk(buffer)
            return None if body is None else replace(reply, body=body)
        return replace(reply, body=buffer) if eof else None


def _dechunk(data: bytes) -> bytes | None:
    body = b""
    while True:
        end = data.find(b"\r\n")
        if end < 0:
            return None
        size = int(data[:end].split(b";")[0], 16)
        if size == 0:
            return body
        if len(data) < end + 2 + size + 2:
            return None
        body += data[end + 2 : end + 2 + size]
        data = data[end + 2 + size + 2 :]


def exchange(port: int, req: Req, timeout: float = 20.0) -> Reply:
    """Send ``req`` on a new connection and read its answer (blocking)."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        for n, part in enumerate(req.wire()):
            if n:
                time.sleep(SPLIT_PAUSE_S)
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                break  # answered (and closed) before the whole body was sent
        while True:
            reply = _parse(received, req.method == b"HEAD", eof=False)
            if reply is not None:
                return reply
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                reply = _parse(received, req.method == b"HEAD", eof=True)
                if reply is None:
                    raise NoReplyError(f"no answer to {req.show()}; got {received[:300]!r}")
                return reply
            received += chunk


def request(
    method: str | bytes,
    target: str | bytes,
    *,
    headers: Iterable[tuple[bytes, bytes]] = (),
    body: bytes = b"",
    auth: bytes | None = None,
    content_type: bytes | None = None,
) -> Req:
    """A well-formed request (``Host``, ``Connection: close``, ``Content-Length``)."""
    method = method.encode() if isinstance(method, str) else method
    if isinstance(target, str):  # chars < 256 are bytes (drawn so), others raw UTF-8
        target = b"".join(c.encode("latin-1" if ord(c) < 256 else "utf-8") for c in target)
    head: list[tuple[bytes, bytes]] = [(b"Host", b"127.0.0.1"), (b"Connection", b"close")]
    if auth is not None:
        head.append((b"Authorization", auth))
    if content_type is not None:
        head.append((b"Content-Type", content_type))
    head.extend(headers)
    if body or method in (b"POST", b"PUT", b"PATCH"):
        head.append((b"Content-Length", str(len(body)).encode()))
    req = Req(method, target, tuple(head), body)
    return _classify(req)


_TARGET_OK = re.compile(rb"[\x21-\x7e]*")
_NAME_OK = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
SINGLETONS = [name.encode() for name in SINGLETON_HEADERS]
"""Headers aiohttp refuses to see twice."""
MAX_LINE = 8 * 1024 - 100
"""Lines at or above this length may hit aiohttp's line limit (``max_header_bytes``)."""


def _classify(req: Req) -> Req:
    """Mark what in ``req`` is malformed HTTP/1.1 (what aiohttp's parser may reject)."""
    why: set[str] = set()
    if not _TARGET_OK.fullmatch(req.target):
        why.add("target bytes")
    if len(req.method) + len(req.target) + 10 >= MAX_LINE:
        why.add("long request line")
    for name, value in req.headers:
        if not _NAME_OK.fullmatch(name):
            why.add("header name")
        if _VALUE_BAD.search(value):
            why.add("header value control char")
        if len(name) + len(value) + 2 >= MAX_LINE:
            why.add("long header")
    if len(req.headers) > 100:
        why.add("too many headers")
    names = Counter(name.lower() for name, _ in req.headers)
    if any(names[name] > 1 for name in SINGLETONS):
        why.add("repeated singleton header")
    return replace(req, malformed=req.malformed | why) if why else req


HEALTHZ = request("GET", "/healthz")


# ------------------------------------------------------------------ the properties


def is_parser_rejection(reply: Reply) -> bool:
    """aiohttp's own 400 for a message it could not parse (module doc)."""
    return reply.status == 400 and reply.media_type == "text/plain" and reply.version == "HTTP/1.0"


def assert_json_error(reply: Reply, req: Req) -> None:
    assert reply.media_type == "application/json", (reply, req.show())
    if req.method == b"HEAD":
        return
    text = reply.body.decode("utf-8")  # strict: the answer is UTF-8
    doc = json.loads(text)
    assert set(doc) == {"error"}, doc
    error = doc["error"]
    assert set(error) >= {"code", "message"}, doc
    assert isinstance(error["code"], str) and re.fullmatch(r"[a-z][a-z_]*", error["code"]), doc
    assert isinstance(error["message"], str) and error["message"], doc
    error["message"].encode("utf-8")  # no lone surrogates (strict JSON parsers refuse them)


@dataclass
class Tally:
    """Cases run by one test, by status, and aiohttp's parser rejections by cause."""

    name: str
    port: int
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    routes: Counter[tuple[str, str]] = field(default_factory=Counter)
    checks: list[Callable[[Req, Reply], None]] = field(default_factory=list)

    def run(self, req: Req) -> Reply:
        """Send ``req``, check every property, check that the server is still up."""
        self.cases += 1
        if req.route is not None:
            self.routes[req.route] += 1
        reply = exchange(self.port, req)
        self.statuses[reply.status] += 1
        assert reply.status < 500, f"{reply.status} {reply.body[:300]!r} for {req.show()}"
        assert SECRET not in reply.body, req.show()
        if reply.status >= 400:
            if is_parser_rejection(reply):
                assert req.malformed, f"parser rejected a well-formed request: {req.show()}"
                self.rejected[" + ".join(sorted(req.malformed))] += 1
            else:
                assert_json_error(reply, req)
                if req.method != b"HEAD":
                    self.codes[json.loads(reply.body)["error"]["code"]] += 1
        if req.expect is not None:
            code = json.loads(reply.body)["error"]["code"] if reply.status >= 400 else None
            assert code == req.expect, (reply, req.show())
        for check in self.checks:
            check(req, reply)
        health = exchange(self.port, HEALTHZ)
        assert health.status == 200 and json.loads(health.body) == {"status": "ok"}, req.show()
        return reply

    def report(self, capsys: pytest.CaptureFixture[str], at_least: int) -> None:
        with capsys.disabled():
            print(
                f"\n{self.name}: {self.cases} cases; statuses {dict(sorted(self.statuses.items()))}"
                f"; error codes {dict(self.codes.most_common())}"
                f"; aiohttp parser rejections {sum(self.rejected.values())}"
                f" {dict(self.rejected.most_common())}"
            )
        assert self.cases >= at_least, (self.cases, at_least)


def fuzz_settings(max_examples: int) -> Callable[[Any], Any]:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )


# ------------------------------------------------------------------ the server


@dataclass(frozen=True)
class World:
    """A running server and the real ids in it."""

    port: int
    live_run: str | None = None
    live_session: str | None = None
    live_ufrag: str | None = None
    live_etag: Callable[[], str] | None = None
    """The live session's ETag of the moment (it changes with every ICE restart)."""

    def run_ids(self, destructive: bool) -> list[str]:
        ids = list(SEEDED_RUNS)
        if self.live_run is not None and not destructive:
            ids.append(self.live_run)
        return ids

    def session_ids(self, destructive: bool) -> list[str]:
        ids = ["s_AAAAAAAAAAAAAAAAAAAAAA", "s_fuzz-unknown_session1"]
        if self.live_session is not None and not destructive:
            ids = [self.live_session] * 3 + ids
        return ids


@contextlib.asynccontextmanager
async def fuzz_server(tmp_path: Path, *, live: bool = False) -> AsyncIterator[World]:
    """A server with seeded runs (and a connected aiortc publisher when ``live``).

    Limits for fuzzing: no rate limits (they would turn cases into 429s); 8 active runs
    per principal, so valid offers reach aiortc while sessions stay far below the session
    cap and media budget (their 503s are the contract, not a bug); a 5 s connect deadline
    reclaims the sessions of fuzzed offers (they never connect); a 1 s body deadline. The
    live publisher pushes to a stream no strategy names (a push there would supersede it).
    """
    config = make_config(
        tmp_path,
        PRINCIPALS,
        limits__stream_limit=8,
        limits__rate_per_address_per_s=0,
        limits__rate_per_principal_per_s=0,
        limits__body_timeout_s=1,
        limits__connect_timeout_s=5,
    )
    configure_ice(config)
    data_dir = config.server.data_dir
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    publisher = AiortcPublisher() if live else None
    try:
        timeline = server.app[TIMELINE_KEY]
        for run_id in SEEDED_RUNS:
            await timeline.append(NewEvent(run_id, "run_created", "seeder", {"stream": "cam"}))
            for n in range(3):
                await timeline.append(NewEvent(run_id, "stats", "seeder", {"n": n}))
        (data_dir / "thumbnails").mkdir(parents=True, exist_ok=True)
        (data_dir / "thumbnails" / f"{SEEDED_RUNS[0]}.jpg").write_bytes(THUMBNAIL)
        for planted in (data_dir / "secret.jpg", data_dir.parent / "secret.jpg"):
            planted.write_bytes(SECRET)
        world = World(server.port)
        if publisher is not None:
            async with aiohttp.ClientSession() as http:
                url = str(server.make_url(f"/whip/{LIVE_STREAM}"))
                auth = {"Authorization": f"Bearer {PUBLISHER}"}
                response = await publisher.publish(http, url, auth)
                assert response.status == 201, await response.text()
            await asyncio.wait_for(publisher.connected.wait(), 20)
            # Fuzzed PATCHes restart ICE with credentials this publisher never learns; its
            # own consent checks would then expire (~30 s) and end the push being probed.
            consent = ice_connection(bundle_ice_transport(publisher.pc))._query_consent_task
            if consent is not None:
                consent.cancel()
            sdp = str(publisher.pc.localDescription.sdp)
            ufrag = re.search(r"a=ice-ufrag:(\S+)", sdp)
            world = replace(
                world,
                live_run=publisher.run_id,
                live_session=publisher.location.rsplit("/", 1)[1],
                live_ufrag=ufrag.group(1) if ufrag else None,
                live_etag=lambda: server.app[SESSIONS_KEY].table.live()[0].etag,
            )
        yield world
        for path in ("/healthz", "/readyz"):
            reply = await asyncio.to_thread(exchange, server.port, request("GET", path))
            assert reply.status == 200, (path, reply)
        if publisher is not None:
            assert publisher.pc.connectionState == "connected", publisher.states
    finally:
        if publisher is not None:
            await publisher.close()
        await server.close()


# ------------------------------------------------------------------ strategies

# fmt: off
GOOD_OFFERS = [
    (FIXTURES / f"{name}.sdp").read_bytes()
    for name in (
        "obs_h264_opus", "ffmpeg_whip_h264_opus", "chrome_multi_codec", "chrome_video_datachannel",
        "gstreamer_webrtcbin", "video_only_vp8", "audio_only_opus",
    )
]
# fmt: on
BAD_OFFERS = [path.read_bytes() for path in sorted(FIXTURES.glob("bad_*.sdp"))]
MUTABLE_OFFERS = [
    b"".join(line for line in offer.splitlines(keepends=True) if b"a=candidate" not in line)
    for offer in GOOD_OFFERS
]
"""Offers to cut and mutate, without candidate lines: a mutated address must never make
the server send STUN checks anywhere but loopback."""


def _pad(size: int) -> bytes:
    offer = MUTABLE_OFFERS[0]
    line = b"a=x-pad:" + b"p" * 100 + b"\r\n"
    return offer + line * ((size - len(offer)) // len(line) + 1)


@st.composite
def _truncated(draw: st.DrawFn) -> bytes:
    offer = draw(st.sampled_from(MUTABLE_OFFERS))
    return offer[: draw(st.integers(0, len(offer)))]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    lines = draw(st.sampled_from(MUTABLE_OFFERS)).split(b"\r\n")
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "swap", "byte", "insert", "blank"]))
        if op == "drop" and len(lines) > 1:
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "byte" and lines[i]:
            k = draw(st.integers(0, len(lines[i]) - 1))
            lines[i] = lines[i][:k] + bytes([draw(st.integers(0, 255))]) + lines[i][k + 1 :]
        elif op == "insert":
            lines.insert(i, draw(st.binary(max_size=40) | st.text(max_size=40).map(str.encode)))
        elif op == "blank":
            lines[i] = b" " * draw(st.integers(0, 3)) + lines[i]
    eol = draw(st.sampled_from([b"\r\n", b"\n", b"\r", b"\n\r"]))
    return eol.join(lines)


_SDP_LINE = st.tuples(
    st.sampled_from("vosctmaiqbzeukr=A1 "),
    st.text(alphabet=st.sampled_from("0123456789 :/=;.abcHIJmrtpfx-\t*"), max_size=60),
).map(lambda kv: f"{kv[0]}={kv[1]}")

# fmt: off
SDP_BODIES = st.one_of(
    st.sampled_from(GOOD_OFFERS + BAD_OFFERS), _truncated(), _mutated(), st.binary(max_size=4096),
    st.lists(_SDP_LINE, max_size=40).map(lambda ls: ("v=0\r\n" + "\r\n".join(ls)).encode()),
    st.sampled_from(
        [
            b"", b"\x00" * 64, b"\xef\xbb\xbf" + GOOD_OFFERS[0],
            GOOD_OFFERS[0].decode().encode("utf-16"),
            GOOD_OFFERS[0].replace(b"s=-", b"s=\xe9t\xe9"),
            GOOD_OFFERS[0].replace(b"s=-", b"s=\xed\xa0\x80"), GOOD_OFFERS[0] + b"\x00",
            b"v=0\r\n" + b"a=" + b"x" * (SDP_LIMIT - 10),
            b"v=0\r\n" + b"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" * 600, _pad(SDP_LIMIT + 1),
            _pad(60 * 1024), _pad(70 * 1024), _pad(300 * 1024), b"v=0\r\n" * 10000,
        ]
    ),
    st.builds(
        lambda offer, at, junk: offer[:at] + junk + offer[at:],
        st.sampled_from(MUTABLE_OFFERS), st.integers(0, 300),
        st.binary(min_size=1, max_size=8).filter(lambda b: any(c >= 0x80 for c in b)),
    ),
)
# fmt: on

_GOOD_FRAGMENT_LINES = [
    b"a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host",
    b"a=candidate:2 1 UDP 1 127.0.0.1 65535 typ host generation 0",
    b"a=candidate:3 1 tcp 1 127.0.0.1 9 typ host tcptype active",
    b"a=candidate:4 1 udp 1 ::1 9 typ host",
    b"a=candidate:6 1 udp 1 127.0.0.1 9 typ relay raddr 127.0.0.1 rport 9",
    b"a=end-of-candidates",
    b"a=ice-ufrag:restart",
    b"a=ice-pwd:0123456789abcdefghijkl",
    b"a=mid:0",
    b"m=audio 9 UDP/TLS/RTP/SAVPF 0",
    b"a=x-unknown:1",
]
"""Lines a fragment may hold (candidates name loopback only: each one makes the server
send STUN checks to its address)."""
# fmt: off
_CANDIDATES = [
    *_GOOD_FRAGMENT_LINES, b"a=candidate:5 1 udp 1 127.0.0.1 99999 typ host",
    b"a=candidate:7 1 udp 99999999999 127.0.0.1 9 typ host",
    b"a=candidate:8 0 udp 1 127.0.0.1 9 typ host", b"a=candidate:", b"a=candidate:x",
    b"a=candidate:1 1 udp 1 127.0.0.1 9 typ bogus", b"c=IN IP4 127.0.0.1", b"x", b"a=",
    b"\xff\xfe",
]
# fmt: on


def trickle_bodies(world: World) -> st.SearchStrategy[bytes]:
    good = list(_GOOD_FRAGMENT_LINES)
    if world.live_ufrag is not None:
        good += [b"a=ice-ufrag:" + world.live_ufrag.encode()] * 3

    def fragments(lines: list[bytes]) -> st.SearchStrategy[bytes]:
        return st.lists(st.sampled_from(lines), max_size=40).flatmap(
            lambda ls: st.sampled_from([b"\r\n", b"\n"]).map(lambda eol: eol.join(ls) + eol)
        )

    return st.one_of(
        fragments(good),
        fragments(good + _CANDIDATES),
        st.binary(max_size=512),
        st.sampled_from([b"", b"a=candidate:1 1 udp 1 127.0.0.1 9 typ host\r\n" * 33]),
        st.just(b"a=x-pad:" + b"y" * (16 * 1024)),
    )


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
# fmt: off
JSON_BODIES = st.one_of(
    _JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    _JSON_VALUES.map(lambda v: json.dumps(v).encode()[:-1]),
    st.sampled_from(
        [
            b"{", b"{'a': 1}", b'{"a": NaN}', b'{"a": 1,}',
            b"[" * 5000,
            b'{"a":' * 2000, b"1e99999", b'"\\ud800"', b"\xff\xfe{}", b"null",
            b'{"reason": "' + b"x" * 50_000 + b'"}',
        ]
    ),
)
# fmt: on

BODIES_BY_KIND: dict[str, st.SearchStrategy[bytes]] = {
    "offer": SDP_BODIES,
    "json": JSON_BODIES,
    "empty": st.just(b"") | st.binary(max_size=64) | JSON_BODIES,
}

_CONTROL = bytes(range(32)).replace(b"\t", b"") + b"\x7f"


def header_safe(value: bytes) -> bytes:
    """``value`` without the control characters aiohttp refuses in a header value (the
    hostile-HTTP test sends those on purpose; elsewhere they would hide the handlers)."""
    return value.translate(None, _CONTROL)


# fmt: off
CONTENT_TYPES = st.one_of(
    st.sampled_from(
        [
            None, b"application/sdp", b"application/sdp", b"APPLICATION/SDP",
            b"application/sdp; charset=utf-8", b"application/sdp;",
            b'application/sdp ; x="a;b" ;; =', b"application/sdp, text/plain",
            b"application/sdp\xff", b"application/sdpx", b"application/sd",
            b"application/trickle-ice-sdpfrag", b"application/trickle-ice-sdpfrag; charset=utf-8",
            b"application/json", b"text/plain", b"multipart/form-data; boundary=x",
            b"application/x-www-form-urlencoded", b"", b";", b"*/*", b"application/*", b"a" * 4000,
        ]
    ),
    st.binary(max_size=40).map(header_safe),
)
# fmt: on

_TOKEN = b"Bearer " + OPERATOR.encode()
# fmt: off
BAD_AUTHS = st.one_of(
    st.sampled_from(
        [
            None, b"", b"Bearer", b"Bearer ", b"bearer " + OPERATOR.encode(),
            b"BEARER   " + OPERATOR.encode(), b"Bearer " + OPERATOR.encode() + b" extra",
            b"Bearer " + OPERATOR.encode() + b"=", b"Bearer ===", b"Basic dXNlcjpwYXNz",
            b"Digest username=x, realm=y", b"Token " + OPERATOR.encode(), b"Bearer " + b"A" * 1025,
            b"Bearer " + b"A" * 7000, b"Bearer \xff\xfe", b"Bearer \xc3\xa9t\xc3\xa9",
            b"Bearer a\tb", b"Bearer a\x00b",
        ]
    ),
    st.binary(max_size=80).map(lambda b: b"Bearer " + header_safe(b)),
    st.text(max_size=40).map(lambda t: header_safe(t.encode())),
)
# fmt: on


def mostly(good: Any, other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` (a value or a strategy) in about 60 % of the draws, else ``other``: most
    cases get past one check to reach the next."""
    preferred = good if isinstance(good, st.SearchStrategy) else st.just(good)
    return st.integers(0, 9).flatmap(lambda n: preferred if n < 6 else other)


AUTHS = mostly(_TOKEN, BAD_AUTHS | st.just(b"Bearer " + PUBLISHER.encode()))

_HEADER_VALUES = st.one_of(
    st.sampled_from([b"", b" ", b"*", b'W/"x"', b"\xff\xfe", b"\xc3\xa9", b"a" * 4000, b"a\x01b"]),
    st.binary(max_size=60).map(header_safe),
)
# fmt: off
EXTRA_HEADERS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                b"Origin", b"If-Match", b"X-Forwarded-For", b"Accept", b"Accept-Encoding",
                b"Range", b"Cookie", b"Authorization", b"X-Run-Id",
                b"Access-Control-Request-Method", b"X-Fuzz",
            ]
        ),
        _HEADER_VALUES,
    ),
    max_size=4,
)
# fmt: on

# fmt: off
HOSTILE_SEGMENTS = [
    "", ".", "..", "...", "%2e", "%2e%2e", "%2E%2E", ".%2e", "%2e.", "..%2f..%2fetc%2fpasswd",
    "..%2F", "%2f", "%2F%2F", "a%2Fb", "%5c", "..%5c..%5cwin.ini", "..\\..\\secret", "\\", "%00",
    "r_a%00b", "%ff", "%fe%ff", "%c0%ae%c0%ae", "%e2%80%ae", "%ed%a0%80", "%zz", "%", "%%", "%2",
    "%%32%65", "%20", "+", "r_a+b", "~", "-r", "_r", ":r", "r;x=1", "r_a%3Fb", "r_a%23b",
    "thumbnail.jpg", "secret", "..%2fsecret", "..%2f..%2fsecret", "r_" + "a" * 126,
    "r_" + "a" * 127, "x" * 2000, "s_AAAAAAAAAAAAAAAAAAAAA", "s_AAAAAAAAAAAAAAAAAAAAAAA",
    "S_AAAAAAAAAAAAAAAAAAAAAA", "%73_AAAAAAAAAAAAAAAAAAAAAA", "s_" + "%2F" * 22,
    "r%5Ffuzzseededrun000000001", "sessions", "a" * 65,
]
# fmt: on
"""Path segments that are not ids (sent as written)."""

_URL_SAFE = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/?#%"),
    max_size=40,
)
RAW_SEGMENTS = st.one_of(
    st.sampled_from(HOSTILE_SEGMENTS),
    st.sampled_from(HOSTILE_SEGMENTS),
    st.text(max_size=40).map(lambda t: quote(t, safe="")),
    st.binary(max_size=16).map(lambda b: quote(b, safe="")),
    _URL_SAFE,
    st.binary(max_size=16).map(lambda b: b.decode("latin-1")),  # raw: often not HTTP
)


def segments(name: str, world: World, destructive: bool) -> st.SearchStrategy[str]:
    """Values for the path parameter ``name``: real ids, made-up ids, not-ids."""
    if name == "run_id":
        real = [*world.run_ids(destructive), "r_unknownrun0000000001"]
    elif name == "session_id":
        real = world.session_ids(destructive)
    else:
        real = ["cam", "cam-1.main_2", "a" * 64, "sessions"]
    return mostly(st.sampled_from(real), RAW_SEGMENTS)


# fmt: off
_NUMBERS = [
    "0", "1", "-1", "+1", "1000", "1001", "00000000000000000000001", "9223372036854775807",
    "9223372036854775808", "1" * 30, "1.5", "0.01", "0.0", "-0", "1e3", "1e309", "1e-400", "nan",
    "NaN", "inf", "-inf", "0x10", "1_000", " 1", "1 ", "\u0661", "\uff11", "²", "", "true", "null",
    "[]",
]
# fmt: on
# fmt: off
_QUERY_KEYS = [
    "after", "limit", "wait", "state", "principal", "stream", "cursor", "w%61it", "limit[]", "",
    "x",
]
# fmt: on
# fmt: off
_QUERY_VALUES = st.one_of(
    st.sampled_from(_NUMBERS).map(lambda v: quote(v, safe="")),
    st.sampled_from(_NUMBERS),
    st.sampled_from(
        [
            "live", "expired", "LIVE", "ops", "studio-a", "studio-b", "cam", "sessions",
            "MTIzLnJfeA", "MTIzLnJfeA==", "====", "%zz", "%", "%00", "%ff%fe", "a+b", "x" * 9000,
        ]
    ),
    st.text(max_size=30).map(lambda t: quote(t, safe="")),
    _URL_SAFE.map(lambda t: t.replace("&", "").replace("=", "")),
    st.binary(max_size=12).map(lambda b: quote(b, safe="")),
)
# fmt: on


def _clamp_wait(key: str, value: str) -> str:
    """A ``wait`` the server would accept is capped at :data:`MAX_WAIT_S`."""
    if unquote_plus(key).strip() != "wait":
        return value
    try:
        seconds = float(unquote_plus(value))
    except ValueError:
        return value
    return "0.05" if MAX_WAIT_S < seconds < float("inf") else value


QUERIES = st.lists(st.tuples(st.sampled_from(_QUERY_KEYS), _QUERY_VALUES), max_size=4).map(
    lambda pairs: "&".join(f"{k}={_clamp_wait(k, v)}" for k, v in pairs)
)


def fill(template: str, draw: st.DrawFn, world: World, destructive: bool) -> str:
    """``template`` with each ``{name}`` replaced by a drawn segment."""
    return re.sub(r"\{(\w+)\}", lambda m: draw(segments(m.group(1), world, destructive)), template)


@st.composite
def route_requests(
    draw: st.DrawFn, world: World, routes: list[tuple[str, str]], other_methods: bool = True
) -> Req:
    """A request to one of ``routes`` with drawn ids, query, auth, type, body, headers."""
    method, template = draw(st.sampled_from(routes))
    if other_methods and draw(st.integers(0, 9)) == 0:
        method = draw(st.sampled_from(OTHER_METHODS))
    destructive = (method, template) in DESTRUCTIVE
    path = fill(template, draw, world, destructive)
    query = draw(QUERIES) if draw(st.booleans()) else ""
    kind = ROUTES.get((method, template), "empty")
    picked = draw(mostly(kind, st.sampled_from(["offer", "json", "empty", "trickle"])))
    body = draw(trickle_bodies(world) if picked == "trickle" else BODIES_BY_KIND[picked])
    types = {"trickle": b"application/trickle-ice-sdpfrag", "json": b"application/json"}
    content_type = draw(mostly(types.get(kind, b"application/sdp"), CONTENT_TYPES))
    req = request(
        method,
        path + ("?" + query if query else ""),
        auth=draw(AUTHS),
        content_type=content_type,
        body=body,
        headers=draw(EXTRA_HEADERS),
    )
    return replace(req, route=(method, template))


# ------------------------------------------------------------------ hostile framing

_CHUNKINGS = ["even", "one", "ext", "trailer", "bad-size", "no-end", "huge", "lf"]


def _chunked(body: bytes, how: str, cut: int) -> tuple[bytes, bool]:
    """``body`` as a chunked stream (framed per ``how``); whether that framing is bad."""
    pieces = [body[i : i + max(cut, 1)] for i in range(0, len(body), max(cut, 1))] or [b""]
    if how == "one":
        pieces = [body]
    ext = b";name=value" if how == "ext" else b""
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in pieces if p)
    if how == "bad-size":
        return b"zz\r\n" + out + b"0\r\n\r\n", True
    if how == "huge":
        return b"ffffffffffffffffffff\r\n" + body + b"\r\n0\r\n\r\n", True
    if how == "lf":
        return out.replace(b"\r\n", b"\n") + b"0\n\n", True
    if how == "no-end":
        return out + b"0\r\n", False  # incomplete: waits for the body deadline (408)
    if how == "trailer":
        return out + b"0\r\nX-Trailer: 1\r\n\r\n", False
    return out + b"0\r\n\r\n", False


# fmt: off
BODY_MUTATIONS = [
    "chunked", "gzip", "deflate", "gzip-garbage", "deflate-garbage", "br", "identity-coding",
    "expect-100", "expect-other", "dup-content-length", "same-content-length",
    "content-length-and-chunked", "te-gzip", "te-gzip-chunked", "bad-content-length", "long-body",
    "pipelined",
]
# fmt: on
"""Mutations of the body, its framing or its coding; a case gets at most one of them."""
# fmt: off
HEAD_MUTATIONS = [
    "split", "huge-header", "big-header", "many-headers", "header-ctl", "header-name", "obs-fold",
    "lf-only", "no-host", "two-hosts", "http10", "http-bad-version", "absolute-form", "bad-method",
    "lowercase-method", "upgrade", "non-ascii-header", "dup-auth",
]
# fmt: on


def mutate(req: Req, how: str, draw: st.DrawFn) -> Req:
    """``req`` with one kind of HTTP-level hostility (``malformed`` says if it is invalid)."""
    if how == "split":
        return replace(req, split=draw(st.integers(0, max(len(req.body) - 1, 0))))
    if how == "chunked":
        framing = draw(st.sampled_from(_CHUNKINGS))
        if framing == "no-end":
            framing = "even"  # 1 s each (the body deadline): covered by an explicit example
        raw, bad = _chunked(req.body, framing, draw(st.integers(1, 64)))
        out = req.without(b"Content-Length").with_header(b"Transfer-Encoding", b"chunked")
        # Bad framing after dispatch waits for the 1 s body deadline: an explicit example.
        split = None if bad else req.split
        return replace(out.bad(*(["chunk framing"] if bad else [])), raw_body=raw, split=split)
    if how in ("gzip", "deflate", "gzip-garbage", "deflate-garbage"):
        coding = how.split("-")[0].encode()
        compress = gzip.compress if coding == b"gzip" else zlib.compress
        raw = req.body if how.endswith("garbage") else compress(req.body)
        if how.endswith("garbage") and draw(st.booleans()):
            raw = compress(req.body)[: draw(st.integers(0, 40))]
        out = coded(req, coding, raw, split=req.split)
        # A coding error found while the body is parsed with the headers is a parser 400.
        return out.bad("content coding") if how.endswith("garbage") else out
    if how == "br":
        return req.with_header(
            b"Content-Encoding", draw(st.sampled_from([b"br", b"zstd"])), "undecodable coding"
        )
    if how == "identity-coding":
        value = draw(st.sampled_from([b"identity", b"x-unknown", b"gzip, identity", b""]))
        return req.with_header(b"Content-Encoding", value)
    if how == "expect-100":
        return req.with_header(b"Expect", b"100-continue")
    if how == "expect-other":
        return req.with_header(b"Expect", draw(st.sampled_from([b"garbage", b"200-ok", b"x" * 50])))
    if how == "dup-content-length":
        return req.with_header(b"Content-Length", b"%d" % (len(req.body) + 1), "content-length")
    if how == "same-content-length":
        return req.with_header(b"Content-Length", b"%d" % len(req.body), "content-length")
    if how == "content-length-and-chunked":
        return req.with_header(b"Transfer-Encoding", b"chunked", "content-length")
    if how == "te-gzip":
        return req.without(b"Content-Length").with_header(b"Transfer-Encoding", b"gzip", "te")
    if how == "te-gzip-chunked":
        raw, _ = _chunked(req.body, "even", 16)
        out = req.without(b"Content-Length").with_header(b"Transfer-Encoding", b"gzip, chunked")
        return replace(out, raw_body=raw)
    if how == "bad-content-length":
        value = draw(st.sampled_from([b"-1", b"abc", b"1e3", b"99999999999999999999999", b" "]))
        return req.without(b"Content-Length").with_header(
            b"Content-Length", value, "content-length"
        )
    if how == "long-body":
        # Read with the request, bytes that cannot start the next one make aiohttp's
        # parser reject the whole read: the complete request before them included.
        extra = draw(st.binary(min_size=1, max_size=64))
        return replace(req, raw_body=(req.raw_body or req.body) + extra).bad("trailing bytes")
    if how == "pipelined":
        # llhttp refuses data after a "Connection: close" request in the same read (and
        # aiohttp then drops that request too); behind keep-alive it is a second request.
        closing = any(v.lower() == b"close" for n, v in req.headers if n.lower() == b"connection")
        pipelined = replace(req, raw_body=(req.raw_body or req.body) + b"".join(HEALTHZ.wire()))
        return pipelined.bad("data after close") if closing else pipelined
    if how == "huge-header":
        return req.with_header(b"X-Huge", b"h" * draw(st.integers(8 * 1024, 20 * 1024)))
    if how == "big-header":
        return req.with_header(b"X-Big", b"b" * draw(st.integers(1000, 6000)))
    if how == "many-headers":
        count = draw(st.sampled_from([90, 129, 300]))
        out = req
        for n in range(count):
            out = out.with_header(b"X-Many-%d" % n, b"v")
        return out.bad("too many headers") if count > 90 else out
    if how == "header-ctl":
        ctl = bytes([draw(st.sampled_from([0, 1, 8, 11, 12, 27, 127]))])
        return req.with_header(b"X-Ctl", b"a" + ctl + b"b", "header value control char")
    if how == "header-name":
        name = draw(st.sampled_from([b"X Bad", b"X:Bad", b"X\xffBad", b"", b"X@B", b"(x)"]))
        return req.with_header(name, b"v", "header name")
    if how == "obs-fold":
        return req.bad("obs-fold", headers=(*req.headers, (b"X-Fold", b"a\r\n b")))
    if how == "lf-only":
        return req.bad("line ends", eol=b"\n")
    if how == "no-host":
        return req.without(b"Host").bad("no host")
    if how == "two-hosts":
        return req.with_header(b"Host", b"evil.example")
    if how == "http10":
        return replace(req, version=b"HTTP/1.0")
    if how == "http-bad-version":
        version = draw(
            st.sampled_from([b"HTTP/1.2", b"HTTP/9.9", b"HTTP/2.0", b"HTTP/1", b"XTTP/1.1"])
        )
        return req.bad("version", version=version)
    if how == "absolute-form":
        return replace(req, target=b"http://127.0.0.1" + req.target)
    if how == "bad-method":
        return req.bad("method", method=draw(st.sampled_from([b"BREW", b"G@T", b"GET\x00", b"-"])))
    if how == "lowercase-method":
        return req.bad("method", method=req.method.lower())
    if how == "upgrade":
        upgrade = draw(st.sampled_from([b"websocket", b"h2c", b"garbage"]))
        out = req.without(b"Connection").with_header(b"Connection", b"Upgrade")
        return out.with_header(b"Upgrade", upgrade)
    if how == "non-ascii-header":
        name = draw(st.sampled_from([b"Origin", b"If-Match", b"Content-Type", b"X-Forwarded-For"]))
        return req.with_header(name, draw(st.binary(min_size=1, max_size=20)).translate(_HIGH))
    if how == "dup-auth":
        return req.with_header(b"Authorization", draw(AUTHS) or b"Bearer x")
    raise AssertionError(how)


_HIGH = bytes(range(128, 256)) * 2
"""``bytes.translate`` table mapping every byte into obs-text (0x80-0xff)."""


def coded(req: Req, coding: bytes, raw: bytes, *, split: int | None) -> Req:
    """``req`` sent with ``Content-Encoding: coding`` and ``raw`` as its (coded) body."""
    out = req.without(b"Content-Length").with_header(b"Content-Encoding", coding)
    out = out.with_header(b"Content-Length", str(len(raw)).encode())
    return replace(out, raw_body=raw, split=split)


def expecting(code: str, req: Req) -> Req:
    """``req`` that must be answered with the error ``code``."""
    return replace(req, expect=code)


def chunked(req: Req, how: str) -> Req:
    """``req`` with its body sent chunked (framed per ``how``)."""
    raw, bad = _chunked(req.body, how, 64)
    out = req.without(b"Content-Length").with_header(b"Transfer-Encoding", b"chunked")
    return replace(out.bad(*(["chunk framing"] if bad else [])), raw_body=raw)


# ------------------------------------------------------------------ the tests


def test_every_route_is_fuzzed(tmp_path: Path) -> None:
    """The fuzz's route table is the router's, both ways: a new route needs a strategy."""
    app = create_app(make_config(tmp_path, PRINCIPALS))
    assert routed(app) == set(ROUTES)
    assert set(ROUTES) >= DESTRUCTIVE


@pytest.mark.timeout(120)
async def test_fuzz_whip_offers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``POST /whip`` and ``/whip/{stream}``: malformed, truncated, oversized, binary and
    non-UTF-8 SDP, wrong and missing content types, garbage credentials, bad streams."""
    examples = 500
    async with fuzz_server(tmp_path) as world:
        tally = Tally("POST /whip offers", world.port)

        def status_matches_body(req: Req, reply: Reply) -> None:
            if reply.status == 201:
                assert reply.header("location") and reply.media_type == "application/sdp"
            if len(req.body) > SDP_LIMIT and reply.media_type == "application/json":
                if reply.status in (401, 415):
                    return
                code = json.loads(reply.body)["error"]["code"]
                assert reply.status == 413 or code in ("bad_stream", "not_found"), req.show()

        tally.checks.append(status_matches_body)

        @st.composite
        def offers(draw: st.DrawFn) -> Req:
            target = draw(st.sampled_from(["/whip", "/whip/{stream}"]))
            target = target.replace("{stream}", draw(segments("stream", world, False)))
            return request(
                "POST",
                target,
                body=draw(SDP_BODIES),
                content_type=draw(mostly(b"application/sdp", CONTENT_TYPES)),
                auth=draw(AUTHS),
                headers=draw(EXTRA_HEADERS),
            )

        def post(body: bytes, content_type: bytes = b"application/sdp") -> Req:
            return request("POST", "/whip", body=body, content_type=content_type, auth=_TOKEN)

        ffmpeg = GOOD_OFFERS[1]

        def without(line: bytes) -> bytes:
            return ffmpeg.replace(line, b"")

        @fuzz_settings(examples)
        @given(req=offers())
        # Regression: a declared body above the limit was judged by what had arrived when
        # the handler read it (400 bad_sdp for the first 90 bytes), not 413.
        @example(req=expecting("sdp_too_large", replace(post(_pad(300 * 1024)), split=90)))
        # Regressions: offers check_offer accepts and aiortc refuses were 500s (an offer
        # without rtcp-mux; a video section with no codec aiortc knows, next to audio: H.261
        # now, AV1 before whip/rtc/codec_table.py; an a=fmtp for a payload type without
        # a=rtpmap, which aiortc's parser crashes on).
        @example(req=expecting("unprocessable_offer", post(without(b"a=rtcp-mux\r\n"))))
        @example(req=expecting("unprocessable_offer", post(ffmpeg.replace(b"H264/", b"H261/"))))
        @example(
            req=expecting("unprocessable_offer", post(without(b"a=rtpmap:106 H264/90000\r\n")))
        )
        # An answer that echoes a non-UTF-8 header value is still strict UTF-8 JSON.
        @example(req=expecting("unsupported_media_type", post(GOOD_OFFERS[0], b"text/\xff")))
        def one(req: Req) -> None:
            tally.run(req)

        await asyncio.to_thread(one)
    tally.report(capsys, examples)
    assert {201, 400, 401, 409, 413, 415, 422} <= set(tally.statuses), tally.statuses


@pytest.mark.timeout(120)
async def test_fuzz_every_route(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every route (and other methods on the same paths) with real and made-up ids, a live
    session's ids, garbage queries, every kind of body, content type and credential."""
    examples = 1200
    async with fuzz_server(tmp_path, live=True) as world:
        tally = Tally("every route", world.port)

        @fuzz_settings(examples)
        @given(req=route_requests(world, sorted(ROUTES)))
        def one(req: Req) -> None:
            tally.run(req)

        await asyncio.to_thread(one)
        # Routes the derandomized draws missed (their share shrinks as routes are added)
        # get a short run of their own, so every route is fuzzed whatever the table.
        missed = sorted(set(ROUTES) - set(tally.routes))
        if missed:

            @fuzz_settings(10 * len(missed))
            @given(req=route_requests(world, missed, other_methods=False))
            def sweep(req: Req) -> None:
                tally.run(req)

            await asyncio.to_thread(sweep)
    tally.report(capsys, examples)
    assert set(tally.routes) >= set(ROUTES), set(ROUTES) - set(tally.routes)
    # Precondition and conflict refusals (428, 412, 409) are not required here: whether
    # the draws reach one moved with the route table and the live session's state from
    # run to run (two full runs reached none). Each is asserted deterministically in
    # tests/test_whip_trickle.py and tests/test_api.py; this fuzz asserts no 5xx and
    # that every route was reached.
    assert {200, 204, 400, 401, 404, 405} <= set(tally.statuses), tally.statuses


@pytest.mark.timeout(120)
async def test_fuzz_hostile_http(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """HTTP-level hostility on every route: framing, codings, Expect, huge and bad headers,
    bad versions and methods, bodies that arrive after the headers."""
    examples = 800

    @st.composite
    def hostile(draw: st.DrawFn, world: World) -> Req:
        req = draw(route_requests(world, sorted(ROUTES), other_methods=False))
        hows = draw(st.lists(st.sampled_from(HEAD_MUTATIONS), max_size=2, unique=True))
        framing = draw(st.sampled_from([None, *BODY_MUTATIONS]))
        for how in [*hows, *([framing] if framing else [])] or ["split"]:
            req = mutate(req, how, draw)
        return _classify(req)

    async with fuzz_server(tmp_path) as world:
        tally = Tally("hostile HTTP", world.port)
        offer = request(
            "POST", "/whip", body=GOOD_OFFERS[0], auth=_TOKEN, content_type=b"application/sdp"
        )
        stop = request("POST", f"/v1/runs/{SEEDED_RUNS[1]}/stop", auth=_TOKEN)
        unrouted = request("GET", "/nowhere")

        @fuzz_settings(examples)
        @given(req=hostile(world))
        # Regressions. A body failing its content coding after dispatch was a 500 ...
        @example(req=expecting("bad_body", coded(offer, b"gzip", b"hello", split=0)))
        @example(req=expecting("bad_body", coded(stop, b"deflate", b"\x00" * 20, split=0)))
        # ... and within the headers' read it waited for the body deadline, then 408.
        @example(req=expecting("bad_body", coded(offer, b"deflate", b"hello", split=None)))
        # An Expect other than 100-continue was a plain-text 417 (outside the middleware).
        @example(req=expecting("expectation_failed", stop.with_header(b"Expect", b"garbage")))
        @example(req=expecting("expectation_failed", unrouted.with_header(b"Expect", b"x")))
        @example(req=expecting("expectation_failed", HEALTHZ.with_header(b"Expect", b"x")))
        # A chunked body that never ends, or whose framing breaks after the request was
        # dispatched (aiohttp does not fail the body stream then), a body shorter than
        # declared: the 408 of the body deadline.
        @example(req=expecting("request_timeout", chunked(offer, "no-end")))
        @example(req=expecting("request_timeout", replace(chunked(offer, "bad-size"), split=0)))
        @example(req=expecting("request_timeout", replace(offer, raw_body=offer.body[:100])))
        def one(req: Req) -> None:
            tally.run(req)

        await asyncio.to_thread(one)
    tally.report(capsys, examples)
    assert tally.rejected, "no case reached aiohttp's parser rejections"
    assert {400, 401, 404, 405, 408, 417} <= set(tally.statuses), tally.statuses


@pytest.mark.timeout(120)
async def test_fuzz_whip_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The WHIP session URL of a live aiortc publisher (and made-up ones): trickle ICE
    fragments, ICE restarts, wrong content types, ``If-Match`` garbage, every method. The
    publisher is still connected at the end (``DELETE`` gets made-up ids only)."""
    examples = 400
    methods = st.sampled_from(["DELETE", "OPTIONS", "GET", "HEAD", "POST", "PUT", "PATCH"])
    if_match = st.sampled_from([b"*", b'"x"', b'W/"x"', b"", b"*, *", b"\xff"]) | _HEADER_VALUES

    async with fuzz_server(tmp_path, live=True) as world:
        tally = Tally("WHIP session URL", world.port)
        live_etag = world.live_etag
        assert live_etag is not None
        current = st.just(b"").map(lambda _: live_etag().encode())  # read at draw time

        @st.composite
        def calls(draw: st.DrawFn) -> Req:
            method = draw(mostly("PATCH", methods))
            session_id = draw(segments("session_id", world, destructive=method == "DELETE"))
            headers = draw(EXTRA_HEADERS)
            if draw(st.booleans()):
                name = draw(st.sampled_from([b"If-Match", b"If-Match", b"ETag"]))
                headers.append((name, draw(current | if_match)))
            return request(
                method,
                f"/whip/sessions/{session_id}",
                body=draw(mostly(trickle_bodies(world), SDP_BODIES | JSON_BODIES)),
                content_type=draw(mostly(trickle, CONTENT_TYPES)),
                auth=draw(AUTHS),
                headers=headers,
            )

        trickle = b"application/trickle-ice-sdpfrag"
        live = f"/whip/sessions/{world.live_session}"
        restart = b"a=ice-ufrag:restart\r\na=ice-pwd:0123456789abcdefghijkl\r\n"

        @fuzz_settings(examples)
        @given(req=calls())
        @example(
            req=request("PATCH", live, body=restart, content_type=trickle, auth=_TOKEN).with_header(
                b"If-Match", b"*"
            )
        )
        @example(
            req=expecting(
                "precondition_required",
                request("PATCH", live, body=restart, content_type=trickle, auth=_TOKEN),
            )
        )
        @example(
            req=expecting(
                "bad_sdpfrag",
                request(
                    "PATCH", live, body=b"a=ice-ufrag:again\r\n", content_type=trickle, auth=_TOKEN
                ).with_header(b"If-Match", b"*"),
            )
        )
        def one(req: Req) -> None:
            tally.run(req)

        await asyncio.to_thread(one)
    tally.report(capsys, examples)
    assert {200, 204, 400, 401, 404, 405, 412, 415, 428} <= set(tally.statuses), tally.statuses


THUMBNAIL_TRICKS = [
    "/v1/runs/../../secret.jpg/thumbnail.jpg",
    "/v1/runs/%2e%2e/%2e%2e/secret/thumbnail.jpg",
    "/v1/runs/..%2f..%2fsecret/thumbnail.jpg",
    "/v1/runs/..%5c..%5csecret/thumbnail.jpg",
    "/v1/runs/..\\..\\secret/thumbnail.jpg",
    "/v1/runs/r_x/thumbnail.jpg/..",
    "/v1/runs/r_x/thumbnail.jpg%00.png",
    "/v1/runs/r_x/thumbnail%2ejpg",
    "/v1/runs/r_x%2fthumbnail.jpg",
    f"/v1/runs/{SEEDED_RUNS[0]}/thumbnail.jpg%2f..%2f..%2fsecret",
    f"/v1/runs/{SEEDED_RUNS[0]}/./thumbnail.jpg",
    f"/v1/runs/{SEEDED_RUNS[0]}/../{SEEDED_RUNS[0]}/thumbnail.jpg",
    f"/v1//runs/{SEEDED_RUNS[0]}/thumbnail.jpg",
    f"//v1/runs/{SEEDED_RUNS[0]}/thumbnail.jpg",
    f"/V1/RUNS/{SEEDED_RUNS[0]}/THUMBNAIL.JPG",
    f"/v1/runs/{SEEDED_RUNS[0]}/thumbnail.jpg/",
    f"/v1/runs/{SEEDED_RUNS[0]}/thumbnail.jpg;x=1",
    f"/v1/runs/{SEEDED_RUNS[0]}/thumbnail.jpg?path=../../secret.jpg",
    "/v1/runs/secret/thumbnail.jpg",
    "/v1/runs/..%252f..%252fsecret/thumbnail.jpg",
    "/v1/runs/%252e%252e/thumbnail.jpg",
    "/v1/runs/%u002e%u002e/thumbnail.jpg",
    "/v1/runs/.../thumbnail.jpg",
    "/v1/runs/thumbnails%2f..%2fsecret/thumbnail.jpg",
    "/v1/runs/r_x/events/../thumbnail.jpg",
    "/v1/runs/%2e%2e/events",
    "/v1/runs/..%2f/events?after=0",
    "/v1/runs/r_x%00/events",
    "/v1/runs/%ff%fe/events",
    "/v1/runs/r_x/events%00",
    "/v1/runs/r_x/events/..%2f..%2fhealthz",
]


@pytest.mark.timeout(120)
async def test_fuzz_path_tricks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Path tricks on ``/v1/runs/{id}/thumbnail.jpg`` and ``/events``: a thumbnail answer is
    only ever the run's own JPEG; nothing else of the filesystem comes back."""
    examples = 400
    tails = ["/thumbnail.jpg", "/events", "/thumbnail.jpg", "/events", "", "/stop"]

    async with fuzz_server(tmp_path) as world:
        tally = Tally("path tricks", world.port)

        def only_the_thumbnail(req: Req, reply: Reply) -> None:
            if reply.status == 200 and reply.media_type == "image/jpeg":
                assert reply.body == THUMBNAIL, req.show()

        tally.checks.append(only_the_thumbnail)

        @st.composite
        def tricks(draw: st.DrawFn) -> Req:
            if draw(st.integers(0, 3)) == 0:
                target = draw(st.sampled_from(THUMBNAIL_TRICKS))
            else:
                run = draw(st.lists(segments("run_id", world, True), min_size=1, max_size=3))
                target = "/v1/runs/" + "/".join(run) + draw(st.sampled_from(tails))
                if draw(st.booleans()):
                    target += draw(st.sampled_from(["", "/", "/..", "%2f..", "/%2e%2e", "\\"]))
            method = "POST" if target.endswith("/stop") else "GET"
            return request(method, target, auth=draw(AUTHS | st.just(_TOKEN)))

        @fuzz_settings(examples)
        @given(req=tricks())
        @example(req=request("GET", f"/v1/runs/{SEEDED_RUNS[0]}/thumbnail.jpg", auth=_TOKEN))
        def one(req: Req) -> None:
            tally.run(req)

        await asyncio.to_thread(one)
    tally.report(capsys, examples)
    assert 200 in tally.statuses and 400 in tally.statuses, tally.statuses


READ_ROUTES = [
    ("GET", "/v1/runs"),
    ("GET", "/v1/runs/{run_id}/events"),
    ("GET", "/v1/runs/{run_id}/events"),
    ("GET", "/v1/runs/{run_id}"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/{session_id}"),
    ("GET", "/v1/webhooks"),
]


@pytest.mark.timeout(120)
async def test_fuzz_queries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Query parameters as garbage: ``after``/``limit``/``wait`` on events (real runs),
    filters and cursors on the lists; repeated, empty, encoded, out of range."""
    examples = 600
    async with fuzz_server(tmp_path) as world:
        tally = Tally("query parameters", world.port)

        @st.composite
        def queries(draw: st.DrawFn) -> Req:
            method, template = draw(st.sampled_from(READ_ROUTES))
            path = template.replace("{run_id}", draw(st.sampled_from(SEEDED_RUNS))).replace(
                "{session_id}", "s_AAAAAAAAAAAAAAAAAAAAAA"
            )
            query = draw(QUERIES)
            return request(method, f"{path}?{query}", auth=draw(st.just(_TOKEN) | AUTHS))

        @fuzz_settings(examples)
        @given(req=queries())
        @example(
            req=expecting(
                "invalid_parameter",
                request("GET", f"/v1/runs/{SEEDED_RUNS[0]}/events?wait=nan", auth=_TOKEN),
            )
        )
        @example(
            req=expecting(
                "invalid_parameter", request("GET", "/v1/runs?cursor=%ff%fe&limit=0", auth=_TOKEN)
            )
        )
        def one(req: Req) -> None:
            tally.run(req)

        await asyncio.to_thread(one)
    tally.report(capsys, examples)
    assert {200, 400, 401} <= set(tally.statuses), tally.statuses
