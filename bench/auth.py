#!/usr/bin/env python3
"""What authentication costs per request: the resolution of one ``Authorization`` header.

Prints one JSON document on stdout.

Each kind runs :meth:`whip.auth.Authenticator.resolve` in a loop on one event loop
(the server's default, uvloop), on one thread, for ``--seconds`` (default 2) after a
warm-up, ``--repeat`` times (default 3; best and median reported as verifications per
second and microseconds each, CPU time of this thread):

- ``static``: a static token, 10 ``[[principals]]`` configured (the lookup compares with
  all of them);
- ``jwt_rs256``, ``jwt_es256``, ``jwt_eddsa``: a JWT already verified once (the verified
  cache of :mod:`whip.auth.jwt_tokens`: a client's every API call repeats its token);
- ``jwt_*_first_use``: ``--tokens`` (default 400) distinct tokens, each verified once (keys
  cached from a JWKS file; a header parse, a key lookup, the signature verification
  and the claim checks), per repetition;
- ``hook_cached``: a token the auth hook (an aiohttp server on 127.0.0.1 in this process)
  admitted once; each further one is a cache hit (no request).

The HTTP request around it is not included (``bench/api.py`` measures the routes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # before bench/ (bench/whip.py)

from bench.support.jwt_keys import AUDIENCE, ISSUER, SigningKey, jwks_document
from whip.auth import Authenticator, hash_token
from whip.config import build_config
from whip.eventloop import DEFAULT_EVENT_LOOP, new_event_loop


async def _rate(
    resolve: Callable[[], Awaitable[object]], seconds: float, repeat: int
) -> dict[str, float]:
    for _ in range(200):  # warm-up
        await resolve()
    rates: list[float] = []
    for _ in range(repeat):
        count, started = 0, time.thread_time()
        while time.thread_time() - started < seconds:
            for _ in range(100):
                await resolve()
            count += 100
        rates.append(count / (time.thread_time() - started))
    return {
        "per_s_best": round(max(rates)),
        "per_s_median": round(statistics.median(rates)),
        "us_each_best": round(1e6 / max(rates), 2),
    }


async def _first_use(
    auth: Authenticator, mint: Callable[[], str], count: int, repeat: int
) -> dict[str, float]:
    rates: list[float] = []
    for _ in range(repeat):
        headers = [f"Bearer {mint()}" for _ in range(count)]
        started = time.thread_time()
        for header in headers:
            await auth.resolve(header)
        rates.append(count / (time.thread_time() - started))
    return {
        "per_s_best": round(max(rates)),
        "per_s_median": round(statistics.median(rates)),
        "us_each_best": round(1e6 / max(rates), 2),
    }


async def _hook_server() -> tuple[web.AppRunner, str]:
    async def admit(request: web.Request) -> web.Response:
        return web.json_response({"principal": "bench-hook", "role": "publisher"})

    app = web.Application()
    app.router.add_post("/auth", admit)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/auth"


async def main(seconds: float, repeat: int, tokens: int) -> dict[str, object]:
    keys = {alg: SigningKey.generate(alg, f"k-{alg}") for alg in ("RS256", "ES256", "EdDSA")}
    runner, hook_url = await _hook_server()
    with tempfile.TemporaryDirectory() as tmp:
        jwks = Path(tmp) / "jwks.json"
        jwks.write_bytes(jwks_document(*keys.values()))
        principals = [
            {"name": f"p{n}", "role": "publisher", "token_sha256": hash_token(f"static-{n}")}
            for n in range(10)
        ]
        document = {
            "auth": {
                "jwks_file": str(jwks),
                "issuer": ISSUER,
                "audience": AUDIENCE,
                "hook_url": hook_url,
            },
            "principals": principals,
        }
        auth = Authenticator.from_config(build_config(document, {}, {}))
    headers = {
        "static": "Bearer static-9",
        "jwt_rs256": f"Bearer {keys['RS256'].mint(exp=int(time.time()) + 3600)}",
        "jwt_es256": f"Bearer {keys['ES256'].mint(exp=int(time.time()) + 3600)}",
        "jwt_eddsa": f"Bearer {keys['EdDSA'].mint(exp=int(time.time()) + 3600)}",
        "hook_cached": "Bearer hook-token-bench",
    }
    results: dict[str, object] = {}
    try:
        for kind, header in headers.items():
            print(f"{kind} ...", file=sys.stderr)
            results[kind] = await _rate(lambda h=header: auth.resolve(h), seconds, repeat)
        for name, alg in (("rs256", "RS256"), ("es256", "ES256"), ("eddsa", "EdDSA")):
            print(f"jwt_{name}_first_use ...", file=sys.stderr)
            mint = keys[alg].mint
            results[f"jwt_{name}_first_use"] = await _first_use(auth, mint, tokens, repeat)
    finally:
        await auth.close()
        await runner.cleanup()
    assert auth.hook is not None
    return {
        "loop": DEFAULT_EVENT_LOOP,
        "seconds": seconds,
        "repeat": repeat,
        "tokens": tokens,
        "hook_calls": auth.hook.calls,
        "kinds": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    loop = new_event_loop(DEFAULT_EVENT_LOOP)
    try:
        figures = loop.run_until_complete(main(args.seconds, args.repeat, args.tokens))
    finally:
        loop.close()
    print(json.dumps(figures, indent=2))
