"""System crash loop: SIGKILL the real server under mixed load, restart it, verify.

The loop is ``bench/support/system_crash_loop.py`` (its docstring lists each iteration's
steps and checks); ``bench/system_crash.py`` runs it longer. Randomness is seeded:
``WHIP_SYSTEM_CRASH_SEED`` replays a failure's plans (the exact kill instant still
depends on timing).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from bench.support.server_process import free_port
from bench.support.system_crash_loop import (
    IterationResult,
    LoopState,
    final_restart,
    restrict_ice_to_loopback,
    run_iteration,
    tail,
)

TEST_ITERATIONS = 10


def master_seed() -> int:
    env = os.environ.get("WHIP_SYSTEM_CRASH_SEED")
    return int(env) if env else random.SystemRandom().randrange(2**32)


# ---------------------------------------------------------------- the tests


async def _loop(tmp_path: Path, iterations: int) -> list[IterationResult]:
    seed = master_seed()
    rng = random.Random(seed)
    state = LoopState(tmp_path / "data", tmp_path / "server.log", free_port())
    history: list[IterationResult] = []
    for iteration in range(iterations):
        iteration_seed = rng.randrange(2**32)
        try:
            history.append(await run_iteration(state, iteration, iteration_seed))
        except AssertionError as exc:
            pytest.fail(
                f"iteration {iteration} failed (WHIP_SYSTEM_CRASH_SEED={seed}, iteration seed "
                f"{iteration_seed}, data dir {state.data_dir}): {exc}\n--- server log ---\n"
                f"{tail(state)}"
            )
    try:
        await final_restart(state)
    except AssertionError as exc:
        pytest.fail(f"final restart failed (WHIP_SYSTEM_CRASH_SEED={seed}): {exc}")
    assert all(r.ok for r in history)
    assert sum(r.confirmed for r in history) >= 5 * iterations, (seed, history)
    assert sum(r.interrupted for r in history) > 0, (seed, history)
    return history


@pytest.fixture
def loopback_ice(monkeypatch: pytest.MonkeyPatch) -> None:
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "get_host_addresses", aioice.ice.get_host_addresses)
    restrict_ice_to_loopback()


@pytest.mark.timeout(300)
async def test_sigkill_under_load_loses_nothing_confirmed(
    tmp_path: Path, loopback_ice: None
) -> None:
    await _loop(tmp_path, TEST_ITERATIONS)
