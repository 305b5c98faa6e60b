"""The webhooks' HTTP/1.1 client against real receivers on 127.0.0.1.

:class:`ScriptedReceiver` is a bare TCP server: it reads each request whole (head and
``Content-Length`` body), records it, and writes what its ``answer`` function returns for
that request, byte for byte, then keeps or closes the connection as told. So every
framing, every hostile answer and every keep-alive race is a real exchange over a socket.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from whip.webhooks.http_client import (
    MAX_HEAD_BYTES,
    HttpClient,
    ProtocolError,
    _Connection,
    _read_body,
    _read_head,
)

OK = b"HTTP/1.1 204 No Content\r\n\r\n"
HEADERS = {"content-type": "application/json", "webhook-id": "run-1:1"}

After = Literal["keep", "close", "drop"]
"""After an answer: keep the connection, close it; ``drop``: close without answering."""


@dataclass
class Request:
    connection: int
    head: bytes
    body: bytes


@dataclass
class ScriptedReceiver:
    answer: Callable[[int, Request], tuple[bytes | list[bytes], After]] = lambda n, r: (OK, "keep")
    """The answer to the n-th request (a list: pieces written 50 ms apart) and what then."""
    delay_s: float = 0.0
    tls: ssl.SSLContext | None = None
    bind: str = "127.0.0.1"
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    closed_by_client: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def __aenter__(self) -> ScriptedReceiver:
        self._server = await asyncio.start_server(self._serve, self.bind, 0, ssl=self.tls)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    def url(self, path: str = "/hook?k=1", host: str = "127.0.0.1") -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        host = f"[{host}]" if ":" in host else host
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self._writers.add(writer)
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_client += 1
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = Request(number, head, await reader.readexactly(length))
                self.requests.append(request)
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                data, after = self.answer(len(self.requests), request)
                if after == "drop":
                    return
                try:
                    for n, piece in enumerate(data if isinstance(data, list) else [data]):
                        if n:
                            await asyncio.sleep(0.05)
                        writer.write(piece)
                        await writer.drain()
                except ConnectionError:
                    self.closed_by_client += 1
                    return
                if after == "close":
                    return
        finally:
            self.open_now -= 1
            self._writers.discard(writer)
            writer.close()


async def test_requests_carry_the_webhook_and_one_connection_carries_them_all() -> None:
    async with ScriptedReceiver() as receiver:
        port = receiver.url().split(":")[2].split("/")[0]
        http = HttpClient(4)
        for n in range(30):
            answer = await http.post(receiver.url(), b'{"n":%d}' % n, HEADERS, 1024)
            assert (answer.status, answer.body) == (204, b"")
        await http.close()
    assert receiver.connections == 1
    first = receiver.requests[0]
    lines = first.head.split(b"\r\n")
    assert lines[0] == b"POST /hook?k=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}".encode() in lines
    assert b"User-Agent: whip-ingest-webhooks/1" in lines
    assert b"content-type: application/json" in lines and b"webhook-id: run-1:1" in lines
    assert not any(line.lower().startswith(b"accept-encoding") for line in lines)
    assert [r.body for r in receiver.requests] == [b'{"n":%d}' % n for n in range(30)]


async def test_an_ipv6_literal_is_connected_to_and_named_in_brackets() -> None:
    async with ScriptedReceiver(bind="::1") as receiver:
        http = HttpClient(1)
        url = receiver.url(host="::1")
        assert (await http.post(url, b"6", HEADERS, 1024)).status == 204
        await http.close()
    port = url.split("]:")[1].split("/")[0]
    assert f"Host: [::1]:{port}".encode() in receiver.requests[0].head.split(b"\r\n")


async def test_no_more_connections_than_parallel_and_every_request_answered() -> None:
    async with ScriptedReceiver(delay_s=0.02) as receiver:
        http = HttpClient(3)
        answers = await asyncio.gather(
            *(http.post(receiver.url(), b"x", HEADERS, 1024) for _ in range(20))
        )
        await http.close()
    assert [a.status for a in answers] == [204] * 20
    assert receiver.most_open == 3 and receiver.connections == 3


FRAMINGS: dict[str, tuple[bytes, int, bytes, int]] = {
    # name: (answer, its status, body the client returns, connections for two posts)
    "length": (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 200, b"hello", 1),
    "chunked": (
        b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n4\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n",
        500,
        b"abcdefg",
        1,
    ),
    "informational first": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: x\r\n\r\n"
        b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\nok",
        202,
        b"ok",
        1,
    ),
    "connection close": (
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n",
        200,
        b"",
        2,
    ),
    "http/1.0": (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", 200, b"hi", 2),
    "other coding": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nzz",
        200,
        b"zz",
        2,
    ),
}


@pytest.mark.parametrize("framing", FRAMINGS)
async def test_each_framing_is_read_and_only_a_framed_whole_answer_keeps_its_connection(
    framing: str,
) -> None:
    data, status, body, connections = FRAMINGS[framing]
    closes = framing in ("connection close", "http/1.0", "other coding")

    def answer(n: int, r: Request) -> tuple[bytes, After]:
        return data, "close" if closes else "keep"

    async with ScriptedReceiver(answer) as receiver:
        http = HttpClient(1)
        first = await http.post(receiver.url(), b"a", HEADERS, 1024)
        second = await http.post(receiver.url(), b"b", HEADERS, 1024)
        await http.close()
    assert first.body == second.body == body
    assert first.status == second.status == status
    assert receiver.connections == connections


async def test_a_body_over_the_bound_is_cut_and_its_connection_not_reused() -> None:
    big = b"y" * (1024 * 1024)

    def answer(n: int, r: Request) -> tuple[list[bytes], After]:
        # The rest of the body comes after the client has its 16 KiB: the connection must
        # not carry the next request (the rest would be read as its answer).
        head = b"HTTP/1.1 400 Bad\r\nContent-Length: %d\r\n\r\n" % len(big)
        return [head + big[: 16 * 1024], big[16 * 1024 :]], "keep"

    async with ScriptedReceiver(answer) as receiver:
        http = HttpClient(1)
        first = await http.post(receiver.url(), b"a", HEADERS, 16 * 1024)
        second = await http.post(receiver.url(), b"b", HEADERS, 16 * 1024)
        await http.close()
    assert first.status == second.status == 400
    assert first.body == second.body == big[: 16 * 1024]
    assert receiver.connections == 2


async def test_a_reused_connection_that_ends_before_its_answer_is_retried_once_on_a_new_one() -> (
    None
):
    # The second request on each connection is dropped unanswered: the race of a receiver
    # closing an idle keep-alive connection while the request is written.
    def answer(n: int, r: Request) -> tuple[bytes, After]:
        on_connection = [q for q in receiver.requests if q.connection == r.connection]
        return OK, "drop" if len(on_connection) == 2 else "keep"

    async with ScriptedReceiver(answer) as receiver:
        http = HttpClient(1)
        for body in (b"1", b"2", b"3"):
            assert (await http.post(receiver.url(), body, HEADERS, 1024)).status == 204
        await http.close()
    assert [r.body for r in receiver.requests] == [b"1", b"2", b"2", b"3", b"3"]
    assert receiver.connections == 3


async def test_a_new_connection_that_ends_before_its_answer_is_an_error_not_a_retry() -> None:
    async with ScriptedReceiver(lambda n, r: (OK, "drop")) as receiver:
        http = HttpClient(1)
        with pytest.raises(ConnectionError, match="before a complete answer"):
            await http.post(receiver.url(), b"1", HEADERS, 1024)
        await http.close()
    assert len(receiver.requests) == 1


async def test_an_idle_connection_the_receiver_closed_is_not_used() -> None:
    async with ScriptedReceiver(lambda n, r: (OK, "close")) as receiver:
        http = HttpClient(1)
        await http.post(receiver.url(), b"1", HEADERS, 1024)
        await asyncio.sleep(0.1)  # the close reaches the idle connection
        await http.post(receiver.url(), b"2", HEADERS, 1024)
        await http.close()
    assert [r.body for r in receiver.requests] == [b"1", b"2"]


HOSTILE: dict[str, bytes] = {
    "not http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "status not a number": b"HTTP/1.1 2x0 OK\r\n\r\n",
    "a header without a colon": b"HTTP/1.1 200 OK\r\nnonsense\r\n\r\n",
    "length not a number": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    "two lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "chunk size not hex": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "chunk without its CRLF": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXY",
    "endless headers": b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * (2 * MAX_HEAD_BYTES),
}


@pytest.mark.parametrize("case", HOSTILE)
async def test_an_answer_that_is_not_http_is_a_protocol_error(case: str) -> None:
    async with ScriptedReceiver(lambda n, r: (HOSTILE[case], "keep")) as receiver:
        http = HttpClient(1)
        with pytest.raises(ProtocolError):
            await http.post(receiver.url(), b"1", HEADERS, 1024)
        await http.close()


@pytest.mark.parametrize(
    "name, value", [("x-a", "1\r\nInjected: yes"), ("x-a\nb", "1"), ("x:a", "1"), ("x", "\0")]
)
async def test_a_header_that_could_split_the_request_is_refused_before_anything_is_sent(
    name: str, value: str
) -> None:
    async with ScriptedReceiver() as receiver:
        http = HttpClient(1)
        with pytest.raises(ValueError, match="cannot carry"):
            await http.post(receiver.url(), b"1", {name: value}, 1024)
        await http.close()
    assert receiver.connections == 0


async def test_a_cancelled_request_closes_its_connection_and_is_never_reused() -> None:
    async with ScriptedReceiver(delay_s=30) as receiver:
        http = HttpClient(1)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await http.post(receiver.url(), b"1", HEADERS, 1024)
        receiver.delay_s = 0
        assert (await http.post(receiver.url(), b"2", HEADERS, 1024)).status == 204
        await http.close()
    assert receiver.connections == 2


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "whip-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_https_verifies_the_receivers_certificate_and_host(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))
    async with ScriptedReceiver(tls=served) as receiver:
        http = HttpClient(1, tls=trusting)
        for _ in range(3):
            assert (await http.post(receiver.url(), b"1", HEADERS, 1024)).status == 204
        assert (await http.post(receiver.url(host="localhost"), b"1", HEADERS, 1024)).status == 204
        await http.close()
        untrusting = HttpClient(1)
        with pytest.raises(ssl.SSLCertVerificationError):
            await untrusting.post(receiver.url(), b"1", HEADERS, 1024)
        await untrusting.close()
    assert [r.body for r in receiver.requests] == [b"1"] * 4
    assert receiver.connections == 2  # one per host name; the refused handshake never served


@st.composite
def _framed_answers(draw: st.DrawFn) -> tuple[bytes, bytes, bool, int]:
    """An answer (status line, headers, a body framed by length, chunks or the end), the
    body, whether it is framed, and a max_body."""
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "end"]))
    if framing == "length":
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        payload = body
    elif framing == "chunked":
        sizes = draw(st.lists(st.integers(1, 64), max_size=20))
        chunks, at = [], 0
        for size in sizes:
            if at >= len(body):
                break
            chunks.append(body[at : at + size])
            at += size
        if at < len(body):
            chunks.append(body[at:])
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        payload = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    else:
        head = b"HTTP/1.1 200 OK\r\n\r\n"
        payload = body
    return head + payload, body, framing != "end", draw(st.integers(0, 400))


@settings(max_examples=300, deadline=None)
@given(answer=_framed_answers(), cuts=st.lists(st.integers(1, 12), max_size=80))
def test_any_split_of_an_answer_reads_the_same_head_and_body(
    answer: tuple[bytes, bytes, bool, int], cuts: list[int]
) -> None:
    data, body, framed, max_body = answer

    async def read() -> tuple[int, bytes, bool]:
        conn = _Connection()

        async def feed() -> None:  # a piece at a time, the reader running in between
            at = 0
            for cut in [*cuts, len(data)]:
                piece = data[at : at + cut]
                at += len(piece)
                if piece:
                    conn.data_received(piece)
                    for _ in range(3):
                        await asyncio.sleep(0)
            if not framed:
                conn.connection_lost(None)

        feeder = asyncio.create_task(feed())
        async with asyncio.timeout(10):
            head = await _read_head(conn)
            text, whole = await _read_body(conn, head, max_body)
        await feeder
        return head.status, text, whole

    status, text, whole = asyncio.run(read())
    assert status == 200
    assert text == body[:max_body]
    assert whole == (len(body) <= max_body)
