"""Smoke run of the leak soak: ``bench/soak.py --quick`` passes all its checks.

The soak starts its own server process (loopback, temp data dir), opens and closes 40
sessions in sequence and 40 in waves of 10 with real aiortc publishers (some vanish and
are reclaimed as ``peer_gone``), and checks that open fds, threads, asyncio tasks and
the live gauges return to the baseline and RSS stays within its tolerance. About 45 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "bench" / "soak.py"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_soak_quick_returns_to_baseline() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--quick"],
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert done.stdout.strip(), f"no report (exit {done.returncode}): {done.stderr[-3000:]}"
    report = json.loads(done.stdout)
    failed = [c for c in report["checks"] if not c["pass"]]
    assert not failed and report["passed"] and done.returncode == 0, (
        f"soak checks failed: {json.dumps(failed, indent=1)[:4000]}\n"
        f"rss: {report.get('rss')}\nlog problems: {report.get('server_log_problems')}\n"
        f"work dir kept: {report.get('work_dir')}\nstderr tail: {done.stderr[-1500:]}"
    )
    # The run did what it says: every session connected and decoded, some vanished.
    for phase in report["phases"].values():
        assert phase["first_frame"] == phase["sessions"] == 40
        assert phase["vanished"] > 0
    assert report["wal"]["close_reasons"].get("peer_gone", 0) > 0
