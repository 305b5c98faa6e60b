"""The embedded webhooks' delivery process (whip/webhooks/delivery_process.py): a child
that follows the WAL itself. Killed under the server, it is replaced and nothing is
skipped; it refuses a cursor file that is not one; it dies with the server; and the
server's own process runs no delivery."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from registry.events import NewEvent
from registry.timeline import Timeline
from tests.support.eventually import eventually, eventually_blocking
from tests.support.processes import process_gone
from tests.support.webhook_receivers import Endpoint, Receivers, retrying_hook
from whip.webhooks.config import parse_webhooks
from whip.webhooks.cursor import CursorFileError
from whip.webhooks.delivery_process import (
    DELIVERY_NICE,
    STATUS_INTERVAL_S,
    STATUS_QUIET_CHECKS,
    STATUS_TRAILING_S,
    DeliveryProcess,
)
from whip.webhooks.group import FEED_GATHER_S

SECRET = "whsec_" + base64.b64encode(b"d" * 32).decode()
RUNS = ("run-a", "run-b", "run-c")


def in_order_per_run(ids: list[str]) -> bool:
    for run in RUNS:
        seqs = [int(i.split(":")[1]) for i in ids if i.startswith(f"{run}:")]
        if seqs != sorted(seqs):
            return False
    return True


@contextlib.asynccontextmanager
async def delivering_to_a_receiver(
    tmp_path: Path, timeline: Timeline
) -> AsyncIterator[tuple[DeliveryProcess, Endpoint]]:
    """A started delivery process with one webhook (``hook``) to a verifying receiver on
    loopback; both closed after the block."""
    receivers = Receivers()
    await receivers.start()
    endpoint = receivers.add("hook", SECRET)
    webhook = retrying_hook(receivers.url("/ok/hook"), SECRET)
    delivery = DeliveryProcess(
        [webhook], timeline, tmp_path / "webhooks", "asyncio", gather_s=FEED_GATHER_S
    )
    await delivery.start()
    try:
        yield delivery, endpoint
    finally:
        await delivery.aclose()
        await receivers.close()


async def test_a_killed_delivery_process_is_replaced_and_nothing_is_skipped(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    async with delivering_to_a_receiver(tmp_path, timeline) as (delivery, endpoint):
        wanted: list[str] = []
        for n in range(60):
            run = RUNS[n % 3]
            seq = await timeline.append(NewEvent(run, "stream_warning", "p", {"n": n}))
            await timeline.append(NewEvent(run, "stats", "p", {"n": n}))  # not wanted
            wanted.append(f"{run}:{seq}")
        await eventually(
            lambda: len(endpoint.first_ids()) >= 20,
            within=20,
            awaiting=lambda: f"deliveries under way: {len(endpoint.first_ids())}",
        )
        first = delivery.pid
        assert first is not None
        # the deliveries yield the cores to the server's threads (module rules)
        server_nice = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, first) == min(19, server_nice + DELIVERY_NICE)
        # SIGTERM (a service manager stopping the whole group) does not stop it: it
        # leaves when the server closes its stdin, its cursors saved
        os.kill(first, signal.SIGTERM)
        seq = await timeline.append(NewEvent("run-a", "stream_warning", "p", {"n": "term"}))
        wanted.append(f"run-a:{seq}")
        await eventually(
            lambda: f"run-a:{seq}" in endpoint.first_ids(),
            within=20,
            awaiting="delivery after SIGTERM",
        )
        assert delivery.pid == first and delivery.starts == 1 and not process_gone(first)
        os.kill(first, signal.SIGKILL)
        for n in range(60, 90):  # appended while no child or a new one runs
            run = RUNS[n % 3]
            seq = await timeline.append(NewEvent(run, "stream_warning", "p", {"n": n}))
            wanted.append(f"{run}:{seq}")
        await eventually(
            lambda: sorted(endpoint.first_ids()) == sorted(wanted),
            within=30,
            awaiting=lambda: f"all {len(wanted)}: got {len(endpoint.first_ids())}",
        )
        assert delivery.starts == 2 and delivery.pid != first
        assert in_order_per_run(endpoint.first_ids())
        bodies: dict[str, set[bytes]] = {}
        for d in endpoint.delivered:
            bodies.setdefault(d.msg_id, set()).add(d.body)
        assert all(len(b) == 1 for b in bodies.values()), "a repeat carries its first body"
        status = await delivery.webhooks[0].describe()
        assert status["state"] == "active" and status["cursor"] == timeline.durable_seq
        assert status["lag_events"] == 0 and delivery.webhooks[0].lag_events == 0
        assert delivery.webhooks[0].outcomes["success"] >= 1
        # the server's process ran no delivery: no webhook thread was started in it
        assert not [t.name for t in threading.enumerate() if t.name.startswith("webhook")]
        assert delivery.wakeups >= 1
    assert delivery.pid is not None and process_gone(delivery.pid)


def context_switches(pid: int) -> int:
    """Every thread's context switches so far (each one a wake-up or a preemption)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as status:
            for line in status:
                if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                    total += int(line.split()[1])
    return total


def saved_upto(cursors: Path, name: str) -> int | None:
    """The webhook's cursor in the cursor file, or None (not written yet)."""
    try:
        entry = json.loads(cursors.read_text())["webhooks"][name]
    except (OSError, ValueError, KeyError):
        return None
    upto = entry["upto"]
    return upto if isinstance(upto, int) else None


async def test_an_idle_delivery_child_sleeps_and_its_items_follow_the_log_again(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    async with delivering_to_a_receiver(tmp_path, timeline) as (delivery, endpoint):
        remote = delivery.webhooks[0]
        for n in range(5):
            await timeline.append(NewEvent("run-a", "stream_warning", "p", {"n": n}))
        await eventually(  # the pushed item (no request), not a fresh one
            lambda: remote.status()["cursor"] == timeline.durable_seq,
            within=20,
            awaiting=lambda: f"pushed cursor {remote.status()['cursor']}",
        )
        cursors = tmp_path / "webhooks" / "cursors.json"
        await eventually(  # the last cursor save (a group commit up to 1 s after)
            lambda: saved_upto(cursors, "hook") == timeline.durable_seq,
            within=20,
            awaiting=lambda: f"saved cursor {saved_upto(cursors, 'hook')}",
        )
        # the item's last change pushed, then its quiet checks: asleep after that
        await asyncio.sleep((STATUS_QUIET_CHECKS + 1) * (STATUS_INTERVAL_S + STATUS_TRAILING_S))
        assert delivery.pid is not None
        before = context_switches(delivery.pid)
        await asyncio.sleep(2.0)
        woke = context_switches(delivery.pid) - before
        # looking for changes every 50 ms, idle or not, had made about 40 in 2 s
        assert woke <= 4, f"an idle delivery child woke {woke} times in 2 s"
        seq = await timeline.append(NewEvent("run-a", "stream_warning", "p", {"n": "after"}))
        await eventually(
            lambda: remote.status()["cursor"] == seq and remote.status()["lag_events"] == 0,
            within=20,
            awaiting=lambda: f"pushed item after the quiet: {remote.status()}",
        )
        assert f"run-a:{seq}" in endpoint.first_ids()
        assert remote.outcomes["success"] == 6


async def test_the_pushed_items_follow_retries_when_no_frame_comes(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    with socket.socket() as probe:  # a port nobody listens on: every attempt refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    webhook = retrying_hook(f"http://127.0.0.1:{port}/hook", SECRET)
    delivery = DeliveryProcess(
        [webhook], timeline, tmp_path / "webhooks", "asyncio", gather_s=FEED_GATHER_S
    )
    await delivery.start()
    remote = delivery.webhooks[0]
    try:
        await timeline.append(NewEvent("run-a", "stream_warning", "p", {"n": 0}))
        # one durable frame, then none: only the child's own checks can push the attempts
        await eventually(
            lambda: sum(remote.outcomes.values()) >= 5,
            within=20,
            awaiting=lambda: f"pushed item: {remote.status()}",
        )
        item = remote.status()
        assert "success" not in remote.outcomes and item["lag_events"] == 1
        assert item["in_flight"] == 1 and isinstance(item["lag_seconds"], float)
        await eventually(  # the seconds of the event in delivery grow in the pushed item
            lambda: float(remote.status()["lag_seconds"]) > float(item["lag_seconds"]),
            within=5,
            awaiting=lambda: f"lag_seconds still {remote.status()['lag_seconds']}",
        )
    finally:
        await delivery.aclose()


async def test_a_cursor_file_that_is_not_one_refuses_the_start(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    (tmp_path / "webhooks").mkdir()
    (tmp_path / "webhooks" / "cursors.json").write_text('{"something": "else"}')
    (webhook,) = parse_webhooks([{"url": "http://127.0.0.1:9/", "secret": SECRET}])
    delivery = DeliveryProcess(
        [webhook], timeline, tmp_path / "webhooks", "asyncio", gather_s=FEED_GATHER_S
    )
    with pytest.raises(CursorFileError, match="not a webhook cursor"):
        await delivery.start()
    assert delivery.pid is not None and process_gone(delivery.pid)
    assert len(timeline.feed) == 0, "the feed subscription was given back"


PARENT = """
import asyncio, sys
from pathlib import Path
from registry.timeline import Timeline, TimelineConfig
from whip.webhooks.config import parse_webhooks
from whip.webhooks.delivery_process import (
    DELIVERY_NICE,
    STATUS_INTERVAL_S,
    STATUS_QUIET_CHECKS,
    STATUS_TRAILING_S,
    DeliveryProcess,
)

async def main():
    timeline = Timeline.open(TimelineConfig(Path(sys.argv[1])))
    hooks = parse_webhooks([{"url": "http://127.0.0.1:9/", "secret": sys.argv[2]}])
    delivery = DeliveryProcess(hooks, timeline, Path(sys.argv[1]) / "webhooks", "asyncio",
                               gather_s=0.05)
    await delivery.start()
    print(delivery.pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_the_delivery_child_exits_when_the_server_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "data"), SECRET],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not process_gone(child)
        parent.kill()
        parent.wait(10)
        eventually_blocking(lambda: process_gone(child), within=10, awaiting="the child to exit")
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
