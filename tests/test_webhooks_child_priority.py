"""The delivery child's CPU priority (whip/webhooks/child_priority.py): SCHED_IDLE while it
keeps up; starved there, it is replaced by a nice child, which goes SCHED_IDLE again once
calm; nothing is skipped across the change. The governor's rules by themselves, then a
real child starved by a real busy loop on the CPU it is pinned to, moved back in place
where the kernel allows it and replaced where it does not."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.events import NewEvent
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.processes import process_gone
from tests.support.webhook_receivers import Receivers, retrying_hook
from whip.webhooks.child_priority import (
    Level,
    PriorityGovernor,
    PriorityTuning,
    RunQueueWait,
    all_threads_at,
    idle_supported,
    leave_sched_idle,
    thread_ids,
)
from whip.webhooks.config import parse_webhooks
from whip.webhooks.delivery_process import DELIVERY_NICE, DeliveryProcess
from whip.webhooks.group import FEED_GATHER_S

SECRET = "whsec_" + base64.b64encode(b"p" * 32).decode()
TUNING = PriorityTuning(
    window_s=1.0, starved_fraction=0.5, starved_windows=3, calm_s=10.0, calm_max_s=35.0
)


def feed(governor: PriorityGovernor, fraction: float, windows: int) -> list[Level | None]:
    return [governor.observe(fraction, 1.0) for _ in range(windows)]


def test_idle_only_where_a_starvation_can_be_seen() -> None:
    assert idle_supported(), "Linux with /proc/<pid>/task/<tid>/schedstat: the CI's host"
    blind = PriorityGovernor(TUNING, available=False)
    assert blind.level is Level.NICE
    assert feed(blind, 0.0, 1000) == [None] * 1000 and blind.level is Level.NICE
    assert PriorityGovernor(TUNING, available=True).level is Level.IDLE


def test_a_wait_over_the_last_windows_together_moves_it_to_nice() -> None:
    governor = PriorityGovernor(TUNING, available=True)
    # the first windows never decide alone; under half of the last three does not count
    assert feed(governor, 0.4, 5) == [None] * 5
    # the kernel books a wait when the thread finally runs: nothing, nothing, then a lump
    assert feed(governor, 0.0, 2) == [None, None]
    assert governor.observe(1.5, 1.0) is Level.NICE, "(0 + 0 + 1.5) / 3 is half"
    assert governor.level is Level.NICE and governor.starvations == 1
    assert governor.observe(1.0, 0.0) is None, "an empty window decides nothing"


def test_a_lump_outside_the_last_windows_does_not_count() -> None:
    governor = PriorityGovernor(TUNING, available=True)
    assert feed(governor, 1.4, 1) + feed(governor, 0.0, 3) == [None] * 4
    assert governor.observe(1.4, 1.0) is None, "(0 + 0 + 1.4) / 3 is under half"
    assert governor.level is Level.IDLE


def test_calm_brings_it_back_to_idle_later_each_time_until_a_stable_spell() -> None:
    governor = PriorityGovernor(TUNING, available=True)
    needed = []
    for _ in range(4):
        assert feed(governor, 1.0, 3)[-1] is Level.NICE
        # a busy window at nice restarts the calm count
        calm = int(governor.calm_needed_s)
        assert feed(governor, 0.0, calm - 1) == [None] * (calm - 1)
        assert governor.observe(0.05, 1.0) is None
        assert feed(governor, 0.0, calm - 1) == [None] * (calm - 1)
        assert governor.observe(0.0, 1.0) is Level.IDLE
        needed.append(calm)
    assert needed == [10, 20, 35, 35], "doubled each return, up to calm_max_s"
    assert feed(governor, 0.0, 3599) == [None] * 3599
    assert governor.calm_needed_s == 35.0
    assert governor.observe(0.0, 1.0) is None and governor.calm_needed_s == 10.0
    assert governor.level is Level.IDLE and governor.starvations == 4


HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + float(sys.argv[2])
print("busy", flush=True)
while time.monotonic() < end:
    pass
"""


def hog(cpu: int, seconds: float) -> subprocess.Popen[bytes]:
    """A busy loop on one CPU, at this process's priority, ending by itself; returned once
    it loops (its start may take a while on a loaded host, blocked on the disk: not a
    run-queue wait)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOG, str(cpu), str(seconds)], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else b""
    if line != b"busy\n":
        proc.kill()
        proc.wait()
        raise AssertionError(f"the busy loop did not start within 30 s: {line!r}")
    assert os.sched_getscheduler(proc.pid) == os.SCHED_OTHER, "a normal task"
    return proc


def test_the_run_queue_wait_of_a_process_behind_a_busy_loop() -> None:
    cpu = max(os.sched_getaffinity(0))
    first, second = hog(cpu, 5), hog(cpu, 5)
    try:
        wait = RunQueueWait(first.pid)
        time.sleep(0.6)
        waited = wait.take()
        # two busy loops on one CPU: each runs about half the time, waits the other half
        assert waited is not None and 0.15 < waited < 0.7, waited
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    assert wait.take() is None, "the process is gone"


def kernel_lets_us_leave_sched_idle() -> bool:
    """Whether this process may move another out of ``SCHED_IDLE`` (``CAP_SYS_NICE``, or
    an ``RLIMIT_NICE`` that allows it): tried on a sleeping child."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.sched_setscheduler(sleeper.pid, os.SCHED_IDLE, os.sched_param(0))
        return leave_sched_idle(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


UNPRIVILEGED = """
import ctypes, os, resource, sys
if sys.argv[1] == "drop":  # CAP_SYS_NICE out of the bounding set, then exec: gone
    if ctypes.CDLL(None, use_errno=True).prctl(24, 23, 0, 0, 0) != 0 and os.geteuid() == 0:
        sys.exit(5)
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[2], "run", sys.argv[3]])
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
if int(status["CapEff"], 16) & (1 << 23):
    sys.exit(4)
from whip.webhooks.child_priority import leave_sched_idle
sys.exit(0 if leave_sched_idle(int(sys.argv[2])) else 3)
"""


def test_leaving_sched_idle_where_the_kernel_refuses_and_where_it_allows() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.sched_setscheduler(sleeper.pid, os.SCHED_IDLE, os.sched_param(0))
        refused = subprocess.run(
            [sys.executable, "-c", UNPRIVILEGED, "drop", UNPRIVILEGED, str(sleeper.pid)],
            check=False,
        )
        assert refused.returncode == 3, "without CAP_SYS_NICE nor RLIMIT_NICE: refused"
        assert all_threads_at(sleeper.pid, os.SCHED_IDLE)
        if os.geteuid() == 0:  # CI runs as root: CAP_SYS_NICE
            assert leave_sched_idle(sleeper.pid) and not all_threads_at(sleeper.pid, os.SCHED_IDLE)
            assert os.sched_getscheduler(sleeper.pid) == os.SCHED_OTHER
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_the_child_is_a_normal_task_whatever_its_parents_policy(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    """A server at SCHED_BATCH stands for one at a real-time policy (what a SVT-AV1 encoder
    opened as root leaves on its thread): the child is SCHED_OTHER at nice all the same."""
    timeline = await asyncio.to_thread(timeline_factory)
    (webhook,) = parse_webhooks([{"url": "http://127.0.0.1:9/", "secret": SECRET}])
    delivery = DeliveryProcess(
        [webhook], timeline, tmp_path / "webhooks", "asyncio", gather_s=0.05, sched_idle=False
    )
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    try:
        await delivery.start()
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    try:
        assert delivery.pid is not None
        assert all_threads_at(delivery.pid, os.SCHED_OTHER)
        nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + DELIVERY_NICE)
        assert os.getpriority(os.PRIO_PROCESS, delivery.pid) == nice
    finally:
        await delivery.aclose()


@pytest.mark.parametrize("in_place", [True, False], ids=["in_place_if_allowed", "replaced"])
async def test_a_starved_child_goes_nice_then_idle_again_nothing_skipped(
    tmp_path: Path,
    timeline_factory: Callable[..., Timeline],
    caplog: pytest.LogCaptureFixture,
    in_place: bool,
) -> None:
    assert os.sched_getscheduler(0) == os.SCHED_OTHER, "the test's own process is a normal one"
    caplog.set_level(logging.DEBUG, logger="whip.webhooks.delivery_process")
    moved_in_place = in_place and kernel_lets_us_leave_sched_idle()
    timeline = await asyncio.to_thread(timeline_factory)
    receivers = Receivers()
    await receivers.start()
    endpoint = receivers.add("hook", SECRET)
    webhook = retrying_hook(receivers.url("/ok/hook"), SECRET)
    tuning = PriorityTuning(window_s=0.2, starved_windows=3, calm_s=3.0)
    delivery = DeliveryProcess(
        [webhook],
        timeline,
        tmp_path / "webhooks",
        "asyncio",
        gather_s=FEED_GATHER_S,
        tuning=tuning,
        leave_idle_in_place=in_place,
    )
    wanted: list[str] = []

    async def append(n: int) -> None:
        seq = await timeline.append(NewEvent(f"run-{n % 3}", "stream_warning", "p", {"n": n}))
        wanted.append(f"run-{n % 3}:{seq}")

    await delivery.start()
    busy: subprocess.Popen[bytes] | None = None
    try:
        first = delivery.pid
        assert first is not None
        await eventually(
            lambda: all_threads_at(first, os.SCHED_IDLE), within=10, awaiting="SCHED_IDLE at ready"
        )
        for n in range(10):
            await append(n)
        await eventually(
            lambda: len(endpoint.first_ids()) == 10, within=20, awaiting="deliveries at idle"
        )
        # starve it: its threads and a busy loop on one CPU, deliveries wanted meanwhile
        cpu = max(os.sched_getaffinity(0))
        for tid in thread_ids(first):
            os.sched_setaffinity(tid, {cpu})
        busy = await asyncio.to_thread(hog, cpu, 30.0)
        n = 10
        deadline = time.monotonic() + 20
        while delivery.governor.level is Level.IDLE and time.monotonic() < deadline:
            await append(n)
            n += 1
            await asyncio.sleep(0.02)
        assert delivery.governor.level is Level.NICE and delivery.governor.starvations == 1
        if moved_in_place:
            assert delivery.pid == first and delivery.starts == 1, "moved, not replaced"
        else:
            await eventually(lambda: delivery.pid != first, within=10, awaiting="a new child")
            assert delivery.starts == 2
            await eventually(lambda: process_gone(first), within=10, awaiting="the old one")
        second = delivery.pid
        assert second is not None
        nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + DELIVERY_NICE)
        await eventually(
            lambda: os.getpriority(os.PRIO_PROCESS, second) == nice,
            within=10,
            awaiting="the child's nice",
        )
        assert all_threads_at(second, os.SCHED_OTHER)
        busy.kill()
        busy.wait()
        for tid in thread_ids(second):  # moved in place, it is still pinned: free it
            os.sched_setaffinity(tid, os.sched_getaffinity(0))
        for m in range(n, n + 10):
            await append(m)
        await eventually(
            lambda: all_threads_at(second, os.SCHED_IDLE),
            within=20,
            awaiting="SCHED_IDLE again, once calm",
        )
        assert delivery.pid == second and delivery.starts == (1 if moved_in_place else 2)
        assert delivery.governor.level is Level.IDLE
        await eventually(
            lambda: sorted(endpoint.first_ids()) == sorted(wanted),
            within=30,
            awaiting=lambda: f"all {len(wanted)}: got {len(endpoint.first_ids())}",
        )
        for run in ("run-0", "run-1", "run-2"):
            seqs = [int(i.split(":")[1]) for i in endpoint.first_ids() if i.startswith(run)]
            assert seqs == sorted(seqs), "in order per run"
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, "a replacement is not a child dying under the server"
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
            if busy.stdout is not None:
                busy.stdout.close()
        await delivery.aclose()
        await receivers.close()
