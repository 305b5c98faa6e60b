"""Reads by position (:mod:`registry.wal_reader`): any order, across segments."""

from __future__ import annotations

from pathlib import Path

from registry.events import Event, NewEvent
from registry.index import Position
from registry.record import FRAME_OVERHEAD, encode_body, encode_frames
from registry.segments import segment_name
from registry.wal_reader import WalReader


def _segment(path: Path, first_seq: int, events: list[NewEvent]) -> list[Position]:
    """Write the events' frames to ``path``; their positions (segment id set later)."""
    bodies = [encode_body(e) for e in events]
    path.write_bytes(encode_frames(first_seq, bodies))
    positions, offset = [], 0
    for body in bodies:
        positions.append(Position(-1, offset, FRAME_OVERHEAD + len(body)))
        offset += FRAME_OVERHEAD + len(body)
    return positions


def test_positions_are_read_in_the_order_given_across_segments(tmp_path: Path) -> None:
    first = [NewEvent(f"run-{i % 2}", "stats", "p", {"i": i}, i) for i in range(5)]
    second = [NewEvent("run-0", "stats", "p", {"i": i}, i) for i in range(5, 8)]
    paths = [tmp_path / segment_name(1), tmp_path / segment_name(6)]
    pos = [p._replace(segment_id=0) for p in _segment(paths[0], 1, first)]
    pos += [p._replace(segment_id=1) for p in _segment(paths[1], 6, second)]
    reader = WalReader(paths, 65536)
    want = [
        Event(seq, e.run_id, e.type, e.ts_ms, e.principal, e.data)
        for seq, e in enumerate(first + second, 1)
    ]
    assert reader.read_positions(pos) == want  # adjacent frames: one pread per segment
    picked = [pos[6], pos[0], pos[2], pos[4], pos[5]]  # run-0, out of order, with gaps
    assert reader.read_positions(picked) == [want[6], want[0], want[2], want[4], want[5]]
    assert reader.read_positions([]) == []
    assert reader.read_all() == want
    assert reader.close() == []
    assert reader.read_positions(pos[:1]) == want[:1]  # reopens what it needs
    assert reader.close() == []


def test_a_segment_added_after_the_reader_is_readable(tmp_path: Path) -> None:
    paths: list[Path] = []
    reader = WalReader(paths, 65536)
    assert reader.read_all() == []
    paths.append(tmp_path / segment_name(1))  # the writer rotates: the list grows
    pos = [p._replace(segment_id=0) for p in _segment(paths[0], 1, [NewEvent("r", "x", "p")])]
    assert [e.seq for e in reader.read_positions(pos)] == [1]
    assert reader.close() == []
