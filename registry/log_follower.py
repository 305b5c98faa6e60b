"""Following the log from another process: index and read what the writer made durable.

A reader outside the writer's process (the webhooks' delivery process,
:mod:`whip.webhooks.delivery_process`) keeps its own :class:`~registry.index.EventIndex` of
the WAL's segment files and reads events through its own
:class:`~registry.wal_reader.WalReader`. It is told by the writer's process how far the
log is durable, and indexes exactly that far.

Rules:

- Only what is durable is read: :meth:`LogFollower.catch_up` indexes the records with
  ``seq <= upto``, where ``upto`` is a seq the writer's process saw confirmed (after the
  batch's ``fdatasync``), so every frame it reads is whole on disk. Bytes past ``upto``
  (a batch being written now, preallocated zeros) are never read as records.
- Frames are checked as recovery checks them (length, CRC32C, the expected seq); the
  follower never writes, truncates or quarantines: the writer's recovery decides that, and
  it ran before any follower started. A durable seq that cannot be found in order is a
  :class:`LogFollowError` (the follower stops there; what it indexed stays readable).
- Segments are found by name (:func:`~registry.segments.segment_name` of the next seq),
  in the order the writer creates them; the writer makes a new segment's directory entry
  durable before writing into it.
- Reads are chunked (``read_chunk`` bytes, :data:`READ_CHUNK` by default, more for a
  larger frame), from where the last catch-up stopped: the cost of a catch-up is the new
  records, not the segment's preallocated size.
- Bounded by its reader: :meth:`LogFollower.forget_passed` drops the runs its reader has
  passed entirely and that have been idle for a while (the webhooks: every active
  webhook's cursor past the run), so the index holds what is still to be read, not the
  whole log's history.
- Warm tails, as the writer's snapshot has: each record a live catch-up indexes is
  decoded there, once, and kept in its run's tail (the newest :data:`TAIL_EVENTS` of each
  of the :data:`WARM_RUNS` runs appended to last). A read the tail covers answers from it,
  so every reader of a new event gets the same object (the webhooks' body cache is keyed
  by it) and nothing is decoded twice; an older one is read from the file. A tail is
  always the newest events of its run (it is filled in seq order and dropped whole), so
  whether it covers a read is a count. The whole log's scan at start keeps no tails.
- Single-threaded: one caller at a time (the delivery process's loop); the index is then
  read by the same caller.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections import OrderedDict, deque
from itertools import islice
from pathlib import Path

import crc32c

from registry.events import Event
from registry.index import EventIndex
from registry.record import FRAME_HEADER, MIN_PAYLOAD, PAYLOAD_HEADER, decode_frame_at
from registry.segments import SEGMENT_SUFFIX, segment_name, segment_paths
from registry.wal_reader import WalReader

READ_CHUNK = 256 * 1024
"""Bytes read at a time while catching up (a larger frame gets a larger read)."""
TAIL_EVENTS = 64
"""Decoded events kept per warm run (its newest)."""
WARM_RUNS = 512
"""Runs with a warm tail (the least recently appended to loses its tail first)."""


class LogFollowError(Exception):
    """A seq the writer confirmed durable is not where the log says it must be."""


class LogFollower:
    """One reader's index of the WAL in ``wal_dir``, up to a durable seq (module rules)."""

    def __init__(
        self,
        wal_dir: Path,
        max_record_bytes: int,
        *,
        read_chunk: int = READ_CHUNK,
        tail_events: int = TAIL_EVENTS,
        warm_runs: int = WARM_RUNS,
    ) -> None:
        self._dir = wal_dir
        self._read_chunk = read_chunk
        self._max_record_bytes = max_record_bytes
        self.index = EventIndex()
        self._paths: list[Path] = []
        self._reader = WalReader(self._paths, max_record_bytes)
        self._offset = 0
        """Where the next frame starts in the last segment of :attr:`_paths`."""
        self._next_seq = 1
        self._run_ids: dict[bytes, str] = {}
        self._tail_events = tail_events
        self._warm_runs = warm_runs
        self._tails: OrderedDict[str, deque[Event]] = OrderedDict()
        self._warm = False
        existing = segment_paths(wal_dir) if wal_dir.is_dir() else []
        if existing:
            self._paths.append(existing[0])
            self._next_seq = int(existing[0].name.removesuffix(SEGMENT_SUFFIX))

    @property
    def last_seq(self) -> int:
        """The newest indexed seq (0 before the first)."""
        return self._next_seq - 1

    def catch_up(self, upto: int, *, warm: bool = True) -> set[str]:
        """Index every record with ``seq <= upto``; the runs that got events (blocking
        file I/O). ``warm``: decode each into its run's tail (module rules). Raises
        :class:`LogFollowError` when a seq up to ``upto`` is missing."""
        self._warm = warm and self._tail_events > 0
        touched: set[str] = set()
        while self._next_seq <= upto:
            if not self._paths and not self._open_segment():
                raise self._missing(upto)
            if self._index_from_offset(upto, touched):
                continue
            if self._next_seq <= upto and not self._open_segment():
                raise self._missing(upto)
        return touched

    def _missing(self, upto: int) -> LogFollowError:
        return LogFollowError(
            f"seq {self._next_seq} is durable (the writer confirmed up to {upto}) but not "
            f"found in {self._dir}"
        )

    def _open_segment(self) -> bool:
        """Move to the segment that starts at the next seq, if it exists."""
        path = self._dir / segment_name(self._next_seq)
        if not path.exists():
            return False
        self._paths.append(path)
        self._offset = 0
        return True

    def _index_from_offset(self, upto: int, touched: set[str]) -> bool:
        """Index from the current offset of the last segment; True if it should be
        called again (a frame went past the chunk read), False at the segment's end."""
        segment_id = len(self._paths) - 1
        fd = os.open(self._paths[segment_id], os.O_RDONLY)
        try:
            chunk = self._read_chunk
            while True:
                buf = os.pread(fd, chunk, self._offset)
                used, need = self._index_buffer(buf, segment_id, upto, touched)
                self._offset += used
                if self._next_seq > upto:
                    return True
                if need == 0 or (len(buf) < chunk and used + need > len(buf)):
                    return False  # past the segment's last frame: the next seq is elsewhere
                chunk = max(self._read_chunk, need)
        finally:
            os.close(fd)

    def _index_buffer(
        self, buf: bytes, segment_id: int, upto: int, touched: set[str]
    ) -> tuple[int, int]:
        """Index the whole frames at the start of ``buf``: ``(bytes used, bytes needed
        from there to read the next frame whole, or 0 when what follows is no frame)``."""
        pos = 0
        end = len(buf)
        view = memoryview(buf)
        header = FRAME_HEADER.size
        add = self.index.add
        while self._next_seq <= upto:
            if pos + header > end:
                return pos, header
            length, crc = FRAME_HEADER.unpack_from(buf, pos)
            if not MIN_PAYLOAD <= length <= self._max_record_bytes - header:
                return pos, 0
            start = pos + header
            stop = start + length
            if stop > end:
                return pos, header + length
            if crc32c.crc32c(view[start:stop]) != crc:
                return pos, 0
            seq, ts_ms, run_len, _type_len, _principal_len = PAYLOAD_HEADER.unpack_from(buf, start)
            if seq != self._next_seq:
                return pos, 0
            raw = buf[start + PAYLOAD_HEADER.size : start + PAYLOAD_HEADER.size + run_len]
            run_id = self._run_ids.get(raw)
            if run_id is None:
                run_id = self._run_ids[raw] = raw.decode()
            add(run_id, seq, segment_id, self._offset + pos, stop - pos, ts_ms)
            touched.add(run_id)
            if self._warm:
                self._keep(run_id, decode_frame_at(buf, pos))
            self._next_seq += 1
            pos = stop
        return pos, 0

    def _keep(self, run_id: str, event: Event) -> None:
        tails = self._tails
        tail = tails.get(run_id)
        if tail is None:
            tail = tails[run_id] = deque(maxlen=self._tail_events)
            if len(tails) > self._warm_runs:
                tails.popitem(last=False)
        else:
            tails.move_to_end(run_id)
        tail.append(event)

    def read(self, run_id: str, after_seq: int, limit: int) -> list[Event]:
        """The run's indexed events with ``seq > after_seq``, oldest first, at most
        ``limit``: from its warm tail when that covers them, else from the file (blocking
        file I/O; [] for a run never indexed)."""
        tail = self._tails.get(run_id)
        run = self.index.known_positions(run_id)
        if tail is not None and run is not None:
            after = len(run.seqs) - bisect_right(run.seqs, after_seq)
            if after <= len(tail):
                start = len(tail) - after
                return list(islice(tail, start, start + limit))
        return self._reader.read_positions(self.index.positions_after(run_id, after_seq, limit))

    def runs_after(self, seq: int) -> set[str]:
        """The runs with an indexed event past ``seq``."""
        return self.index.runs_after(seq)

    def forget_passed(self, upto: int, idle_before_ms: int) -> int:
        """Drop from the index every run whose events all have ``seq <= upto`` and whose
        newest is older than ``idle_before_ms``; how many were dropped. A later event of
        such a run is indexed again as the run's first (its earlier ones are not read
        again: they were passed)."""
        forgotten = 0
        for run in self.index.runs():
            if run.seqs and run.seqs[-1] <= upto and run.last_ts < idle_before_ms:
                self.index.forget(run.run_id)
                self._tails.pop(run.run_id, None)
                self._run_ids.pop(run.run_id.encode(), None)
                forgotten += 1
        return forgotten

    def close(self) -> list[OSError]:
        """Release the reader's descriptors; the errors instead of raising them."""
        return self._reader.close()
