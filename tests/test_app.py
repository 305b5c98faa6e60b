"""The application's start-up and cleanup (:mod:`whip.app`): one cleanup context per
resource, entered in order and exited in reverse, so a failure part-way through start-up
still closes what was opened (the timeline's writer thread and the data-dir lock)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from registry.errors import DataDirLockedError
from registry.timeline import Timeline, TimelineConfig
from tests.support.servers import make_config
from whip.app import create_app
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.config import Config
from whip.negotiation import Negotiator
from whip.session_manager import SessionSeams


class BrokenStartError(RuntimeError):
    """Raised by a start-up step on purpose."""


def _writer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("wal-writer")]


def _data_dir_is_free(data_dir: Path) -> bool:
    try:
        timeline = Timeline.open(TimelineConfig(data_dir))
    except DataDirLockedError:
        return False
    timeline.close()
    return True


async def test_a_failure_after_the_timeline_opened_closes_it(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    opened: list[Config] = []

    def failing_negotiator(config: Config) -> Negotiator:
        # The session manager is built right after the timeline opened: fail there.
        opened.append(config)
        assert not _data_dir_is_free(config.server.data_dir), "the timeline holds the lock"
        raise BrokenStartError("injected start-up failure")

    writers_before = _writer_threads()
    server = TestServer(
        create_app(config, seams=SessionSeams(negotiator=failing_negotiator)), host="127.0.0.1"
    )
    with pytest.raises(BrokenStartError):
        await server.start_server()
    await server.close()
    assert opened == [config], "start-up reached the step after the timeline"
    assert _writer_threads() == writers_before, "the writer thread was left running"
    assert _data_dir_is_free(config.server.data_dir), "the data-dir lock was left held"


async def test_cleanup_closes_sessions_before_the_timeline(tmp_path: Path) -> None:
    server = TestServer(create_app(make_config(tmp_path)), host="127.0.0.1")
    await server.start_server()
    timeline = server.app[TIMELINE_KEY]
    manager = server.app[SESSIONS_KEY]
    assert timeline.ready and not _data_dir_is_free(tmp_path / "data")
    await server.close()
    assert not timeline.ready, "the timeline was closed"
    assert len(manager.table) == 0
    assert _data_dir_is_free(tmp_path / "data")


def test_create_app_checks_the_aiortc_adapter_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """``create_app`` refuses an aiortc stack other than the verified one (the check is
    :func:`whip.rtc.compat.check_internals`; here the installed version is made to differ
    by pretending the metadata says so)."""
    import importlib.metadata

    from whip.rtc.compat import IncompatibleAiortcError

    real_version = importlib.metadata.version

    def version(name: str) -> str:
        return "0.0.1" if name == "aiortc" else real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(IncompatibleAiortcError, match=r"aiortc 0\.0\.1"):
        create_app(make_config(Path("/nonexistent-never-opened")))
