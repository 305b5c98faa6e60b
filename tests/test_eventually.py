"""tests/support/eventually.py: the bounded wait every test uses for state it can only look at."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.support.eventually import eventually, eventually_blocking


async def test_returns_the_first_truthy_value_of_the_condition() -> None:
    values = iter([0, None, "", [], {"n": 3}, {"n": 4}])
    value = await eventually(lambda: next(values), within=5, awaiting="a value", every=0)
    assert value == {"n": 3}


async def test_an_async_condition_is_awaited_and_its_value_returned() -> None:
    calls: list[int] = []

    async def probe() -> int:
        await asyncio.sleep(0)
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    assert await eventually(probe, within=5, awaiting="three probes", every=0) == 3


async def test_a_timeout_names_what_was_awaited_and_the_last_value() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(AssertionError, match=r"not within 0.2 s: the door open \(last value: 0\)"):
        await eventually(lambda: 0, within=0.2, awaiting="the door open")
    assert 0.199 <= loop.time() - started < 2  # uvloop's clock counts whole milliseconds


async def test_a_described_state_is_computed_only_at_the_timeout() -> None:
    described: list[int] = []

    def state() -> str:
        described.append(1)
        return "12 of 100 parked"

    with pytest.raises(AssertionError, match="12 of 100 parked"):
        await eventually(lambda: False, within=0.05, awaiting=state)
    assert described == [1]


async def test_an_async_condition_that_hangs_is_cut_off_at_the_bound() -> None:
    forever = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(AssertionError, match="a wakeup"):
        await eventually(forever.wait, within=0.2, awaiting="a wakeup")
    assert loop.time() - started < 2


async def test_an_error_in_the_condition_fails_at_once() -> None:
    def broken() -> bool:
        raise AssertionError("the publisher exited")

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(AssertionError, match="the publisher exited"):
        await eventually(broken, within=30, awaiting="never")
    assert loop.time() - started < 1


async def test_the_condition_sees_state_that_other_tasks_change() -> None:
    box: list[str] = []
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, box.append, "ready")
    assert await eventually(lambda: box, within=5, awaiting="the box filled") == ["ready"]


def test_the_blocking_variant_waits_for_another_thread() -> None:
    box: list[str] = []
    timer = threading.Timer(0.05, box.append, ("ready",))
    timer.start()
    try:
        assert eventually_blocking(lambda: box, within=5, awaiting="the box filled") == ["ready"]
    finally:
        timer.cancel()
    with pytest.raises(AssertionError, match=r"not within 0\.05 s: nothing"):
        eventually_blocking(lambda: None, within=0.05, awaiting="nothing")


async def test_the_blocking_variant_refuses_the_event_loop_thread() -> None:
    with pytest.raises(RuntimeError, match="await eventually"):
        eventually_blocking(lambda: True, within=1, awaiting="anything")
