"""A last-resort watchdog for a test stuck where pytest-timeout cannot reach it.

pytest-timeout (``timeout = 120`` in pyproject.toml) interrupts a test with ``SIGALRM``,
whose Python handler runs only when the interpreter gets the GIL back. A test stuck in C
code that holds the GIL (a libdatachannel lock taken without releasing it, one full run)
or with the signal blocked never sees it, and the run hangs until CI's own limit: one CI
run ended that way, 1,792 of 1,793 tests reported, nothing said about the last.

So each test also arms :func:`faulthandler.dump_traceback_later` (a C thread, no GIL
needed) at its pytest-timeout plus :data:`GRACE_S`: if the test is still running then,
every thread's Python stack goes to the worker's original stderr (the console: xdist
workers inherit it) and the worker exits. xdist reports "worker crashed while running
<test>" and starts a new worker, so the run ends, red, naming the test and where it
stood. pytest-timeout keeps the first word: the watchdog fires only when it could not.

A pytest plugin: ``pytest_plugins`` in tests/conftest.py loads it. ``WHIP_TEST_HANG_GRACE_S``
overrides :data:`GRACE_S` (its own test waits 1 s, not 60).
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator

import pytest

GRACE_S = float(os.environ.get("WHIP_TEST_HANG_GRACE_S", "60"))
"""How long past its pytest-timeout a test may run before the worker is ended."""

_stderr_fd: int | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Keep a descriptor on the original stderr (pytest's fd capture redirects fd 2
    around each test)."""
    global _stderr_fd
    if _stderr_fd is None and sys.__stderr__ is not None:
        _stderr_fd = os.dup(sys.__stderr__.fileno())


def deadline_s(item: pytest.Item) -> float:
    """The test's pytest-timeout (its ``timeout`` mark, else ``--timeout``, else the ini
    value) plus :data:`GRACE_S`."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        timeout = marker.args[0]
    else:
        timeout = item.config.getoption("timeout", None) or item.config.getini("timeout")
    return max(float(timeout or 0), 1.0) + GRACE_S


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Arm the watchdog around one test's whole protocol (setup, call, teardown)."""
    faulthandler.dump_traceback_later(
        deadline_s(item), exit=True, file=_stderr_fd if _stderr_fd is not None else sys.stderr
    )
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
