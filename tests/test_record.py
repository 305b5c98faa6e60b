"""The WAL record codec and segment scanner (sans-IO)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.errors import EventTooLargeError, InvalidEventError
from registry.events import NewEvent
from registry.record import (
    ScanEnd,
    ScanOutcome,
    decode_frame_at,
    encode_body,
    encode_frame,
    scan_segment,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
run_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,20}", fullmatch=True)


def _segment(events: list[NewEvent], first_seq: int = 1) -> bytes:
    return b"".join(encode_frame(first_seq + i, encode_body(e)) for i, e in enumerate(events))


@given(
    run_id=run_ids,
    etype=st.sampled_from(["run_created", "stats", "custom_type_1"]),
    principal=st.text(max_size=30),
    data=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    seq=st.integers(1, 2**63 - 1),
    ts=st.integers(0, 2**62),
)
def test_frame_round_trip(
    run_id: str, etype: str, principal: str, data: dict[str, object], seq: int, ts: int
) -> None:
    event = NewEvent(run_id, etype, principal, data, ts)
    frame = encode_frame(seq, encode_body(event))
    decoded = decode_frame_at(frame, 0)
    assert (decoded.seq, decoded.run_id, decoded.type, decoded.principal, decoded.ts_ms) == (
        seq,
        run_id,
        etype,
        principal,
        ts,
    )
    assert decoded.data == data


def test_scan_clean_segment_yields_every_record_in_order() -> None:
    events = [NewEvent(f"run{i % 3}", "stats", "p", {"i": i}) for i in range(50)]
    buf = _segment(events, first_seq=7)
    outcome = ScanOutcome()
    infos = list(scan_segment(buf, 7, outcome, is_last=True))
    assert [i.seq for i in infos] == list(range(7, 57))
    assert [i.run_id for i in infos] == [e.run_id for e in events]
    assert (outcome.end, outcome.good_end, outcome.next_seq) == (ScanEnd.CLEAN, len(buf), 57)


@settings(max_examples=200)
@given(cut=st.integers(min_value=1, max_value=10_000), garbage=st.binary(max_size=64))
def test_torn_tail_is_detected_at_any_cut(cut: int, garbage: bytes) -> None:
    events = [NewEvent("r", "stats", "p", {"i": i, "pad": "x" * (i % 40)}) for i in range(60)]
    buf = _segment(events)
    cut = cut % len(buf)
    torn = buf[:cut] + garbage
    outcome = ScanOutcome()
    infos = list(scan_segment(torn, 1, outcome, is_last=True))
    # Everything reported is intact and a prefix of what was written.
    assert [i.seq for i in infos] == list(range(1, len(infos) + 1))
    assert outcome.good_end <= cut or outcome.end is ScanEnd.CLEAN
    if outcome.end is not ScanEnd.CLEAN:
        assert outcome.end is ScanEnd.TORN_TAIL
        assert outcome.next_seq == len(infos) + 1


def test_bad_frame_followed_by_valid_frames_is_corruption_not_a_torn_tail() -> None:
    events = [NewEvent("r", "stats", "p", {"i": i}) for i in range(20)]
    buf = bytearray(_segment(events))
    third = len(encode_frame(1, encode_body(events[0]))) * 2 + 12
    buf[third] ^= 0xFF
    outcome = ScanOutcome()
    infos = list(scan_segment(bytes(buf), 1, outcome, is_last=True))
    assert outcome.end is ScanEnd.CORRUPT
    assert [i.seq for i in infos] == [1, 2]
    assert "checksum" in outcome.reason or "sequence" in outcome.reason


def test_any_bad_frame_in_a_non_last_segment_is_corruption() -> None:
    buf = _segment([NewEvent("r", "stats", "p", {"i": i}) for i in range(5)])
    outcome = ScanOutcome()
    list(scan_segment(buf[:-3], 1, outcome, is_last=False))
    assert outcome.end is ScanEnd.CORRUPT


def test_a_sequence_gap_is_not_accepted() -> None:
    a = encode_frame(1, encode_body(NewEvent("r", "stats", "p")))
    c = encode_frame(3, encode_body(NewEvent("r", "stats", "p")))
    outcome = ScanOutcome()
    infos = list(scan_segment(a + c, 1, outcome, is_last=True))
    assert [i.seq for i in infos] == [1]
    assert outcome.end is not ScanEnd.CLEAN


def test_oversized_events_are_refused_before_reaching_the_log() -> None:
    with pytest.raises(EventTooLargeError):
        encode_body(NewEvent("r", "stats", "p", {"blob": "x" * 70_000}))
    encode_body(NewEvent("r", "stats", "p", {"blob": "x" * 1000}), max_record_bytes=2048)
    with pytest.raises(EventTooLargeError):
        encode_body(NewEvent("r", "stats", "p", {"blob": "x" * 3000}), max_record_bytes=2048)


@pytest.mark.parametrize(
    ("run_id", "etype", "data"),
    [
        ("", "stats", {}),
        ("has space", "stats", {}),
        ("r" * 129, "stats", {}),
        ("ok", "Bad-Type", {}),
        ("ok", "", {}),
        ("trailing-newline\n", "stats", {}),
        ("ok", "stats\n", {}),
        ("Upper-Case-Run", "Upper-Case-Run", {}),
    ],
)
def test_invalid_events_are_refused(run_id: str, etype: str, data: dict[str, object]) -> None:
    with pytest.raises(InvalidEventError):
        NewEvent(run_id, etype, "p", data)


def test_non_json_data_is_refused() -> None:
    with pytest.raises(InvalidEventError):
        encode_body(NewEvent("r", "stats", "p", {"x": object()}))
    with pytest.raises(InvalidEventError):
        encode_body(NewEvent("r", "stats", "p", {"x": float("nan")}))


@pytest.mark.parametrize("is_last", [True, False])
def test_zeros_after_the_last_frame_are_unwritten_space_in_any_segment(is_last: bool) -> None:
    buf = _segment([NewEvent("r", "stats", "p", {"i": i}) for i in range(5)])
    outcome = ScanOutcome()
    infos = list(scan_segment(buf + bytes(4096), 1, outcome, is_last=is_last))
    assert [i.seq for i in infos] == [1, 2, 3, 4, 5]
    assert (outcome.end, outcome.good_end, outcome.zero_tail) == (ScanEnd.TORN_TAIL, len(buf), True)


def test_anything_but_zeros_after_a_zero_gap_is_not_unwritten_space() -> None:
    frames = [encode_frame(i, encode_body(NewEvent("r", "stats", "p", {"i": i}))) for i in (1, 2)]
    outcome = ScanOutcome()
    list(scan_segment(frames[0] + bytes(64) + b"\x01", 1, outcome, is_last=False))
    assert outcome.end is ScanEnd.CORRUPT and not outcome.zero_tail
    # A valid frame behind zeros, even far behind, is found: corruption, never truncated.
    outcome = ScanOutcome()
    list(scan_segment(frames[0] + bytes(100_000) + frames[1], 1, outcome, is_last=True))
    assert outcome.end is ScanEnd.CORRUPT


def test_the_c_extensions_are_built() -> None:
    """``make test`` builds ``registry._walcodec`` and ``registry._newevent`` (pyproject
    ext-modules, optional so an install without a compiler still works). Without them
    every append runs the slower pure-Python paths, which nothing else would notice:
    fail here instead."""
    import registry.events as events
    import registry.record as record

    missing = [
        name
        for name, built in (
            ("registry._walcodec", record.HAVE_C_CODEC),
            ("registry._newevent", events.HAVE_C_NEW_EVENT),
        )
        if not built
    ]
    assert not missing, (
        f"not built: {missing}; reinstall with a C compiler (`pip install -e .` builds "
        "them) or see pyproject.toml"
    )
