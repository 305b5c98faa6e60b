"""registry._walcodec (C) against its reference, the pure Python of registry.record.

Every comparison is of whole outcomes: the bytes, or the exception's type, message and
``__cause__``/``__context__``.
"""

from __future__ import annotations

import enum
import gc
import json
import math
import os
import random
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry import record
from registry.errors import EventTooLargeError, InvalidEventError
from registry.events import NewEvent

# Skipped (with the ImportError in the -ra summary) only when the extension is not built.
W: Any = pytest.importorskip("registry._walcodec", exc_type=ImportError)

# The pure-Python reference: once record.py binds encode_body/encode_frames to the C
# functions it keeps the Python ones as _py_encode_body/_py_encode_frames.
py_encode_body: Any = getattr(record, "_py_encode_body", record.encode_body)
py_encode_frames: Any = getattr(record, "_py_encode_frames", record.encode_frames)


def _reference_problem() -> str:
    """Why the reference is not the pure Python (else every test compares C with C)."""
    body = getattr(getattr(py_encode_body, "__code__", None), "co_names", ())
    frames = getattr(getattr(py_encode_frames, "__code__", None), "co_names", ())
    if "_encode_json" in body and "crc32c" in frames:
        return ""
    return (
        "registry.record must keep its pure-Python encode_body/encode_frames as "
        "_py_encode_body/_py_encode_frames when it binds the public names to C"
    )


@pytest.fixture(scope="module", autouse=True)
def _configured() -> None:
    if problem := _reference_problem():
        pytest.fail(problem, pytrace=False)
    W.configure(InvalidEventError, EventTooLargeError, record._encode_json, crc32c.crc32c)


def outcome(fn: Callable[..., bytes], *args: object) -> tuple[object, ...]:
    try:
        return ("ok", fn(*args))
    except Exception as exc:
        cause, context = exc.__cause__, exc.__context__
        return (
            type(exc),
            str(exc),
            type(cause),
            str(cause),
            exc.__suppress_context__,
            type(context),
            str(context),
        )


def same_body(event: object, limit: object = record.DEFAULT_MAX_RECORD_BYTES) -> tuple[object, ...]:
    got = outcome(W.encode_body, event, limit)
    assert got == outcome(py_encode_body, event, limit)
    return got


def same_frames(first_seq: object, bodies: list[Any]) -> tuple[object, ...]:
    got = outcome(W.encode_frames, first_seq, bodies)
    assert got == outcome(py_encode_frames, first_seq, bodies)
    return got


class Level(enum.IntEnum):
    LOW = 1


class Mode(enum.StrEnum):
    FAST = "fast"


class Key(str):
    pass


STATS = {"fps": 29.97, "bitrate_kbps": 2500, "frames": 12345, "dropped": 0}

printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
any_text = (
    printable
    | st.text(max_size=12)
    | st.text(st.characters(categories=["Cs", "L", "Cc", "Po"]), max_size=6)  # surrogates
)
keys = printable | any_text | st.sampled_from([Key("k"), Mode.FAST])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**31), 2**31)
    | st.integers(-(2**63) - 2, 2**63 + 1)
    | st.integers(-(2**300), 2**300)
    | st.floats()  # nan, inf, -0.0, subnormals
    | st.floats(allow_nan=False, allow_infinity=False)
    | printable
    | any_text
    | st.sampled_from([Level.LOW, Mode.FAST, Key("v"), b"x", 1 + 2j])
)
nested = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
datas = (
    st.dictionaries(printable, scalars, max_size=8)
    | st.dictionaries(keys, scalars, max_size=8)
    | st.dictionaries(keys, nested, max_size=5)
)
timestamps = (
    st.integers(0, 2**45)
    | st.integers(-(2**63), 2**63 - 1)
    | st.integers(-(2**64), 2**64)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, True])
)


@st.composite
def events(draw: st.DrawFn) -> NewEvent:
    return NewEvent(
        draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}", fullmatch=True)),
        draw(st.from_regex(r"[a-z][a-z0-9_]{0,63}", fullmatch=True)),
        draw(any_text | st.text(max_size=64)),  # <= 64 chars: NewEvent does not encode it
        draw(datas),
        draw(timestamps),
    )


@settings(max_examples=1500)
@given(event=events(), delta=st.integers(-3, 3) | st.integers(-(10**6), 10**6))
def test_encode_body_matches_reference(event: NewEvent, delta: int) -> None:
    ref = outcome(py_encode_body, event, 2**62)
    size = record.FRAME_OVERHEAD + len(ref[1]) if ref[0] == "ok" else 100  # type: ignore[arg-type]
    same_body(event, size + delta)


@given(data=st.dictionaries(printable, scalars, max_size=8))
def test_fast_path_json_is_compact_json(data: dict[str, Any]) -> None:
    event = NewEvent("r", "stats", "p", data, 1)
    if same_body(event)[0] == "ok":
        body = W.encode_body(event, 2**20)
        assert body[21:] == json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def test_size_limit_boundary() -> None:
    event = NewEvent("run-1", "stats", "p", STATS, 1)
    frame = record.FRAME_OVERHEAD + len(py_encode_body(event))
    assert same_body(event, frame)[0] == "ok"
    err = same_body(event, frame - 1)
    assert err[:2] == (
        EventTooLargeError,
        f"event of type 'stats' encodes to {frame} bytes; the limit is {frame - 1}",
    )
    for limit in (0, -1, -(2**100), 2**100, frame + 0.5, frame - 0.5, True):
        same_body(event, limit)
    assert same_body(event, None)[0] is TypeError


@given(x=st.floats(allow_nan=False, allow_infinity=False))
def test_floats_are_float_repr(x: float) -> None:
    body = same_body(NewEvent("r", "stats", "p", {"x": x}, 1))[1]
    assert body[21:] == f'{{"x":{x!r}}}'.encode()  # type: ignore[index]


def test_float_repr_in_bulk() -> None:
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
        assert W.encode_body(event, 2**30) == py_encode_body(event, 2**30)


def test_fallback_values_give_identical_bytes() -> None:
    datas: list[dict[Any, Any]] = [
        {"level": Level.LOW, "mode": Mode.FAST},
        {Key("k"): 1, "k2": Key("v")},
        {"nested": {"a": [1, 2.5, None]}, "t": "tab\there", "q": 'say "hi"', "u": "é"},
        {"big": 2**64, "neg": -(2**63) - 1, "huge": 10**300},
        {1: "int key", None: "none key", 2.5: "float key"},
        {True: "bool key", False: "bool key"},
        {"del": "\x7f", "bs": "\\", "ctl": "\x01", "surrogate": "\ud800"},
    ]
    for data in datas:
        assert same_body(NewEvent("r", "stats", "p", data, 1))[0] == "ok"


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        (object(), TypeError),
        (float("nan"), ValueError),
        (float("-inf"), ValueError),
        (10**5000, ValueError),  # int.__repr__ refuses > 4300 digits
        (b"bytes", TypeError),
    ],
    ids=["object", "nan", "-inf", "10**5000", "bytes"],
)
def test_unserializable_data_is_invalid_event(value: object, cause: type[Exception]) -> None:
    got = same_body(NewEvent("r", "stats", "p", {"x": value}, 1))
    assert got[0] is InvalidEventError
    assert got[2] is cause and got[4] is True and got[5] is cause
    assert str(got[1]).startswith("event data is not serializable JSON: ")


def test_cycle_is_invalid_event_with_recursion_error_cause() -> None:
    data: dict[str, Any] = {"a": 1}
    data["self"] = data
    got = same_body(NewEvent("r", "stats", "p", data, 1))
    assert got[0] is InvalidEventError and got[2] is RecursionError


def test_lone_surrogate_in_principal_raises_unicode_encode_error() -> None:
    got = same_body(NewEvent("r", "stats", "a\ud800b", {}, 1))
    assert got[0] is UnicodeEncodeError
    assert "surrogates not allowed" in str(got[1])


def test_envelope_errors_match_struct() -> None:
    for ts in (2**63, -(2**63) - 1, 2**100, 1.5, "x", None):
        event = tuple.__new__(NewEvent, ("r", "stats", "p", {}, ts))  # NewEvent: None is now
        assert same_body(event)[0] is struct.error
    for ts in (True, False, 2**63 - 1, -(2**63)):
        assert same_body(NewEvent("r", "stats", "p", {}, ts))[0] == "ok"
    # Past NewEvent's checks (the writer never does this, but the errors still match).
    raw = tuple.__new__(NewEvent, ("r", "stats", "p" * 70_000, {}, 1))
    assert same_body(raw, 2**30)[0] is struct.error
    assert same_body(tuple.__new__(NewEvent, ("r", "stats", 5, {}, 1)))[0] is AttributeError
    assert same_body(tuple.__new__(NewEvent, ("r", "stats", b"p", {}, 1)))[0] is AttributeError

    class Shouting(str):
        def encode(self, *args: Any, **kwargs: Any) -> bytes:
            return self.upper().encode()

    assert same_body(tuple.__new__(NewEvent, ("r", "stats", Shouting("p"), {}, 1)))[0] == "ok"
    assert same_body(tuple.__new__(NewEvent, ("r", "stats", "p", [1, 2], 1)))[0] == "ok"


def test_non_event_arguments_raise_type_error() -> None:
    bads: list[object] = [None, ("r", "stats", "p", {}), "r"]
    for bad in bads:
        with pytest.raises(TypeError):
            W.encode_body(bad, 100)
    with pytest.raises(TypeError):
        W.encode_body(NewEvent("r", "stats", "p", {}, 1))
    with pytest.raises(TypeError):
        W.encode_frames(1)


@settings(max_examples=500)
@given(
    first=st.integers(0, 2**63 - 1 - 64),
    bodies=st.lists(st.binary(max_size=300), max_size=40),
)
def test_encode_frames_matches_reference(first: int, bodies: list[bytes]) -> None:
    assert same_frames(first, bodies)[0] == "ok"


def test_encode_frames_edges() -> None:
    body = py_encode_body(NewEvent("r", "stats", "p", STATS, 1))
    for first in range(2**64 - 5, 2**64 + 1):
        for count in range(8):
            same_frames(first, [body] * count)
    for odd in (-1, -(2**70), 1.0, "1", None, True, False):
        for count in (0, 1, 3):
            same_frames(odd, [body] * count)
    assert same_frames(7, [b"", bytearray(b"ab"), body])[0] == "ok"
    assert W.encode_frames(3, iter([body, b"x"])) == py_encode_frames(3, iter([body, b"x"]))
    assert same_frames(1, [body, 5])[0] is TypeError  # from len()
    assert same_frames(1, [body, "str"])[0] is TypeError  # from crc32c.crc32c
    assert same_frames(2**64 - 1, [5])[0] is TypeError  # the seq fits, the body fails
    assert same_frames(2**64 - 1, [body, 5])[0] is struct.error  # seq 2**64 comes first
    with pytest.raises(TypeError):
        W.encode_frames(1, [memoryview(body)])  # accepted by the reference
    with pytest.raises(TypeError):
        W.encode_frames(1, 5)


@given(data=st.binary(max_size=600), value=st.integers(0, 2**32 - 1))
def test_native_crc32c(data: bytes, value: int) -> None:
    want = crc32c.crc32c(data, value)
    assert W._crc32c(data, value) == want
    assert W._crc32c(data, value, True) == want


def test_configure_validates() -> None:
    with pytest.raises(TypeError):
        W.configure(ValueError, int, record._encode_json, crc32c.crc32c)
    with pytest.raises(TypeError):
        W.configure(ValueError, ValueError, None, crc32c.crc32c)
    with pytest.raises(RuntimeError, match="disagrees"):
        W.configure(ValueError, ValueError, record._encode_json, lambda data, value=0: 0)
    # A refused configure leaves the previous one in place.
    event = NewEvent("r", "stats", "p", {"x": object()}, 1)
    assert same_body(event)[0] is InvalidEventError


# ----------------------------------------------------------------------- leaks


def _calls() -> Iterator[Callable[[], object]]:
    cyclic: dict[str, Any] = {}
    cyclic["c"] = cyclic
    ok = NewEvent("run-1", "stats", "p", STATS, 1)
    body = py_encode_body(ok)
    cases: list[tuple[Callable[..., object], tuple[object, ...]]] = [
        (W.encode_body, (ok, 65536)),  # fast path
        (W.encode_body, (NewEvent("r", "stats", "p", {"n": [1], "e": "é", "f": 1e300}, 1), 65536)),
        (W.encode_body, (NewEvent("r", "stats", "p", {"x": object()}, 1), 65536)),
        (W.encode_body, (NewEvent("r", "stats", "p", {"x": float("nan")}, 1), 65536)),
        (W.encode_body, (ok, 10)),  # too large
        (W.encode_body, (NewEvent("r", "stats", "p\ud800", {}, 1), 65536)),
        (W.encode_body, (NewEvent("r", "stats", "p", {}, 2**64), 65536)),
        (W.encode_body, (ok, None)),
        (W.encode_frames, (1, [body] * 16)),
        (W.encode_frames, (2**64 - 2, [body] * 4)),
        (W.encode_frames, (1, [body, 5])),
        (W.encode_frames, (-1, [body])),
        (W.encode_body, (NewEvent("r", "stats", "p", cyclic, 1), 65536)),  # slow: keep last
    ]
    for fn, args in cases:

        def call(fn: Callable[..., object] = fn, args: tuple[object, ...] = args) -> object:
            try:
                return fn(*args)
            except Exception as exc:
                return exc

        yield call


def test_no_reference_leaks_on_inputs() -> None:
    # Strings built at run time: an interned literal such as "stats" is shared with the
    # rest of the process, whose references come and go while this runs.
    run_id, etype = "".join(["leak", "-run"]), "".join(["leak", "_check"])
    ok = NewEvent(run_id, etype, "".join(["principal-", "é"]), dict(STATS), 1)
    bad: NewEvent = NewEvent(
        run_id, etype, "".join(["p", "x"]), {"x": object(), "y": Level.LOW}, 2**40
    )
    limit = 12345678901234567890
    bodies = [py_encode_body(ok)] * 4
    watched = [ok, *ok, bad, *bad, *bad.data.values(), limit, bodies, bodies[0]]
    before = [sys.getrefcount(obj) for obj in watched]
    for _ in range(10_000):
        W.encode_body(ok, limit)
        with pytest.raises(EventTooLargeError):
            W.encode_body(ok, 1)
        with pytest.raises(InvalidEventError):
            W.encode_body(bad, limit)
        W.encode_frames(limit, bodies)
        with pytest.raises(struct.error):
            W.encode_frames(2**64 - 2, bodies)
    gc.collect()
    assert [sys.getrefcount(obj) for obj in watched] == before


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_no_memory_growth_over_200k_calls_per_path() -> None:
    calls = list(_calls())
    for call in calls:
        for _ in range(2000):
            call()
    gc.collect()
    start = _rss()
    for call in calls:
        for _ in range(200_000 if call is not calls[-1] else 2_000):
            call()
    gc.collect()
    assert _rss() - start < 5 * 1024 * 1024
