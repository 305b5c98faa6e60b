"""The WAL record codec and segment scanner (sans-IO)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import math
import random
import re
import struct
import sys
from typing import Any

import crc32c
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.errors import EventTooLargeError, InvalidEventError
from registry.events import NewEvent
from registry.record import (
    FRAME_OVERHEAD,
    ScanEnd,
    ScanOutcome,
    decode_frame_at,
    encode_body,
    encode_frame,
    encode_frames,
    scan_segment,
)
from tests.support.event_data import (
    STATS,
    Key,
    Level,
    Mode,
    datas,
    printable,
    scalars,
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
    """``make test`` builds ``registry._framing`` and ``registry._newevent`` (pyproject
    ext-modules, required). Were one missing, every append would run the slower
    pure-Python path, which nothing else would notice: fail here instead."""
    import registry.events as events
    import registry.record as record

    missing = [
        name
        for name, built in (
            ("registry._framing", record.HAVE_C_FRAMING),
            ("registry._newevent", events.HAVE_C_NEW_EVENT),
        )
        if not built
    ]
    assert not missing, (
        f"not built: {missing}; reinstall with a C compiler (`pip install -e .` builds "
        "them) or see pyproject.toml"
    )


# ------------------------------------------------------------- the JSON of ``data``
# (moved from tests/test_walcodec.py when its C codec went: every outcome that held for
# the reference still holds, through whichever encode_body registry.record binds; only
# the float and non-ASCII spelling of the JSON text changed, see registry/record.py. The
# C glue against the reference: tests/test_framing.py.)


def _stdlib_json(data: object) -> bytes:
    """What the earlier encoder wrote for ``data`` (the value every record must keep)."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def _data_text(event: NewEvent, limit: int = 2**30) -> bytes:
    body = encode_body(event, limit)
    header = len(event.run_id.encode()) + len(event.type.encode()) + len(event.principal.encode())
    return body[14 + header :]


@settings(max_examples=1500)
@given(data=datas)
def test_data_is_stored_as_the_value_json_dumps_stores_or_refused_as_it_refuses(
    data: dict[Any, Any],
) -> None:
    event = NewEvent("r", "stats", "p", data, 1)
    try:
        want = _stdlib_json(data)
    except (TypeError, ValueError, RecursionError) as exc:
        with pytest.raises(InvalidEventError) as info:
            encode_body(event, 2**30)
        assert type(info.value.__cause__) is type(exc)
        assert str(info.value) == f"event data is not serializable JSON: {exc}"
        return
    text = _data_text(event)
    assert json.loads(text) == json.loads(want)
    assert decode_frame_at(encode_frame(1, encode_body(event, 2**30)), 0).data == json.loads(want)


@given(data=st.dictionaries(printable, scalars, max_size=8))
def test_data_text_is_compact_json(data: dict[str, Any]) -> None:
    event = NewEvent("r", "stats", "p", data, 1)
    try:
        text = _data_text(event)
    except InvalidEventError:
        return
    assert json.loads(text) == json.loads(_stdlib_json(data))
    try:
        assert text == orjson.dumps(data)
    except orjson.JSONEncodeError:
        assert text == _stdlib_json(data)
    outside_strings = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', text)
    assert b" " not in outside_strings and b"\n" not in outside_strings


def test_size_limit_boundary() -> None:
    event = NewEvent("run-1", "stats", "p", STATS, 1)
    frame = FRAME_OVERHEAD + len(encode_body(event))
    assert encode_body(event, frame)
    with pytest.raises(EventTooLargeError) as info:
        encode_body(event, frame - 1)
    assert str(info.value) == (
        f"event of type 'stats' encodes to {frame} bytes; the limit is {frame - 1}"
    )
    for limit in (0, -1, -(2**100), frame - 0.5):
        with pytest.raises(EventTooLargeError):
            encode_body(event, limit)  # type: ignore[arg-type]
    for limit in (2**100, frame + 0.5):
        assert encode_body(event, limit)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_body(event, None)  # type: ignore[arg-type]


@given(x=st.floats(allow_nan=False, allow_infinity=False))
def test_floats_read_back_as_the_same_float(x: float) -> None:
    event = NewEvent("r", "stats", "p", {"x": x}, 1)
    back = decode_frame_at(encode_frame(1, encode_body(event)), 0).data["x"]
    assert back == x and math.copysign(1.0, back) == math.copysign(1.0, x)
    assert float(json.loads(_data_text(event))["x"]) == x


def test_floats_read_back_in_bulk() -> None:
    rnd = random.Random(20240611)

    def draw() -> float:
        kind = rnd.randrange(5)
        if kind == 0:
            value: float = struct.unpack("<d", rnd.randbytes(8))[0]
            return value
        if kind == 1:
            return rnd.randrange(-(10**16), 10**16) / float(f"1e{rnd.randrange(0, 22)}")
        if kind == 2:
            return float(f"{rnd.randrange(1, 10 ** rnd.randrange(1, 18))}e{rnd.randrange(-24, 20)}")
        near = float(f"{rnd.randrange(1, 10**6)}e{rnd.randrange(-9, 13)}")
        return math.nextafter(near, rnd.choice([math.inf, -math.inf]))

    specials = [1.0, -0.0, 0.0, 1e16, 1e15, 1e-7, 1e-4, 1e-5, 0.1 + 0.2, 5e-324]
    specials += [999999999999999.9, 1e15 - 1, 9.999999999999999e-05, sys.float_info.max]
    for _ in range(100):
        values = [v for v in (draw() for _ in range(1000)) if math.isfinite(v)] + specials
        data = {str(i): v for i, v in enumerate(values)}
        event = NewEvent("r", "stats", "p", data, 1)
        back = decode_frame_at(encode_frame(1, encode_body(event, 2**30)), 0).data
        assert [(v, math.copysign(1.0, v)) for v in back.values()] == [
            (v, math.copysign(1.0, v)) for v in values
        ]


def test_values_orjson_refuses_are_written_as_json_dumps_writes_them() -> None:
    fallbacks: list[dict[Any, Any]] = [
        {Key("k"): 1, "k2": Key("v")},
        {"big": 2**64, "neg": -(2**63) - 1, "huge": 10**300},
        {1: "int key", None: "none key", 2.5: "float key"},
        {True: "bool key", False: "bool key"},
        {"del": "\x7f", "bs": "\\", "ctl": "\x01", "surrogate": "\ud800"},
        {"deep": functools.reduce(lambda inner, _: [inner], range(300), [])},
    ]
    for data in fallbacks:
        assert _data_text(NewEvent("r", "stats", "p", data, 1)) == _stdlib_json(data)
    same_value: list[dict[Any, Any]] = [
        {"level": Level.LOW, "mode": Mode.FAST},
        {"nested": {"a": [1, 2.5, None]}, "t": "tab\there", "q": 'say "hi"', "u": "é"},
        {"none": None, "flag": False, "n": 0},
    ]
    for data in same_value:
        text = _data_text(NewEvent("r", "stats", "p", data, 1))
        assert json.loads(text) == json.loads(_stdlib_json(data))


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        (object(), TypeError),
        (float("nan"), ValueError),
        (float("-inf"), ValueError),
        ([1, {"deep": float("inf")}], ValueError),
        (10**5000, ValueError),  # int.__repr__ refuses > 4300 digits
        (b"bytes", TypeError),
        (dt.datetime(2024, 6, 11, tzinfo=dt.UTC), TypeError),
        (Point(1), TypeError),
    ],
    ids=["object", "nan", "-inf", "nested-inf", "10**5000", "bytes", "datetime", "dataclass"],
)
def test_unserializable_data_is_invalid_event(value: object, cause: type[Exception]) -> None:
    with pytest.raises(InvalidEventError) as info:
        encode_body(NewEvent("r", "stats", "p", {"x": value}, 1))
    exc = info.value
    assert type(exc.__cause__) is cause and exc.__suppress_context__
    assert type(exc.__context__) is cause
    assert exc.__cause__.__context__ is None  # no orjson error chained behind it
    assert str(exc).startswith("event data is not serializable JSON: ")


def test_cycle_is_invalid_event_with_recursion_error_cause() -> None:
    data: dict[str, Any] = {"a": 1}
    data["self"] = data
    with pytest.raises(InvalidEventError) as info:
        encode_body(NewEvent("r", "stats", "p", data, 1))
    assert type(info.value.__cause__) is RecursionError


def test_lone_surrogate_in_principal_raises_unicode_encode_error() -> None:
    with pytest.raises(UnicodeEncodeError, match="surrogates not allowed"):
        encode_body(NewEvent("r", "stats", "a\ud800b", {}, 1))


def test_envelope_errors_are_structs() -> None:
    for ts in (2**63, -(2**63) - 1, 2**100, 1.5, "x", None):
        event = tuple.__new__(NewEvent, ("r", "stats", "p", {}, ts))  # NewEvent: None is now
        with pytest.raises(struct.error):
            encode_body(event)
    for ts in (True, False, 2**63 - 1, -(2**63)):
        assert encode_body(NewEvent("r", "stats", "p", {}, ts))
    # Past NewEvent's checks (the writer never does this, but the errors are still clear).
    with pytest.raises(struct.error):
        encode_body(tuple.__new__(NewEvent, ("r", "stats", "p" * 70_000, {}, 1)), 2**30)
    with pytest.raises(AttributeError):
        encode_body(tuple.__new__(NewEvent, ("r", "stats", 5, {}, 1)))
    with pytest.raises(AttributeError):
        encode_body(tuple.__new__(NewEvent, ("r", "stats", b"p", {}, 1)))

    class Shouting(str):
        def encode(self, *args: Any, **kwargs: Any) -> bytes:
            return self.upper().encode()

    assert b"P{}" in encode_body(tuple.__new__(NewEvent, ("r", "stats", Shouting("p"), {}, 1)))
    assert encode_body(tuple.__new__(NewEvent, ("r", "stats", "p", [1, 2], 1))).endswith(b"[1,2]")


# ------------------------------------------------------------------------ frames


def _parse_frames(buf: bytes, first_seq: int) -> list[bytes]:
    """The bodies of ``buf``'s frames, checking each frame's layout (module docstring)."""
    bodies: list[bytes] = []
    pos = 0
    seq = first_seq
    while pos < len(buf):
        length, crc = struct.unpack_from("<II", buf, pos)
        payload = buf[pos + 8 : pos + 8 + length]
        assert len(payload) == length and crc == crc32c.crc32c(payload)
        assert struct.unpack_from("<Q", payload)[0] == seq
        bodies.append(payload[8:])
        pos += 8 + length
        seq += 1
    return bodies


@settings(max_examples=500)
@given(
    first=st.integers(0, 2**63 - 1 - 64),
    bodies=st.lists(st.binary(max_size=300), max_size=40),
)
def test_encode_frames_is_the_frames_of_each_body(first: int, bodies: list[bytes]) -> None:
    buf = encode_frames(first, bodies)
    assert _parse_frames(buf, first) == bodies
    assert buf == b"".join(encode_frame(first + i, body) for i, body in enumerate(bodies))
    assert len(buf) == sum(FRAME_OVERHEAD + len(body) for body in bodies)


def test_encode_frames_edges() -> None:
    body = encode_body(NewEvent("r", "stats", "p", STATS, 1))
    for first in range(2**64 - 5, 2**64 + 1):
        for count in range(8):
            fits = count == 0 or first + count - 1 <= 2**64 - 1
            if fits:
                assert _parse_frames(encode_frames(first, [body] * count), first) == [body] * count
            else:
                with pytest.raises(struct.error):
                    encode_frames(first, [body] * count)
    for odd in (-1, -(2**70), 1.0, "1", None):
        assert encode_frames(odd, []) == b""  # type: ignore[arg-type]
        for count in (1, 3):
            with pytest.raises(struct.error):
                encode_frames(odd, [body] * count)  # type: ignore[arg-type]
    assert _parse_frames(encode_frames(True, [body]), 1) == [body]
    assert _parse_frames(encode_frames(7, [b"", bytearray(b"ab"), body]), 7) == [b"", b"ab", body]
    assert encode_frames(3, iter([body, b"x"])) == encode_frames(3, [body, b"x"])
    assert encode_frames(1, [memoryview(body)]) == encode_frames(1, [body])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        encode_frames(1, [body, 5])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        encode_frames(1, [body, "str"])  # type: ignore[list-item]
    with pytest.raises(struct.error):
        encode_frames(2**64 - 1, [body, 5])  # type: ignore[list-item]  # seq 2**64 first
    with pytest.raises(TypeError):
        encode_frames(1, 5)  # type: ignore[arg-type]
