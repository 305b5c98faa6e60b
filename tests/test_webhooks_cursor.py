"""The webhook cursor: the ledger never passes an undone event, whatever the interleaving
of parallel runs and crashes; the file store replaces atomically; the timeline's feed
names every run of every batch; a 410 mark is saved with the cursor and outlives a
restart until another URL is configured; a start forgets the cursors of webhooks no
longer configured, and only those."""

from __future__ import annotations

import asyncio
import base64
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.events import NewEvent
from registry.timeline import Timeline
from registry.webhook_mark import DisabledMark
from tests.support.eventually import eventually
from tests.support.webhook_receivers import Receivers
from whip.webhooks.config import WebhookConfig, parse_webhooks
from whip.webhooks.cursor import CursorFileError, CursorState, DeliveryLedger, FileCursorStore
from whip.webhooks.dispatcher import WebhookDispatcher
from whip.webhooks.group import WebhookGroup

LogEntry = tuple[int, str, bool]
"""seq, run, wanted."""


def simulate(
    log: list[LogEntry],
    batches: list[int],
    state: CursorState,
    delivered: set[int],
    rng: random.Random,
    crash_after: int | None,
    max_ahead: int,
) -> CursorState:
    """Drive a ledger the way the dispatcher does: the feed names each batch's runs, run
    tasks read, skip, hold and deliver in random interleavings. Returns the state at the
    crash (or at the end). Checks the cursor invariant after every step."""
    ledger = DeliveryLedger(state, 0, max_ahead)
    by_run: dict[str, list[LogEntry]] = {}
    visible = 0  # events appended so far
    batch_iter = iter(batches)
    active: set[str] = set()
    steps = 0

    def check() -> None:
        for seq, _run, wanted in log:
            if wanted and ledger.already_delivered(seq):
                assert seq in delivered, (seq, ledger.upto)

    while True:
        steps += 1
        if crash_after is not None and steps > crash_after:
            return ledger.state()
        moves = []
        if visible < len(log):
            moves.append("append")
        if active:
            moves.append("step")
        if not moves:
            return ledger.state()
        move = rng.choice(moves)
        if move == "append":
            size = next(batch_iter, 1)
            batch = log[visible : visible + max(1, size)]
            visible += len(batch)
            for entry in batch:
                by_run.setdefault(entry[1], []).append(entry)
            active.update(ledger.named({run for _, run, _ in batch}, batch[-1][0]))
        else:
            run = rng.choice(sorted(active))
            after = ledger.read_from(run)
            todo = [e for e in by_run.get(run, []) if e[0] > after]
            if not todo:
                ledger.caught_up(run)
                active.discard(run)
            else:
                seq, _, wanted = todo[0]
                if not wanted or ledger.already_delivered(seq):
                    ledger.passed(run, seq)
                else:
                    ledger.holding(run, seq)
                    if rng.random() < 0.7:  # delivered now; else it stays held a while
                        delivered.add(seq)
                        ledger.delivered(run, seq)
        check()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=60),
    st.lists(st.integers(1, 8), max_size=20),
    st.integers(0, 2**32),
    st.integers(1, 200),
    st.sampled_from([0, 3, 1000]),
)
def test_the_cursor_never_passes_an_undelivered_event_across_crashes(
    shape: list[tuple[int, bool]], batches: list[int], seed: int, crash_at: int, max_ahead: int
) -> None:
    log = [(seq, f"run{run}", wanted) for seq, (run, wanted) in enumerate(shape, start=1)]
    rng = random.Random(seed)
    delivered: set[int] = set()
    saved = simulate(log, batches, CursorState(0), delivered, rng, crash_at, max_ahead)
    assert all(s in delivered for s in saved.delivered_above)
    for seq, _run, wanted in log:
        if wanted and seq <= saved.upto:
            assert seq in delivered
    # restart from the saved state, the whole log durable (one batch): everything arrives
    final = simulate(log, [len(log)], saved, delivered, rng, None, max_ahead)
    assert {seq for seq, _, wanted in log if wanted} <= delivered
    assert final.upto == len(log) and final.delivered_above == ()


def test_delivered_above_is_bounded_and_dropped_as_the_cursor_passes() -> None:
    ledger = DeliveryLedger(CursorState(0), 0, max_ahead=2)
    assert sorted(ledger.named({"a", "b"}, 5)) == ["a", "b"]
    ledger.holding("a", 1)
    for seq in (2, 3, 4):
        ledger.delivered("b", seq)
    assert ledger.state() == CursorState(0, (2, 3)) and ledger.unrecorded == 1
    ledger.caught_up("b")
    ledger.delivered("a", 1)
    assert ledger.upto == 1  # a still pending at its floor
    ledger.passed("a", 5)
    ledger.caught_up("a")
    assert ledger.state() == CursorState(5, ())


async def test_the_file_store_round_trips_groups_and_refuses_a_foreign_file(
    tmp_path: Path,
) -> None:
    store = FileCursorStore(tmp_path / "webhooks", flush_interval_s=0.05)
    assert await store.load("crm") is None
    await store.save("crm", CursorState(7, (9, 12)))
    # saves that arrive together are one write of one file
    await asyncio.gather(
        store.save("crm", CursorState(8, (9, 12))), store.save("billing", CursorState(3))
    )
    again = FileCursorStore(tmp_path / "webhooks")
    assert await again.load("crm") == CursorState(8, (9, 12))
    assert await again.load("billing") == CursorState(3)
    assert sorted(p.name for p in (tmp_path / "webhooks").iterdir()) == ["cursors.json"]
    for foreign in ('{"version": 1, "webhooks": {"crm": {"upto": 3}}}', "garbage", "[]"):
        store.path.write_text(foreign)
        with pytest.raises(CursorFileError, match="not a webhook cursor"):
            await FileCursorStore(tmp_path / "webhooks").load("crm")


async def test_the_feed_names_every_run_of_every_batch(
    timeline_factory: Callable[..., Timeline],
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    subscription = timeline.feed.subscribe()
    seqs = await asyncio.gather(
        *(timeline.append(NewEvent(f"run{i % 3}", "run_created", "p")) for i in range(30))
    )
    await asyncio.wait_for(subscription.ready.wait(), 10)
    seen: set[str] = set()
    upto = 0
    while upto < max(seqs):
        await asyncio.wait_for(subscription.ready.wait(), 10)
        runs, upto = subscription.take()
        seen |= runs
    assert seen == {"run0", "run1", "run2"} and upto == 30
    assert subscription.take() == (set(), 30) and not subscription.ready.is_set()
    timeline.feed.unsubscribe(subscription)
    assert len(timeline.feed) == 0


async def test_a_cancelled_save_is_still_written_and_never_races_the_next_one(
    tmp_path: Path,
) -> None:
    store = FileCursorStore(tmp_path / "webhooks", flush_interval_s=0)
    assert await store.load("crm") is None  # the file is read once, before the saves
    for upto in range(1, 40):
        first = asyncio.ensure_future(store.save("crm", CursorState(upto)))
        await asyncio.sleep(0)  # one loop turn: the save has started its write
        first.cancel()  # its caller stops waiting; the write goes on
        await store.save("other", CursorState(upto, (upto + 5,)))
        again = FileCursorStore(tmp_path / "webhooks")
        assert await again.load("crm") == CursorState(upto)
    assert await FileCursorStore(tmp_path / "webhooks").load("other") == CursorState(39, (44,))


async def test_a_410_stays_disabled_across_a_restart_until_another_url(
    tmp_path: Path, timeline_factory: Callable[..., Timeline]
) -> None:
    timeline = await asyncio.to_thread(timeline_factory)
    receivers = Receivers()
    await receivers.start()
    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    directory = tmp_path / "webhooks"

    def config(path: str) -> WebhookConfig:
        entry = {"name": "hook", "url": receivers.url(path), "secret": secret}
        (webhook,) = parse_webhooks([{**entry, "retry_min_s": 0.05, "retry_max_s": 0.2}])
        return webhook

    groups: list[WebhookGroup] = []

    async def started(path: str) -> tuple[WebhookGroup, WebhookDispatcher]:
        dispatcher = WebhookDispatcher(config(path), timeline, FileCursorStore(directory, 0.05))
        group = WebhookGroup([dispatcher], timeline)
        groups.append(group)
        await group.start()
        return group, dispatcher

    try:
        group, first = await started("/gone")
        await timeline.append(NewEvent("r1", "run_created", "p", {"stream": "x"}))
        await eventually(lambda: first.disabled, within=5, awaiting="the 410")
        await group.aclose()
        saved = await FileCursorStore(directory).load("hook")
        assert saved is not None and saved.upto == 0
        assert saved.disabled == DisabledMark(
            receivers.url("/gone"), saved.disabled.at_ms, "410 Gone"
        )
        assert first.status()["disabled"] == {
            "url": receivers.url("/gone"), "at_ms": saved.disabled.at_ms, "reason": "410 Gone"
        }  # fmt: skip

        # restarted with the same url: disabled from the start, nothing sent
        group, again = await started("/gone")
        await timeline.append(NewEvent("r2", "run_created", "p", {"stream": "y"}))
        assert again.disabled and again.status()["state"] == "disabled"
        await group.aclose()
        assert receivers.gone_hits == 1

        # another url: the mark is cleared, and what the 410 left is delivered
        endpoint = receivers.add("back", secret)
        group, back = await started("/ok/back")
        assert not back.disabled
        await eventually(
            lambda: sorted(endpoint.first_ids()) == ["r1:1", "r2:2"],  # different runs
            within=5,
            awaiting=lambda: f"the events left, got {endpoint.first_ids()}",
        )
        await group.aclose()
        cleared = await FileCursorStore(directory).load("hook")
        assert cleared is not None and cleared.disabled is None and cleared.upto == 2
    finally:
        for group in groups:
            await group.aclose()  # idempotent
        await receivers.close()


async def test_a_server_start_forgets_the_cursors_of_webhooks_no_longer_configured(
    tmp_path: Path, whip_servers: Callable[..., Awaitable[TestServer]]
) -> None:
    data_dir = tmp_path / "shared"
    cursors = data_dir / "webhooks" / FileCursorStore.FILE_NAME
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()

    def entries(*names: str) -> list[dict[str, str]]:
        return [{"name": n, "url": "http://127.0.0.1:9/hook", "secret": secret} for n in names]

    def saved() -> dict[str, object]:
        webhooks: dict[str, object] = orjson.loads(cursors.read_bytes())["webhooks"]
        return webhooks

    history = []
    for names in (("crm", "billing", "audit"), ("crm",), ()):
        server = await whip_servers(webhooks=entries(*names), server__data_dir=str(data_dir))
        await server.close()
        history.append(sorted(saved()))
    assert history == [["audit", "billing", "crm"], ["crm"], []]
    # With no webhook, a file that is not a cursor file is left alone, not a refused start.
    cursors.write_text("garbage")
    await (await whip_servers(server__data_dir=str(data_dir))).close()
    assert cursors.read_text() == "garbage"


async def test_forget_keeps_the_configured_cursors_whole(tmp_path: Path) -> None:
    store = FileCursorStore(tmp_path / "webhooks", flush_interval_s=0.05)
    await store.save("crm", CursorState(8, (9, 12)))
    await store.save("old", CursorState(3))
    again = FileCursorStore(tmp_path / "webhooks")
    assert await again.forget({"crm", "never-saved"}) == ["old"]
    assert await again.forget({"crm"}) == []  # nothing more: no write
    reread = FileCursorStore(tmp_path / "webhooks")
    assert (await reread.load("crm"), await reread.load("old")) == (CursorState(8, (9, 12)), None)
    with pytest.raises(RuntimeError, match="before any save"):
        pending = asyncio.create_task(reread.save("crm", CursorState(9)))
        await asyncio.sleep(0)  # the save is pending in its group
        try:
            await reread.forget({"crm"})
        finally:
            await pending
