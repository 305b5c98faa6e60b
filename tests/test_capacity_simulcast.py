"""``bench/capacity.py --codecs simulcast``: a step passes on the decoded layer's figures
(the highest, the only one ever decoded, its own frames_in), not on a sum of layers; and
``simulcast_comparison`` sets it beside the single-layer ``h264`` publisher per N."""

from __future__ import annotations

from typing import Any

from bench.capacity import compare_simulcast, simulcast_reasons, simulcast_row

SENT = 300


def _layer(rid: str, width: int, height: int, frames_in: int, decoding: bool) -> dict[str, Any]:
    return {
        "rid": rid,
        "width": width,
        "height": height,
        "fps": 30.0,
        "bitrate_bps": 1,
        "frames_in": frames_in,
        "decoding": decoding,
    }


def _final(top_frames_in: int = SENT, decoded_rid: str = "2") -> dict[str, Any]:
    sizes = {"0": (320, 180), "1": (640, 360), "2": (1280, 720)}
    layers = [
        _layer(rid, *size, top_frames_in if rid == "2" else SENT, rid == decoded_rid)
        for rid, size in sizes.items()
    ]
    return {"frames_decoded": SENT, "layers": layers}


def _decoded(*rids: str) -> list[dict[str, Any]]:
    return [{"change": "layer_decoded", "rid": rid, "decoding": rid} for rid in rids]


def test_the_highest_layer_alone_passes() -> None:
    row = simulcast_row(_final(), _decoded("2"))
    assert row["decoded_layer"]["rid"] == "2" and row["highest_layer"]["rid"] == "2"
    assert row["layers_frames_in"] == {"0": SENT, "1": SENT, "2": SENT}
    assert simulcast_reasons(row, SENT) == []


def test_the_decoded_layers_own_figures_count_not_the_sum() -> None:
    # Three layers' frames_in sum past the frames sent; the decoded layer's are short.
    row = simulcast_row(_final(top_frames_in=SENT - 10), _decoded("2"))
    assert simulcast_reasons(row, SENT) == ["decoded layer frames_in < 99% of sent"]


def test_a_lower_layer_decoded_or_on_the_way_fails() -> None:
    lower = simulcast_row(_final(decoded_rid="1"), _decoded("1"))
    assert simulcast_reasons(lower, SENT) == ["decoded layer not the highest"]
    switched = simulcast_row(_final(), _decoded("0", "2"))
    assert simulcast_reasons(switched, SENT) == ["another layer decoded on the way"]
    none = simulcast_row({"frames_decoded": 0}, [])
    assert simulcast_reasons(none, SENT) == ["not exactly one layer decoded"]


def _config(codec: str, cpu_by_n: dict[int, float], failing: int | None) -> dict[str, Any]:
    steps = [
        {"n": n, "passed": n != failing, "server_cpu_pct_of_one_core_per_session": cpu}
        for n, cpu in cpu_by_n.items()
    ]
    passing = [s["n"] for s in steps if s["passed"]]
    return {
        "resolution": "720p",
        "decode": "all",
        "udp_mux": True,
        "codec": codec,
        "largest_passing_n": max(passing, default=0),
        "steps": steps,
    }


def test_simulcast_comparison_per_n_both_ran() -> None:
    configs = {
        "720p:all:h264": _config("h264", {4: 10.0, 8: 11.0, 12: 12.0}, None),
        "720p:all:simulcast": _config("simulcast", {4: 12.5, 8: 14.0}, 8),
        "720p:all:av1": _config("av1", {4: 20.0}, None),
    }
    out = compare_simulcast(configs)
    assert list(out) == ["720p:all"]
    assert out["720p:all"]["largest_passing_n"] == {"simulcast": 4, "single_layer_h264": 12}
    assert out["720p:all"]["by_n"] == {
        "4": {
            "simulcast_cpu_pct_per_session": 12.5,
            "single_layer_cpu_pct_per_session": 10.0,
            "simulcast_over_single_layer": 1.25,
            "simulcast_passed": True,
            "single_layer_passed": True,
        },
        "8": {
            "simulcast_cpu_pct_per_session": 14.0,
            "single_layer_cpu_pct_per_session": 11.0,
            "simulcast_over_single_layer": 1.273,
            "simulcast_passed": False,
            "single_layer_passed": True,
        },
    }
    assert compare_simulcast({"720p:all:h264": configs["720p:all:h264"]}) == {}
