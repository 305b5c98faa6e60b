"""The webhooks' HTTP attempts in a child process (whip/webhooks/attempt_process.py):
attempts are made there; a child killed under the server is replaced and nothing is
skipped; a cancelled attempt closes its connection in the child; the child exits when
the server closes it, and when the server is SIGKILLed."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from registry.events import NewEvent
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.processes import process_gone
from tests.support.webhook_receivers import RawReceiver, Receivers, retrying_hook
from whip.webhooks.attempt_process import AttemptProcess
from whip.webhooks.cursor import FileCursorStore
from whip.webhooks.dispatcher import WebhookDispatcher
from whip.webhooks.group import WebhookGroup
from whip.webhooks.signing import headers

SECRET = "whsec_" + base64.b64encode(b"a" * 32).decode()


async def test_attempts_are_made_in_the_child_and_a_killed_child_is_replaced(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    receivers = Receivers()
    await receivers.start()
    endpoint = receivers.add("hook", SECRET)
    attempts = AttemptProcess("uvloop")
    dispatcher = WebhookDispatcher(
        retrying_hook(receivers.url("/ok/hook"), SECRET),
        timeline,
        FileCursorStore(tmp_path / "webhooks"),
    )
    group = WebhookGroup([dispatcher], timeline, attempts=attempts)
    await group.start()
    try:
        first = attempts.pid
        assert first is not None and first != os.getpid() and attempts.starts == 1
        for n in range(5):
            await timeline.append(NewEvent("r1", "stream_warning", "p", {"n": n}))
        ids = [f"r1:{seq}" for seq in range(1, 11)]
        await eventually(lambda: endpoint.first_ids() == ids[:5], within=10, awaiting="5 events")
        assert attempts.attempts == endpoint.requests == 5  # each through the child

        os.kill(first, signal.SIGKILL)
        await eventually(lambda: process_gone(first), within=10, awaiting="the child reaped")
        for n in range(5, 10):
            await timeline.append(NewEvent("r1", "stream_warning", "p", {"n": n}))
        await eventually(
            lambda: endpoint.first_ids() == ids,
            within=20,
            awaiting=lambda: f"all 10 in order, got {endpoint.first_ids()}",
        )
        assert attempts.starts == 2 and attempts.pid not in (None, first)
    finally:
        await group.aclose()
        await receivers.close()
        await asyncio.to_thread(timeline.close)
    last = attempts.pid
    assert last is not None and process_gone(last), "aclose waited for the child's exit"


async def test_a_cancelled_attempt_closes_its_connection_in_the_child() -> None:
    hang = RawReceiver("hang")
    await hang.start()
    attempts = AttemptProcess("uvloop")
    try:
        webhook = retrying_hook(hang.url, SECRET, timeout_s=60)
        body = b'{"type":"stream_warning"}'
        task = asyncio.create_task(
            attempts.attempt(webhook, body, headers(webhook.secret_key, "r1:1", 1, body))
        )
        await eventually(lambda: hang.requests == 1, within=10, awaiting="the request")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await eventually(
            lambda: hang.closed_by_client == 1, within=10, awaiting="the child to close it"
        )
    finally:
        await attempts.aclose()
        await hang.close()


PARENT = """
import asyncio, sys
from whip.webhooks.attempt_process import AttemptProcess

async def main():
    attempts = AttemptProcess("asyncio")
    await attempts.start()
    print(attempts.pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_the_child_exits_when_the_server_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not process_gone(child)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not process_gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)  # the child is init's now: it is reaped there
        assert process_gone(child), "the child outlived the server"
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
