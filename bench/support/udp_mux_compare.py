"""The UDP mux on/off comparison of ``bench/capacity.py``: the same configurations and
N steps, run back to back with the shared UDP port and with a socket per session.

Per configuration: the largest passing N of each mode, and at every N both modes ran,
the server's CPU per session (percent of one core, over the steady-state window) with
the mux, without it, and their ratio. ``within_target`` says whether every ratio is at
most :data:`TARGET_RATIO` (the mux costs at most 5 % CPU per session); ``None`` when no
N ran in both modes.
"""

from __future__ import annotations

from typing import Any

TARGET_RATIO = 1.05
_CPU = "server_cpu_pct_of_one_core_per_session"


def compare_udp_mux(configs: dict[str, Any]) -> dict[str, Any]:
    """The comparison of every configuration that ran in both modes (module doc)."""
    out: dict[str, Any] = {}
    for name, on in configs.items():
        off = configs.get(f"{name}:nomux")
        if off is None or not on.get("udp_mux", True):
            continue
        cpu_off = {s["n"]: s.get(_CPU) for s in off["steps"]}
        rows = []
        for step in on["steps"]:
            n, with_mux, without = step["n"], step.get(_CPU), cpu_off.get(step["n"])
            if with_mux is None or not without:
                continue
            rows.append(
                {
                    "n": n,
                    "cpu_pct_per_session_mux": with_mux,
                    "cpu_pct_per_session_no_mux": without,
                    "ratio": round(with_mux / without, 3),
                    "both_passed": bool(step["passed"])
                    and any(s["n"] == n and s["passed"] for s in off["steps"]),
                }
            )
        out[name] = {
            "largest_passing_n_mux": on["largest_passing_n"],
            "largest_passing_n_no_mux": off["largest_passing_n"],
            "by_n": rows,
            "within_target": all(r["ratio"] <= TARGET_RATIO for r in rows) if rows else None,
        }
    return out
