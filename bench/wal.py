#!/usr/bin/env python3
"""Benchmark of the durable timeline (``registry/``) against two SQLite baselines.

Prints exactly one JSON document on stdout; progress goes to stderr.

Sections (all in one run):

1. ``appends``: durable appends/s and confirm-latency percentiles with 1, 16 and 256
   concurrent producers, side by side for

   - ``timeline``: asyncio tasks, each ``await timeline.append(NewEvent(...))`` in a loop;
   - ``timeline_without_c``: the same in a child process started with ``--without-c``,
     where the registry runs without its C extensions (``registry._framing``,
     ``registry._newevent``) on their pure-Python references: the figure with and
     without the remaining C, side by side;
   - ``timeline_interpreter_gc``, ``timeline_asyncio_loop``: the same with the
     interpreter's GC thresholds, and on the standard library's event loop;
   - ``sqlite_per_event``: the naive service: producer threads share one connection
     guarded by a lock, one INSERT + COMMIT per event (the primary per-event baseline);
   - ``sqlite_per_event_own_conn``: the other naive shape, one connection per producer
     thread, one INSERT + COMMIT per event, contention left to SQLite's busy handler;
   - ``sqlite_batched``: asyncio producers queue events for one writer thread that
     commits whatever is queued as one transaction and then confirms that batch.

   Every SQLite store uses ``journal_mode=WAL`` and ``synchronous=FULL``; every store
   gets a fresh directory under the same base directory (same filesystem).
2. ``reads``: warm tail hits vs cold WAL reads of the same cursor on a log of
   ``--runs`` x ``--events-per-run`` events, then the same cold reads after
   ``--other-runs`` more runs were appended (cold reads must not grow with the log).
3. ``recovery``: the time ``Timeline.open`` takes on that log (1,000,000 events by
   default), with the page cache warm and after dropping the segments from it.

Usage::

    .venv/bin/python bench/wal.py            # default, a few minutes
    .venv/bin/python bench/wal.py --quick    # ~30 s smoke run
    .venv/bin/python bench/wal.py --help
    .venv/bin/python bench/wal.py --sections appends --producers 256 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import math
import os
import platform
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

WITHOUT_C_FLAG = "--without-c"
C_EXTENSIONS = ("registry._framing", "registry._newevent")
"""The registry's C extensions; each module that uses one keeps a pure-Python reference."""
if WITHOUT_C_FLAG in sys.argv[1:]:
    # Before registry is imported: its modules then run their pure-Python references.
    for _name in C_EXTENSIONS:
        sys.modules[_name] = None

from registry import events as registry_events  # noqa: E402
from registry import record as registry_record  # noqa: E402
from registry.confirmations import settle_futures  # noqa: E402
from registry.events import EventType, NewEvent  # noqa: E402
from registry.snapshot import DEFAULT_TAIL_EVENTS  # noqa: E402
from registry.timeline import Timeline, TimelineConfig  # noqa: E402
from whip.eventloop import DEFAULT_EVENT_LOOP, EventLoopKind, new_event_loop  # noqa: E402
from whip.gcpolicy import DEFAULT_YOUNG_THRESHOLD, set_young_threshold  # noqa: E402

PRINCIPAL = "bench"
RECOVERY_TARGET_S = 5.0
PER_EVENT_RATIO_TARGET = 20.0
COLD_SCALING_TOLERANCE = 1.5

STORES = (
    "timeline",
    "timeline_without_c",
    "timeline_interpreter_gc",
    "timeline_asyncio_loop",
    "sqlite_per_event",
    "sqlite_per_event_own_conn",
    "sqlite_batched",
)
SUMMARY_RATIOS = (
    ("timeline", "sqlite_per_event"),
    ("timeline", "sqlite_per_event_own_conn"),
    ("timeline", "sqlite_batched"),
    ("timeline_without_c", "sqlite_per_event"),
    ("timeline", "timeline_without_c"),
    ("timeline_interpreter_gc", "sqlite_per_event"),
    ("timeline_asyncio_loop", "sqlite_per_event"),
)
"""The ``ratio_<a>_vs_<b>`` figures of each producer count's summary (appends/s medians)."""
INTERPRETER_YOUNG_THRESHOLD = 700
"""CPython's default young-generation threshold (``gc.get_threshold()[0]``)."""

STORE_DESCRIPTIONS: dict[str, dict[str, str]] = {
    "timeline": {
        "producers": "asyncio tasks on one event loop",
        "append": "await timeline.append(NewEvent(...)); returns once durable",
        "durability": "registry WAL: group commit, one pwrite + fdatasync per batch",
    },
    "timeline_without_c": {
        "producers": "asyncio tasks on one event loop",
        "append": "the same as timeline, in a child process (bench/wal.py "
        f"{WITHOUT_C_FLAG}) where the registry runs without its C extensions "
        f"({', '.join(C_EXTENSIONS)}) on their pure-Python references; shows what the "
        "remaining C is worth",
        "durability": "registry WAL: group commit, one pwrite + fdatasync per batch",
    },
    "timeline_interpreter_gc": {
        "producers": "asyncio tasks on one event loop",
        "append": "the same as timeline, but with the interpreter's GC thresholds instead "
        "of the server's policy (whip.gcpolicy); shows what that policy is worth",
        "durability": "registry WAL: group commit, one pwrite + fdatasync per batch",
    },
    "timeline_asyncio_loop": {
        "producers": "asyncio tasks on the standard library's event loop",
        "append": "the same as timeline, but on asyncio's own loop instead of the "
        "server's default (uvloop, whip.eventloop); shows what that choice is worth",
        "durability": "registry WAL: group commit, one pwrite + fdatasync per batch",
    },
    "sqlite_per_event": {
        "producers": "OS threads",
        "append": "INSERT + COMMIT per event on ONE shared connection guarded by a "
        "threading.Lock (the primary one-transaction-per-event baseline)",
        "durability": "SQLite journal_mode=WAL, synchronous=FULL",
    },
    "sqlite_per_event_own_conn": {
        "producers": "OS threads",
        "append": "INSERT + COMMIT per event, each thread on ITS OWN connection; "
        "writers contend through SQLite's busy handler (timeout 60 s)",
        "durability": "SQLite journal_mode=WAL, synchronous=FULL",
    },
    "sqlite_batched": {
        "producers": "asyncio tasks on one event loop (same producer model as timeline)",
        "append": "queue the row, await a future; one writer thread drains the queue and "
        "commits each drained batch with executemany in one transaction, then confirms "
        "the batch via loop.call_soon_threadsafe",
        "durability": "SQLite journal_mode=WAL, synchronous=FULL",
    },
}

SQLITE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS events ("
    " seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, type TEXT NOT NULL,"
    " ts_ms INTEGER NOT NULL, principal TEXT NOT NULL, data TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS events_by_run ON events (run_id, seq)",
)
SQLITE_INSERT = "INSERT INTO events (run_id, type, ts_ms, principal, data) VALUES (?, ?, ?, ?, ?)"
SQLITE_INSERT_SEQ = (
    "INSERT INTO events (seq, run_id, type, ts_ms, principal, data) VALUES (?, ?, ?, ?, ?, ?)"
)


def log(message: str) -> None:
    """Progress line on stderr (stdout is reserved for the JSON document)."""
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- helpers


def stats_event(run_id: str, k: int) -> NewEvent:
    """The event every producer appends: a small analyzer ``stats`` record."""
    return NewEvent(
        run_id,
        EventType.STATS,
        PRINCIPAL,
        {"fps": 29.97, "bitrate_kbps": 2480 + k % 40, "frames": k, "dropped": 0},
    )


def created_event(run_id: str) -> NewEvent:
    return NewEvent(run_id, EventType.RUN_CREATED, PRINCIPAL, {"stream": f"cam-{run_id}"})


def percentiles(values: Sequence[float], scale: float, digits: int = 3) -> dict[str, float]:
    """Nearest-rank percentiles of ``values`` multiplied by ``scale``."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    n = len(ordered)

    def rank(p: float) -> float:
        return round(ordered[min(n - 1, max(0, math.ceil(p * n) - 1))] * scale, digits)

    return {
        "n": n,
        "mean": round(statistics.fmean(ordered) * scale, digits),
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "max": round(ordered[-1] * scale, digits),
    }


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b > 0 else None


def fresh_dir(base: Path, name: str) -> Path:
    path = base / name
    path.mkdir(parents=True)
    return path


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def segment_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*.wal"))


def drop_page_cache(paths: Sequence[Path]) -> None:
    """Ask the kernel to drop these (clean, fsynced) files from the page cache.

    ``POSIX_FADV_DONTNEED`` needs no privileges. On a VM the host may still cache them.
    """
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _mem_total_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def _filesystem(path: Path) -> dict[str, str]:
    best = ("", "", "")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype, *_ = line.split()
            if str(path).startswith(mount) and len(mount) > len(best[1]):
                best = (device, mount, fstype)
    except OSError:
        pass
    return {"device": best[0], "mount": best[1], "type": best[2]}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def fdatasync_probe(base: Path, count: int = 200, preallocate: bool = False) -> dict[str, float]:
    """Latency of one small pwrite + fdatasync on the benchmark filesystem (the floor
    of any one-transaction-per-event store): appending to a growing file, or writing
    into space allocated beforehand (as the WAL's active segment is)."""
    path = base / "fsync-probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    durations: list[float] = []
    try:
        payload = b"x" * 128
        if preallocate:
            os.posix_fallocate(fd, 0, count * len(payload))
            os.fsync(fd)
        for i in range(count):
            os.pwrite(fd, payload, i * len(payload))
            t0 = time.perf_counter()
            os.fdatasync(fd)
            durations.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return percentiles(durations, 1e6, 1)


def machine_info(base: Path) -> dict[str, Any]:
    fsync = fdatasync_probe(base)
    try:
        fsync_preallocated: dict[str, Any] = fdatasync_probe(base, preallocate=True)
    except OSError as exc:  # a filesystem without fallocate: the WAL grows per write there
        fsync_preallocated = {"n": 0, "error": str(exc)}
    return {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "python_full": sys.version,
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "mem_total_mb": _mem_total_mb(),
        "sqlite_version": sqlite3.sqlite_version,
        "data_base_dir": str(base),
        "filesystem": _filesystem(base.resolve()),
        "fdatasync_128b_us": fsync,
        "fdatasync_128b_preallocated_us": fsync_preallocated,
        "one_fdatasync_per_event_ceiling_per_s": round(1e6 / fsync["p50"]),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "git_commit": _git_commit(),
    }


# --------------------------------------------------------------------------- sqlite stores


def sqlite_connect(path: Path, *, check_same_thread: bool = True) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60.0, check_same_thread=check_same_thread)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode != "wal":
        raise RuntimeError(f"SQLite refused WAL mode (got {mode!r})")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def sqlite_init(path: Path) -> None:
    conn = sqlite_connect(path)
    try:
        for statement in SQLITE_SCHEMA:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def sqlite_row(event: NewEvent) -> tuple[str, str, int, str, str]:
    data = json.dumps(event.data, separators=(",", ":"), allow_nan=False)
    return (event.run_id, event.type, event.ts_ms, event.principal, data)


class SqlitePerEvent:
    """One transaction per event: INSERT + COMMIT, on a shared or a per-thread connection."""

    def __init__(self, path: Path, *, shared: bool) -> None:
        sqlite_init(path)
        self.path = path
        self.shared = shared
        self._lock = threading.Lock()
        self._conn = sqlite_connect(path, check_same_thread=False) if shared else None

    def connection(self) -> sqlite3.Connection:
        """The connection a producer thread uses (call it on that thread)."""
        if self._conn is not None:
            return self._conn
        return sqlite_connect(self.path)

    def append(self, conn: sqlite3.Connection, event: NewEvent) -> int:
        row = sqlite_row(event)
        if self.shared:
            with self._lock:
                seq = conn.execute(SQLITE_INSERT, row).lastrowid
                conn.commit()
        else:
            seq = conn.execute(SQLITE_INSERT, row).lastrowid
            conn.commit()
        assert seq is not None
        return seq

    def release(self, conn: sqlite3.Connection) -> None:
        """Close a per-thread connection (on its own thread); the shared one stays."""
        if conn is not self._conn:
            conn.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@dataclass(slots=True)
class _Queued:
    row: tuple[str, str, int, str, str]
    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future[int]


class SqliteBatched:
    """Group commit over SQLite: one writer thread, one transaction per drained batch."""

    def __init__(self, path: Path) -> None:
        sqlite_init(path)
        self.path = path
        self.batches = 0
        self.appended = 0
        self._cv = threading.Condition()
        self._items: list[_Queued] = []
        self._closed = False
        self._thread = threading.Thread(target=self._writer, name="sqlite-writer", daemon=True)
        self._thread.start()

    async def append(self, event: NewEvent) -> int:
        row = sqlite_row(event)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        with self._cv:
            if self._closed:
                raise RuntimeError("closed")
            self._items.append(_Queued(row, loop, fut))
            self._cv.notify()
        return await fut

    def _writer(self) -> None:
        conn = sqlite_connect(self.path)
        next_seq = 1 + (conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0])
        try:
            while True:
                with self._cv:
                    while not self._items and not self._closed:
                        self._cv.wait()
                    batch, self._items = self._items, []
                if not batch:
                    return
                first = next_seq
                outcome: BaseException | None = None
                try:
                    conn.executemany(
                        SQLITE_INSERT_SEQ,
                        [(first + i, *item.row) for i, item in enumerate(batch)],
                    )
                    conn.commit()
                    next_seq += len(batch)
                    self.batches += 1
                    self.appended += len(batch)
                except sqlite3.Error as exc:
                    conn.rollback()
                    outcome = exc
                by_loop: dict[
                    asyncio.AbstractEventLoop,
                    list[tuple[asyncio.Future[int], int | BaseException]],
                ] = {}
                for i, item in enumerate(batch):
                    result: int | BaseException = first + i if outcome is None else outcome
                    by_loop.setdefault(item.loop, []).append((item.fut, result))
                for loop, results in by_loop.items():
                    loop.call_soon_threadsafe(settle_futures, results)
        finally:
            conn.close()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()


# --------------------------------------------------------------------------- load runs


@dataclass(slots=True)
class Trace:
    """Start and end (perf_counter) of every append one producer made."""

    starts: array[float] = field(default_factory=lambda: array("d"), repr=False)
    ends: array[float] = field(default_factory=lambda: array("d"), repr=False)


@dataclass(slots=True)
class LoadOutcome:
    traces: list[Trace]
    t_begin: float
    t_measure: float
    t_end: float
    errors: int = 0
    cpu_s: float = 0.0
    """Process CPU time (user + sys, all threads) from t_begin until the last producer
    finished."""
    extra: dict[str, Any] = field(default_factory=dict)


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def runs_for_producer(runs: Sequence[str], producer: int, producers: int) -> list[str]:
    return list(runs[producer::producers])


async def _async_load(
    append: Callable[[NewEvent], Awaitable[int]],
    runs: Sequence[str],
    producers: int,
    warmup_s: float,
    duration_s: float,
) -> LoadOutcome:
    await asyncio.gather(*(append(created_event(run)) for run in runs))
    traces = [Trace() for _ in range(producers)]
    errors = 0
    cpu_begin = cpu_seconds()
    t_begin = time.perf_counter()
    t_measure = t_begin + warmup_s
    t_end = t_measure + duration_s

    async def producer(index: int) -> None:
        nonlocal errors
        mine = runs_for_producer(runs, index, producers)
        trace = traces[index]
        starts, ends = trace.starts, trace.ends
        k = 0
        perf = time.perf_counter
        while True:
            t0 = perf()
            if t0 >= t_end:
                return
            try:
                await append(stats_event(mine[k % len(mine)], k))
            except Exception:
                errors += 1
                continue
            starts.append(t0)
            ends.append(perf())
            k += 1

    await asyncio.gather(*(producer(i) for i in range(producers)))
    cpu_s = cpu_seconds() - cpu_begin
    return LoadOutcome(traces, t_begin, t_measure, t_end, errors, cpu_s)


def _thread_load(
    store: SqlitePerEvent,
    runs: Sequence[str],
    producers: int,
    warmup_s: float,
    duration_s: float,
) -> LoadOutcome:
    setup = store.connection()
    for run in runs:
        store.append(setup, created_event(run))
    store.release(setup)
    traces = [Trace() for _ in range(producers)]
    errors = [0] * producers
    ready = threading.Barrier(producers + 1)
    go = threading.Event()
    clock: dict[str, float] = {}

    def producer(index: int) -> None:
        conn = store.connection()
        mine = runs_for_producer(runs, index, producers)
        trace = traces[index]
        starts, ends = trace.starts, trace.ends
        perf = time.perf_counter
        ready.wait()
        go.wait()
        t_end = clock["end"]
        k = 0
        try:
            while True:
                t0 = perf()
                if t0 >= t_end:
                    return
                try:
                    store.append(conn, stats_event(mine[k % len(mine)], k))
                except sqlite3.Error:
                    errors[index] += 1
                    continue
                starts.append(t0)
                ends.append(perf())
                k += 1
        finally:
            store.release(conn)

    threads = [
        threading.Thread(target=producer, args=(i,), name=f"producer-{i}", daemon=True)
        for i in range(producers)
    ]
    for thread in threads:
        thread.start()
    ready.wait()
    cpu_begin = cpu_seconds()
    t_begin = time.perf_counter()
    clock["end"] = t_begin + warmup_s + duration_s
    go.set()
    for thread in threads:
        thread.join()
    cpu_s = cpu_seconds() - cpu_begin
    return LoadOutcome(traces, t_begin, t_begin + warmup_s, clock["end"], sum(errors), cpu_s)


def summarize_load(store: str, producers: int, rep: int, out: LoadOutcome) -> dict[str, Any]:
    """Throughput = appends that completed inside the measured window / its length.
    Latencies = every append that started inside the window."""
    completed = 0
    latencies: list[float] = []
    for trace in out.traces:
        for t0, t1 in zip(trace.starts, trace.ends, strict=True):
            if out.t_measure <= t1 <= out.t_end:
                completed += 1
            if t0 >= out.t_measure:
                latencies.append(t1 - t0)
    window = out.t_end - out.t_measure
    last_end = max((trace.ends[-1] for trace in out.traces if trace.ends), default=out.t_end)
    per_producer = [
        sum(1 for t1 in trace.ends if out.t_measure <= t1 <= out.t_end) for trace in out.traces
    ]
    return {
        "store": store,
        "producers": producers,
        "repetition": rep,
        "window_s": round(window, 3),
        "appends_in_window": completed,
        "appends_per_s": round(completed / window, 1),
        "latency_ms": percentiles(latencies, 1e3),
        "per_producer_appends": {
            "min": min(per_producer),
            "max": max(per_producer),
        },
        "errors": out.errors,
        "process_cpu_cores_used": round(out.cpu_s / max(1e-9, last_end - out.t_begin), 2),
        "process_cpu_us_per_append": round(
            out.cpu_s / max(1, sum(len(trace.ends) for trace in out.traces)) * 1e6, 1
        ),
        **out.extra,
        "_latencies": latencies,
    }


def run_without_c(producers: int, rep: int, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The ``timeline`` store in a child process without the registry's C extensions (an
    extension cannot be unloaded from this one)."""
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        WITHOUT_C_FLAG,
        "--sections=appends",
        "--stores=timeline",
        f"--producers={producers}",
        "--repeat=1",
        f"--warmup={args.warmup}",
        f"--duration={args.duration}",
        f"--min-runs={args.min_runs}",
        f"--dir={base}",
        "--raw-latencies",
    ]
    child = subprocess.run(argv, capture_output=True, text=True, check=False)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{child.stderr}")
    doc = json.loads(child.stdout)
    if any(doc["c_extensions"].values()):
        raise RuntimeError(f"the child still loaded C extensions: {doc['c_extensions']}")
    (result,) = doc["appends"]["raw"]
    result.update(store="timeline_without_c", repetition=rep, c_extensions=doc["c_extensions"])
    result["_latencies"] = result.pop("latencies_s")
    return result


def run_append_config(
    store: str, producers: int, rep: int, base: Path, args: argparse.Namespace
) -> dict[str, Any]:
    if store == "timeline_without_c":
        return run_without_c(producers, rep, base, args)
    data_dir = fresh_dir(base, f"{store}-p{producers}-r{rep}")
    runs = [f"p{producers}-r{i:04d}" for i in range(max(producers, args.min_runs))]
    gc.collect()
    young = INTERPRETER_YOUNG_THRESHOLD if store.endswith("_interpreter_gc") else None
    restore_gc = set_young_threshold(young) if young is not None else None
    loop_kind: EventLoopKind = "asyncio" if store.endswith("_asyncio_loop") else DEFAULT_EVENT_LOOP

    def new_loop() -> asyncio.AbstractEventLoop:
        return new_event_loop(loop_kind)

    try:
        if store.startswith("timeline"):
            timeline = Timeline.open(TimelineConfig(data_dir=data_dir))
            try:
                before = (timeline.wal.stats.batches, timeline.wal.stats.appended)
                outcome = asyncio.run(
                    _async_load(timeline.append, runs, producers, args.warmup, args.duration),
                    loop_factory=new_loop,
                )
                batches = timeline.wal.stats.batches - before[0]
                appended = timeline.wal.stats.appended - before[1]
            finally:
                timeline.close()
            outcome.extra = {"batches": batches, "mean_batch": round(appended / batches, 1)}
        elif store == "sqlite_batched":
            batched = SqliteBatched(data_dir / "events.sqlite")
            try:
                outcome = asyncio.run(
                    _async_load(batched.append, runs, producers, args.warmup, args.duration),
                    loop_factory=new_loop,
                )
            finally:
                batched.close()
            outcome.extra = {
                "batches": batched.batches,
                "mean_batch": round(batched.appended / max(1, batched.batches), 1),
            }
        else:
            per_event = SqlitePerEvent(
                data_dir / "events.sqlite", shared=store == "sqlite_per_event"
            )
            try:
                outcome = _thread_load(per_event, runs, producers, args.warmup, args.duration)
            finally:
                per_event.close()
        outcome.extra["runs"] = len(runs)
        outcome.extra["gc_threshold"] = list(gc.get_threshold())
        outcome.extra["event_loop"] = loop_kind
        return summarize_load(store, producers, rep, outcome)
    finally:
        if restore_gc is not None:
            restore_gc()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


def appends_section(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    raw: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        for producers in args.producers:
            for store in args.stores:
                result = run_append_config(store, producers, rep, base, args)
                log(
                    f"appends rep={rep} producers={producers:>3} {store:<26} "
                    f"{result['appends_per_s']:>9.0f}/s  p50 {result['latency_ms']['p50']:.3f} ms"
                    f"  p99 {result['latency_ms']['p99']:.3f} ms"
                )
                raw.append(result)

    summary: dict[str, Any] = {}
    for producers in args.producers:
        per_store: dict[str, Any] = {}
        for store in args.stores:
            reps = [r for r in raw if r["store"] == store and r["producers"] == producers]
            rates = [r["appends_per_s"] for r in reps]
            pooled = [lat for r in reps for lat in r["_latencies"]]
            per_store[store] = {
                "appends_per_s_median": round(statistics.median(rates), 1),
                "appends_per_s_runs": rates,
                "latency_ms_pooled": percentiles(pooled, 1e3),
            }
        summary[str(producers)] = {"stores": per_store}
        for ours, theirs in SUMMARY_RATIOS:
            if ours in per_store and theirs in per_store:
                summary[str(producers)][f"ratio_{ours}_vs_{theirs}"] = ratio(
                    per_store[ours]["appends_per_s_median"],
                    per_store[theirs]["appends_per_s_median"],
                )
    for r in raw:
        latencies = r.pop("_latencies")
        if args.raw_latencies:
            r["latencies_s"] = latencies
    return {
        "method": {
            "event": "NewEvent(run_id, 'stats', 'bench', {fps, bitrate_kbps, frames, dropped}); "
            "constructing it is inside the timed region for every store",
            "runs": f"max(producers, {args.min_runs}) runs per config, each created first "
            "(run_created, untimed); producer i cycles over runs i, i+P, i+2P, ...",
            "window": f"{args.warmup} s warm-up, then {args.duration} s measured, "
            f"{args.repeat} repetition(s) interleaved across stores; rate = appends "
            "completed in the window / window; latency = perf_counter around each append "
            "that started in the window (queueing included); summary rate = median of "
            "repetitions, summary latency = pooled over repetitions",
            "sqlite_schema": list(SQLITE_SCHEMA),
            "event_loop": "asyncio producers (timeline, sqlite_batched) run on the server's "
            f"default loop ({DEFAULT_EVENT_LOOP}, whip.eventloop), except "
            "timeline_asyncio_loop (the standard library's)",
            "gc_policy": "the whole run uses the server's GC policy "
            f"(whip.gcpolicy.set_young_threshold({DEFAULT_YOUNG_THRESHOLD})), every store "
            "alike, except timeline_interpreter_gc (young threshold "
            f"{INTERPRETER_YOUNG_THRESHOLD}, the interpreter's)",
            "process_cpu_cores_used": "process CPU (user+sys, all threads) / wall time of "
            "the load; below 1.0 on a GIL-bound run means CPU was taken by others or "
            "threads waited (fsync, GIL hand-offs)",
            "process_cpu_us_per_append": "the same process CPU / every append completed "
            "from the start of the load (warm-up included): the CPU cost of one append, "
            "whatever waited",
        },
        "stores": STORE_DESCRIPTIONS,
        "summary": summary,
        "raw": raw,
    }


# --------------------------------------------------------------------------- big logs


def run_events(run_id: str, count: int, k: int) -> NewEvent:
    """Event ``k`` (0-based) of a run of ``count`` events: created, connected, stats...,
    closed (so the run is ended and recovery has nothing to interrupt)."""
    if k == 0:
        return created_event(run_id)
    if k == 1:
        return NewEvent(run_id, EventType.SESSION_CONNECTED, PRINCIPAL, {"session_id": "s"})
    if k == count - 1:
        return NewEvent(run_id, EventType.SESSION_CLOSED, PRINCIPAL, {"reason": "eos"})
    return stats_event(run_id, k)


async def _build(
    timeline: Timeline,
    run_ids: Sequence[str],
    events_per_run: int,
    concurrency: int,
    cursor_index: int,
) -> dict[str, int]:
    """Append every run's events; runs are written concurrently, so their events
    interleave in the log as with live streams. Returns {run: seq at cursor_index}."""
    cursors: dict[str, int] = {}
    pending = list(reversed(run_ids))

    async def worker() -> None:
        while pending:
            run_id = pending.pop()
            for k in range(events_per_run):
                seq = await timeline.append(run_events(run_id, events_per_run, k))
                if k == cursor_index:
                    cursors[run_id] = seq

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(run_ids)))))
    return cursors


def build_log(
    timeline: Timeline,
    run_ids: Sequence[str],
    events_per_run: int,
    concurrency: int,
    cursor_index: int,
    label: str,
) -> tuple[dict[str, int], dict[str, Any]]:
    total = len(run_ids) * events_per_run
    log(f"building {label}: {len(run_ids)} runs x {events_per_run} events = {total:,} events")
    before = (timeline.wal.stats.batches, timeline.wal.stats.appended)
    t0 = time.perf_counter()
    cursors = asyncio.run(
        _build(timeline, run_ids, events_per_run, concurrency, cursor_index),
        loop_factory=new_event_loop,
    )
    seconds = time.perf_counter() - t0
    batches = timeline.wal.stats.batches - before[0]
    appended = timeline.wal.stats.appended - before[1]
    info = {
        "runs": len(run_ids),
        "events_per_run": events_per_run,
        "events": total,
        "concurrent_writers": min(concurrency, len(run_ids)),
        "seconds": round(seconds, 2),
        "appends_per_s": round(appended / seconds, 1),
        "batches": batches,
        "mean_batch": round(appended / max(1, batches), 1),
    }
    log(f"built {label} in {seconds:.1f} s ({info['appends_per_s']:.0f} appends/s)")
    return cursors, info


# --------------------------------------------------------------------------- reads


def time_reads(
    fn: Callable[[str, int, int], list[Any]],
    samples: Sequence[tuple[str, int]],
    limit: int,
    rounds: int,
    before_each: Callable[[], None] | None = None,
) -> tuple[dict[str, float], int]:
    durations: list[float] = []
    returned = 0
    perf = time.perf_counter
    for _ in range(rounds):
        for run_id, cursor in samples:
            if before_each is not None:
                before_each()
            t0 = perf()
            events = fn(run_id, cursor, limit)
            durations.append(perf() - t0)
            returned += len(events)
    return percentiles(durations, 1e6, 1), returned // max(1, len(durations))


def measure_reads(
    timeline: Timeline,
    samples: Sequence[tuple[str, int]],
    args: argparse.Namespace,
    data_dir: Path,
    *,
    warm: bool,
) -> dict[str, Any]:
    limit = args.read_limit
    out: dict[str, Any] = {}
    if warm:
        missing = [r for r, c in samples if timeline.read_warm(r, c, limit) is None]
        if missing:
            raise RuntimeError(f"{len(missing)} sampled cursors are not covered by warm tails")
        mismatched = sum(
            1
            for r, c in samples
            if timeline.read_warm(r, c, limit) != timeline.read_cold(r, c, limit)
        )
        out["warm_equals_cold"] = mismatched == 0
        stats, per_read = time_reads(timeline.read_run_events, samples, limit, args.read_rounds)
        out["warm_hit_read_run_events_us"] = {**stats, "events_per_read": per_read}
    stats, per_read = time_reads(timeline.read_cold, samples, limit, args.read_rounds)
    out["cold_read_cold_us"] = {**stats, "events_per_read": per_read}
    from_start = [(run_id, 0) for run_id, _ in samples]
    stats, per_read = time_reads(timeline.read_run_events, from_start, limit, args.read_rounds)
    out["cold_miss_from_run_start_read_run_events_us"] = {**stats, "events_per_read": per_read}
    if args.uncached_samples > 0:
        segments = segment_files(data_dir)
        subset = list(samples[: args.uncached_samples])
        stats, per_read = time_reads(
            timeline.read_cold, subset, limit, 1, before_each=lambda: drop_page_cache(segments)
        )
        out["cold_read_cold_page_cache_dropped_us"] = {**stats, "events_per_read": per_read}
    return out


# --------------------------------------------------------------------------- recovery


def recovery_report_json(timeline: Timeline) -> dict[str, Any]:
    report = timeline.recovery
    assert report is not None
    return {
        "segments": report.segments,
        "records": report.records,
        "last_seq": report.last_seq,
        "torn_tail_bytes": report.torn_tail_bytes,
        "corruption": None if report.corruption is None else str(report.corruption),
        "quarantined": list(report.quarantined),
        "seconds": round(report.seconds, 3),
    }


def measure_open(data_dir: Path, *, drop_cache: bool) -> tuple[Timeline, dict[str, Any]]:
    """Time ``Timeline.open`` (recovery); the caller closes the returned timeline."""
    if drop_cache:
        drop_page_cache(segment_files(data_dir))
    gc.collect()
    t0 = time.perf_counter()
    timeline = Timeline.open(TimelineConfig(data_dir=data_dir))
    seconds = time.perf_counter() - t0
    report = recovery_report_json(timeline)
    records = report["records"]
    result = {
        "page_cache": "dropped (POSIX_FADV_DONTNEED)" if drop_cache else "warm",
        "open_seconds": round(seconds, 3),
        "events_per_s": round(records / seconds, 1),
        "wal_scan_seconds": report["seconds"],
        "rest_of_open_seconds": round(seconds - report["seconds"], 3),
        "rest_of_open_is": "warm-tail seeding (read + decode the last tail events of up to "
        "warm_runs runs), writer start, run_interrupted appends",
        "recovery_report": report,
        "interrupted_runs": len(timeline.interrupted),
        "warm_runs_after_open": len(timeline.snapshot.tails),
    }
    log(
        f"Timeline.open ({result['page_cache']}): {seconds:.2f} s for {records:,} events "
        f"(scan {report['seconds']:.2f} s), interrupted {len(timeline.interrupted)}"
    )
    return timeline, result


def recovery_block(data_dir: Path, expect_events: int) -> tuple[Timeline, dict[str, Any]]:
    """Warm-cache open, close, dropped-cache open; returns the last (open) timeline."""
    timeline, warm = measure_open(data_dir, drop_cache=False)
    timeline.close()
    timeline, dropped = measure_open(data_dir, drop_cache=True)
    segments = segment_files(data_dir)
    return timeline, {
        "log_events": expect_events,
        "log_bytes": sum(p.stat().st_size for p in segments),
        "segments": len(segments),
        "page_cache_warm": warm,
        "page_cache_dropped": dropped,
    }


# --------------------------------------------------------------------------- log section


def log_section(base: Path, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build the big log, measure reads on it, recovery of it, then grow it with other
    runs and measure the same cold reads again. Returns (reads, recovery)."""
    data_dir = fresh_dir(base, "timeline-log")
    n_runs, n_events = args.runs, args.events_per_run
    cursor_index = n_events - args.cursor_back
    run_ids = [f"run-{i:06d}" for i in range(n_runs)]
    other_ids = [f"other-{i:06d}" for i in range(args.other_runs)]
    rng = random.Random(args.seed)
    sampled = rng.sample(run_ids, min(args.read_samples, n_runs))

    timeline = Timeline.open(TimelineConfig(data_dir=data_dir))
    try:
        cursors, build_main = build_log(
            timeline, run_ids, n_events, args.build_concurrency, cursor_index, "main log"
        )
        samples = [(run_id, cursors[run_id]) for run_id in sampled]
        log(f"reads on {n_runs:,} runs: {len(samples)} runs x {args.read_rounds} rounds")
        reads_base = measure_reads(timeline, samples, args, data_dir, warm=True)
        timeline.close()

        log(f"recovery of {n_runs * n_events:,} events")
        timeline, recovery_main = recovery_block(data_dir, n_runs * n_events)

        build_other: dict[str, Any] = {}
        reads_big: dict[str, Any] = {}
        recovery_big: dict[str, Any] = {}
        if other_ids:
            _, build_other = build_log(
                timeline,
                other_ids,
                args.other_events_per_run,
                args.build_concurrency,
                -1,
                "other runs",
            )
            log(f"reads with {n_runs + len(other_ids):,} runs in the log")
            reads_big = measure_reads(timeline, samples, args, data_dir, warm=False)
            timeline.close()
            total = n_runs * n_events + len(other_ids) * args.other_events_per_run
            timeline, recovery_big = recovery_block(data_dir, total)
    finally:
        timeline.close()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)

    def p50(block: dict[str, Any], key: str) -> float:
        return float(block[key]["p50"]) if key in block else math.nan

    scaling: dict[str, Any] = {}
    if reads_big:
        for key in (
            "cold_read_cold_us",
            "cold_miss_from_run_start_read_run_events_us",
            "cold_read_cold_page_cache_dropped_us",
        ):
            if key in reads_base and key in reads_big:
                scaling[key] = {
                    "p50_before": p50(reads_base, key),
                    "p50_after": p50(reads_big, key),
                    "p50_ratio_after_vs_before": ratio(p50(reads_big, key), p50(reads_base, key)),
                    "p99_ratio_after_vs_before": ratio(
                        float(reads_big[key]["p99"]), float(reads_base[key]["p99"])
                    ),
                }
    reads = {
        "method": {
            "limit": args.read_limit,
            "cursor": f"seq of each sampled run's event #{cursor_index} (0-based) of "
            f"{n_events}: {args.cursor_back - 1} newer events, inside the last "
            f"{DEFAULT_TAIL_EVENTS} (warm tail); same (run, cursor, limit) for warm "
            "and cold",
            "warm": "timeline.read_run_events (served from the snapshot tail)",
            "cold": "timeline.read_cold (index + pread + decode), page cache warm unless noted",
            "cold_from_run_start": "timeline.read_run_events(run, 0, limit): cursor older than "
            "the warm tail, falls back to the WAL",
            "page_cache_dropped": "POSIX_FADV_DONTNEED on every segment before each read",
            "layout": f"{args.build_concurrency} runs written concurrently, so a run's "
            "events are interleaved with other runs' events in the segments (one pread "
            "per event on cold reads)",
            "sampled_runs": len(samples),
            "rounds": args.read_rounds,
        },
        "build_main_log": build_main,
        "log_main": {"runs": n_runs, "events": n_runs * n_events, **reads_base},
    }
    if reads_big:
        reads["build_other_runs"] = build_other
        reads["log_with_other_runs"] = {
            "runs": n_runs + len(other_ids),
            "events": n_runs * n_events + len(other_ids) * args.other_events_per_run,
            **reads_big,
        }
        reads["cold_scaling"] = scaling
    recovery = {"target_s": RECOVERY_TARGET_S, "main_log": recovery_main}
    if recovery_big:
        recovery["log_with_other_runs"] = recovery_big
    return reads, recovery


# --------------------------------------------------------------------------- targets


def evaluate_targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []
    appends = doc.get("appends")
    if appends:
        summary = appends["summary"]
        for key, which in (
            ("ratio_timeline_vs_sqlite_per_event", ""),
            ("ratio_timeline_without_c_vs_sqlite_per_event", ", without the C extensions"),
        ):
            if key in summary.get("256", {}):
                measured = summary["256"][key]
                targets.append(
                    {
                        "name": "appends/s at 256 producers >= 20x sqlite "
                        f"one-transaction-per-event (shared connection){which}",
                        "measured": measured,
                        "pass": measured is not None and measured >= PER_EVENT_RATIO_TARGET,
                    }
                )
        for producers, block in summary.items():
            if "ratio_timeline_vs_sqlite_batched" not in block:
                continue
            measured = block["ratio_timeline_vs_sqlite_batched"]
            targets.append(
                {
                    "name": f"appends/s at {producers} producers not below sqlite batched",
                    "measured": measured,
                    "pass": measured is not None and measured >= 1.0,
                }
            )
    recovery = doc.get("recovery")
    if recovery:
        main = recovery["main_log"]
        events = main["log_events"]
        seconds = main["page_cache_warm"]["open_seconds"]
        targets.append(
            {
                "name": f"recovery (Timeline.open, page cache warm) of 1,000,000 events < "
                f"{RECOVERY_TARGET_S} s",
                "measured": seconds,
                "log_events": events,
                "applies": events >= 1_000_000,
                "pass": seconds < RECOVERY_TARGET_S if events >= 1_000_000 else None,
            }
        )
    reads = doc.get("reads")
    if reads and "cold_scaling" in reads:
        measured = reads["cold_scaling"]["cold_read_cold_us"]["p50_ratio_after_vs_before"]
        targets.append(
            {
                "name": "cold read p50 with 10x more other runs within "
                f"{COLD_SCALING_TOLERANCE}x of before (informal 'barely changes')",
                "measured": measured,
                "pass": measured is not None and measured <= COLD_SCALING_TOLERANCE,
            }
        )
    return targets


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark the durable timeline against SQLite; prints one JSON document."
    )
    parser.add_argument("--quick", action="store_true", help="~30 s smoke run (small sizes)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="base dir for fresh temp dirs (default: /tmp)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the data dirs")
    parser.add_argument(
        WITHOUT_C_FLAG,
        action="store_true",
        help="run the registry without its C extensions (their pure-Python references)",
    )
    parser.add_argument(
        "--stores",
        default=",".join(STORES),
        help=f"comma list of append stores (default: all of {','.join(STORES)})",
    )
    parser.add_argument(
        "--raw-latencies",
        action="store_true",
        help="keep every append's latency in the raw results (timeline_without_c's child)",
    )
    parser.add_argument(
        "--sections",
        default="appends,log",
        help="comma list of: appends, log (log = reads + recovery)",
    )
    group = parser.add_argument_group("appends")
    group.add_argument(
        "--producers", default="1,16,256", help="comma list of producer counts (default 1,16,256)"
    )
    group.add_argument("--duration", type=float, default=None, help="measured s (default 2)")
    group.add_argument("--warmup", type=float, default=None, help="warm-up s (default 0.5)")
    group.add_argument("--repeat", type=int, default=None, help="repetitions (default 3)")
    group.add_argument("--min-runs", type=int, default=64, help="runs per config at least")
    group = parser.add_argument_group("log (reads and recovery)")
    group.add_argument("--runs", type=int, default=None, help="runs (default 1000)")
    group.add_argument("--events-per-run", type=int, default=None, help="(default 1000)")
    group.add_argument("--other-runs", type=int, default=None, help="added runs (default 9000)")
    group.add_argument("--other-events-per-run", type=int, default=None, help="(default 100)")
    group.add_argument("--build-concurrency", type=int, default=1000)
    group.add_argument("--read-samples", type=int, default=None, help="runs sampled (200)")
    group.add_argument("--read-rounds", type=int, default=None, help="passes over samples (5)")
    group.add_argument("--read-limit", type=int, default=100)
    group.add_argument(
        "--cursor-back", type=int, default=200, help="cursor this many events before the end"
    )
    group.add_argument(
        "--uncached-samples", type=int, default=None, help="cold reads after cache drop (50)"
    )
    group.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    quick = args.quick
    defaults = {
        "duration": (1.0, 2.0),
        "warmup": (0.25, 0.5),
        "repeat": (1, 3),
        "runs": (100, 1000),
        "events_per_run": (1000, 1000),
        "other_runs": (900, 9000),
        "other_events_per_run": (100, 100),
        "read_samples": (50, 200),
        "read_rounds": (3, 5),
        "uncached_samples": (10, 50),
    }
    for name, (quick_value, full_value) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick_value if quick else full_value)
    args.producers = [int(p) for p in str(args.producers).split(",") if p]
    args.sections = {s.strip() for s in str(args.sections).split(",") if s.strip()}
    args.stores = [s.strip() for s in str(args.stores).split(",") if s.strip()]
    if unknown_stores := set(args.stores) - set(STORES):
        parser.error(f"unknown stores: {sorted(unknown_stores)}")
    unknown = args.sections - {"appends", "log"}
    if unknown:
        parser.error(f"unknown sections: {sorted(unknown)}")
    if not 1 <= args.cursor_back <= min(args.events_per_run - 1, DEFAULT_TAIL_EVENTS):
        parser.error(
            f"--cursor-back must be in 1..min(events per run - 1, {DEFAULT_TAIL_EVENTS}) "
            "so the cursor is inside the run's warm tail"
        )
    if args.events_per_run < 3 or args.other_events_per_run < 3:
        parser.error("runs need at least 3 events (created, connected, closed)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    parent = args.dir if args.dir is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="whip-bench-wal-", dir=parent))
    log(f"data under {base}")
    doc: dict[str, Any] = {
        "benchmark": "whip-ingest registry WAL (bench/wal.py)",
        "quick": args.quick,
        "config": {
            k: sorted(v) if isinstance(v, set) else (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
        },
    }
    phases: dict[str, float] = {}
    # The server's GC policy for the whole run (the server applies it at start-up);
    # timeline_interpreter_gc switches back to the interpreter's for its own runs.
    restore_gc = set_young_threshold(DEFAULT_YOUNG_THRESHOLD)
    try:
        doc["machine"] = machine_info(base)
        doc["machine"]["gc_threshold"] = list(gc.get_threshold())
        doc["c_extensions"] = {
            "registry._framing": registry_record.HAVE_C_FRAMING,
            "registry._newevent": registry_events.HAVE_C_NEW_EVENT,
        }
        if "appends" in args.sections:
            t0 = time.perf_counter()
            doc["appends"] = appends_section(fresh_dir(base, "appends"), args)
            phases["appends"] = round(time.perf_counter() - t0, 1)
        if "log" in args.sections:
            t0 = time.perf_counter()
            doc["reads"], doc["recovery"] = log_section(base, args)
            phases["log"] = round(time.perf_counter() - t0, 1)
    finally:
        restore_gc()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    doc["targets"] = evaluate_targets(doc)
    doc["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    doc["phase_seconds"] = phases
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    log(f"done in {doc['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
