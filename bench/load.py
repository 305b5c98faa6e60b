#!/usr/bin/env python3
"""A WHIP POST burst from its own process: all offers at once, over warm connections.

Input (``--plan``, JSON): ``{"url": ".../whip", "posts": [{"offer": SDP, "token": T}]}``
(``token`` may be null: anonymous mode). Output (``--out``, JSON, one record per post in
input order): ``{"status", "code", "latency_ms", "location", "run_id", "retry_after"}``
plus ``{"burst_s": wall time of the burst}``. Progress goes to stderr.

Running the client in a separate process keeps its own work (and its share of the GIL)
off the server's event loop, so latencies measured by someone probing the server during
the burst are the server's. Keep-alive connections are opened first, 100 at a time
(below aiohttp's default listen backlog of 128): an overflowed accept queue drops SYNs,
which clients retry only after a second, and that would be measured instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL


async def warm(http: aiohttp.ClientSession, url: URL, count: int, batch: int = 100) -> None:
    """Hold ``count`` connections open at once, then return them all to the pool."""
    held: list[aiohttp.ClientResponse] = []
    try:
        for start in range(0, count, batch):
            held += await asyncio.gather(*(http.get(url) for _ in range(min(batch, count - start))))
    finally:
        for response in held:
            await response.read()
            response.release()


async def burst(plan: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    url = URL(plan["url"])
    posts = plan["posts"]
    records: list[dict[str, Any]] = [{} for _ in posts]
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=120)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as http:
        await warm(http, url.with_path("/healthz"), len(posts))
        print(f"load: {len(posts)} connections warm", file=sys.stderr)

        async def post(index: int) -> None:
            item = posts[index]
            headers = {"Content-Type": "application/sdp"}
            if item.get("token"):
                headers["Authorization"] = f"Bearer {item['token']}"
            started = time.monotonic()
            async with http.post(url, data=item["offer"], headers=headers) as response:
                body = await response.read()
                record = records[index]
                record["latency_ms"] = (time.monotonic() - started) * 1000
                record["status"] = response.status
                record["retry_after"] = response.headers.get("Retry-After")
                record["location"] = response.headers.get("Location", "")
                record["run_id"] = response.headers.get("X-Run-Id", "")
                code = ""
                if response.status != 201:
                    try:
                        code = json.loads(body)["error"]["code"]
                    except (ValueError, KeyError, TypeError):
                        code = ""
                record["code"] = code

        started = time.monotonic()
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(post(i) for i in range(len(posts))))
        elapsed = time.monotonic() - started
    return {"burst_s": elapsed, "records": records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    result = asyncio.run(burst(plan, args.timeout))
    args.out.write_text(json.dumps(result))
    print(f"load: burst of {len(plan['posts'])} in {result['burst_s']:.2f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
