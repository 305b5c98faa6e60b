"""The POST burst's other processes (tests/test_load.py): what would be other machines.

Usage (from the repository root)::

    python -m tests.support.load_procs offers COUNT OUT
    python -m tests.support.load_procs probe URL OUT [--every SECONDS]

- ``offers``: COUNT aiortc publishers (video only, ICE host candidates on 127.0.0.1)
  make their offers; the offers go to OUT (a JSON list) and ``ready`` is printed on
  stdout (flushed). The publishers stay open, so each offer's ICE endpoint answers the
  server's connectivity checks, until stdin reaches end of file; then they are closed.
- ``probe``: ``GET URL`` every SECONDS (default 0.02) over one keep-alive connection,
  ``ready`` once the connection is open, until stdin reaches end of file; then OUT gets
  ``{"latencies_ms": [...], "started": [...], "statuses": {...}}``: every answer's wall
  time, client side, and when its request started (``time.monotonic()``, the same clock
  in every process).

Both run in their own process so that the server's event loop, garbage collector and
GIL carry only the server, as in production, where publishers and health checkers are
other machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

OFFER_BATCH = 50


async def stdin_closed() -> None:
    """Return once the parent closes our stdin (or exits)."""
    await asyncio.to_thread(sys.stdin.buffer.read)


def announce() -> None:
    print("ready", flush=True)


def write_json(path: Path, value: object) -> None:
    """Small and once, at the end: blocking is fine in this process."""
    path.write_text(json.dumps(value))


async def hold_offers(count: int, out: Path) -> int:
    from tests.support.peers import AiortcPublisher
    from whip.rtc.host_addresses import restrict_host_addresses

    restrict_host_addresses(["127.0.0.1"])
    publishers = [AiortcPublisher() for _ in range(count)]
    try:
        offers: list[str] = []
        for start in range(0, count, OFFER_BATCH):
            batch = publishers[start : start + OFFER_BATCH]
            offers += await asyncio.gather(*(p.offer(audio=False) for p in batch))
        write_json(out, offers)
        announce()
        await stdin_closed()
    finally:
        await asyncio.gather(*(p.close() for p in publishers), return_exceptions=True)
    return 0


async def probe(url: str, out: Path, every_s: float) -> int:
    import aiohttp

    latencies: list[float] = []
    starts: list[float] = []
    statuses: Counter[int] = Counter()
    stop = asyncio.ensure_future(stdin_closed())
    connector = aiohttp.TCPConnector(limit=1, keepalive_timeout=120)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        async with http.get(url) as response:  # the connection is open before timing
            await response.read()
        announce()
        while not stop.done():
            started = time.monotonic()
            async with http.get(url) as response:
                await response.read()
            latencies.append((time.monotonic() - started) * 1000)
            starts.append(started)
            statuses[response.status] += 1
            await asyncio.wait({stop}, timeout=max(0.0, started + every_s - time.monotonic()))
    write_json(out, {"latencies_ms": latencies, "started": starts, "statuses": statuses})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    offers = sub.add_parser("offers")
    offers.add_argument("count", type=int)
    offers.add_argument("out", type=Path)
    prober = sub.add_parser("probe")
    prober.add_argument("url")
    prober.add_argument("out", type=Path)
    prober.add_argument("--every", type=float, default=0.02)
    args = parser.parse_args(argv)
    if args.command == "offers":
        return asyncio.run(hold_offers(args.count, args.out))
    return asyncio.run(probe(args.url, args.out, args.every))


if __name__ == "__main__":
    if not __package__:  # run as a script: make ``tests`` and ``whip`` importable
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
