#!/usr/bin/env python3
"""CPU per durable append, per thread, with A/B variants interleaved (JSON on stdout).

On a shared machine appends/s is noise; the CPU one append costs is not (or much less).
This bench runs the load of ``bench/wal.py``'s ``timeline`` store (``--producers`` asyncio
tasks on uvloop, each awaiting ``timeline.append(stats event)`` in a loop; the server's
young-generation GC threshold) in a fresh child process per measurement and reports, over
the measured window, the CPU time per append of the event loop thread, of the WAL writer
thread (``/proc/self/task/<tid>/schedstat``, nanoseconds) and of the whole process.

Variants are source trees (``--tree LABEL=PATH``, each with its C extensions built in
place; the default is this repository), each optionally without the registry's C
extensions (``LABEL=PATH:without-c``). Every round runs every variant once, in an order
that alternates between rounds; the summary gives each variant's medians and each
variant's loop/writer/process CPU relative to the first variant's, round by round.

Usage::

    .venv/bin/python bench/wal_cpu.py --rounds 6
    .venv/bin/python bench/wal_cpu.py --tree new=. --tree old=/path/to/old/checkout
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CHILD_FLAG = "--child"
C_EXTENSIONS = ("registry._framing", "registry._newevent", "registry._walcodec")
YOUNG_THRESHOLD = 10_000
"""The server's young-generation threshold (``whip.gcpolicy``), set here without
importing ``whip`` so that any tree (even one without that module) can be measured."""


def _thread_cpu_ns(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        return int(f.read().split()[0])


class GcClock:
    """Time spent in garbage collections, by generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.ns = [0, 0, 0]
        self.count = [0, 0, 0]
        self._started = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        else:
            self.ns[info["generation"]] += time.perf_counter_ns() - self._started
            self.count[info["generation"]] += 1


def _switches(native_id: int) -> int:
    """Context switches of a thread so far (voluntary + involuntary)."""
    total = 0
    with open(f"/proc/self/task/{native_id}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name.endswith("ctxt_switches"):
                total += int(value)
    return total


def _counters(loop_tid: int, writer_tid: int, stats: Any, gc_clock: GcClock) -> dict[str, Any]:
    return {
        "loop_switches": _switches(loop_tid),
        "writer_switches": _switches(writer_tid),
        "loop_ns": _thread_cpu_ns(loop_tid),
        "writer_ns": _thread_cpu_ns(writer_tid),
        "process_ns": time.process_time_ns(),
        "appended": stats.appended,
        "batches": stats.batches,
        "wall_ns": time.perf_counter_ns(),
        "gc_ns": list(gc_clock.ns),
        "gc_count": list(gc_clock.count),
    }


def child_main(args: argparse.Namespace) -> int:
    """One measurement in this process: print one JSON object."""
    if args.without_c:
        for name in C_EXTENSIONS:
            sys.modules[name] = None  # type: ignore[assignment]
    sys.path.insert(0, args.tree)
    import uvloop

    from registry.events import EventType, NewEvent
    from registry.timeline import Timeline, TimelineConfig

    principal = "bench"

    def stats_event(run_id: str, k: int) -> NewEvent:
        return NewEvent(
            run_id,
            EventType.STATS,
            principal,
            {"fps": 29.97, "bitrate_kbps": 2480 + k % 40, "frames": k, "dropped": 0},
        )

    producers = args.producers
    runs = [f"p{producers}-r{i:04d}" for i in range(max(producers, args.min_runs))]
    with tempfile.TemporaryDirectory(dir=args.dir) as data_dir:
        gc.collect()
        before = gc.get_threshold()
        if args.gc_off:
            gc.disable()
        else:
            gc.set_threshold(YOUNG_THRESHOLD, *before[1:])
        gc_clock = GcClock()
        gc.callbacks.append(gc_clock)
        timeline = Timeline.open(TimelineConfig(data_dir=Path(data_dir)))
        writer = next(t for t in threading.enumerate() if t.name == "wal-writer")
        assert writer.native_id is not None
        writer_tid = writer.native_id
        loop_tid = threading.get_native_id()
        stats = timeline.wal.stats
        marks: list[dict[str, Any]] = []

        async def load() -> None:
            await asyncio.gather(
                *(
                    timeline.append(NewEvent(run, EventType.RUN_CREATED, principal, {}))
                    for run in runs
                )
            )
            stop = False

            async def producer(index: int) -> None:
                mine = runs[index::producers]
                k = 0
                append = timeline.append
                while not stop:
                    await append(stats_event(mine[k % len(mine)], k))
                    k += 1

            tasks = [asyncio.create_task(producer(i)) for i in range(producers)]
            await asyncio.sleep(args.warmup)
            marks.append(_counters(loop_tid, writer_tid, stats, gc_clock))
            await asyncio.sleep(args.duration)
            marks.append(_counters(loop_tid, writer_tid, stats, gc_clock))
            stop = True
            await asyncio.gather(*tasks)

        try:
            asyncio.run(load(), loop_factory=uvloop.new_event_loop)
        finally:
            timeline.close()
            gc.callbacks.remove(gc_clock)
            gc.set_threshold(*before)
            gc.enable()
    start, end = marks
    appended = int(end["appended"] - start["appended"])
    wall_s = (end["wall_ns"] - start["wall_ns"]) / 1e9

    def per_append_us(key: str) -> float:
        return round(float(end[key] - start[key]) / 1e3 / max(1, appended), 3)

    loaded = {name: name in sys.modules and sys.modules[name] is not None for name in C_EXTENSIONS}
    print(
        json.dumps(
            {
                "appended": appended,
                "appends_per_s": round(appended / wall_s, 1),
                "loop_us_per_append": per_append_us("loop_ns"),
                "writer_us_per_append": per_append_us("writer_ns"),
                "process_us_per_append": per_append_us("process_ns"),
                "batches": end["batches"] - start["batches"],
                "loop_switches_per_batch": round(
                    (end["loop_switches"] - start["loop_switches"])
                    / max(1, end["batches"] - start["batches"]),
                    2,
                ),
                "writer_switches_per_batch": round(
                    (end["writer_switches"] - start["writer_switches"])
                    / max(1, end["batches"] - start["batches"]),
                    2,
                ),
                "gc_us_per_append": [
                    round((b - a) / 1e3 / max(1, appended), 3)
                    for a, b in zip(start["gc_ns"], end["gc_ns"], strict=True)
                ],
                "gc_collections": [
                    b - a for a, b in zip(start["gc_count"], end["gc_count"], strict=True)
                ],
                "c_extensions": loaded,
            }
        )
    )
    return 0


VARIANT_FLAGS = ("without-c", "gc-off")
"""What a variant may add after its path: the registry without its C extensions, the
garbage collector disabled (what the GC costs)."""

Variant = tuple[str, str, tuple[str, ...]]
"""``(label, absolute path of the tree, flags)``."""


def parse_variant(spec: str) -> Variant:
    """``LABEL=PATH[:FLAG[,FLAG]]`` -> (label, absolute path, flags)."""
    label, sep, rest = spec.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"expected LABEL=PATH[:FLAG,...], got {spec!r}")
    path, _, flag_text = rest.partition(":")
    flags = tuple(f for f in flag_text.split(",") if f)
    for flag in flags:
        if flag not in VARIANT_FLAGS:
            raise argparse.ArgumentTypeError(f"unknown variant flag {flag!r}")
    return label, str(Path(path).resolve()), flags


def run_child(variant: Variant, args: argparse.Namespace) -> dict[str, Any]:
    label, tree, flags = variant
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        CHILD_FLAG,
        f"--tree-path={tree}",
        f"--producers={args.producers}",
        f"--min-runs={args.min_runs}",
        f"--warmup={args.warmup}",
        f"--duration={args.duration}",
    ]
    if args.dir:
        argv.append(f"--dir={args.dir}")
    argv += [f"--{flag}" for flag in flags]
    child = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tree)
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{child.stderr}")
    result: dict[str, Any] = json.loads(child.stdout)
    result["variant"] = label
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=parse_variant, default=[])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--producers", type=int, default=256)
    parser.add_argument("--min-runs", type=int, default=256)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--dir", default=None, help="base directory for the data dirs")
    parser.add_argument(CHILD_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree-path", help=argparse.SUPPRESS)
    parser.add_argument("--without-c", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gc-off", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.tree = args.tree_path
        return child_main(args)
    variants: list[Variant] = args.tree or [("this", str(REPO), ())]
    raw: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = variants if rnd % 2 == 0 else variants[::-1]
        for variant in order:
            result = run_child(variant, args)
            result["round"] = rnd
            raw.append(result)
            print(
                f"round {rnd} {result['variant']:<12} loop {result['loop_us_per_append']:6.2f}"
                f"  writer {result['writer_us_per_append']:6.2f}"
                f"  process {result['process_us_per_append']:6.2f} us/append"
                f"  gc {sum(result['gc_us_per_append']):5.2f}"
                f"  {result['appends_per_s']:>9.0f}/s",
                file=sys.stderr,
                flush=True,
            )
    keys = ("loop_us_per_append", "writer_us_per_append", "process_us_per_append")
    summary: dict[str, Any] = {}
    base_label = variants[0][0]
    for label, _tree, _flags in variants:
        mine = [r for r in raw if r["variant"] == label]
        block: dict[str, Any] = {
            key: round(statistics.median(r[key] for r in mine), 3)
            for key in (*keys, "appends_per_s")
        }
        if label != base_label:
            base = {r["round"]: r for r in raw if r["variant"] == base_label}
            for key in keys:
                block[f"{key}_vs_{base_label}"] = round(
                    statistics.median(r[key] / base[r["round"]][key] for r in mine), 3
                )
        summary[label] = block
    doc = {
        "producers": args.producers,
        "rounds": args.rounds,
        "warmup_s": args.warmup,
        "duration_s": args.duration,
        "loadavg_start": os.getloadavg(),
        "variants": {label: {"tree": tree, "flags": flags} for label, tree, flags in variants},
        "summary": summary,
        "raw": raw,
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
