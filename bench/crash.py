"""Crash-consistency soak: the WAL SIGKILL loop (bench/support/crash_writer.py) as JSON.

    .venv/bin/python bench/crash.py [--iterations 100] [--seed N] [--segment-bytes B]
        [--fresh-every K] [--data-dir DIR] [--progress]

Each iteration spawns ``bench/support/crash_writer.py`` on the same data dir, SIGKILLs it at a
random point, reopens the dir here and checks every confirmed append (all iterations so
far), gap-free seqs, no duplicates and the ``run_interrupted`` of exactly the runs left
live. Prints one JSON object on stdout; exits 1 if any iteration failed. A failed
iteration is reported with its seeds and the loop goes on in a fresh data dir.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

from bench.support.crash_writer import IterationStats, LoopState, run_iteration  # noqa: E402


def summary(values: list[float], digits: int = 4) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), digits),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], digits),
        "max": round(ordered[-1], digits),
        "mean": round(statistics.fmean(ordered), digits),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="master seed (default: random)")
    parser.add_argument("--segment-bytes", type=int, default=128 * 1024)
    parser.add_argument(
        "--fresh-every", type=int, default=0, help="start a new data dir every K iterations"
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="kept afterwards if given")
    parser.add_argument("--progress", action="store_true", help="one line per iteration on stderr")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    base = args.data_dir or Path(tempfile.mkdtemp(prefix="whip-crash-"))
    base.mkdir(parents=True, exist_ok=True)
    dirs = 0

    def fresh_state() -> LoopState:
        nonlocal dirs
        dirs += 1
        return LoopState(base / f"dir{dirs}" / "data", segment_bytes=args.segment_bytes)

    state = fresh_state()
    passed: list[IterationStats] = []
    failures: list[dict[str, Any]] = []
    started = time.monotonic()
    for iteration in range(args.iterations):
        iteration_seed = rng.randrange(2**32)
        try:
            stats = run_iteration(state, iteration, iteration_seed)
        except Exception as exc:  # AssertionError, or the reopen itself raised
            failures.append(
                {
                    "iteration": iteration,
                    "seed": seed,
                    "iteration_seed": iteration_seed,
                    "data_dir": str(state.data_dir),
                    "error": f"{type(exc).__name__}: {exc}"[:4000],
                }
            )
            state = fresh_state()
            outcome = "FAILED"
        else:
            passed.append(stats)
            outcome = (
                f"ok confirmed={stats.confirmed} records={stats.records} "
                f"open={stats.open_seconds:.3f}s log={stats.log_records} ({stats.kill_plan})"
            )
        if args.progress:
            print(f"[{iteration + 1}/{args.iterations}] {outcome}", file=sys.stderr)
        if args.fresh_every and (iteration + 1) % args.fresh_every == 0:
            state = fresh_state()

    result = {
        "iterations": args.iterations,
        "passed": len(passed),
        "failures": failures,
        "seed": seed,
        "segment_bytes": args.segment_bytes,
        "data_dirs": dirs,
        "seconds": round(time.monotonic() - started, 2),
        "recovery_seconds": summary([s.recovery_seconds for s in passed]),
        "open_seconds": summary([s.open_seconds for s in passed]),
        "records_per_iteration": summary([float(s.records) for s in passed], 1),
        "confirmed_per_iteration": summary([float(s.confirmed) for s in passed], 1),
        "interrupted_per_iteration": summary([float(s.interrupted) for s in passed], 1),
        "records_total": sum(s.records for s in passed),
        "confirmed_total": sum(s.confirmed for s in passed),
        "killed_before_first_confirmation": sum(1 for s in passed if s.confirmed == 0),
        "double_crashes": sum(1 for s in passed if "then a writer" in s.kill_plan),
        "torn_tails_seen": sum(1 for s in passed if s.torn_tail_bytes),
        "final_log_records": passed[-1].log_records if passed else 0,
        "final_segments": passed[-1].segments if passed else 0,
    }
    print(json.dumps(result, indent=2))
    if args.data_dir is None and not failures:
        shutil.rmtree(base, ignore_errors=True)
    elif failures:
        print(f"data kept in {base}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
