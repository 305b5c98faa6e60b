"""Crash-consistency harness: a writer program to SIGKILL, and the parent side that checks.

As a program (the child)::

    python bench/support/crash_writer.py DATA_DIR --tag TAG --seed SEED [--producers N]
        [--threads N] [--segment-bytes B] [--max-seconds S]
    python bench/support/crash_writer.py DATA_DIR --hold

The writer opens a :class:`Timeline` on ``DATA_DIR`` and appends under load until it is
killed: ``--producers`` asyncio tasks (``await append``) and ``--threads`` worker threads
(``append_blocking``), each running runs through ``run_created`` -> maybe
``session_connected`` -> some ``stats`` -> maybe ``session_closed``. Every event carries
a unique ``marker`` in its data. Protocol on stdout, one ``os.write`` per line (short
lines, so a line is written atomically and lines from threads never interleave)::

    opening                                  (right before Timeline.open)
    ready <next_seq> <number of runs interrupted by this open>
    ok <seq> <run_id> <type> <marker>        (only after the append was confirmed)

``--hold`` opens the data dir, prints ``ready <pid>``, holds the lock until its stdin
is closed, then closes the timeline and prints ``closed``.

As a module (the parent, used by ``tests/test_crash.py`` and ``bench/crash.py``; the
frame walk also by ``tests/test_corruption.py`` and the system crash loop):
:class:`WriterProcess` runs and kills a writer while reading its confirmations on a
thread; :func:`verify_reopened` checks a reopened timeline against every confirmation
ever read; :func:`run_iteration` is one spawn -> kill -> reopen -> verify -> close round.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from registry.events import Event, EventType, NewEvent
from registry.timeline import Timeline, TimelineConfig

WRITER = Path(__file__).resolve()
PRINCIPAL = "crash-tester"
DEFAULT_SEGMENT_BYTES = 256 * 1024


# --------------------------------------------------------------------------- child


def _emit(line: str) -> None:
    try:
        os.write(1, (line + "\n").encode())
    except BrokenPipeError:  # the parent is gone: nobody is counting on us any more
        os._exit(4)


def _die(message: str) -> None:
    os.write(2, (message + "\n").encode())
    os._exit(5)


def run_script(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """The events of one run, in order (each one is confirmed before the next is sent)."""
    steps: list[tuple[str, dict[str, Any]]] = [
        (EventType.RUN_CREATED, {"stream": f"s{rng.randrange(1000)}", "session_id": "x"})
    ]
    if rng.random() < 0.7:
        steps.append((EventType.SESSION_CONNECTED, {}))
    for _ in range(rng.randint(0, 3)):
        # Mostly small records, sometimes multi-page ones (a batch then spans pages,
        # so a kill can land in the middle of its write).
        pad = "p" * rng.choice((0, 0, 0, 300, 6000))
        steps.append((EventType.STATS, {"frames": rng.randrange(100_000), "pad": pad}))
    if rng.random() < 0.5:
        steps.append((EventType.SESSION_CLOSED, {"reason": "done"}))
    return steps


def _event(
    tag: str, worker: str, run_no: int, n: int, etype: str, data: dict[str, Any]
) -> NewEvent:
    marker = f"{tag}.{worker}.{n}"
    return NewEvent(f"{tag}-{worker}-{run_no}", etype, PRINCIPAL, {**data, "marker": marker})


def _confirmed(seq: int, ev: NewEvent) -> None:
    _emit(f"ok {seq} {ev.run_id} {ev.type} {ev.data['marker']}")


async def _async_producer(timeline: Timeline, tag: str, seed: int, idx: int) -> None:
    rng = random.Random(f"{seed}/a{idx}")
    worker = f"a{idx}"
    n = 0
    run_no = 0
    while True:
        for etype, data in run_script(rng):
            ev = _event(tag, worker, run_no, n, etype, data)
            n += 1
            _confirmed(await timeline.append(ev), ev)
        run_no += 1


def _thread_producer(timeline: Timeline, tag: str, seed: int, idx: int) -> None:
    rng = random.Random(f"{seed}/t{idx}")
    worker = f"t{idx}"
    n = 0
    run_no = 0
    try:
        while True:
            for etype, data in run_script(rng):
                ev = _event(tag, worker, run_no, n, etype, data)
                n += 1
                _confirmed(timeline.append_blocking(ev, timeout=30), ev)
            run_no += 1
    except BaseException as exc:
        _die(f"thread producer {idx} failed: {exc!r}")


async def _async_main(timeline: Timeline, args: argparse.Namespace) -> None:
    tasks = [
        asyncio.create_task(_async_producer(timeline, args.tag, args.seed, i))
        for i in range(args.producers)
    ]
    done, _ = await asyncio.wait(
        tasks, timeout=args.max_seconds, return_when=asyncio.FIRST_EXCEPTION
    )
    for task in done:
        if task.exception() is not None:
            _die(f"async producer failed: {task.exception()!r}")


def _hold(data_dir: Path) -> int:
    timeline = Timeline.open(TimelineConfig(data_dir))
    _emit(f"ready {os.getpid()}")
    sys.stdin.buffer.read()  # until the parent closes our stdin
    timeline.close()
    _emit("closed")
    return 0


def child_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--tag", default="w")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--producers", type=int, default=6)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--segment-bytes", type=int, default=DEFAULT_SEGMENT_BYTES)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    if args.hold:
        return _hold(args.data_dir)
    _emit("opening")
    timeline = Timeline.open(TimelineConfig(args.data_dir, segment_bytes=args.segment_bytes))
    _emit(f"ready {timeline.wal.next_seq} {len(timeline.interrupted)}")
    for i in range(args.threads):
        threading.Thread(
            target=_thread_producer,
            args=(timeline, args.tag, args.seed, i),
            name=f"producer-{i}",
            daemon=True,
        ).start()
    asyncio.run(_async_main(timeline, args))
    # Nobody killed us within --max-seconds: exit without closing (the parent reports
    # the unexpected exit status).
    os._exit(3)


# --------------------------------------------------------------------------- parent


@dataclass(frozen=True, slots=True)
class Confirmed:
    """One append the writer reported as confirmed."""

    seq: int
    run_id: str
    type: str
    marker: str


class WriterProcess:
    """A running child; a thread reads its stdout lines as they arrive."""

    def __init__(self, args: Sequence[str], stderr_path: Path, *, hold: bool = False) -> None:
        self.stderr_path = stderr_path
        with open(stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(WRITER), *args],
                stdin=subprocess.PIPE if hold else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self._cond = threading.Condition()
        self.lines: list[str] = []
        self.eof = False
        self._reader = threading.Thread(target=self._read, name="writer-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if not raw.endswith(b"\n"):
                break  # cut short by the kill: not a confirmation
            with self._cond:
                self.lines.append(raw.decode().rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def wait_lines(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` lines were read; False on EOF or timeout."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.lines) >= count or self.eof, timeout)
            return len(self.lines) >= count

    def read_count(self) -> int:
        with self._cond:
            return len(self.lines)

    def kill(self, timeout: float = 30.0) -> int:
        """SIGKILL the child; returns how many lines had been read before the signal."""
        seen = self.read_count()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.finish(timeout)
        return seen

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for exit and for the reader to see EOF; returns the exit status."""
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        return code

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError as exc:
            return f"<cannot read stderr: {exc}>"
        return text[-limit:]


def parse_confirmed(lines: Sequence[str]) -> tuple[tuple[int, int] | None, list[Confirmed]]:
    """Split the writer's lines into its ``ready`` header and its confirmations."""
    ready: tuple[int, int] | None = None
    confirmed: list[Confirmed] = []
    for line in lines:
        parts = line.split()
        if parts == ["opening"]:
            assert ready is None and not confirmed, f"unexpected opening line {line!r}"
        elif parts[0] == "ready":
            assert ready is None and not confirmed, f"unexpected ready line {line!r}"
            ready = (int(parts[1]), int(parts[2]))
        elif parts[0] == "ok" and len(parts) == 5:
            confirmed.append(Confirmed(int(parts[1]), parts[2], parts[3], parts[4]))
        else:
            raise AssertionError(f"unparseable writer line {line!r}")
    return ready, confirmed


_ENDED = frozenset({EventType.SESSION_CLOSED, EventType.RUN_INTERRUPTED})


def live_runs(events: Sequence[Event]) -> set[str]:
    """Runs created and neither closed nor interrupted in ``events`` (our own reading)."""
    state: dict[str, bool] = {}
    for ev in events:
        if ev.type == EventType.RUN_CREATED:
            state.setdefault(ev.run_id, True)
        elif ev.type in _ENDED and ev.run_id in state:
            state[ev.run_id] = False
    return {run_id for run_id, live in state.items() if live}


def verify_reopened(
    timeline: Timeline, ledger: dict[str, Confirmed], focus_runs: set[str] | None = None
) -> list[Event]:
    """Check a freshly reopened timeline; raises AssertionError. Returns ``read_all()``.

    ``ledger`` maps marker -> every confirmation read so far (all iterations);
    ``focus_runs`` are also compared through the public per-run read path.
    """
    report = timeline.recovery
    assert report is not None
    events = timeline.wal.read_all()
    seqs = [ev.seq for ev in events]
    if seqs != list(range(1, len(events) + 1)):
        gaps = [(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1][:5]
        raise AssertionError(f"seqs are not 1..{len(events)}: first breaks {gaps}")
    records, problems = walk_log(timeline.config.data_dir)
    assert not problems, problems
    assert records == len(events), f"our frame walk finds {records} records, read_all {len(events)}"
    last = report.last_seq
    interrupted = events[last:]
    assert len(interrupted) == len(timeline.interrupted), (
        f"recovered up to seq {last}, log ends at {len(events)}, but the open appended "
        f"{len(timeline.interrupted)} run_interrupted"
    )

    missing: list[str] = []
    for c in ledger.values():
        ev = events[c.seq - 1] if c.seq <= last else None
        if ev is None or (ev.run_id, ev.type, ev.data.get("marker")) != (
            c.run_id,
            c.type,
            c.marker,
        ):
            found = None if ev is None else (ev.run_id, ev.type, ev.data.get("marker"))
            missing.append(f"{c} -> {found}")
    assert not missing, f"{len(missing)} confirmed appends lost or changed: {missing[:5]}"

    markers = Counter(ev.data["marker"] for ev in events if "marker" in ev.data)
    duplicated = [m for m, n in markers.items() if n > 1]
    assert not duplicated, f"markers appended more than once: {duplicated[:5]}"

    expected_live = live_runs(events[:last])
    for ev in interrupted:
        assert ev.type == EventType.RUN_INTERRUPTED, f"unexpected event after recovery: {ev}"
        assert ev.data == {"reason": "server_restart"}, ev
    got = [ev.run_id for ev in interrupted]
    assert len(got) == len(set(got)), f"a run was interrupted twice: {Counter(got).most_common(3)}"
    assert set(got) == expected_live, (
        f"run_interrupted for the wrong runs: missing {sorted(expected_live - set(got))[:5]}, "
        f"unexpected {sorted(set(got) - expected_live)[:5]}"
    )
    assert set(timeline.interrupted) == expected_live

    # Through the public read path and the run registry: after a reopen every run has
    # ended one way or the other, the way its own events say.
    for run_id in sorted((focus_runs or set()) | expected_live):
        mine = [ev for ev in events if ev.run_id == run_id]
        assert timeline.read_run_events(run_id, 0, 1000) == mine[:1000], run_id
        view = timeline.runs.get(run_id)
        assert view is not None, run_id
        ends = [ev.type for ev in mine if ev.type in _ENDED]
        assert len(ends) == 1, (run_id, ends)
        want = "ended" if ends[0] == EventType.SESSION_CLOSED else "interrupted"
        assert view.state == want, (run_id, view.state, want)
    return events


@dataclass(slots=True)
class LoopState:
    """What carries over from one kill iteration to the next (same data dir)."""

    data_dir: Path
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    ledger: dict[str, Confirmed] = field(default_factory=dict)
    last_seq: int = 0
    last_open_seconds: float = 0.1


@dataclass(slots=True)
class IterationStats:
    iteration: int
    seed: int
    kill_plan: str
    confirmed: int
    confirmed_before_kill: int
    records: int
    """Records this iteration's writer left in the log (confirmed or not)."""
    log_records: int
    open_seconds: float
    recovery_seconds: float
    torn_tail_bytes: int
    interrupted: int
    segments: int


def kill_writer(writer: WriterProcess, rng: random.Random) -> tuple[int, str]:
    """Kill at a random point; returns (lines read before the kill, the plan used)."""
    if rng.random() < 0.1:
        delay = rng.uniform(0.0, 0.4)  # maybe still starting up or opening the timeline
        plan = f"{delay:.3f}s after spawn"
    else:
        need = rng.choice((2, rng.randint(3, 60), rng.randint(60, 600)))
        if not writer.wait_lines(need, timeout=30.0):
            writer.kill()
            raise AssertionError(
                f"writer produced {writer.read_count()} lines, wanted {need}; "
                f"stderr: {writer.stderr_tail()}"
            )
        delay = rng.uniform(0.0, 0.08)
        plan = f"{delay:.3f}s after {need} lines"
    time.sleep(delay)  # a random kill point, not synchronization
    return writer.kill(), plan


def _spawn(state: LoopState, tag: str, seed: int) -> WriterProcess:
    args = [str(state.data_dir), "--tag", tag, "--seed", str(seed)]
    args += ["--segment-bytes", str(state.segment_bytes)]
    state.data_dir.parent.mkdir(parents=True, exist_ok=True)
    return WriterProcess(args, state.data_dir.parent / f"writer-{tag}.stderr")


def _collect(state: LoopState, writer: WriterProcess, seen: int) -> list[Confirmed]:
    code = writer.proc.returncode
    assert code == -signal.SIGKILL, (
        f"writer exited with {code} instead of being killed; stderr: {writer.stderr_tail()}"
    )
    _, confirmed = parse_confirmed(writer.lines)
    before_kill = parse_confirmed(writer.lines[:seen])[1]
    assert before_kill == confirmed[: len(before_kill)]
    for c in confirmed:
        assert c.marker not in state.ledger, f"marker confirmed twice: {c}"
        state.ledger[c.marker] = c
    return confirmed


def run_iteration(state: LoopState, iteration: int, seed: int) -> IterationStats:
    """Spawn a writer on ``state.data_dir``, kill it, reopen here, verify, close.

    In about one iteration in five a second writer is started on the crashed dir and
    killed soon after spawn (during its startup, its recovery and ``run_interrupted``
    appends, or its first appends) before this process reopens.
    """
    rng = random.Random(seed)
    writer = _spawn(state, f"i{iteration}", seed)
    try:
        seen, plan = kill_writer(writer, rng)
    finally:
        if writer.proc.poll() is None:
            writer.kill()
    ready, _ = parse_confirmed(writer.lines)
    if ready is not None:
        assert ready == (state.last_seq + 1, 0), (
            f"writer opened at next_seq {ready[0]} with {ready[1]} interrupted; the previous "
            f"clean close left seq {state.last_seq} and no live runs"
        )
    confirmed = _collect(state, writer, seen)
    before_kill = parse_confirmed(writer.lines[:seen])[1]

    recovered_by_writer: tuple[int, int] | None = None
    if rng.random() < 0.2:
        # Kill it somewhere in its recovery (scan, truncation, run_interrupted appends)
        # or just after: the window is about as long as our last reopen took.
        second = _spawn(state, f"i{iteration}r", seed + 1)
        delay = rng.uniform(0.0, 1.5 * state.last_open_seconds)
        plan += f"; then a writer killed {delay:.3f}s into its open"
        try:
            assert second.wait_lines(1, timeout=30.0), second.stderr_tail()
            time.sleep(delay)  # a random kill point, not synchronization
        finally:
            seen = second.kill()
        recovered_by_writer = parse_confirmed(second.lines)[0]
        if recovered_by_writer is None:
            plan += " before it was ready"
        else:
            plan += f" after it interrupted {recovered_by_writer[1]} runs"
        confirmed += _collect(state, second, seen)

    started = time.monotonic()
    timeline = Timeline.open(TimelineConfig(state.data_dir, segment_bytes=state.segment_bytes))
    open_seconds = time.monotonic() - started
    try:
        report = timeline.recovery
        assert report is not None
        focus = {c.run_id for c in confirmed}
        events = verify_reopened(timeline, state.ledger, focus)
        if recovered_by_writer is not None:
            # The second writer's open interrupted the first one's live runs right before
            # it printed "ready": those events must be there, once each.
            next_seq, interrupted = recovered_by_writer
            mine = events[next_seq - 1 - interrupted : next_seq - 1]
            assert len(mine) == interrupted
            assert all(e.type == EventType.RUN_INTERRUPTED for e in mine), mine
            assert interrupted == len(live_runs(events[: next_seq - 1 - interrupted]))
        assert report.corruption is None, f"a SIGKILL produced corruption: {report.corruption}"
        stats = IterationStats(
            iteration=iteration,
            seed=seed,
            kill_plan=plan,
            confirmed=len(confirmed),
            confirmed_before_kill=len(before_kill),
            records=report.last_seq - state.last_seq,
            log_records=len(events),
            open_seconds=open_seconds,
            recovery_seconds=report.seconds,
            torn_tail_bytes=report.torn_tail_bytes,
            interrupted=len(timeline.interrupted),
            segments=report.segments,
        )
        state.last_seq = len(events)
        state.last_open_seconds = open_seconds
    finally:
        timeline.close()
    return stats


# --------------------------------------------------------------------------- frames

_FRAME = struct.Struct("<II")
_SEQ = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Frame:
    offset: int
    size: int
    seq: int


def walk_frames(buf: bytes, first_seq: int) -> tuple[list[Frame], int]:
    """Our own reading of the frame format (``u32 len | u32 crc32c | u64 seq ...``).

    Returns the valid, consecutive frames from the start and the offset where they end.
    """
    frames: list[Frame] = []
    offset = 0
    expect = first_seq
    while offset + _FRAME.size + _SEQ.size <= len(buf):
        length, crc = _FRAME.unpack_from(buf, offset)
        end = offset + _FRAME.size + length
        if length < _SEQ.size or end > len(buf):
            break
        if crc32c.crc32c(buf[offset + _FRAME.size : end]) != crc:
            break
        (seq,) = _SEQ.unpack_from(buf, offset + _FRAME.size)
        if seq != expect:
            break
        frames.append(Frame(offset, end - offset, seq))
        expect += 1
        offset = end
    return frames, offset


def segment_paths(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*.wal"))


def walk_log(data_dir: Path) -> tuple[int, list[str]]:
    """Walk every segment with :func:`walk_frames`: (records, problems found).

    A problem is a segment whose name is not its first seq, or bytes after its last
    valid frame. A recovered log has none: torn tails are truncated, not skipped. The one
    exception is the space the writer preallocates in the segment it is writing to: only
    zero bytes, and only after the last frame of the last segment.
    """
    problems: list[str] = []
    records = 0
    paths = segment_paths(data_dir)
    for path in paths:
        buf = path.read_bytes()
        if buf and int(path.stem) != records + 1:
            problems.append(f"{path.name} starts at seq {records + 1}")
        frames, end = walk_frames(buf, records + 1)
        preallocated = path == paths[-1] and buf.count(0, end) == len(buf) - end
        if end != len(buf) and not preallocated:
            problems.append(f"{path.name}: {len(buf) - end} bytes after the last valid frame")
        records += len(frames)
    return records, problems


if __name__ == "__main__":
    sys.exit(child_main())
