"""Webhooks end to end: one real push, real receivers on loopback, each receiver behaving
as a real one may (well, down for a while, hanging, trickling, redirecting, answering
100 MB, gone), and what each webhook makes of it.

One push serves every property (the suite's time budget): the receivers are separate
webhooks of one server, so the push also shows that a bad receiver holds up no other.
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from registry.events import Event
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.servers import normal_push
from tests.support.webhook_receivers import HUGE_BODY_BYTES, RawReceiver, Receivers
from whip.appkeys import TIMELINE_KEY, WEBHOOKS_KEY
from whip.webhooks.config import DEFAULT_EVENTS
from whip.webhooks.cursor import FileCursorStore
from whip.webhooks.signing import message_id

FAST_RETRY = {"retry_min_s": 0.05, "retry_max_s": 0.2}


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
async def receivers() -> AsyncIterator[tuple[Receivers, RawReceiver, RawReceiver]]:
    http_receivers, hang, trickle = Receivers(), RawReceiver("hang"), RawReceiver("trickle")
    for receiver in (http_receivers, hang, trickle):
        await receiver.start()
    yield http_receivers, hang, trickle
    for receiver in (trickle, hang, http_receivers):
        await receiver.close()


def webhook_status(server: TestServer) -> dict[str, dict[str, Any]]:
    return {d.name: d.status() for d in server.app[WEBHOOKS_KEY]}


async def test_one_push_every_receiver_behaviour(
    receivers: tuple[Receivers, RawReceiver, RawReceiver],
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    http, hang, trickle = receivers
    good = http.add("good", new_secret())
    flaky = http.add("flaky", new_secret(), accept_first=1, refuse=3)
    nobody = http.add("nobody", new_secret())
    other = new_secret()
    lifecycle_start = ["run_created"]
    server = await whip_servers(
        webhooks=[
            {"name": "good", "url": http.url("/ok/good"), "secret": good.secret, **FAST_RETRY},
            {"name": "flaky", "url": http.url("/flaky/flaky"), "secret": flaky.secret} | FAST_RETRY,
            {"name": "hang", "url": hang.url, "secret": other, "timeout_s": 60},
            {"name": "trickle", "url": trickle.url, "secret": other, "timeout_s": 0.3}
            | {"events": lifecycle_start, **FAST_RETRY},
            {"name": "huge", "url": http.url("/huge"), "secret": other, "events": lifecycle_start},
            {"name": "redirect", "url": http.url("/redirect"), "secret": other}
            | {"events": lifecycle_start, **FAST_RETRY},
            {"name": "gone", "url": http.url("/gone"), "secret": other, **FAST_RETRY},
            {"name": "nobody", "url": http.url("/ok/nobody"), "secret": nobody.secret}
            | {"principals": ["somebody-else"]},
        ]
    )
    timeline: Timeline = server.app[TIMELINE_KEY]
    publisher = await normal_push(server, "cam")
    run_id = publisher.run_id

    def closed_delivered() -> bool:
        return any(d.payload["type"] == "session_closed" for d in good.delivered)

    await eventually(closed_delivered, within=20, awaiting="session_closed at the good receiver")
    events: list[Event] = await timeline.read_events(run_id, 0, 1000)
    wanted = [e for e in events if e.type in DEFAULT_EVENTS]
    wanted_ids = [message_id(e) for e in wanted]
    types = [e.type for e in wanted]
    assert types[:2] == ["run_created", "session_connected"] and types[-1] == "session_closed"
    assert "first_frame" in types

    # the good receiver: every lifecycle event, verified, once each, in order
    assert [d.msg_id for d in good.delivered] == wanted_ids
    assert [d.payload["data"] for d in good.delivered] == [e.to_json() for e in wanted]

    # the flaky one: down after its first, until 3 refusals; then all, none skipped,
    # repeats only with the same id and body
    await eventually(
        lambda: flaky.first_ids() == wanted_ids,
        within=10,
        awaiting=lambda: f"flaky got {flaky.first_ids()} of {wanted_ids}",
    )
    assert len(flaky.refused) == 3 and flaky.delivered[0].msg_id == wanted_ids[0]
    bodies: dict[str, set[bytes]] = {}
    for delivery in flaky.delivered + flaky.refused:
        bodies.setdefault(delivery.msg_id, set()).add(delivery.body)
    assert all(len(b) == 1 for b in bodies.values()), "one id, one body"
    assert {d.msg_id for d in flaky.refused} <= set(wanted_ids)

    # the hanging one has held its first request all along, without holding up the rest
    assert hang.requests == 1 and hang.closed_by_client == 0
    async with aiohttp.ClientSession() as client:
        async with client.get(server.make_url("/healthz")) as response:
            assert response.status == 200
        async with client.get(server.make_url("/v1/webhooks")) as response:
            assert response.status == 200
            listing = await response.json()
        async with client.get(server.make_url("/metrics")) as response:
            metrics = await response.text()
    assert [item["name"] for item in listing["items"]] == [
        "good", "flaky", "hang", "trickle", "huge", "redirect", "gone", "nobody"
    ]  # fmt: skip
    assert all("whsec" not in str(item) for item in listing["items"])
    hung = webhook_status(server)["hang"]
    assert hung["in_flight"] == 1 and hung["lag_events"] > 0 and hung["lag_seconds"] > 0
    assert hung["deliveries"] == {} and hung["state"] == "active"

    # the trickling one is cut by its timeout, again and again: never a success
    await eventually(
        lambda: webhook_status(server)["trickle"]["deliveries"].get("timeout", 0) >= 2,
        within=10,
        awaiting=lambda: f"trickle timeouts: {webhook_status(server)['trickle']}",
    )
    assert "success" not in webhook_status(server)["trickle"]["deliveries"]
    assert trickle.closed_by_client >= 1

    # 100 MB answered: delivered, the body not read past a small bound
    await eventually(lambda: http.huge_written, within=10, awaiting="the huge answer to end")
    huge = webhook_status(server)["huge"]
    assert huge["deliveries"].get("success") == 1 and huge["last_status"] == 200
    assert http.huge_written[0] < HUGE_BODY_BYTES // 4, http.huge_written

    # a redirect is never followed: retried, and the target never reached
    await eventually(
        lambda: webhook_status(server)["redirect"]["deliveries"].get("redirect", 0) >= 2,
        within=10,
        awaiting="the redirect to be refused twice",
    )
    redirect = webhook_status(server)["redirect"]
    assert http.target_hits == 0 and redirect["last_status"] == 307
    assert "redirect not followed" in redirect["last_error"]

    # 410 disables the webhook at once: one request although more events followed
    gone = webhook_status(server)["gone"]
    assert gone["state"] == "disabled" and http.gone_hits == 1
    assert gone["deliveries"] == {"gone": 1} and gone["cursor"] < wanted[0].seq

    # a principals filter that matches nobody: nothing sent, the cursor passes it all
    last = events[-1].seq
    await eventually(
        lambda: webhook_status(server)["nobody"]["cursor"] >= last,
        within=10,
        awaiting=lambda: f"nobody's cursor past {last}: {webhook_status(server)['nobody']}",
    )
    assert nobody.requests == 0

    # the good webhook's cursor is saved past the run, and its figures are exported
    async def saved_past_last() -> bool:
        state = await FileCursorStore(timeline.config.data_dir / "webhooks").load("good")
        return state is not None and state.upto >= wanted[-1].seq

    await eventually(saved_past_last, within=10, awaiting="good's cursor file past the run")
    success_line = 'whip_webhook_deliveries_total{outcome="success",webhook="good"} '
    assert f"{success_line}{float(len(wanted))}" in metrics, metrics
    assert 'whip_webhook_lag_events{webhook="hang"}' in metrics
    # the delivery process at SCHED_IDLE, never starved (whip/webhooks/child_priority.py)
    assert "whip_webhook_delivery_sched_idle 1.0" in metrics
    assert "whip_webhook_delivery_starvations_total 0.0" in metrics
