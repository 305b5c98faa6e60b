"""What a webhook cursor save costs the WAL's ``fdatasync`` on the same file system.

The question (issue 14, docs/PERFORMANCE.md "The delivery process at SCHED_IDLE,
governed"): the delivery child saves its cursors once a second the way
:class:`whip.webhooks.cursor.FileCursorStore` does (a new temporary file, written,
``fsync``, renamed over the old one). On ext4 that is a journal commit; the WAL's
``fdatasync`` of a write into its preallocated segment is one too (the written extent's
conversion), and the journal commits one at a time. Does an append that meets a cursor save
wait for it, and how much does that add to the appends' mean and tail?

Method, no server and no webhook: this process does what the WAL writer does at a steady
rate (``--rate`` appends a second: one ``pwrite`` of ``--record`` bytes into a segment
preallocated with ``posix_fallocate``, then ``fdatasync``; :mod:`registry.segments`) and
times each ``fdatasync``. A second process saves a cursor file once per ``--save-every``
seconds through a real :class:`~whip.webhooks.cursor.FileCursorStore`, in the windows
marked ``saves``; the windows alternate with ``quiet`` ones (``--windows`` of each,
``--window-s`` long), so the host's drift falls on both alike. Output: JSON on stdout,
each side's ``fdatasync`` p50 / p90 / p99 / max / mean in milliseconds over all its
windows, and the saves' added percentage.

``meeting``, the sharper reading (it needs no quiet window, so the hour's drift is out of
it): the saver times each save (write, ``fsync``, rename) on the system-wide monotonic
clock, and the ``saves`` windows' ``fdatasync`` s are split into those whose span
overlapped a save's and the others; what the met ones take beyond the others' mean,
spread over every append, is the saves' share of the appends' mean.

``--saver in-place`` replaces the store by the cursor write that would need no journal
commit (:func:`save_in_place`: two preallocated slots written in place, ``fdatasync``), to
measure whether that design removes the cost before anyone builds it.

Usage::

    .venv/bin/python bench/fsync_interference.py            # about two minutes
    .venv/bin/python bench/fsync_interference.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import multiprocessing
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.support.latency import added_percent, percentiles_ms
from registry.segments import fsync_dir
from whip.webhooks.cursor import CursorState, FileCursorStore

SEGMENT_BYTES = 64 << 20


class TimedStore(FileCursorStore):
    """The real store, each file write (write, ``fsync``, rename) timed on the
    system-wide monotonic clock, so the appender can tell which ``fdatasync`` met one."""

    def __init__(self, directory: Path, flush_interval_s: float) -> None:
        super().__init__(directory, flush_interval_s)
        self.spans: list[tuple[float, float]] = []

    def _write(self, states: dict[str, CursorState]) -> None:
        started = time.monotonic()
        try:
            super()._write(states)
        finally:
            self.spans.append((started, time.monotonic()))


def save_cursors(directory: Path, every_s: float, stop: Any, spans: Any) -> None:
    """Save 10 webhooks' cursors through a real
    :class:`~whip.webhooks.cursor.FileCursorStore` (its group commit at ``every_s``, as
    the delivery child's at its default), each cursor moving on at every save, until
    ``stop`` is set; then send the saves' spans on ``spans``."""

    async def saving() -> list[tuple[float, float]]:
        store = TimedStore(directory, every_s)
        upto = 0
        while not stop.is_set():
            upto += 100
            await asyncio.gather(
                *(store.save(f"hook{i:02}", CursorState(upto + i)) for i in range(10))
            )
        return store.spans

    spans.send(asyncio.run(saving()))


SLOT_BYTES = 4096
"""One slot of the in-place design (:func:`save_in_place`)."""


def make_slots(directory: Path) -> Path:
    """The in-place design's file: two zero-written slots, ``fsync``ed with their
    directory once, so later writes into them change no block map (no ext4 journal
    commit for an ``fdatasync``)."""
    path = directory / "cursors.slots"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, bytes(2 * SLOT_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory)
    return path


def save_in_place(directory: Path, every_s: float, stop: Any, spans: Any) -> None:
    """The cursor write issue 14's note proposes, as a probe (not the store's): the same
    10 cursors as :func:`save_cursors`, once per ``every_s``, each save one ``pwrite`` of
    a header (generation, length, CRC-32) and the JSON body into the older of the two
    slots of :func:`make_slots`'s file, then ``fdatasync``; the saves' spans sent on
    ``spans`` at the end (as :func:`save_cursors`)."""
    fd = os.open(directory / "cursors.slots", os.O_WRONLY)
    timed: list[tuple[float, float]] = []
    try:
        generation = 0
        while not stop.wait(every_s):
            started = time.monotonic()
            generation += 1
            body = json.dumps(
                {f"hook{i:02}": {"upto": generation * 100 + i} for i in range(10)}
            ).encode()
            header = struct.pack("<QII", generation, len(body), zlib.crc32(body))
            os.pwrite(fd, header + body, (generation % 2) * SLOT_BYTES)
            os.fdatasync(fd)
            timed.append((started, time.monotonic()))
    finally:
        os.close(fd)
        spans.send(timed)


SAVERS = {"store": save_cursors, "in-place": save_in_place}


def append_window(
    fd: int, offset: int, record: bytes, rate: float, seconds: float
) -> tuple[list[tuple[float, float]], int]:
    """Append ``record`` at ``rate`` a second for ``seconds``: each ``fdatasync``'s span
    (system-wide monotonic seconds), and the new offset."""
    spans: list[tuple[float, float]] = []
    started = time.monotonic()
    count = int(rate * seconds)
    for index in range(count):
        delay = started + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        os.pwrite(fd, record, offset)
        offset += len(record)
        t0 = time.monotonic()
        os.fdatasync(fd)
        spans.append((t0, time.monotonic()))
    return spans, offset


MEET_MARGINS_S = (0.0, 0.02)
"""How long after a save's end an ``fdatasync`` that starts still counts as meeting it: 0
(the spans overlap), and 20 ms (a journal commit the save left running)."""


def met_a_save(
    sync: tuple[float, float], saves: list[tuple[float, float]], margin_s: float
) -> bool:
    """Whether an ``fdatasync``'s span overlaps a save's, the save's end moved
    ``margin_s`` later (``saves`` sorted)."""
    at = bisect.bisect_right(saves, (sync[1], float("inf")))
    return any(
        start < sync[1] and sync[0] < end + margin_s for start, end in saves[max(0, at - 2) : at]
    )


def meeting(
    syncs: list[tuple[float, float]], saves: list[tuple[float, float]], margin_s: float
) -> dict[str, Any]:
    """The ``saves`` windows' ``fdatasync`` s split by whether they met a save
    (:func:`met_a_save`): each group's figures, the share that met one, and what the
    meeting adds to the mean of all (the met ones' excess over the others' mean, spread
    over every append)."""
    saves = sorted(saves)
    met: list[float] = []
    apart: list[float] = []
    for sync in syncs:
        (met if met_a_save(sync, saves, margin_s) else apart).append(sync[1] - sync[0])
    figures: dict[str, Any] = {
        "margin_ms": round(1000 * margin_s, 1),
        "saves": len(saves),
        "save_mean_ms": round(1000 * statistics.fmean(e - s for s, e in saves), 3)
        if saves
        else None,
        "met": percentiles_ms(met, with_max=True) if met else None,
        "apart": percentiles_ms(apart, with_max=True) if apart else None,
        "met_share": round(len(met) / len(syncs), 4) if syncs else None,
    }
    if met and apart:
        excess = statistics.fmean(met) - statistics.fmean(apart)
        figures["added_mean_ms_by_meeting"] = round(1000 * excess * len(met) / len(syncs), 4)
        figures["added_mean_percent_by_meeting"] = round(
            100 * excess * len(met) / len(syncs) / statistics.fmean(apart), 2
        )
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="whip-fsync-", dir=args.dir))
    segment = base / "wal-000001.seg"
    fd = os.open(segment, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, SEGMENT_BYTES)
    os.fsync(fd)
    record = os.urandom(args.record)
    if args.saver == "in-place":
        make_slots(base)
    offset = 0
    sides: dict[str, list[float]] = {"quiet": [], "saves": []}
    save_syncs: list[tuple[float, float]] = []
    save_spans: list[tuple[float, float]] = []
    windows: list[dict[str, Any]] = []
    context = multiprocessing.get_context("spawn")
    try:
        for number in range(args.windows * 2):
            side = ("quiet", "saves")[(number + number // 2) % 2]  # q s s q q s s q ...
            if offset + args.record * args.rate * (args.window_s + 1) > SEGMENT_BYTES:
                raise SystemExit("segment too small for these windows")
            stop = context.Event()
            saver = None
            if side == "saves":
                receive, send = context.Pipe(duplex=False)
                saver = context.Process(
                    target=SAVERS[args.saver],
                    args=(base, args.save_every, stop, send),
                    daemon=True,
                )
                saver.start()
            try:
                syncs, offset = append_window(fd, offset, record, args.rate, args.window_s)
            finally:
                if saver is not None:
                    stop.set()
                    if receive.poll(10):
                        save_spans += receive.recv()
                    saver.join(10)
                    if saver.is_alive():
                        saver.kill()
                    receive.close()
                    send.close()
            latencies = [end - start for start, end in syncs]
            if side == "saves":
                save_syncs += syncs
            sides[side] += latencies
            windows.append({"side": side, **percentiles_ms(latencies, with_max=True)})
            print(f"[fsync_interference] {side}: {windows[-1]}", file=sys.stderr, flush=True)
    finally:
        os.close(fd)
        shutil.rmtree(base, ignore_errors=True)
    out: dict[str, Any] = {
        "benchmark": "fsync_interference",
        "rate_per_s": args.rate,
        "record_bytes": args.record,
        "save_every_s": args.save_every,
        "saver": args.saver,
        "window_s": args.window_s,
        "windows_each": args.windows,
        "load_average": os.getloadavg(),
        "pooled": {side: percentiles_ms(values, with_max=True) for side, values in sides.items()},
        "windows": windows,
    }
    out["meeting"] = [meeting(save_syncs, save_spans, margin) for margin in MEET_MARGINS_S]
    quiet, saves = out["pooled"]["quiet"], out["pooled"]["saves"]
    out["added_percent"] = {
        key.removesuffix("_ms"): added_percent(quiet[key], saves[key]) for key in quiet
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two short windows of each")
    parser.add_argument("--rate", type=float, default=100.0, help="appends a second")
    parser.add_argument("--record", type=int, default=400, help="bytes an append")
    parser.add_argument("--save-every", type=float, default=1.0, help="seconds between saves")
    parser.add_argument(
        "--saver",
        choices=sorted(SAVERS),
        default="store",
        help="store: the real FileCursorStore; in-place: two preallocated slots (a probe)",
    )
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--windows", type=int, default=6, help="windows of each side")
    parser.add_argument("--dir", default=None, help="where (default: the system's temp dir)")
    args = parser.parse_args()
    if args.quick:
        args.window_s, args.windows = 2.0, 2
    print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
