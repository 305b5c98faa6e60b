"""Recovery of the log on start: verify every segment, truncate a torn tail, quarantine.

Rules (:func:`recover_segments`, run before the writer thread starts):

- Every segment is scanned in log order with the rules of :mod:`registry.record`; each
  intact record is indexed (:class:`~registry.index.EventIndex`), and seqs must follow
  on across segments.
- A torn tail (a write the crash interrupted, or preallocated space never written) is
  truncated, durably, and logged (INFO for unwritten zeros, WARNING otherwise).
- Corruption (records after a bad one that cannot be trusted in order) is either fatal
  (``on_corruption="fail"``: :class:`CorruptLogError`, nothing changed on disk) or, with
  ``"quarantine"`` (the default), the bad segment's remainder and every later segment
  are moved, intact, to ``wal/quarantine/`` and the log continues after the last good
  record. Each recovery that quarantines gets its own ``quarantine/<UTC time>-<n>/``
  folder: a later corruption (seqs are reused after a quarantine) never overwrites what
  an earlier one preserved. Logged at ERROR.
- The scan decodes only what the caller asks for: ``on_record`` sees the first record
  of every run and the records whose type is ``wanted``; every other record is only
  indexed (that is what keeps recovery fast: figures in docs/PERFORMANCE.md).

Blocking file I/O throughout: run it before the loop needs the log, or in a thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from registry.errors import CorruptLogError
from registry.index import OFFSET_BITS, EventIndex, RunPositions
from registry.record import ScanEnd, ScanOutcome, scan_frames
from registry.segments import fsync_dir, segment_paths

logger = logging.getLogger(__name__)

RecordHook = Callable[[str, str, int, int, bytes, int], None]
"""Recovery callback: ``(run_id, type, seq, ts_ms, segment_bytes, offset)``."""


@dataclass(slots=True)
class RecoveryReport:
    """What recovery found."""

    segments: int = 0
    records: int = 0
    last_seq: int = 0
    torn_tail_bytes: int = 0
    corruption: CorruptLogError | None = None
    quarantined: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class RecoveredLog:
    """The log as recovery left it: where the writer continues."""

    report: RecoveryReport
    paths: list[Path]
    """The segments kept, in log order (their ids are their indexes)."""
    good_end: int
    """Where the last kept segment's intact frames end."""
    next_seq: int
    """The seq the next record gets."""


def recover_segments(
    wal_dir: Path,
    index: EventIndex,
    *,
    max_record_bytes: int,
    on_corruption: Literal["quarantine", "fail"],
    on_record: RecordHook | None = None,
    wanted: frozenset[str] = frozenset(),
) -> RecoveredLog:
    """Scan, verify and index every segment of ``wal_dir``; truncate a torn tail.

    ``on_record(run_id, type, seq, ts_ms, segment_bytes, offset)`` is called, in seq
    order, for each record whose type is in ``wanted`` and for the first record of
    every run (decode more of it with :func:`registry.record.decode_frame_at`).
    Raises :class:`CorruptLogError` on corruption when ``on_corruption="fail"``.
    """
    started = time.monotonic()
    report = RecoveryReport()
    wal_dir.mkdir(parents=True, exist_ok=True)
    paths = segment_paths(wal_dir)
    kept: list[Path] = []
    expect = 1
    good_end = 0
    wanted_raw = frozenset(t.encode() for t in wanted)
    runs: dict[bytes, RunPositions] = {}
    types: dict[bytes, str] = {}
    positions_for = index.positions_for
    for number, path in enumerate(paths):
        is_last = number == len(paths) - 1
        buf = path.read_bytes()
        outcome = ScanOutcome()
        base = len(kept) << OFFSET_BITS
        kept.append(path)
        for offset, length, seq, ts_ms, raw_run, raw_type in scan_frames(
            buf, expect, outcome, is_last=is_last, max_record_bytes=max_record_bytes
        ):
            run = runs.get(raw_run)
            first = run is None
            if run is None:
                run = runs[raw_run] = positions_for(raw_run.decode())
            run.seqs.append(seq)
            run.locs.append(base | offset)
            run.lens.append(length)
            run.last_ts = ts_ms
            if on_record is not None and (first or raw_type in wanted_raw):
                etype = types.get(raw_type)
                if etype is None:
                    etype = types[raw_type] = raw_type.decode()
                on_record(run.run_id, etype, seq, ts_ms, buf, offset)
        report.records += outcome.next_seq - expect
        expect = outcome.next_seq
        good_end = outcome.good_end
        if outcome.end is ScanEnd.TORN_TAIL:
            _truncate_torn_tail(path, buf, outcome, expect - 1, report)
        elif outcome.end is ScanEnd.CORRUPT:
            error = CorruptLogError(
                f"WAL corruption in {path} ({outcome.reason}); last intact seq is {expect - 1}",
                segment=str(path),
                offset=outcome.good_end,
                last_good_seq=expect - 1,
            )
            if on_corruption == "fail":
                raise error
            report.corruption = error
            quarantine(wal_dir, path, buf, outcome.good_end, paths[number + 1 :], report)
            break
    report.segments = len(kept)
    report.last_seq = expect - 1
    report.seconds = time.monotonic() - started
    logger.info(
        "wal: recovered %d records in %d segments up to seq %d in %.3fs",
        report.records,
        report.segments,
        report.last_seq,
        report.seconds,
    )
    return RecoveredLog(report, kept, good_end, expect)


def _truncate_torn_tail(
    path: Path, buf: bytes, outcome: ScanOutcome, last_seq: int, report: RecoveryReport
) -> None:
    cut = len(buf) - outcome.good_end
    report.torn_tail_bytes += cut
    logger.log(
        logging.INFO if outcome.zero_tail else logging.WARNING,
        "wal: torn tail in %s (%s): truncating %d bytes after seq %d",
        path.name,
        outcome.reason,
        cut,
        last_seq,
    )
    with open(path, "r+b") as fh:
        fh.truncate(outcome.good_end)
        os.fsync(fh.fileno())


def quarantine(
    wal_dir: Path,
    path: Path,
    buf: bytes,
    good_end: int,
    later: list[Path],
    report: RecoveryReport,
) -> None:
    """Move ``path``'s bytes from ``good_end`` and every ``later`` segment, intact, into a
    fresh ``quarantine/<UTC time>-<n>/`` folder; cut ``path`` back to ``good_end``.

    Every step is made durable before the next one depends on it.
    """
    root = wal_dir / "quarantine"
    root.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    for attempt in range(1000):
        qdir = root / f"{stamp}-{attempt:03d}"
        try:
            qdir.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise OSError(f"cannot create a quarantine folder under {root}")
    fsync_dir(root)
    kept = qdir / f"{path.name}.from-{good_end}"
    kept.write_bytes(buf[good_end:])
    with open(kept, "rb+") as fh:
        os.fsync(fh.fileno())
    report.quarantined.append(str(kept))
    for other in later:
        target = qdir / other.name
        os.replace(other, target)
        report.quarantined.append(str(target))
    fsync_dir(qdir)
    with open(path, "r+b") as fh:
        fh.truncate(good_end)
        os.fsync(fh.fileno())
    fsync_dir(wal_dir)
    logger.error(
        "wal: %s; the intact prefix is kept, %d bytes and %d later segments moved to %s",
        report.corruption,
        len(buf) - good_end,
        len(later),
        qdir,
    )
