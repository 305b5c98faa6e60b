"""Stream slots, media budget and the session table under many threads."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from whip.admission import (
    BudgetExhaustedError,
    MediaBudget,
    MediaPermit,
    StreamLimitError,
    StreamSlot,
    StreamSlots,
)
from whip.session_table import SessionCapError, SessionIdCollisionError, SessionTable

THREADS = 64


def _race(worker: Callable[[int], None], n: int = THREADS) -> None:
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            worker(i)
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"race-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


def test_stream_slots_never_over_the_limit_under_a_race() -> None:
    committed = {"alice": 1}
    slots = StreamSlots(limit=5, committed_count=lambda p: committed.get(p, 0))
    won: list[StreamSlot] = []
    refused: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        try:
            slot = slots.reserve("alice")
        except StreamLimitError as exc:
            assert exc.http_status == 409
            with lock:
                refused.append(exc.code)
            return
        with lock:
            won.append(slot)

    _race(worker)
    assert len(won) == 4 and len(refused) == THREADS - 4
    assert slots.reserved("alice") == 4
    # Each release happens once, however many times it is called, from however many threads.
    _race(lambda i: won[i % 4].release() and None)
    assert slots.reserved() == 0
    assert slots.reserve("bob").principal == "bob"


def test_media_budget_reserves_both_or_nothing_and_releases_exactly_once() -> None:
    budget = MediaBudget(total_bytes=10_000, total_threads=8)
    permits: list[MediaPermit] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        try:
            permit = budget.reserve(1000, 2)
        except BudgetExhaustedError as exc:
            assert exc.http_status == 503 and exc.headers["Retry-After"]
            return
        with lock:
            permits.append(permit)

    _race(worker)
    assert len(permits) == 4  # threads run out first: 4 x 2 = 8
    figures = budget.figures()
    assert (figures.bytes_reserved, figures.threads_reserved) == (4000, 8)
    released = [p.release() for p in permits] + [p.release() for p in permits]
    assert released.count(True) == 4
    assert budget.figures().bytes_reserved == 0


def test_a_kept_permit_stays_reserved_and_is_reported() -> None:
    budget = MediaBudget(total_bytes=3000, total_threads=3)
    kept = budget.reserve(1000, 1)
    assert kept.keep() and not kept.release()
    figures = budget.figures()
    assert (figures.bytes_reserved, figures.threads_reserved) == (1000, 1)
    assert (figures.bytes_kept, figures.threads_kept) == (1000, 1)
    budget.reserve(2000, 2)
    with pytest.raises(BudgetExhaustedError):
        budget.reserve(1, 1)


def test_session_table_cap_is_exact_under_a_race() -> None:
    table: SessionTable[object] = SessionTable(max_sessions=10)
    inserted: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        try:
            table.insert(f"s{i}", object())
        except SessionCapError:
            return
        with lock:
            inserted.append(f"s{i}")

    _race(worker)
    assert len(inserted) == 10 == len(table)


def test_remove_if_owned_has_one_winner_and_leaves_a_tombstone() -> None:
    table: SessionTable[object] = SessionTable(max_sessions=2)
    entry = object()
    table.insert("s1", entry)
    wins: list[int] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        if table.remove_if_owned("s1", entry, "run-1", f"reason-{i}"):
            with lock:
                wins.append(i)

    _race(worker)
    assert len(wins) == 1
    stone = table.tombstone("s1")
    assert stone is not None and stone.reason == f"reason-{wins[0]}"
    with pytest.raises(SessionIdCollisionError):
        table.insert("s1", object())
    # A different entry under a reused id is not removable by the old owner.
    other = object()
    table.insert("s2", other)
    assert not table.remove_if_owned("s2", entry, "run-2", "stale")
    assert table.get("s2") is other


def test_tombstones_expire_and_are_capped() -> None:
    now = [0.0]
    table: SessionTable[object] = SessionTable(
        max_sessions=100, tombstone_ttl_s=600, tombstone_cap=3, clock=lambda: now[0]
    )
    entries = {f"s{i}": object() for i in range(5)}
    for sid, entry in entries.items():
        table.insert(sid, entry)
        table.remove_if_owned(sid, entry, "r", "deleted")
    assert table.tombstones == 3
    assert table.tombstone("s0") is None and table.tombstone("s4") is not None
    now[0] = 601.0
    assert table.tombstone("s4") is None
    assert table.tombstones == 0
