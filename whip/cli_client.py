"""The operator and publisher commands of ``whip-ingest`` (everything but ``serve``).

Human-readable tables by default, ``--json`` for scripts (one JSON document, or one
event per line for ``events --follow``). Exit status: 0 ok, 1 the server refused
(the error code is printed), 2 bad usage, 130 interrupted (SIGINT); ``publish`` stopped
by a signal exits 128 + its number (130 SIGINT, 143 SIGTERM) after deleting its session.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from whip.client import ApiClient, ApiError, Target


def add_client_commands(sub: Any) -> None:
    """Register ``runs``, ``sessions`` and ``publish`` on the top-level subparsers."""

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--server", help="server URL (env WHIP_INGEST_URL)")
        parser.add_argument("--token", help="bearer token (env WHIP_INGEST_TOKEN)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    runs = sub.add_parser("runs", help="list, inspect, stop and delete runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True)
    ls = runs_sub.add_parser("ls", help="list runs, newest first")
    common(ls)
    ls.add_argument("--state")
    ls.add_argument("--principal")
    ls.add_argument("--stream")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    for name, text in (
        ("show", "one run"),
        ("stop", "stop a run's live session"),
        ("delete", "delete a run"),
    ):
        cmd = runs_sub.add_parser(name, help=text)
        common(cmd)
        cmd.add_argument("run_id")
    events = runs_sub.add_parser("events", help="a run's timeline")
    common(events)
    events.add_argument("run_id")
    events.add_argument("--after", type=int, default=0)
    events.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep waiting for new events until the session closes",
    )
    sessions = sub.add_parser("sessions", help="live sessions")
    common(sessions)
    publish = sub.add_parser("publish", help="push a file or a test pattern over WHIP")
    publish.add_argument("source", nargs="?", help="media file (omit with --test-pattern)")
    publish.add_argument("url", nargs="?", help="WHIP endpoint, e.g. http://127.0.0.1:8080/whip")
    publish.add_argument("--test-pattern", action="store_true")
    publish.add_argument("--token", help="bearer token (env WHIP_INGEST_TOKEN)")
    publish.add_argument("--loop", action="store_true", help="repeat the file")
    publish.add_argument("--duration", type=float, default=None, help="stop after N seconds")


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [
        [str(row.get(c, "") if row.get(c) is not None else "-") for c in columns] for row in rows
    ]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _when(ms: Any) -> str:
    if not isinstance(ms, int):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


async def _run_api(args: argparse.Namespace) -> int:
    target = Target.from_args(args.server, args.token)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=90)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        api = ApiClient(target, http)
        if args.command == "sessions":
            page = await api.call("GET", "/v1/sessions")
            if args.json:
                print(json.dumps(page))
            else:
                print(
                    _table(page["items"], ["id", "run_id", "principal", "stream", "state", "age_s"])
                )
            return 0
        command = args.runs_command
        if command == "ls":
            items: list[dict[str, Any]] = []
            async for run in api.runs(
                state=args.state, principal=args.principal, stream=args.stream
            ):
                items.append(run)
                if len(items) >= args.limit:
                    break
            if args.json:
                print(json.dumps({"items": items}))
            else:
                rows = [{**r, "created": _when(r.get("created_ms"))} for r in items]
                print(_table(rows, ["id", "principal", "stream", "state", "created"]))
            return 0
        path = f"/v1/runs/{args.run_id}"
        if command == "show":
            run = await api.call("GET", path)
            print(json.dumps(run, indent=None if args.json else 2))
            return 0
        if command == "stop":
            print(json.dumps(await api.call("POST", path + "/stop")))
            return 0
        if command == "delete":
            print(json.dumps(await api.call("DELETE", path)))
            return 0
        if command == "events":
            follow = args.follow
            if follow:
                run = await api.call("GET", path)
                follow = run["state"] in ("starting", "live", "stopping")
            async for event in api.events(args.run_id, args.after, follow=follow):
                if args.json:
                    print(json.dumps(event), flush=True)
                else:
                    data = json.dumps(event["data"], separators=(",", ":"))
                    print(
                        f"{event['seq']:>8}  {_when(event['ts_ms'])}  {event['type']:<18} {data}",
                        flush=True,
                    )
            return 0
    return 2


def run_client(args: argparse.Namespace) -> int:
    """Execute a client command; errors become a one-line message and an exit status."""
    if args.command == "publish":
        return _publish(args)
    try:
        return asyncio.run(_run_api(args))
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _publish(args: argparse.Namespace) -> int:
    from whip.publish import publish  # PyAV is loaded only for this command

    source, url = args.source, args.url
    if args.test_pattern and url is None:
        source, url = None, source
    if url is None or (source is None and not args.test_pattern):
        print("usage: whip-ingest publish (SOURCE | --test-pattern) URL", file=sys.stderr)
        return 2
    token = args.token or Target.from_args(None, None).token
    try:
        progress = publish(
            url,
            source=Path(source) if source else None,
            token=token,
            loop=args.loop,
            duration_s=args.duration,
        )
    except KeyboardInterrupt:  # Ctrl-C before publish() took the stop signals: no session
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if progress.stopped_by is not None:
        # Bytes were sent only after the first mux's handshake, so a session existed.
        outcome = "session deleted" if progress.bytes_sent else "no session was created"
        print(f"stopped by {progress.stopped_by.name}: {outcome}", file=sys.stderr)
        return 128 + progress.stopped_by.value
    return 0
