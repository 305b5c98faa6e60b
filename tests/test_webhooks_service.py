"""The webhook group (whip/webhooks/group.py): the feed's wake-ups are gathered, so
batches made durable close together reach the dispatchers in one take, and every event
is still delivered, in order per run."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from pathlib import Path

from registry.events import NewEvent
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.webhook_receivers import Receivers
from whip.webhooks.config import parse_webhooks
from whip.webhooks.cursor import FileCursorStore
from whip.webhooks.dispatcher import WebhookDispatcher
from whip.webhooks.group import FEED_GATHER_S, WebhookGroup

SECRET = "whsec_" + base64.b64encode(b"g" * 32).decode()
APPENDS = 60


async def test_batches_close_together_wake_the_group_once_per_gathering(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    receivers = Receivers()
    await receivers.start()
    endpoint = receivers.add("hook", SECRET)
    entry = {"name": "hook", "url": receivers.url("/ok/hook"), "secret": SECRET}
    (webhook,) = parse_webhooks([{**entry, "events": ["stream_warning"]}])
    dispatcher = WebhookDispatcher(webhook, timeline, FileCursorStore(tmp_path / "webhooks"))
    group = WebhookGroup([dispatcher], timeline)
    await group.start()
    try:
        started = time.monotonic()
        for n in range(APPENDS):  # one durable batch each: every append is awaited
            await timeline.append(NewEvent(f"r{n % 3}", "stream_warning", "p", {"n": n}))
        elapsed = time.monotonic() - started
        expected = [f"r{n % 3}:{n + 1}" for n in range(APPENDS)]
        await eventually(
            lambda: sorted(endpoint.first_ids(), key=lambda i: int(i.split(":")[1])) == expected,
            within=20,
            awaiting=lambda: f"every event delivered, got {len(endpoint.first_ids())}",
        )
        for run in ("r0", "r1", "r2"):  # in order per run
            ids = [i for i in endpoint.first_ids() if i.startswith(f"{run}:")]
            assert ids == [i for i in expected if i.startswith(f"{run}:")]
        # A take per batch would be APPENDS wake-ups; gathered, at most one per window
        # of the appends' time (plus the first and the last).
        assert group.wakeups <= elapsed / FEED_GATHER_S + 2, (group.wakeups, elapsed)
        assert group.wakeups < APPENDS / 2, (group.wakeups, elapsed)
    finally:
        await group.aclose()
        await receivers.close()
        await asyncio.to_thread(timeline.close)
