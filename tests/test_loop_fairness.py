"""A burst of POSTs shares the event loop: SDP checks take turns, negotiations are gated.

- :class:`whip.loop_fairness.TurnGate`: at most ``per_turn`` grants per loop iteration, in arrival
  order; a waiter cancelled before its turn takes nothing.
- :class:`whip.loop_fairness.LeaseGate`: at most ``size`` holders; a place held past its lease
  goes to the next waiter, and comes back exactly once.
- ``POST /whip`` checks at most ``limits.sdp_checks_per_turn`` offers per iteration and
  runs at most ``limits.negotiation_concurrency`` negotiations at once; one that waits
  (an mDNS candidate being resolved) does not hold the others up.

Loop iterations are counted by a ticker task (``await asyncio.sleep(0)`` resumes exactly
one iteration later).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

import whip.routes_whip
from tests.support.peers import AiortcPublisher
from whip.appkeys import SESSIONS_KEY
from whip.loop_fairness import LeaseGate, TurnGate
from whip.negotiation import Negotiated, Negotiator
from whip.session_manager import SessionManager, SessionSeams

FIXTURES = Path(__file__).parent.parent / "fixtures"


@asynccontextmanager
async def ticking() -> AsyncIterator[list[int]]:
    """``[n]``: the number of loop iterations since the block started."""
    tick = [0]

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0)
            tick[0] += 1

    task = asyncio.create_task(ticker(), name="ticker")
    try:
        yield tick
    finally:
        task.cancel()


async def test_turns_are_handed_out_per_iteration_in_arrival_order() -> None:
    gate = TurnGate(3)
    granted: list[tuple[int, int]] = []
    async with ticking() as tick:

        async def take(index: int) -> None:
            await gate.turn()
            granted.append((tick[0], index))

        await asyncio.gather(*(take(i) for i in range(20)))
    per_iteration = Counter(at for at, _ in granted)
    assert max(per_iteration.values()) == 3, per_iteration
    assert len(per_iteration) == 7  # 20 turns, 3 at a time
    assert [index for _, index in granted] == list(range(20))


async def test_a_waiter_cancelled_before_its_turn_takes_nothing() -> None:
    gate = TurnGate(1)
    takers = [asyncio.create_task(gate.turn()) for _ in range(4)]
    await asyncio.sleep(0)  # the first has this iteration's turn, the others wait
    assert [t.done() for t in takers] == [True, False, False, False]
    takers[1].cancel()
    await asyncio.gather(takers[0], *takers[2:])
    assert takers[1].cancelled()
    await asyncio.wait_for(gate.turn(), 1)  # every turn came back


def test_at_least_one_turn() -> None:
    with pytest.raises(ValueError):
        TurnGate(0)


async def test_sdp_checks_take_turns_under_a_burst(
    whip_servers: Callable[..., Awaitable[TestServer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    per_turn = 4
    server = await whip_servers(
        limits__sdp_checks_per_turn=per_turn,
        limits__rate_per_address_per_s=0,
        limits__rate_per_principal_per_s=0,
    )
    bad = (FIXTURES / "sdp" / "bad_no_media.sdp").read_bytes()
    checked: list[int] = []
    real_check = whip.routes_whip.check_offer
    async with ticking() as tick:

        def check(body: bytes, **kwargs: Any) -> Any:
            checked.append(tick[0])
            return real_check(body, **kwargs)

        monkeypatch.setattr(whip.routes_whip, "check_offer", check)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def post() -> int:
                headers = {"Content-Type": "application/sdp"}
                async with http.post(server.make_url("/whip"), data=bad, headers=headers) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(post() for _ in range(60)))
    assert Counter(statuses) == {400: 60}
    per_iteration = Counter(checked)
    assert len(checked) == 60
    assert max(per_iteration.values()) <= per_turn, per_iteration


async def test_a_lease_gate_bounds_holders_and_takes_back_an_expired_place() -> None:
    # One holder stays past its lease; ten quick ones (10 ms each: 100 ms of holds, past
    # the stuck one's 50 ms) go through the other place. Observed by the loop's clock,
    # not by how fast this machine runs them: the stuck lease's expiry is a timer, which
    # never fires before its deadline, so until then the quick holders share one place;
    # once it has fired, the expired place is theirs too (two at once), never more.
    gate = LeaseGate(2, lease_s=0.05)
    loop = asyncio.get_running_loop()
    quick = [0]
    most_before_expiry = [0]
    most = [0]
    hold_on = asyncio.Event()

    async def stuck_holder() -> None:
        async with gate.lease():
            await hold_on.wait()  # past its lease

    async def quick_holder() -> None:
        async with gate.lease():
            quick[0] += 1
            most[0] = max(most[0], quick[0])
            if loop.time() < expires_at:
                most_before_expiry[0] = max(most_before_expiry[0], quick[0])
            await asyncio.sleep(0.01)
            quick[0] -= 1

    # The stuck lease begins after this, so it expires later; less a 2 ms margin, since
    # uvloop's clock counts whole milliseconds and a sum of floats can land one ulp below
    # the millisecond its timer fires on (CI once saw 2 quick holders at that instant).
    expires_at = loop.time() + gate.lease_s - 0.002
    stuck = asyncio.create_task(stuck_holder())
    await asyncio.sleep(0)  # the stuck holder takes its place first
    async with asyncio.timeout(5):
        await asyncio.gather(*(quick_holder() for _ in range(10)))  # not held up by it
    assert most_before_expiry[0] <= 1
    assert most[0] == 2
    hold_on.set()
    await stuck

    # Every place came back exactly once: two fit at once, a third waits.
    asking = asyncio.Event()

    async def third_holder() -> None:
        asking.set()  # a free place would be taken (and given back) without a suspension
        async with gate.lease():
            pass

    async with gate.lease(), gate.lease():
        third = asyncio.create_task(third_holder())
        await asking.wait()  # one loop turn, well within the leases
        assert not third.done()
    await asyncio.wait_for(third, 1)


def test_at_least_one_place_and_a_lease() -> None:
    with pytest.raises(ValueError):
        LeaseGate(0, 1.0)
    with pytest.raises(ValueError):
        LeaseGate(1, 0)


@asynccontextmanager
async def posting(server: TestServer, offers: list[str]) -> AsyncIterator[list[asyncio.Task[int]]]:
    """POST every offer at once; the tasks answer each status (cancelled at the end)."""
    async with aiohttp.ClientSession() as http:

        async def post(offer: str) -> int:
            headers = {"Content-Type": "application/sdp"}
            async with http.post(server.make_url("/whip"), data=offer, headers=headers) as r:
                await r.read()
                return r.status

        tasks = [asyncio.create_task(post(o)) for o in offers]
        try:
            yield tasks
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_negotiations_in_flight_are_bounded(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    gate = 2
    in_flight = [0]
    most = [0]

    class CountingNegotiator(Negotiator):
        async def negotiate(self, *args: Any) -> Negotiated:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            try:
                await asyncio.sleep(0.01)  # several loop iterations, well within the lease
                return await super().negotiate(*args)
            finally:
                in_flight[0] -= 1

    server = await whip_servers(
        seams=SessionSeams(negotiator=CountingNegotiator),
        limits__negotiation_concurrency=gate,
        limits__stream_limit=100,
        limits__rate_per_address_per_s=0,
        limits__rate_per_principal_per_s=0,
    )
    manager: SessionManager = server.app[SESSIONS_KEY]
    publishers = [AiortcPublisher() for _ in range(8)]
    try:
        offers = await asyncio.gather(*(p.offer(audio=False) for p in publishers))
        async with posting(server, offers) as tasks, asyncio.timeout(30):
            statuses = await asyncio.gather(*tasks)
    finally:
        await asyncio.gather(*(p.close() for p in publishers))
    assert statuses == [201] * len(offers)
    assert most[0] == gate
    await manager.shutdown()
    assert len(manager.table) == 0


async def test_a_negotiation_that_waits_holds_nobody_up(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    stalled = asyncio.Event()
    release = asyncio.Event()

    class StallingNegotiator(Negotiator):
        async def negotiate(self, *args: Any) -> Negotiated:
            if not stalled.is_set():  # the first waits, like an mDNS candidate resolving
                stalled.set()
                await release.wait()
            return await super().negotiate(*args)

    server = await whip_servers(
        seams=SessionSeams(negotiator=StallingNegotiator),
        limits__negotiation_concurrency=1,
        limits__stream_limit=100,
        limits__rate_per_address_per_s=0,
        limits__rate_per_principal_per_s=0,
    )
    manager: SessionManager = server.app[SESSIONS_KEY]
    publishers = [AiortcPublisher() for _ in range(6)]
    answered = 0
    try:
        offers = await asyncio.gather(*(p.offer(audio=False) for p in publishers))
        async with posting(server, offers) as tasks, asyncio.timeout(30):
            for next_answer in asyncio.as_completed(tasks):
                assert await next_answer == 201
                answered += 1
                if answered == len(tasks) - 1:  # all but the waiting one
                    release.set()
    finally:
        release.set()
        await asyncio.gather(*(p.close() for p in publishers))
    assert answered == len(offers)
    await manager.shutdown()
    assert len(manager.table) == 0
