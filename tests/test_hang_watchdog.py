"""The hang watchdog (tests/support/hang_watchdog.py) ends a pytest process whose test is
stuck where pytest-timeout's signal cannot reach it, with the stuck test's stack on stderr;
a test that pytest-timeout can interrupt is left to it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STUCK = """
import signal, time

def test_stuck_where_the_signal_cannot_reach():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)

def test_interruptible():
    time.sleep(60)
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_stuck.py").write_text(STUCK)
    argv = [sys.executable, "-m", "pytest", "-p", "tests.support.hang_watchdog",
            "-p", "no:cacheprovider", "--timeout", "1", "-q", *args]  # fmt: skip
    env = {**os.environ, "WHIP_TEST_HANG_GRACE_S": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50, check=False
    )


def test_a_test_the_signal_cannot_reach_ends_its_process_with_its_stack(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "test_stuck.py::test_stuck_where_the_signal_cannot_reach")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Timeout (0:00:02)!" in done.stderr
    assert "in test_stuck_where_the_signal_cannot_reach" in done.stderr
    assert "passed" not in done.stdout and "failed" not in done.stdout  # never reported


def test_a_test_pytest_timeout_interrupts_is_left_to_it(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "test_stuck.py::test_interruptible")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout and "Timeout" in done.stdout
    assert "Timeout (0:00:02)!" not in done.stderr
