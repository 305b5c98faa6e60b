"""Which asyncio event loop the server runs on (``server.event_loop``).

``uvloop`` (the default) is libuv's loop for asyncio: the same asyncio API, with the
loop's own machinery (``call_soon``, handles, the ready queue, socket I/O) in C instead
of Python. That machinery is a large share of an append's CPU: every durable append
wakes its producer task through ``call_soon``, so uvloop makes appends cheaper (figures:
``docs/PERFORMANCE.md``, "Event loop"). ``asyncio`` keeps the standard library's
loop (for debugging, or a platform without uvloop). The test suite runs on the
configured default (tests/conftest.py), so what is tested is what is served.
"""

from __future__ import annotations

import asyncio
from typing import Literal

EventLoopKind = Literal["uvloop", "asyncio"]
DEFAULT_EVENT_LOOP: EventLoopKind = "uvloop"


def new_event_loop(kind: EventLoopKind = DEFAULT_EVENT_LOOP) -> asyncio.AbstractEventLoop:
    """A new, not yet running event loop of ``kind``."""
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()
