"""bench/analysis_ablation.py knocks out what it says: run as a subprocess (it pins its
own CPU affinity), ``--quick``, the ``none`` and ``everything`` pieces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "analysis_ablation.py"


def test_the_ablation_pairs_frames_and_knocks_out_the_named_piece() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--pieces", "none,everything"],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["bench"] == "analysis_ablation" and set(out["pieces"]) == {"none", "everything"}
    for piece in out["pieces"].values():
        assert piece["frames_per_side"] == 60  # 4 s at 30 fps, every other frame a side
    everything = out["pieces"]["everything"]["on_frame_us_mean"]
    # A no-op on_frame against the analyzers' per-frame work on a 720p picture (tens of us).
    assert everything["ablated"] < 10 < everything["intact"]
    none = out["pieces"]["none"]["on_frame_us_mean"]
    assert none["intact"] > 10 and none["ablated"] > 10  # nothing knocked out: both analyze


def test_an_unknown_piece_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--pieces", "luma,colour"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unknown pieces ['colour']" in done.stderr
