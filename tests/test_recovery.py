"""Recovery (:mod:`registry.recovery`): what a restart finds, keeps, truncates and reports.

Corruption and quarantine are in tests/test_corruption.py, SIGKILL crash loops in
tests/test_crash.py; this file covers the scan itself and logs written by earlier
versions of the codec.
"""

from __future__ import annotations

import math
from pathlib import Path

from registry.events import Event, EventType, NewEvent
from registry.index import EventIndex
from registry.record import (
    ScanEnd,
    ScanOutcome,
    decode_frame_at,
    encode_body,
    encode_frame,
    encode_frames,
    scan_segment,
)
from registry.recovery import recover_segments
from registry.segments import segment_name, segment_paths
from registry.timeline import Timeline, TimelineConfig

OLD_SEGMENT = bytes.fromhex(
    "42000000c856c9d40100000000000000009cc7009001000007000b0008006f6c642d72756e72756e5f637265"
    "6174656473747564696f2d617b2273747265616d223a2263616d2d31227d9d00000024232a4f020000000000"
    "0000019cc700900100000700050008006f6c642d72756e737461747373747564696f2d617b22667073223a32"
    "392e39372c2274696e79223a31652d30352c22736d616c6c223a31652d30372c22626967223a31652b31362c"
    "226e6567223a2d302e302c22626974726174655f627073223a323438303030302c2268756765223a31313830"
    "3539313632303731373431313330333432347d9f0000003144920c0300000000000000029cc7009001000007"
    "000e0009006f6c642d72756e73747265616d5f7761726e696e6773747564696f2dc3a97b2274657874223a22"
    "6361665c7530306539205c7532363033205c22715c22205c5c207461625c74222c226e6573746564223a7b22"
    "6c697374223a5b312c322e352c6e756c6c2c747275655d7d2c22737572726f67617465223a225c7564383030"
    "222c2231223a226b227d4b000000116c4c120400000000000000039cc7009001000007000e0008006f6c642d"
    "72756e73657373696f6e5f636c6f73656473747564696f2d617b22726561736f6e223a22706565725f636c6f"
    "736564227d"
)
"""Four records exactly as the codec of f1df96e (C, byte-identical to ``json.dumps``)
wrote them: ASCII escapes, Python's float repr (``1e-05``, ``1e+16``), an integer beyond
64 bits, a lone surrogate. Kept as bytes: no test re-implements the old encoder."""

OLD_EVENTS = [
    Event(1, "old-run", "run_created", 1718000000000, "studio-a", {"stream": "cam-1"}),
    Event(
        2,
        "old-run",
        "stats",
        1718000000001,
        "studio-a",
        {
            "fps": 29.97,
            "tiny": 1e-05,
            "small": 1e-07,
            "big": 1e16,
            "neg": -0.0,
            "bitrate_bps": 2480000,
            "huge": 2**70,
        },
    ),
    Event(
        3,
        "old-run",
        "stream_warning",
        1718000000002,
        "studio-é",
        {
            "text": 'café \u2603 "q" \\ tab\t',
            "nested": {"list": [1, 2.5, None, True]},
            "surrogate": "\ud800",
            "1": "k",
        },
    ),
    Event(4, "old-run", "session_closed", 1718000000003, "studio-a", {"reason": "peer_closed"}),
]


def test_records_written_by_the_earlier_encoder_still_scan_and_decode() -> None:
    outcome = ScanOutcome()
    infos = list(scan_segment(OLD_SEGMENT, 1, outcome, is_last=True))
    assert (outcome.end, outcome.good_end) == (ScanEnd.CLEAN, len(OLD_SEGMENT))
    decoded = [decode_frame_at(OLD_SEGMENT, info.offset) for info in infos]
    assert decoded == OLD_EVENTS
    assert type(decoded[1].data["huge"]) is int
    assert math.copysign(1.0, decoded[1].data["neg"]) == -1.0
    # The same events written now hold the same values (spelled as orjson spells them).
    for old in OLD_EVENTS:
        event = NewEvent(old.run_id, old.type, old.principal, old.data, old.ts_ms)
        assert decode_frame_at(encode_frame(old.seq, encode_body(event)), 0) == old


def test_a_log_written_by_the_earlier_encoder_recovers_and_continues(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    (wal_dir / segment_name(1)).write_bytes(OLD_SEGMENT)
    timeline = Timeline.open(TimelineConfig(tmp_path))
    try:
        report = timeline.recovery
        assert report is not None
        assert (report.records, report.last_seq, report.torn_tail_bytes) == (4, 4, 0)
        assert report.corruption is None and timeline.interrupted == []
        assert timeline.read_cold("old-run", 0, 10) == OLD_EVENTS
        assert timeline.read_run_events("old-run", 0, 10) == OLD_EVENTS
        seq = timeline.append_blocking(NewEvent("old-run", "stats", "studio-a", {"x": 1e-05}, 5))
        assert seq == 5
    finally:
        timeline.close()
    again = Timeline.open(TimelineConfig(tmp_path))
    try:
        events = again.wal.read_all()
        assert events[:4] == OLD_EVENTS
        assert events[4] == Event(5, "old-run", "stats", 5, "studio-a", {"x": 1e-05})
        assert again.read_run_events("old-run", 0, 10) == events
    finally:
        again.close()


# ------------------------------------------------------------------- the scan itself


def _write_segment(wal_dir: Path, first_seq: int, events: list[NewEvent]) -> Path:
    path = wal_dir / segment_name(first_seq)
    path.write_bytes(encode_frames(first_seq, [encode_body(e) for e in events]))
    return path


def test_recovery_indexes_every_record_and_reports_each_run_once(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    first = [NewEvent(f"run-{i % 3}", EventType.STATS, "p", {"i": i}, i) for i in range(6)]
    second = [NewEvent("run-0", EventType.SESSION_CLOSED, "p", {}, 6)]
    second.append(NewEvent("run-9", EventType.STATS, "q", {}, 7))
    _write_segment(wal_dir, 1, first)
    _write_segment(wal_dir, 7, second)
    seen: list[tuple[str, str, int, int, str]] = []

    def on_record(run_id: str, etype: str, seq: int, ts_ms: int, buf: bytes, offset: int) -> None:
        seen.append((run_id, etype, seq, ts_ms, decode_frame_at(buf, offset).principal))

    index = EventIndex()
    log = recover_segments(
        wal_dir,
        index,
        max_record_bytes=65536,
        on_corruption="fail",
        on_record=on_record,
        wanted=frozenset({EventType.SESSION_CLOSED}),
    )
    assert seen == [
        ("run-0", "stats", 1, 0, "p"),
        ("run-1", "stats", 2, 1, "p"),
        ("run-2", "stats", 3, 2, "p"),
        ("run-0", "session_closed", 7, 6, "p"),
        ("run-9", "stats", 8, 7, "q"),
    ]
    assert (log.next_seq, log.paths, log.good_end) == (
        9,
        segment_paths(wal_dir),
        len(encode_frames(7, [encode_body(e) for e in second])),
    )
    assert (log.report.segments, log.report.records, log.report.last_seq) == (2, 8, 8)
    assert [index.count(f"run-{i}") for i in (0, 1, 2, 9)] == [3, 2, 2, 1]
    assert [p.segment_id for p in index.last_positions("run-0", 3)] == [0, 0, 1]


def test_a_torn_tail_is_truncated_and_reported(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    path = _write_segment(
        wal_dir, 1, [NewEvent("r", EventType.STATS, "p", {"i": i}) for i in range(3)]
    )
    intact = path.read_bytes()
    torn = encode_frame(4, encode_body(NewEvent("r", EventType.STATS, "p", {"i": 3})))
    path.write_bytes(intact + torn[: len(torn) // 2])
    log = recover_segments(wal_dir, EventIndex(), max_record_bytes=65536, on_corruption="fail")
    assert path.read_bytes() == intact
    assert (log.next_seq, log.good_end, log.report.torn_tail_bytes) == (
        4,
        len(intact),
        len(torn) // 2,
    )
    assert log.report.corruption is None and log.report.quarantined == []


def test_an_empty_dir_recovers_to_nothing(tmp_path: Path) -> None:
    log = recover_segments(
        tmp_path / "wal", EventIndex(), max_record_bytes=65536, on_corruption="fail"
    )
    assert (log.paths, log.next_seq, log.good_end, log.report.records) == ([], 1, 0, 0)
    assert (tmp_path / "wal").is_dir()
