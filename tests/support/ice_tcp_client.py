"""A raw ICE-TCP client for tests: RFC 4571 frames and STUN Binding requests over a plain
socket, to say to the server's TCP port what a real agent (or an attacker) would.

The STUN messages come from aioice's own encoder (what an aiortc agent signs with); the
frame is the 2-byte length RFC 4571 puts before each one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aioice.stun

READ_BOUND_S = 20.0


def frame(payload: bytes) -> bytes:
    """``payload`` as one RFC 4571 frame."""
    return len(payload).to_bytes(2, "big") + payload


def binding_request(username: str | None, key: bytes | None, *, fingerprint: bool = True) -> bytes:
    """A Binding request as a controlling ICE agent sends it: USERNAME (when given),
    PRIORITY, ICE-CONTROLLING, MESSAGE-INTEGRITY with ``key`` (when given), FINGERPRINT."""
    message = aioice.stun.Message(
        message_method=aioice.stun.Method.BINDING, message_class=aioice.stun.Class.REQUEST
    )
    if username is not None:
        message.attributes["USERNAME"] = username
    message.attributes["PRIORITY"] = 1845501695
    message.attributes["ICE-CONTROLLING"] = 1
    if key is not None:
        message.add_message_integrity(key)
    if fingerprint:
        message.add_fingerprint()
    return bytes(message)


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent until it closed the connection (EOF or reset); fails
    after :data:`READ_BOUND_S` if it never does."""
    received = b""
    async with asyncio.timeout(READ_BOUND_S):
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's payload (bounded by :data:`READ_BOUND_S`)."""
    async with asyncio.timeout(READ_BOUND_S):
        header = await reader.readexactly(2)
        return await reader.readexactly(int.from_bytes(header, "big"))


def split_frames(data: bytes) -> list[bytes]:
    """The payloads of the whole frames in ``data``, in order."""
    payloads = []
    while len(data) >= 2:
        end = 2 + int.from_bytes(data[:2], "big")
        payloads.append(data[2:end])
        data = data[end:]
    return payloads


@contextlib.asynccontextmanager
async def connected(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A TCP connection to 127.0.0.1 ``port``, closed at exit whatever happened."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
