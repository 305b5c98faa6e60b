"""Segment files (:mod:`registry.segments`): naming, preallocation, rotation, rollback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from registry.segments import (
    PREALLOCATE_BYTES,
    SegmentFiles,
    segment_name,
    segment_paths,
)


def test_names_sort_in_log_order_and_only_segments_are_listed(tmp_path: Path) -> None:
    firsts = [1, 9, 10, 12345, 2**40]
    assert sorted(segment_name(f) for f in reversed(firsts)) == [segment_name(f) for f in firsts]
    assert segment_name(10) == "00000000000000000010.wal"
    for first in reversed(firsts):
        (tmp_path / segment_name(first)).write_bytes(b"")
    (tmp_path / "quarantine").mkdir()
    (tmp_path / "notes.txt").write_bytes(b"")
    assert segment_paths(tmp_path) == [tmp_path / segment_name(f) for f in firsts]


def _allocated(path: Path) -> int:
    return os.stat(path).st_size


def test_writes_go_after_the_last_frame_into_preallocated_space(tmp_path: Path) -> None:
    files = SegmentFiles(tmp_path, segment_bytes=1 << 20)
    files.create(1)
    path = files.paths[0]
    files.write(b"a" * 100)
    files.sync()
    files.size += 100
    files.write(b"b" * 50)
    files.sync()
    files.size += 50
    # Preallocated one step ahead, capped at the segment size (or not at all where the
    # filesystem cannot): either way the frames are where they belong.
    assert _allocated(path) in (150, min(PREALLOCATE_BYTES, 1 << 20))
    files.cut_preallocation()
    assert path.read_bytes() == b"a" * 100 + b"b" * 50
    files.close()
    files.close()  # idempotent


def test_rotation_cuts_the_segment_left_behind_to_its_last_frame(tmp_path: Path) -> None:
    files = SegmentFiles(tmp_path, segment_bytes=64)
    files.create(1)
    files.rotate_if_full(1)
    assert len(files.paths) == 1  # empty: nothing to rotate
    files.write(b"x" * 100)  # one batch may exceed the segment size
    files.sync()
    files.size += 100
    files.rotate_if_full(7)
    assert [p.name for p in files.paths] == [segment_name(1), segment_name(7)]
    assert (files.active_id, files.size) == (1, 0)
    assert files.paths[0].read_bytes() == b"x" * 100
    files.write(b"y" * 10)
    files.sync()
    files.size += 10
    files.cut_preallocation()
    assert files.paths[1].read_bytes() == b"y" * 10
    files.close()


def test_a_failed_write_is_rolled_back_to_the_last_frame(tmp_path: Path) -> None:
    files = SegmentFiles(tmp_path, segment_bytes=1 << 20)
    files.create(1)
    files.write(b"kept")
    files.sync()
    files.size += 4
    files.write(b"lost in a failed batch")  # say the fsync of this failed
    files.rollback()
    assert files.paths[0].read_bytes() == b"kept"
    files.write(b"next")
    files.sync()
    files.size += 4
    files.cut_preallocation()
    assert files.paths[0].read_bytes() == b"keptnext"
    files.close()


def test_continuing_a_recovered_segment_writes_after_its_intact_frames(tmp_path: Path) -> None:
    path = tmp_path / segment_name(1)
    path.write_bytes(b"frames" + bytes(100))  # zeros: preallocated, never written
    files = SegmentFiles(tmp_path, segment_bytes=1 << 20)
    files.paths.append(path)
    files.open_active(6)
    files.write(b"+more")
    files.sync()
    files.size += 5
    files.cut_preallocation()
    assert path.read_bytes() == b"frames+more"
    files.close()


def test_without_an_active_segment_nothing_is_written(tmp_path: Path) -> None:
    files = SegmentFiles(tmp_path, segment_bytes=1 << 20)
    with pytest.raises(RuntimeError, match="no active segment"):
        files.write(b"x")
    files.cut_preallocation()  # nothing to cut
    files.close()
