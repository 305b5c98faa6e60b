"""The server under test as a subprocess, shared by the bench scripts and the tests.

:class:`ServerProcess` runs ``python -m whip serve`` (or a wrapper that runs it the same
way) on a free 127.0.0.1 port with its own ``--data-dir``, stdout and stderr to a log
file, a clean environment (no inherited ``WHIP_INGEST_*``, only the overrides given). Its
PID is recorded and only it is ever signalled: SIGINT to stop (graceful: closes live
sessions, flushes the timeline), SIGKILL only past the deadline.

:func:`serve_argv` is that command line (tests that kill, signal or restart the server
build their own process from it); :func:`wait_ready` is the one readiness wait
(``GET /readyz`` until 200, failing at once if the process exits).

Nothing here imports the ``whip`` package: the command line runs it in another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0


def log(source: str, message: str) -> None:
    """One progress line on stderr, ``[source HH:MM:SS] message`` (stdout is the report)."""
    print(f"[{source} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    """A TCP port on HOST that was free a moment ago (bound, read back, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def serve_args(port: int, data_dir: Path, *extra: str) -> list[str]:
    """``serve`` and its flags on HOST (``extra``: more flags, later ones win): what follows
    the launcher. The ICE UDP and TCP ports are free ones (``--udp-port 0``,
    ``--tcp-port 0``): runs on one machine never contend for the default 8189."""
    return [
        "serve",
        "--host",
        HOST,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--udp-port",
        "0",
        "--tcp-port",
        "0",
        *extra,
    ]


def serve_argv(port: int, data_dir: Path, *extra: str) -> list[str]:
    """The command line of a real server process on HOST (``extra``: more flags)."""
    return [sys.executable, "-m", "whip", *serve_args(port, data_dir, *extra)]


async def wait_ready(
    base: str, exit_code: Callable[[], int | None], within_s: float = READY_TIMEOUT_S
) -> float:
    """Poll ``GET {base}/readyz`` until 200, at most ``within_s`` seconds; the seconds it
    took. ``exit_code()`` is the process's exit status (None while it runs): an exit
    ends the wait at once. Raises :class:`RuntimeError` (exited, or not ready in time).
    Its own client session: no connection to the server is left open afterwards.

    Cancellation: stops polling; the process keeps running.
    """
    started = time.monotonic()
    deadline = started + within_s
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while True:
            code = exit_code()
            if code is not None:
                raise RuntimeError(f"server exited with {code}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        return time.monotonic() - started
            if time.monotonic() >= deadline:
                raise RuntimeError(f"server not ready within {within_s} s")
            await asyncio.sleep(0.05)


def media_budget_env(sessions: int) -> dict[str, str]:
    """Media budget overrides that never refuse ``sessions`` two-track sessions: the
    default (4 GiB / 256 threads) admits 128, and a bench measures the server, not the
    budget (which then only does accounting)."""
    n = max(sessions, 128)
    return {
        "WHIP_INGEST_LIMITS_MEDIA_BUDGET_BYTES": str(n * 2 * 16 * (1 << 20)),
        "WHIP_INGEST_LIMITS_MEDIA_BUDGET_THREADS": str(min(4096, n * 2)),
    }


class ServerProcess:
    """One server subprocess, started by the constructor (module doc).

    ``env_overrides`` are the ``WHIP_INGEST_*`` settings (reported by the scripts);
    ``bench_env`` are further variables for a wrapper (``launcher``), not reported.
    ``max_sessions`` sets both ``--max-sessions`` and ``--stream-limit``.
    """

    def __init__(
        self,
        source: str,
        data_dir: Path,
        log_path: Path,
        max_sessions: int,
        env_overrides: Mapping[str, str],
        *,
        bench_env: Mapping[str, str] | None = None,
        launcher: Sequence[str] = ("-m", "whip"),
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.source = source
        self.data_dir, self.log_path = data_dir, log_path
        self.stop_timeout_s = stop_timeout_s
        self.port = free_port()
        self.base = f"http://{HOST}:{self.port}"
        limits = ("--max-sessions", str(max_sessions), "--stream-limit", str(max_sessions))
        self.cmd = [sys.executable, *launcher, *serve_args(self.port, data_dir, *limits)]
        self.env_overrides = dict(env_overrides)
        env = {k: v for k, v in os.environ.items() if not k.startswith("WHIP_INGEST_")}
        env.update(bench_env or {})
        env.update(self.env_overrides)
        with open(log_path, "wb") as sink:
            self.proc = subprocess.Popen(
                self.cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink
            )
        self.pid = self.proc.pid
        self.spawned_at = time.monotonic()
        self.ready_s = math.nan
        self.stop: dict[str, Any] = {}
        self.log(f"server pid {self.pid} on {self.base}, data dir {data_dir}, log {log_path}")

    def log(self, message: str) -> None:
        log(self.source, message)

    async def wait_ready(self) -> float:
        """Poll ``GET /readyz`` until 200 (the process must still be running); the
        seconds since the start, also kept in ``ready_s``. Its own client session: no
        connection to the server is left open afterwards.

        Cancellation: stops polling; the process keeps running (``shutdown`` stops it).
        """
        left = self.spawned_at + READY_TIMEOUT_S - time.monotonic()
        try:
            await wait_ready(self.base, self.proc.poll, left)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {self.tail()}") from None
        self.ready_s = round(time.monotonic() - self.spawned_at, 3)
        self.log(f"server ready after {self.ready_s} s")
        return self.ready_s

    def tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server log ("" if unreadable)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def problems(self, *, first: int = 0, most_common: int = 0) -> dict[str, Any]:
        """The WARNING, ERROR and Traceback lines of the server log: ``count``, plus the
        ``first`` few lines and the ``most_common`` messages (each key only when asked)."""
        lines: list[str] = []
        with contextlib.suppress(OSError):
            lines = [
                line
                for line in self.log_path.read_text(errors="replace").splitlines()
                if " WARNING " in line or " ERROR " in line or "Traceback" in line
            ]
        out: dict[str, Any] = {"count": len(lines)}
        if first:
            out["first"] = lines[:first]
        if most_common:
            kinds = Counter(line.split(": ", 1)[-1][:80] for line in lines)
            out["most_common"] = kinds.most_common(most_common)
        return out

    def shutdown(self) -> dict[str, Any]:
        """SIGINT (graceful), SIGKILL only past ``stop_timeout_s``; this process only.
        The outcome is returned and kept in ``stop``. Blocks up to the deadline + 5 s."""
        if self.proc.poll() is not None:
            self.stop = {"exit_code": self.proc.returncode, "already_exited": True}
            return self.stop
        started = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        killed = False
        try:
            self.proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.log(f"server pid {self.pid} ignored SIGINT for {self.stop_timeout_s} s: SIGKILL")
            self.proc.kill()
            self.proc.wait(5)
            killed = True
        self.stop = {
            "signal": "SIGINT",
            "exit_code": self.proc.returncode,
            "seconds": round(time.monotonic() - started, 2),
            "killed": killed,
        }
        self.log(f"server pid {self.pid} stopped: {self.stop}")
        return self.stop
