"""The process GC policy (whip/gcpolicy.py): the real server applies it while it runs and
restores the interpreter's settings on cleanup."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from tests.support.servers import make_config
from whip.app import create_app
from whip.gcpolicy import DEFAULT_YOUNG_THRESHOLD, set_young_threshold


@pytest.mark.parametrize(
    ("configured", "expected_young"),
    [(None, DEFAULT_YOUNG_THRESHOLD), (25_000, 25_000), (0, "unchanged")],
)
async def test_server_sets_the_young_threshold_and_restores_it(
    tmp_path: Path, configured: int | None, expected_young: int | str
) -> None:
    before = gc.get_threshold()
    overrides = {} if configured is None else {"server__gc_young_threshold": configured}
    server = TestServer(create_app(make_config(tmp_path, **overrides)), host="127.0.0.1")
    await server.start_server()
    try:
        running = gc.get_threshold()
        young = before[0] if expected_young == "unchanged" else expected_young
        assert running == (young, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        await server.close()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_set_young_threshold_keeps_the_older_generations_and_undoes() -> None:
    before = gc.get_threshold()
    undo = set_young_threshold(before[0] + 1234)
    try:
        assert gc.get_threshold() == (before[0] + 1234, *before[1:])
    finally:
        undo()
    assert gc.get_threshold() == before
    set_young_threshold(0)()
    assert gc.get_threshold() == before
