"""Mid-log corruption and data-dir locking.

A flipped byte in the *middle* of the log (valid records after it) is corruption, not a
torn tail. With ``on_corruption="fail"`` opening raises :class:`CorruptLogError` and
changes nothing on disk; with ``"quarantine"`` (the default) the intact prefix is kept and
readable, the rest (the bad segment's remainder and every later segment) is moved
byte-for-byte into ``wal/quarantine/``, and the log continues after the last good seq.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from pathlib import Path

import pytest

from bench.support.crash_writer import WriterProcess, live_runs, segment_paths, walk_frames
from registry.errors import CorruptLogError, DataDirLockedError, UnknownRunError
from registry.events import Event, EventType, NewEvent
from registry.timeline import Timeline, TimelineConfig

SMALL_SEGMENTS = 4096


def build_log(data_dir: Path, *, segment_bytes: int, runs: int = 10, seed: int = 7) -> list[Event]:
    """Append interleaved runs (some closed, some left live) and close; the expected log."""
    rng = random.Random(seed)
    scripts: dict[str, list[tuple[str, dict[str, object]]]] = {}
    for r in range(runs):
        steps: list[tuple[str, dict[str, object]]] = [(EventType.RUN_CREATED, {"stream": f"s{r}"})]
        steps.append((EventType.SESSION_CONNECTED, {}))
        steps += [
            (EventType.STATS, {"n": i, "pad": "x" * rng.randrange(50, 400)}) for i in range(8)
        ]
        if r % 3:
            steps.append((EventType.SESSION_CLOSED, {"reason": "done"}))
        scripts[f"run-{r}"] = steps
    expected: list[Event] = []
    timeline = Timeline.open(TimelineConfig(data_dir, segment_bytes=segment_bytes))
    try:
        n = 0
        while any(scripts.values()):
            for run_id, steps in scripts.items():
                if not steps:
                    continue
                etype, data = steps.pop(0)
                ev = NewEvent(run_id, etype, "owner", {**data, "marker": f"m{n}"})
                n += 1
                seq = timeline.append_blocking(ev)
                expected.append(Event(seq, ev.run_id, ev.type, ev.ts_ms, ev.principal, ev.data))
    finally:
        timeline.close()
    assert [e.seq for e in expected] == list(range(1, len(expected) + 1))
    return expected


def locate(data_dir: Path, seq: int) -> tuple[Path, int, int]:
    """(segment, offset, frame size) of the record ``seq``, by our own frame walk."""
    first = 1
    for path in segment_paths(data_dir):
        buf = path.read_bytes()
        frames, end = walk_frames(buf, first)
        assert end == len(buf), f"{path.name} is not intact"
        for frame in frames:
            if frame.seq == seq:
                return path, frame.offset, frame.size
        first += len(frames)
    raise AssertionError(f"seq {seq} not in the log")


FLIP_AT = {
    "length": lambda size: 0,
    "length_high": lambda size: 3,
    "checksum": lambda size: 5,
    "seq": lambda size: 8,
    "payload": lambda size: size // 2,
    "last_byte": lambda size: size - 1,
}


def flip(path: Path, offset: int) -> bytes:
    buf = bytearray(path.read_bytes())
    buf[offset] ^= 0xA5
    path.write_bytes(bytes(buf))
    return bytes(buf)


def snapshot_dir(data_dir: Path) -> dict[str, bytes]:
    wal = data_dir / "wal"
    return {str(p.relative_to(wal)): p.read_bytes() for p in sorted(wal.rglob("*")) if p.is_file()}


def quarantine_files(data_dir: Path) -> list[Path]:
    """Every file under ``wal/quarantine/`` (in whatever sub-folders the log uses)."""
    return sorted(p for p in (data_dir / "wal" / "quarantine").rglob("*") if p.is_file())


def check_fail_mode(
    data_dir: Path, segment: Path, offset: int, last_good: int, segment_bytes: int
) -> None:
    before = snapshot_dir(data_dir)
    config = TimelineConfig(data_dir, segment_bytes=segment_bytes, on_corruption="fail")
    with pytest.raises(CorruptLogError) as info:
        Timeline.open(config)
    err = info.value
    assert (err.segment, err.offset, err.last_good_seq) == (str(segment), offset, last_good)
    message = str(err)
    assert segment.name in message
    assert f"offset {offset}" in message
    assert str(last_good) in message
    assert snapshot_dir(data_dir) == before, "a failed open must not touch the log"
    with pytest.raises(CorruptLogError):  # the lock was released: same answer again
        Timeline.open(config)


def check_quarantined(
    timeline: Timeline,
    data_dir: Path,
    expected: list[Event],
    *,
    segment: Path,
    offset: int,
    corrupted: bytes,
    later: dict[str, bytes],
    caplog: pytest.LogCaptureFixture,
) -> list[Event]:
    """Everything the default mode promises; returns ``read_all()`` after the open."""
    report = timeline.recovery
    assert report is not None
    last_good = report.last_seq
    err = report.corruption
    assert isinstance(err, CorruptLogError)
    assert (err.segment, err.offset, err.last_good_seq) == (str(segment), offset, last_good)
    assert any(
        r.levelno >= logging.ERROR and segment.name in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]

    # The rest is preserved byte-for-byte: later segments under their names, and the
    # bad segment's remainder from the corrupt record on.
    files = quarantine_files(data_dir)
    assert sorted(report.quarantined) == sorted(str(p) for p in files)
    kept = {p.name: p.read_bytes() for p in files}
    assert len(kept) == len(files), "one quarantine, one file per name"
    for name, content in later.items():
        assert kept.pop(name, None) == content, f"later segment {name} not preserved"
    assert len(kept) == 1, sorted(kept)
    [(name, remainder)] = kept.items()
    assert segment.name in name
    assert remainder == corrupted[offset:]
    assert segment.read_bytes()[:offset] == corrupted[:offset]

    # The prefix is intact; after it only the interrupts of runs live in the prefix.
    events = timeline.wal.read_all()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[:last_good] == expected[:last_good]
    tail = events[last_good:]
    assert all(e.type == EventType.RUN_INTERRUPTED for e in tail), tail
    assert {e.run_id for e in tail} == live_runs(expected[:last_good])
    assert len(tail) == len(timeline.interrupted)
    for run_id in {e.run_id for e in expected}:
        mine = [e for e in events if e.run_id == run_id]
        if not mine:
            assert run_id not in timeline.runs
            with pytest.raises(UnknownRunError):
                timeline.read_run_events(run_id)
            continue
        assert timeline.read_run_events(run_id, 0, 1000) == mine
        assert timeline.read_run_events(run_id, mine[0].seq, 2) == mine[1:3]
        assert timeline.read_cold(run_id, 0, 1000) == mine
    return events


def append_after(timeline: Timeline, events: list[Event]) -> int:
    seq = timeline.append_blocking(
        NewEvent("after-corruption", EventType.RUN_CREATED, "owner", {"marker": "after"})
    )
    assert seq == len(events) + 1
    assert timeline.read_run_events("after-corruption") == [
        e for e in timeline.wal.read_all() if e.run_id == "after-corruption"
    ]
    return seq


@pytest.mark.parametrize("where", sorted(FLIP_AT))
def test_corruption_in_the_middle_of_the_only_segment(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    big = 1 << 30
    expected = build_log(data_dir, segment_bytes=big)
    assert len(segment_paths(data_dir)) == 1
    bad_seq = len(expected) // 2
    segment, offset, size = locate(data_dir, bad_seq)
    corrupted = flip(segment, offset + FLIP_AT[where](size))

    check_fail_mode(data_dir, segment, offset, bad_seq - 1, big)

    caplog.set_level(logging.WARNING)
    config = TimelineConfig(data_dir, segment_bytes=big)
    timeline = Timeline.open(config)
    try:
        assert timeline.recovery is not None
        assert timeline.recovery.last_seq == bad_seq - 1
        events = check_quarantined(
            timeline,
            data_dir,
            expected,
            segment=segment,
            offset=offset,
            corrupted=corrupted,
            later={},
            caplog=caplog,
        )
        new_seq = append_after(timeline, events)
    finally:
        timeline.close()
    quarantine = snapshot_dir(data_dir)

    # Reopening is clean now, keeps the quarantine as it is and the new record.
    again = Timeline.open(config)
    try:
        assert again.recovery is not None
        assert again.recovery.corruption is None
        assert again.recovery.quarantined == []
        assert again.recovery.last_seq == new_seq
        assert again.interrupted == ["after-corruption"]
        assert {k: v for k, v in snapshot_dir(data_dir).items() if "quarantine" in k} == {
            k: v for k, v in quarantine.items() if "quarantine" in k
        }
        assert again.wal.read_all()[: new_seq - 1] == events
    finally:
        again.close()


@pytest.mark.parametrize("which", ["first", "second", "middle", "last"])
def test_corruption_in_a_segment_with_later_segments(
    tmp_path: Path, which: str, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    expected = build_log(data_dir, segment_bytes=SMALL_SEGMENTS, runs=14)
    paths = segment_paths(data_dir)
    assert len(paths) >= 6, "segment_bytes did not force rotation"
    index = {"first": 0, "second": 1, "middle": len(paths) // 2, "last": len(paths) - 1}[which]
    target = paths[index]
    first = 1
    for path in paths[:index]:
        first += len(walk_frames(path.read_bytes(), first)[0])
    frames, _ = walk_frames(target.read_bytes(), first)
    assert len(frames) >= 3
    bad = frames[len(frames) // 2]
    later = {p.name: p.read_bytes() for p in paths[index + 1 :]}
    corrupted = flip(target, bad.offset + FLIP_AT["payload"](bad.size))

    check_fail_mode(data_dir, target, bad.offset, bad.seq - 1, SMALL_SEGMENTS)

    caplog.set_level(logging.WARNING)
    config = TimelineConfig(data_dir, segment_bytes=SMALL_SEGMENTS)
    timeline = Timeline.open(config)
    try:
        assert timeline.recovery is not None
        assert timeline.recovery.last_seq == bad.seq - 1
        assert timeline.recovery.segments == index + 1
        events = check_quarantined(
            timeline,
            data_dir,
            expected,
            segment=target,
            offset=bad.offset,
            corrupted=corrupted,
            later=later,
            caplog=caplog,
        )
        append_after(timeline, events)
        # Keep writing past a few rotations: the reused seqs must not collide with
        # anything that is still in the wal directory.
        for i in range(60):
            timeline.append_blocking(
                NewEvent("after-corruption", EventType.STATS, "owner", {"i": i, "pad": "z" * 300})
            )
        total = timeline.wal.read_all()
    finally:
        timeline.close()

    again = Timeline.open(config)
    try:
        assert again.recovery is not None
        assert again.recovery.corruption is None
        assert again.recovery.torn_tail_bytes == 0
        assert again.wal.read_all()[: len(total)] == total
        kept = {p.name: p.read_bytes() for p in quarantine_files(data_dir)}
        for name, content in later.items():
            assert kept[name] == content
    finally:
        again.close()


def test_corrupt_first_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data_dir = tmp_path / "data"
    expected = build_log(data_dir, segment_bytes=SMALL_SEGMENTS)
    paths = segment_paths(data_dir)
    segment, offset, size = locate(data_dir, 1)
    assert (segment, offset) == (paths[0], 0)
    corrupted = flip(segment, FLIP_AT["payload"](size))
    later = {p.name: p.read_bytes() for p in paths[1:]}

    check_fail_mode(data_dir, segment, 0, 0, SMALL_SEGMENTS)

    caplog.set_level(logging.WARNING)
    timeline = Timeline.open(TimelineConfig(data_dir, segment_bytes=SMALL_SEGMENTS))
    try:
        events = check_quarantined(
            timeline,
            data_dir,
            expected,
            segment=segment,
            offset=0,
            corrupted=corrupted,
            later=later,
            caplog=caplog,
        )
        assert events == []
        assert append_after(timeline, events) == 1
    finally:
        timeline.close()


def quarantined(data_dir: Path) -> list[bytes]:
    """The contents of every file under ``wal/quarantine``."""
    return sorted(p.read_bytes() for p in quarantine_files(data_dir))


def fill_uniform(config: TimelineConfig, count: int) -> None:
    """Equal-sized records, so segments rotate at the same seqs every time."""
    timeline = Timeline.open(config)
    try:
        for i in range(count):
            timeline.append_blocking(NewEvent("uniform", EventType.STATS, "o", {"i": i % 10}))
    finally:
        timeline.close()


@pytest.mark.parametrize("second_spot", ["same_record", "earlier_segment"])
def test_repeated_corruption_keeps_every_quarantined_byte(tmp_path: Path, second_spot: str) -> None:
    """Corruption twice (a failing sector, a second bad block): nothing quarantined the
    first time may be lost the second time."""
    data_dir = tmp_path / "data"
    config = TimelineConfig(data_dir, segment_bytes=800)
    fill_uniform(config, 60)
    paths = segment_paths(data_dir)
    assert len(paths) >= 3
    first_bad = paths[1]
    frames, _ = walk_frames(first_bad.read_bytes(), int(first_bad.stem))
    bad = frames[len(frames) // 2]
    flip(first_bad, bad.offset + FLIP_AT["payload"](bad.size))
    Timeline.open(config).close()
    first_round = quarantined(data_dir)
    assert len(first_round) == len(paths) - 1  # the remainder + every later segment

    fill_uniform(config, 60)  # seqs after the bad record are reused
    if second_spot == "same_record":
        segment, offset, size = bad_again = locate(data_dir, bad.seq)
        assert (segment, offset) == (first_bad, bad.offset), bad_again
    else:
        segment = segment_paths(data_dir)[0]
        frames, _ = walk_frames(segment.read_bytes(), 1)
        offset, size = frames[len(frames) // 2].offset, frames[len(frames) // 2].size
    flip(segment, offset + FLIP_AT["payload"](size))
    timeline = Timeline.open(config)
    try:
        assert timeline.recovery is not None
        assert timeline.recovery.corruption is not None
    finally:
        timeline.close()
    second_round = quarantined(data_dir)
    lost = [content for content in first_round if content not in second_round]
    assert not lost, f"{len(lost)} files of the first quarantine were overwritten"
    assert len(second_round) > len(first_round)


# --------------------------------------------------------------------------- locking


def _holder(tmp_path: Path, data_dir: Path) -> tuple[WriterProcess, int]:
    holder = WriterProcess([str(data_dir), "--hold"], tmp_path / "holder.stderr", hold=True)
    if not holder.wait_lines(1, timeout=30):
        holder.kill()
        raise AssertionError(f"the holder never got the lock: {holder.stderr_tail()}")
    word, pid = holder.lines[0].split()
    assert word == "ready"
    assert int(pid) == holder.proc.pid
    return holder, holder.proc.pid


def test_second_process_fails_fast_while_the_first_holds_the_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    expected = build_log(data_dir, segment_bytes=SMALL_SEGMENTS, runs=2)
    holder, pid = _holder(tmp_path, data_dir)
    try:
        before = snapshot_dir(data_dir)
        started = time.monotonic()
        with pytest.raises(DataDirLockedError) as info:
            Timeline.open(TimelineConfig(data_dir))
        assert time.monotonic() - started < 2.0, "must fail fast, not wait for the lock"
        assert str(pid) in str(info.value)
        assert snapshot_dir(data_dir) == before
    finally:
        assert holder.proc.stdin is not None
        holder.proc.stdin.close()  # let the holder close its timeline and exit
        assert holder.finish() == 0, holder.stderr_tail()
    assert holder.lines[-1] == "closed"

    timeline = Timeline.open(TimelineConfig(data_dir))
    try:
        events = timeline.wal.read_all()
        assert events[: len(expected)] == expected
    finally:
        timeline.close()


def test_lock_dies_with_a_killed_holder(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    holder, _ = _holder(tmp_path, data_dir)
    with pytest.raises(DataDirLockedError):
        Timeline.open(TimelineConfig(data_dir))
    holder.kill()
    assert holder.proc.returncode == -signal.SIGKILL
    Timeline.open(TimelineConfig(data_dir)).close()
