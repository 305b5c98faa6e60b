"""Detached work (:mod:`whip.detached`): a caller's cancellation never reaches the task.

Pinned here, as the module docstring states them:

- :meth:`DetachedTasks.run`: a cancelled caller stops waiting; the work runs to its end
  (and its result or error reaches a caller that did not cancel);
- :meth:`DetachedTasks.detach` starts a named task nobody awaits, kept by a strong
  reference until it finishes;
- :meth:`DetachedTasks.pending` lists the unfinished ones; :meth:`DetachedTasks.wait`
  waits up to a bound and returns those still pending; cancelling a ``wait`` abandons
  only the wait.

Ordered by events: each piece of work signals that it started and blocks on a release
event the test sets.

How each test was checked to fail (then restored): the cancellation tests by making
``run`` await the task without ``asyncio.shield``; the naming test by dropping
``task.set_name(name)``; the pending test by listing every kept task (no ``done()``
filter) and dropping the done callback that discards a finished task, and by waiting
without the timeout; the strong-reference test by not adding the task to ``_tasks``.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from whip.detached import DetachedTasks

WAIT_S = 5.0


class Work:
    """One piece of work that says when it started and finishes when released."""

    def __init__(self, result: str = "done") -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = False
        self.cancelled = False
        self.result = result

    async def __call__(self) -> str:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True
        return self.result


async def test_a_cancelled_caller_does_not_cancel_the_work() -> None:
    detached = DetachedTasks()
    work = Work()
    caller = asyncio.create_task(detached.run(work(), "close-s_1"))
    await asyncio.wait_for(work.started.wait(), WAIT_S)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    [task] = detached.pending()
    assert task.get_name() == "close-s_1" and not task.cancelled()
    work.release.set()
    assert await detached.wait(WAIT_S) == []
    assert (work.finished, work.cancelled) == (True, False)
    assert task.result() == "done"


async def test_run_returns_the_result_and_raises_the_error_of_the_work() -> None:
    detached = DetachedTasks()
    work = Work(result="answer")
    work.release.set()
    assert await detached.run(work(), "ok") == "answer"

    async def failing() -> None:
        raise LookupError("no such run")

    with pytest.raises(LookupError, match="no such run"):
        await detached.run(failing(), "failing")
    assert detached.pending() == []


async def test_detach_starts_a_named_task_nobody_awaits() -> None:
    detached = DetachedTasks()
    work = Work()
    task = detached.detach(work(), "tombstone-r_1")
    assert task.get_name() == "tombstone-r_1"
    await asyncio.wait_for(work.started.wait(), WAIT_S)
    assert detached.pending() == [task]
    work.release.set()
    assert await task == "done"


async def test_pending_lists_only_unfinished_tasks_and_wait_returns_the_stragglers() -> None:
    detached = DetachedTasks()
    quick, slow = Work(), Work()
    quick_task = detached.detach(quick(), "quick")
    slow_task = detached.detach(slow(), "slow")
    await asyncio.wait_for(asyncio.gather(quick.started.wait(), slow.started.wait()), WAIT_S)
    assert {t.get_name() for t in detached.pending()} == {"quick", "slow"}

    quick.release.set()
    await quick_task
    assert detached.pending() == [slow_task]

    # The bound is the behaviour under test here: the slow task is blocked on an event
    # nobody sets before the wait returns (the outer bound turns a wait that ignores its
    # own into a failure, not a hang).
    async with asyncio.timeout(WAIT_S):
        assert await detached.wait(0.05) == [slow_task]
    assert not slow_task.done(), "a wait that runs out leaves the task running"

    slow.release.set()
    assert await detached.wait(WAIT_S) == []
    assert detached.pending() == []
    assert slow.finished


async def test_wait_with_nothing_pending_returns_at_once() -> None:
    assert await DetachedTasks().wait(0) == []


async def test_a_cancelled_wait_abandons_only_the_wait() -> None:
    detached = DetachedTasks()
    work = Work()
    task = detached.detach(work(), "stop-r_1")
    await asyncio.wait_for(work.started.wait(), WAIT_S)
    waiter = asyncio.create_task(detached.wait(WAIT_S))
    await asyncio.sleep(0)  # let the waiter start waiting (one loop turn, not a delay)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert detached.pending() == [task] and not task.cancelled()
    work.release.set()
    assert await task == "done"


async def test_a_detached_task_is_kept_alive_while_nobody_else_refers_to_it() -> None:
    detached = DetachedTasks()

    async def orphan() -> None:
        # Waits on a future only this coroutine refers to: without the strong reference
        # in DetachedTasks, the task would be garbage (asyncio keeps tasks weakly).
        await asyncio.get_running_loop().create_future()

    reference = weakref.ref(detached.detach(orphan(), "orphan"))
    gc.collect()
    task = reference()
    assert task is not None, "the detached task was garbage-collected mid-flight"
    assert detached.pending() == [task]
    task.cancel()
    assert await detached.wait(WAIT_S) == []
