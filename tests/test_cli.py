"""The CLI end to end: a real server process, a real publish, the operator commands."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.eventually import eventually_blocking
from tests.support.servers import serve_argv
from whip.config import LimitsConfig

PYTHON = sys.executable


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(
    tmp_path: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real ``whip-ingest serve`` process on a free port of 127.0.0.1, accepting
    connections, as ``(url, process)``; SIGINT (then kill after 15 s) on the way out.
    Its output goes to ``tmp_path/server.log``."""
    port = _free_port()
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        serve_argv(port, tmp_path / "data"), stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:

        def accepting() -> bool:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return True
            except OSError:
                return False

        eventually_blocking(accepting, within=30, awaiting="the server started", every=0.1)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with serving(tmp_path) as (url, _proc):
        yield url


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WHIP_INGEST_TOKEN": ""}
    return subprocess.run(
        [PYTHON, "-m", "whip", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_publish_then_operate_on_the_run(server: str) -> None:
    publisher = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "whip",
            "publish",
            "--test-pattern",
            f"{server}/whip/cli-test",
            "--duration",
            "8",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A bound, not a timing figure: each cli() call is a fresh interpreter (~1 s, and
        # several on a loaded 2-core machine), and the publisher imports PyAV before it
        # POSTs. The session is found by an in-process probe first (which fails at once if
        # the publisher exits), so the CLI's own `sessions` call starts while the 8 s push
        # is surely live; its run outlives it.
        found = _session_run_id(server, "cli-test", publisher, bound_s=60)
        sessions = cli("sessions", "--server", server, "--json")
        assert sessions.returncode == 0, sessions.stderr
        live = [s["run_id"] for s in json.loads(sessions.stdout)["items"]]
        assert live == [found]
        listed = cli("runs", "ls", "--server", server, "--json")
        assert listed.returncode == 0, listed.stderr
        runs: list[dict[str, object]] = json.loads(listed.stdout)["items"]
        (run,) = runs
        run_id = str(run["id"])
        assert run["stream"] == "cli-test"
        table = cli("runs", "ls", "--server", server)
        assert run_id in table.stdout and "STATE" in table.stdout
        assert live == [run_id]
        # --follow streams until the session closes (the publisher ends after 8 s).
        follow = cli("runs", "events", run_id, "--follow", "--json", "--server", server)
        assert follow.returncode == 0, follow.stderr
        types = [json.loads(line)["type"] for line in follow.stdout.splitlines()]
        assert types[0] == "run_created" and types[-1] == "session_closed"
        assert "first_frame" in types
        _, progress = publisher.communicate(timeout=30)
        assert publisher.returncode == 0, progress
        assert "frames" in progress and "kb/s" in progress
    finally:
        if publisher.poll() is None:
            publisher.kill()
        publisher.communicate()
    shown = cli("runs", "show", run_id, "--server", server, "--json")
    assert json.loads(shown.stdout)["state"] == "ended"
    refused = cli("runs", "stop", run_id, "--server", server)
    assert refused.returncode == 1 and "not_live" in refused.stderr
    deleted = cli("runs", "delete", run_id, "--server", server)
    assert deleted.returncode == 0
    again = cli("runs", "delete", run_id, "--server", server)
    assert json.loads(again.stdout)["repeat"] is True
    missing = cli("runs", "show", "r_nope", "--server", server)
    assert missing.returncode == 1 and "404" in missing.stderr


def _get_json(url: str, timeout_s: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def _session_run_id(
    server: str, stream: str, publisher: subprocess.Popen[str], bound_s: float
) -> str:
    """The run id of the live session on ``stream``, once it is listed (bounded; fails at
    once if the publisher exits first)."""

    def listed() -> str | None:  # the list cannot be long-polled: re-ask
        if publisher.poll() is not None:
            _, said = publisher.communicate()
            raise AssertionError(f"publisher exited {publisher.returncode}: {said}")
        items = _get_json(f"{server}/v1/sessions")["items"]
        runs = [str(item["run_id"]) for item in items if item["stream"] == stream]
        if not runs:
            return None
        (run_id,) = runs
        return run_id

    found: str = eventually_blocking(
        listed, within=bound_s, awaiting=f"a session on {stream}", every=0.1
    )
    return found


def _event(server: str, run_id: str, etype: str, bound_s: float) -> dict[str, Any]:
    """The run's first ``etype`` event, long-polling its timeline (bounded)."""
    after = 0
    deadline = time.monotonic() + bound_s
    while (remaining := deadline - time.monotonic()) > 0:
        wait_s = min(remaining, 30)
        url = f"{server}/v1/runs/{run_id}/events?after={after}&wait={wait_s:.2f}"
        for event in _get_json(url, timeout_s=wait_s + 10)["items"]:
            if event["type"] == etype:
                return dict(event)
            after = int(event["seq"])
    raise AssertionError(f"no {etype} for {run_id} within {bound_s} s")


@pytest.mark.parametrize(
    ("stop", "status"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
    ids=["SIGINT", "SIGTERM"],
)
def test_a_stop_signal_on_publish_deletes_the_session(
    server: str, stop: signal.Signals, status: int
) -> None:
    """SIGTERM (a service manager, ``timeout``, a container stop) ends a push exactly as
    Ctrl-C does: the publisher DELETEs its session URL, so the run records
    ``session_closed{deleted}`` long before the reclaimer could (it would say
    ``peer_gone``, ``reclaim_after_s`` after the media stopped), and exits 128 + signal."""
    stream = f"stop-{stop.name.lower()}"
    publisher = subprocess.Popen(
        [PYTHON, "-m", "whip", "publish", "--test-pattern", f"{server}/whip/{stream}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Bounds, not timing figures: the publisher imports PyAV before it POSTs (seconds
        # on a loaded 2-core machine).
        run_id = _session_run_id(server, stream, publisher, bound_s=60)
        _event(server, run_id, "first_frame", bound_s=30)  # the push loop is running
        signalled_ms = time.time() * 1000
        publisher.send_signal(stop)
        _, progress = publisher.communicate(timeout=20)
        assert publisher.returncode == status, progress
        assert f"stopped by {stop.name}: session deleted" in progress
    finally:
        if publisher.poll() is None:
            publisher.kill()
        publisher.communicate()
    closed = _event(server, run_id, "session_closed", bound_s=10)
    assert closed["data"]["reason"] == "deleted"
    reclaim_ms = LimitsConfig().reclaim_after_s * 1000
    assert closed["ts_ms"] - signalled_ms < reclaim_ms / 3
    events = cli("runs", "events", run_id, "--json", "--server", server)
    closes = [json.loads(line) for line in events.stdout.splitlines()]
    reasons = [e["data"]["reason"] for e in closes if e["type"] == "session_closed"]
    assert reasons == ["deleted"]


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_serve_runs_on_the_configured_event_loop(tmp_path: Path, kind: str) -> None:
    env = {**os.environ, "WHIP_INGEST_SERVER_EVENT_LOOP": kind}
    with (
        serving(tmp_path, env) as (url, proc),
        urllib.request.urlopen(f"{url}/healthz", timeout=10) as answer,
    ):
        assert answer.status == 200
    assert proc.returncode == 0, (tmp_path / "server.log").read_text()
    assert f"{kind} loop)" in (tmp_path / "server.log").read_text()
