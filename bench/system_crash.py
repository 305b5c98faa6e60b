"""System crash soak: the server SIGKILL loop (bench/support/system_crash_loop.py) as JSON.

    .venv/bin/python bench/system_crash.py [--iterations 100] [--seed N] [--data-dir DIR]
        [--progress]

Each iteration starts ``python -m whip serve`` on the same data dir, waits for
``/readyz`` (timed), checks the restart (zero budget/session/slot gauges, exactly the
expected ``run_interrupted``, API reads equal the log, a new push connects), runs mixed
load (aiortc publishers, an operator stopping/deleting, long-pollers) for a random
1-4 s, SIGKILLs the server and checks the log read-only against every confirmed item.
Prints one JSON object on stdout; exits 1 if any iteration failed. A failed iteration
is reported with its seed and the loop goes on in a fresh data dir.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # before bench/ (``bench/whip.py`` would shadow ``whip``)

from bench.support.server_process import free_port  # noqa: E402
from bench.support.system_crash_loop import (  # noqa: E402
    IterationResult,
    LoopState,
    final_restart,
    restrict_ice_to_loopback,
    run_iteration,
    tail,
)


def summary(values: list[float], digits: int = 3) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), digits),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], digits),
        "max": round(ordered[-1], digits),
        "mean": round(statistics.fmean(ordered), digits),
    }


def fresh_state(root: Path, generation: int) -> LoopState:
    base = root / f"gen{generation}"
    base.mkdir(parents=True)
    return LoopState(base / "data", base / "server.log", free_port())


async def soak(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    restrict_ice_to_loopback()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    generation = 0
    state = fresh_state(root, generation)
    results: list[IterationResult] = []
    failures: list[dict[str, Any]] = []
    started = time.monotonic()
    for iteration in range(args.iterations):
        iteration_seed = rng.randrange(2**32)
        try:
            result = await run_iteration(state, iteration, iteration_seed)
        except Exception as exc:  # AssertionError or an unexpected error: both findings
            failures.append(
                {
                    "iteration": iteration,
                    "seed": seed,
                    "iteration_seed": iteration_seed,
                    "data_dir": str(state.data_dir),
                    "error": f"{type(exc).__name__}: {exc}"[:2000],
                    "traceback": traceback.format_exc()[-1500:],
                    "server_log_tail": tail(state, 1500),
                }
            )
            result = IterationResult(iteration, iteration_seed, error=str(exc)[:300])
            generation += 1
            state = fresh_state(root, generation)
        results.append(result)
        if args.progress:
            print(
                f"{iteration}: ok={result.ok} ready={result.ready_s:.2f}s "
                f"confirmed={result.confirmed} interrupted={result.interrupted} "
                f"log={result.log_events}",
                file=sys.stderr,
                flush=True,
            )
    final_ok = True
    try:
        await final_restart(state)
    except Exception as exc:
        final_ok = False
        failures.append({"iteration": "final_restart", "seed": seed, "error": str(exc)[:2000]})
    ok = [r for r in results if r.ok]
    return {
        "benchmark": "system_crash",
        "seed": seed,
        "iterations": args.iterations,
        "passed": len(ok),
        "final_restart_ok": final_ok,
        "failures": failures,
        "ready_s": summary([r.ready_s for r in ok]),
        "confirmed_per_iteration": summary([float(r.confirmed) for r in ok], 1),
        "confirmed_total": sum(r.confirmed for r in ok),
        "interrupted_per_restart": summary([float(r.interrupted) for r in ok], 1),
        "interrupted_total": sum(r.interrupted for r in ok),
        "publishers_total": sum(r.publishers for r in ok),
        "log_events_final": ok[-1].log_events if ok else 0,
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--data-dir", type=Path, default=None, help="kept; default a temp dir")
    parser.add_argument("--progress", action="store_true", help="one line per iteration")
    args = parser.parse_args()
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="whip-system-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        report = asyncio.run(soak(args, root))
    finally:
        if args.data_dir is None and "report" in locals() and not report["failures"]:
            shutil.rmtree(root, ignore_errors=True)
    if report["failures"]:
        report["kept_dir"] = str(root)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0 if report["passed"] == report["iterations"] and report["final_restart_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
