"""The system crash loop: SIGKILL the real server under mixed load, restart it, verify.

Each iteration, on one data dir that lives across iterations:

1. start ``python -m whip serve`` (a subprocess on loopback) and wait for ``/readyz``
   (the time is recorded);
2. check right after readiness: ``/metrics`` shows no reserved budget, no live session
   and no stream slot in use; every run the previous kill left live got exactly one
   ``run_interrupted`` (``readyz.last_seq`` is the old log end plus one per such run);
   a sample of runs reads the same through the API as the log says;
3. a new push gets 201 and connects (it is also the first publisher of the load);
4. mixed load for a random 1-4 s: aiortc publishers (in this process) pushing test
   media, an operator stopping and deleting random runs it created, pollers long-polling
   ``/v1/runs/{id}/events``. Every *confirmed* item is written to a ledger that spans
   all iterations: a 201 (its ``X-Run-Id``), a 200 on stop (``seq``) or delete (the
   event), every event an API answer returned;
5. ``SIGKILL`` the server, close the client peers, and read the WAL segments read-only
   (our own frame walk plus the production record decoder; no lock taken, nothing
   appended): seqs are ``1..N`` without gaps, every ledger item is there with the same
   seq/run/type, each run has one ``run_created``, at most one ``run_deleted`` and at
   most one ``run_interrupted``, the previous recovery appended exactly the expected
   ``run_interrupted`` events, and the runs now live are the ones the next start must
   interrupt.

Randomness is seeded per iteration (:func:`run_iteration`'s ``seed``): the same seed
replays a failure's plans (the exact kill instant still depends on timing). The test
(``tests/test_system_crash.py``) runs a few iterations; ``bench/system_crash.py`` runs the
same loop longer and prints JSON. A failed check raises :class:`AssertionError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.support.crash_writer import live_runs, segment_paths, walk_frames
from bench.support.metrics import metric_values
from bench.support.publisher import AiortcPublisher
from bench.support.server_process import HOST, REPO, serve_argv, wait_ready
from registry.events import Event, EventType
from registry.record import decode_frame_at
from whip.rtc.host_addresses import restrict_host_addresses

READY_DEADLINE_S = 30.0
CONNECT_DEADLINE_S = 15.0
HTTP_TIMEOUT_S = 10.0
LOAD_MIN_S, LOAD_MAX_S = 1.0, 4.0
ZERO_GAUGES = (
    "whip_media_budget_bytes_reserved",
    "whip_media_budget_threads_reserved",
    "whip_sessions_live",
    "whip_stream_slots_in_use",
)
EARLY_KILL_P = 0.2
"""How often an iteration first kills a server that is still starting."""


@dataclass(frozen=True)
class Confirmed:
    """Something a client was told is durable: ``seq`` None means "the run exists"."""

    run_id: str
    type: str
    seq: int | None
    source: str  # "201", "stop", "delete", "poll", "api"


@dataclass
class IterationResult:
    iteration: int
    seed: int
    ready_s: float = 0.0
    confirmed: int = 0
    publishers: int = 0
    interrupted: int = 0
    log_events: int = 0
    ok: bool = False
    error: str = ""


@dataclass
class LoopState:
    data_dir: Path
    log_path: Path
    port: int
    ledger: dict[tuple[str, str, int | None], Confirmed] = field(default_factory=dict)
    created: set[str] = field(default_factory=set)
    # What the next start must do: interrupt exactly these runs after this log end.
    expect_interrupted: set[str] = field(default_factory=set)
    log_end: int = 0
    # Checked at the next kill, when the log can be read again.
    pending_recovery: tuple[int, set[str]] | None = None

    @property
    def base(self) -> str:
        """The server's URL (the port stays the same across its lives)."""
        return f"http://{HOST}:{self.port}"

    def confirm(self, item: Confirmed) -> None:
        self.ledger.setdefault((item.run_id, item.type, item.seq), item)


# ---------------------------------------------------------------- reading the log


def read_log(data_dir: Path) -> list[Event]:
    """Every valid event of the WAL, read-only (the server may be dead mid-write: a torn
    tail ends the walk, as recovery would truncate it)."""
    events: list[Event] = []
    for path in segment_paths(data_dir):
        buf = path.read_bytes()
        frames, _end = walk_frames(buf, len(events) + 1)
        events.extend(decode_frame_at(buf, frame.offset) for frame in frames)
    return events


def check_log(state: LoopState, events: list[Event]) -> None:
    """The log after a kill against everything ever confirmed (raises AssertionError)."""
    seqs = [ev.seq for ev in events]
    if seqs != list(range(1, len(events) + 1)):
        breaks = [(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1][:5]
        raise AssertionError(f"seqs are not 1..{len(events)}: {breaks}")
    assert len(events) >= state.log_end, (
        f"the log shrank: {len(events)} events, {state.log_end} before the last start"
    )
    creates = Counter(ev.run_id for ev in events if ev.type == EventType.RUN_CREATED)
    dup = [r for r, n in creates.items() if n > 1]
    assert not dup, f"run_created more than once: {dup[:5]}"
    for etype in (EventType.RUN_DELETED, EventType.RUN_INTERRUPTED):
        counts = Counter(ev.run_id for ev in events if ev.type == etype)
        dup = [r for r, n in counts.items() if n > 1]
        assert not dup, f"{etype} more than once: {dup[:5]}"
    missing: list[str] = []
    for item in state.ledger.values():
        if item.seq is None:
            if creates.get(item.run_id, 0) != 1:
                missing.append(f"{item} (run_created x{creates.get(item.run_id, 0)})")
            continue
        ev = events[item.seq - 1] if 1 <= item.seq <= len(events) else None
        if ev is None or (ev.run_id, str(ev.type)) != (item.run_id, item.type):
            found = None if ev is None else (ev.seq, ev.run_id, str(ev.type))
            missing.append(f"{item} -> {found}")
    assert not missing, f"{len(missing)} confirmed items lost or changed: {missing[:5]}"
    if state.pending_recovery is not None:
        start, expected = state.pending_recovery
        appended = events[start : start + len(expected)]
        got = [ev.run_id for ev in appended]
        assert all(ev.type == EventType.RUN_INTERRUPTED for ev in appended), appended
        assert set(got) == expected and len(got) == len(expected), (
            f"recovery after seq {start} interrupted {sorted(got)}, expected {sorted(expected)}"
        )


# ---------------------------------------------------------------- the server process


async def start_server(state: LoopState) -> tuple[asyncio.subprocess.Process, float]:
    """Spawn the server and wait for ``/readyz`` (bounded); returns (process, seconds).

    Cancellation: the process is left running (the caller's ``kill`` ends it).
    """
    log = state.log_path.open("ab")
    try:
        proc = await asyncio.create_subprocess_exec(
            *serve_argv(state.port, state.data_dir, "--stream-limit", "1000"),
            cwd=REPO,
            stdout=log,
            stderr=log,
            env={**os.environ, "WHIP_INGEST_LOG_LEVEL": "WARNING"},
        )
    finally:
        log.close()
    try:
        ready_s = await wait_ready(state.base, lambda: proc.returncode, READY_DEADLINE_S)
    except RuntimeError as exc:
        await kill(proc)
        raise AssertionError(f"{exc}: {tail(state)}") from None
    return proc, ready_s


async def kill(proc: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
    try:
        await asyncio.wait_for(proc.wait(), 20)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 20)


def tail(state: LoopState, limit: int = 3000) -> str:
    try:
        return state.log_path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


# ---------------------------------------------------------------- the load


class Load:
    """Publishers, an operator and pollers against one server life."""

    def __init__(self, state: LoopState, http: aiohttp.ClientSession, rng: random.Random) -> None:
        self.state = state
        self.http = http
        self.rng = rng
        self.base = state.base
        self.publishers: list[AiortcPublisher] = []
        self.mine: list[str] = []  # runs created in this server life
        self.watch: set[str] = set()
        self.tasks: list[asyncio.Task[None]] = []

    def confirm(self, run_id: str, etype: str, seq: int | None, source: str) -> None:
        self.state.confirm(Confirmed(run_id, etype, seq, source))

    async def push(self, stream: str) -> AiortcPublisher | None:
        publisher = AiortcPublisher()
        self.publishers.append(publisher)
        response = await publisher.publish(self.http, f"{self.base}/whip/{stream}")
        if response.status != 201:
            return None
        self.confirm(publisher.run_id, EventType.RUN_CREATED, None, "201")
        self.state.created.add(publisher.run_id)
        self.mine.append(publisher.run_id)
        self.watch.add(publisher.run_id)
        return publisher

    async def publisher_loop(self, index: int) -> None:
        for attempt in range(100):  # bounded; the kill cancels it
            publisher = await self.push(f"p{index}")
            if publisher is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(publisher.connected.wait(), CONNECT_DEADLINE_S)
            await asyncio.sleep(self.rng.uniform(0.3, 1.5) * (attempt + 1))

    async def operator_loop(self) -> None:
        for _ in range(200):  # bounded
            await asyncio.sleep(self.rng.uniform(0.2, 0.9))
            old = sorted(self.state.created - set(self.mine))
            if old and self.rng.random() < 0.25:
                await self.operate(self.rng.choice(old), over=True)
            elif self.mine:
                await self.operate(self.rng.choice(self.mine))

    async def operate(self, run_id: str, over: bool = False) -> None:
        """One stop or delete of ``run_id``; a 200 is confirmed. ``over``: a run of an
        earlier server life, ended or interrupted by now: a stop must be 409."""
        if self.rng.random() < 0.5:
            async with self.http.post(f"{self.base}/v1/runs/{run_id}/stop") as response:
                if over:
                    assert response.status == 409, (
                        f"stop of {run_id} from an earlier server life answered "
                        f"{response.status}: {await response.text()}"
                    )
                if response.status == 200:
                    body = await response.json()
                    self.confirm(run_id, EventType.STOP_REQUESTED, body["seq"], "stop")
        else:
            async with self.http.delete(f"{self.base}/v1/runs/{run_id}") as response:
                if response.status == 200:
                    event = (await response.json())["event"]
                    assert event["run_id"] == run_id and event["type"] == "run_deleted"
                    self.confirm(run_id, event["type"], event["seq"], "delete")

    def in_flight(self) -> None:
        """Start a request the kill will land in the middle of (never confirmed unless
        its answer arrives first)."""
        if self.mine and self.rng.random() < 0.6:
            coro = self.operate(self.rng.choice(self.mine))
        else:
            coro = self._push_quietly()
        self.tasks.append(asyncio.create_task(coro))

    async def _push_quietly(self) -> None:
        await self.push("inflight")

    async def poller_loop(self) -> None:
        cursors: dict[str, int] = {}
        for _ in range(500):  # bounded
            candidates = sorted(self.watch)
            if not candidates:
                await asyncio.sleep(0.1)
                continue
            run_id = self.rng.choice(candidates)
            after = cursors.get(run_id, 0)
            url = f"{self.base}/v1/runs/{run_id}/events?after={after}&wait=0.5&limit=1000"
            async with self.http.get(url) as response:
                assert response.status == 200, (url, response.status, await response.text())
                body = await response.json()
            last = after
            for item in body["items"]:
                assert item["run_id"] == run_id and item["seq"] > last, (url, body)
                last = item["seq"]
                self.confirm(run_id, item["type"], item["seq"], "poll")
            cursors[run_id] = last

    async def run(self, seconds: float, n_publishers: int, n_pollers: int) -> None:
        for index in range(n_publishers):
            self.tasks.append(asyncio.create_task(self.publisher_loop(index)))
        self.tasks.append(asyncio.create_task(self.operator_loop()))
        for _ in range(n_pollers):
            self.tasks.append(asyncio.create_task(self.poller_loop()))
        done, _ = await asyncio.wait(self.tasks, timeout=seconds)
        for task in done:  # a load task that failed on its own is a finding
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def stop(self) -> None:
        """After the kill: cancel the tasks (errors from the dead server are expected)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for publisher in self.publishers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(publisher.close(), 5)


# ---------------------------------------------------------------- checks on a live server


async def check_restarted(
    state: LoopState, http: aiohttp.ClientSession, before: list[Event], rng: random.Random
) -> None:
    """Right after readiness: zero gauges, the interruptions, API reads == log."""
    base = state.base
    values = await metric_values(http, base)
    nonzero = {g: values.get(g) for g in ZERO_GAUGES if values.get(g) != 0}
    assert not nonzero, f"after restart, gauges not zero: {nonzero}"
    expected_end = len(before) + len(state.expect_interrupted)
    by_run: dict[str, list[Event]] = {}
    for ev in before:
        by_run.setdefault(ev.run_id, []).append(ev)
    sample = set(state.expect_interrupted)
    others = sorted(set(by_run) - sample)
    sample.update(rng.sample(others, min(4, len(others))))
    for run_id in sorted(sample):
        url = f"{base}/v1/runs/{run_id}/events?after=0&limit=1000"
        async with http.get(url) as response:
            assert response.status == 200, (run_id, response.status)
            items = (await response.json())["items"]
        got = [(i["seq"], i["type"]) for i in items]
        want = [(ev.seq, str(ev.type)) for ev in by_run[run_id]][:1000]
        if run_id in state.expect_interrupted:
            tail_items = got[len(want) :]
            assert got[: len(want)] == want, (run_id, got, want)
            assert len(tail_items) == 1 and tail_items[0][1] == EventType.RUN_INTERRUPTED, (
                f"run {run_id} was live at the kill (its log: {want[-6:]}); after restart "
                f"it got {tail_items} instead of one run_interrupted"
            )
            assert len(before) < tail_items[0][0] <= expected_end, (run_id, tail_items)
            state.confirm(Confirmed(run_id, tail_items[0][1], tail_items[0][0], "api"))
        else:
            assert got == want, f"run {run_id}: API {got} != log {want}"
        async with http.get(f"{base}/v1/runs/{run_id}") as response:
            assert response.status == 200, (run_id, response.status)
            view = await response.json()
        assert view["state"] not in ("starting", "live", "stopping"), (run_id, view)
    async with http.get(f"{base}/readyz") as response:
        ready = await response.json()
    assert ready["last_seq"] == expected_end, (
        f"readyz last_seq {ready['last_seq']}, expected {len(before)} + "
        f"{len(state.expect_interrupted)} run_interrupted"
    )


# ---------------------------------------------------------------- one iteration


async def run_iteration(state: LoopState, iteration: int, seed: int) -> IterationResult:
    result = IterationResult(iteration, seed)
    rng = random.Random(seed)
    before = read_log(state.data_dir)
    confirmed_before = len(state.ledger)
    recovery_start = (len(before), set(state.expect_interrupted))
    if rng.random() < EARLY_KILL_P:
        before = await kill_during_start(state, before, rng.uniform(0.0, 1.0))
    proc, result.ready_s = await start_server(state)
    load: Load | None = None
    try:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await check_restarted(state, http, before, rng)
            result.interrupted = len(recovery_start[1])
            state.pending_recovery = recovery_start
            load = Load(state, http, rng)
            load.watch.update(rng.sample(sorted(state.created), min(3, len(state.created))))
            # A new push works: 201, then the peer connects.
            first = await load.push("fresh")
            assert first is not None, "a new push after restart was refused"
            await asyncio.wait_for(first.connected.wait(), CONNECT_DEADLINE_S)
            await load.run(
                rng.uniform(LOAD_MIN_S, LOAD_MAX_S),
                n_publishers=rng.randint(1, 2),
                n_pollers=rng.randint(1, 3),
            )
            assert proc.returncode is None, f"server died on its own: {tail(state)}"
            if rng.random() < 0.4:
                load.in_flight()
                await asyncio.sleep(rng.uniform(0.0, 0.05))
            await kill(proc)  # SIGKILL mid-load: the tasks are still running
            await load.stop()
            result.publishers = len(load.publishers)
    finally:
        await kill(proc)
        if load is not None:
            await load.stop()
    events = read_log(state.data_dir)
    check_log(state, events)
    state.log_end = len(events)
    state.expect_interrupted = live_runs(events)
    result.log_events = len(events)
    result.confirmed = len(state.ledger) - confirmed_before
    result.ok = True
    return result


async def kill_during_start(state: LoopState, before: list[Event], delay: float) -> list[Event]:
    """SIGKILL a starting server after ``delay`` s (imports, recovery, or just ready),
    then check what its recovery left: a prefix of the expected ``run_interrupted``.
    Returns the log now; the runs still live are what the next start must interrupt."""
    log = state.log_path.open("ab")
    try:
        proc = await asyncio.create_subprocess_exec(
            *serve_argv(state.port, state.data_dir),
            cwd=REPO,
            stdout=log,
            stderr=log,
        )
    finally:
        log.close()
    try:
        await asyncio.sleep(delay)
    finally:
        await kill(proc)
    events = read_log(state.data_dir)
    pending, state.pending_recovery = state.pending_recovery, None
    try:
        check_log(state, events)
    finally:
        state.pending_recovery = pending
    appended = events[len(before) :]
    got = [ev.run_id for ev in appended]
    assert all(ev.type == EventType.RUN_INTERRUPTED for ev in appended), appended
    assert len(set(got)) == len(got) and set(got) <= state.expect_interrupted, (
        f"a start killed after {delay:.3f}s appended {got}; expected a subset of "
        f"{sorted(state.expect_interrupted)}"
    )
    state.expect_interrupted = live_runs(events)
    return events


async def final_restart(state: LoopState) -> float:
    """After the last kill: one more start, the restart checks, a graceful stop."""
    before = read_log(state.data_dir)
    proc, ready_s = await start_server(state)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            await check_restarted(state, http, before, random.Random(0))
    finally:
        await kill(proc, signal.SIGINT)
    state.pending_recovery = (len(before), set(state.expect_interrupted))
    events = read_log(state.data_dir)
    check_log(state, events)
    return ready_s


def restrict_ice_to_loopback() -> None:
    """The publishers of this process gather host candidates on HOST only."""
    restrict_host_addresses([HOST])
