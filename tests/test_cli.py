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

import pytest

from tests.support.eventually import eventually_blocking
from tests.support.servers import serve_argv

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
            "5",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A bound, not a timing figure: each cli() call is a fresh interpreter (~1 s on a
        # loaded 2-core machine), and the publisher imports PyAV before it POSTs.
        deadline = time.monotonic() + 60

        def listed_runs() -> list[dict[str, object]]:  # once the push is admitted
            listed = cli("runs", "ls", "--server", server, "--json")
            assert listed.returncode == 0, listed.stderr
            return list(json.loads(listed.stdout)["items"])

        runs = eventually_blocking(listed_runs, within=60, awaiting="a run appeared", every=0.2)
        (run,) = runs
        run_id = str(run["id"])
        assert run["stream"] == "cli-test"
        table = cli("runs", "ls", "--server", server)
        assert run_id in table.stdout and "STATE" in table.stdout

        def live_runs() -> list[str]:  # run_created is durable just before the session exists
            sessions = cli("sessions", "--server", server, "--json")
            return [s["run_id"] for s in json.loads(sessions.stdout)["items"]]

        live = eventually_blocking(
            live_runs,
            within=deadline - time.monotonic(),  # the same 60 s as the run's appearance
            awaiting="a live session appeared",
            every=0,
        )
        assert live == [run_id]
        # --follow streams until the session closes (the publisher ends after 5 s).
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


def test_ctrl_c_on_publish_deletes_the_session(server: str) -> None:
    publisher = subprocess.Popen(
        [PYTHON, "-m", "whip", "publish", "--test-pattern", f"{server}/whip/interrupt"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # A bound, not a timing figure: each cli() call is a fresh interpreter (~1 s on a
        # loaded 2-core machine), and the publisher imports PyAV before it POSTs.

        def live_run() -> str:
            items = json.loads(cli("sessions", "--server", server, "--json").stdout)["items"]
            return str(items[0]["run_id"]) if items else ""

        run_id = eventually_blocking(live_run, within=60, awaiting="a live session", every=0.2)
        publisher.send_signal(signal.SIGINT)
        assert publisher.wait(20) == 130
    finally:
        if publisher.poll() is None:
            publisher.kill()
        publisher.communicate()
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
