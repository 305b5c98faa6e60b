"""registry._framing (C) against its reference, the pure Python of registry.record.

Every comparison is of whole outcomes: the bytes, or the exception's type, message and
``__cause__``/``__context__``. The C module is configured with spies around the
references, so the tests also check which path a call took: the fast path must not call
them, everything else must.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import os
import random
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry import record
from registry.errors import EventTooLargeError, InvalidEventError
from registry.events import NewEvent
from tests.support.event_data import (
    STATS,
    Key,
    Level,
    any_text,
    datas,
)

# Skipped (with the ImportError in the -ra summary) only when the extension is not built.
W: Any = pytest.importorskip("registry._framing", exc_type=ImportError)

py_encode_body: Any = record._py_encode_body
py_encode_frames: Any = record._py_encode_frames

slow_calls = 0


def _spy(reference: Callable[..., bytes]) -> Callable[..., bytes]:
    def spy(*args: Any, **kwargs: Any) -> bytes:
        global slow_calls
        slow_calls += 1
        return reference(*args, **kwargs)

    return spy


def _configure(body: Callable[..., bytes], frames: Callable[..., bytes]) -> None:
    W.configure(body, frames, orjson.dumps, record._ORJSON_OPTIONS, crc32c.crc32c)


@pytest.fixture(scope="module", autouse=True)
def _configured() -> Iterator[None]:
    assert record.encode_body is W.encode_body, "registry.record must bind the C functions"
    _configure(_spy(py_encode_body), _spy(py_encode_frames))
    yield
    _configure(py_encode_body, py_encode_frames)  # as registry/record.py does


def outcome(fn: Callable[..., bytes], *args: object, **kwargs: object) -> tuple[object, ...]:
    try:
        return ("ok", fn(*args, **kwargs))
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


def took_fast(fn: Callable[..., bytes], *args: object) -> bool:
    before = slow_calls
    fn(*args)
    return slow_calls == before


def same_body(event: object, limit: object = record.DEFAULT_MAX_RECORD_BYTES) -> tuple[object, ...]:
    got = outcome(W.encode_body, event, limit)
    assert got == outcome(py_encode_body, event, limit)
    return got


def same_frames(first_seq: object, bodies: Any) -> tuple[object, ...]:
    got = outcome(W.encode_frames, first_seq, bodies)
    assert got == outcome(py_encode_frames, first_seq, bodies)
    return got


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


# ------------------------------------------------------------------- encode_body


@settings(max_examples=1500)
@given(event=events(), delta=st.integers(-3, 3) | st.integers(-(10**6), 10**6))
def test_encode_body_matches_reference(event: NewEvent, delta: int) -> None:
    ref = outcome(py_encode_body, event, 2**62)
    size = record.FRAME_OVERHEAD + len(ref[1]) if ref[0] == "ok" else 100  # type: ignore[arg-type]
    same_body(event, size + delta)


def test_common_events_take_the_fast_path() -> None:
    for event in [
        NewEvent("run-1", "stats", "bench", STATS, 1),
        NewEvent("run-1", "run_created", "studio-é", {"stream": "cam-1", "n": [1, 2.5]}, 2),
        NewEvent("r", "first_frame", "p", {"codec": "h264", "fps": 30.0, "ok": True}, 3),
        NewEvent("r", "stats", "p", {}, -5),
        NewEvent("r", "stats", "😀" * 64, {"deep": {"a": {"b": [True, False]}}}, 2**63 - 1),
    ]:
        assert took_fast(W.encode_body, event, 65536), event
        assert same_body(event)[0] == "ok"


def test_everything_else_goes_to_the_reference() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    slow: list[tuple[object, object]] = [
        (NewEvent("r", "stats", "p", {"x": None}, 1), 65536),  # "null": the reference decides
        (NewEvent("r", "stats", "p", {"x": "null"}, 1), 65536),
        (NewEvent("r", "stats", "p", {"x": float("nan")}, 1), 65536),
        (NewEvent("r", "stats", "p", {"x": 2**64}, 1), 65536),  # orjson refuses
        (NewEvent("r", "stats", "p", {1: "int key"}, 1), 65536),
        (NewEvent("r", "stats", "p", {"x": object()}, 1), 65536),
        (NewEvent("r", "stats", "p", cyclic, 1), 65536),
        (NewEvent("r", "stats", "p", STATS, 1), 10),  # too large
        (NewEvent("r", "stats", "p", STATS, 1), -(2**70)),
        (NewEvent("r", "stats", "p", STATS, 1), 65536.0),
        (NewEvent("r", "stats", "p", STATS, True), 65536),
        (NewEvent("r", "stats", "p", STATS, 2**63), 65536),
        (NewEvent("r", "stats", "a\ud800b", {}, 1), 65536),  # no UTF-8 form
        (tuple.__new__(NewEvent, ("r", "stats", Key("p"), {}, 1)), 65536),
        (tuple.__new__(NewEvent, ("r", "stats", "p" * 70_000, {}, 1)), 2**30),
        (("r", "stats", "p", {}), 65536),  # not five fields
        (None, 65536),
    ]
    for event, limit in slow:
        before = slow_calls
        same_body(event, limit)
        outcome(W.encode_body, event, limit)
        assert slow_calls == before + 2, (event, limit)  # same_body's C call and this one
    before = slow_calls
    assert outcome(W.encode_body, NewEvent("r", "stats", "p", STATS, 1)) == outcome(
        py_encode_body, NewEvent("r", "stats", "p", STATS, 1)
    )
    assert outcome(
        W.encode_body, NewEvent("r", "stats", "p", STATS, 1), max_record_bytes=2048
    ) == outcome(py_encode_body, NewEvent("r", "stats", "p", STATS, 1), max_record_bytes=2048)
    assert outcome(W.encode_body)[0] is TypeError
    assert slow_calls == before + 3  # one argument, a keyword, none


def test_size_limit_boundary() -> None:
    event = NewEvent("run-1", "stats", "p", STATS, 1)
    frame = record.FRAME_OVERHEAD + len(py_encode_body(event))
    assert same_body(event, frame)[0] == "ok"
    assert took_fast(W.encode_body, event, frame)
    err = same_body(event, frame - 1)
    assert err[:2] == (
        EventTooLargeError,
        f"event of type 'stats' encodes to {frame} bytes; the limit is {frame - 1}",
    )
    for limit in (0, -1, -(2**100), 2**100, 2**63, frame + 0.5, frame - 0.5, True):
        same_body(event, limit)
    assert same_body(event, None)[0] is TypeError


def test_floats_in_bulk() -> None:
    rnd = random.Random(20240611)
    specials = [1.0, -0.0, 0.0, 1e16, 1e15, 1e-7, 1e-4, 1e-5, 0.1 + 0.2, 5e-324]
    specials += [999999999999999.9, 1e15 - 1, 9.999999999999999e-05, sys.float_info.max]
    for _ in range(50):
        values = [struct.unpack("<d", rnd.randbytes(8))[0] for _ in range(1000)]
        data = {str(i): v for i, v in enumerate([v for v in values if math.isfinite(v)] + specials)}
        event = NewEvent("r", "stats", "p", data, 1)
        assert W.encode_body(event, 2**30) == py_encode_body(event, 2**30)


@pytest.mark.parametrize(
    "value",
    [object(), float("nan"), float("-inf"), 10**5000, b"bytes"],
    ids=["object", "nan", "-inf", "10**5000", "bytes"],
)
def test_unserializable_data_is_the_references_invalid_event(value: object) -> None:
    got = same_body(NewEvent("r", "stats", "p", {"x": value}, 1))
    assert got[0] is InvalidEventError and got[4] is True


def test_dumps_errors_other_than_type_errors_propagate() -> None:
    class Boom(Exception):
        pass

    def dumps(*args: object) -> bytes:
        raise Boom("from dumps")

    def odd_dumps(*args: object) -> object:
        return "not bytes"

    try:
        W.configure(py_encode_body, py_encode_frames, dumps, 0, crc32c.crc32c)
        with pytest.raises(Boom):
            W.encode_body(NewEvent("r", "stats", "p", STATS, 1), 65536)
        W.configure(_spy(py_encode_body), py_encode_frames, odd_dumps, 0, crc32c.crc32c)
        event = NewEvent("r", "stats", "p", STATS, 1)
        assert not took_fast(W.encode_body, event, 65536)  # not bytes: the reference
    finally:
        _configure(_spy(py_encode_body), _spy(py_encode_frames))


# ----------------------------------------------------------------- encode_frames


@settings(max_examples=500)
@given(
    first=st.integers(0, 2**63 - 1 - 64),
    bodies=st.lists(st.binary(max_size=300), max_size=40),
)
def test_encode_frames_matches_reference(first: int, bodies: list[bytes]) -> None:
    assert same_frames(first, bodies)[0] == "ok"
    assert took_fast(W.encode_frames, first, bodies)


def test_encode_frames_edges() -> None:
    body = py_encode_body(NewEvent("r", "stats", "p", STATS, 1))
    for first in range(2**64 - 5, 2**64 + 1):
        for count in range(8):
            same_frames(first, [body] * count)
    for odd in (-1, -(2**70), 1.0, "1", None, True, False):
        for count in (0, 1, 3):
            same_frames(odd, [body] * count)
    assert same_frames(7, [b"", bytearray(b"ab"), body])[0] == "ok"
    assert same_frames(3, (body, b"x"))[0] == "ok"
    assert W.encode_frames(3, iter([body, b"x"])) == py_encode_frames(3, iter([body, b"x"]))
    assert same_frames(1, [memoryview(body)])[0] == "ok"
    assert same_frames(1, [body, 5])[0] is TypeError
    assert same_frames(1, [body, "str"])[0] is TypeError
    assert same_frames(2**64 - 1, [5])[0] is TypeError  # the seq fits, the body fails
    assert same_frames(2**64 - 1, [body, 5])[0] is struct.error  # seq 2**64 comes first
    assert same_frames(1, 5)[0] is TypeError
    assert outcome(W.encode_frames, 1)[0] is TypeError
    assert outcome(W.encode_frames, first_seq=1, bodies=[body]) == (
        "ok",
        W.encode_frames(1, [body]),
    )


def test_a_crc_callable_that_misbehaves_is_an_error_not_a_bad_frame() -> None:
    kept: list[object] = []

    def keeps(view: object) -> int:
        kept.append(view)
        return 0

    def wide(view: object) -> int:
        return 2**32

    def fails(view: object) -> int:
        raise OSError("crc")

    body = b"x" * 10
    try:
        for crc, error in ((keeps, SystemError), (wide, SystemError), (fails, OSError)):
            W.configure(py_encode_body, py_encode_frames, orjson.dumps, 0, crc)
            with pytest.raises(error):
                W.encode_frames(1, [body])
    finally:
        _configure(_spy(py_encode_body), _spy(py_encode_frames))
    assert len(kept) == 1


# ------------------------------------------------------------------- the module


def test_configure_validates() -> None:
    good = (py_encode_body, py_encode_frames, orjson.dumps, 0, crc32c.crc32c)
    for bad in [
        good[:4],
        (None, *good[1:]),
        (good[0], None, *good[2:]),
        (*good[:2], None, *good[3:]),
        (*good[:3], 1.0, good[4]),
        (*good[:4], None),
    ]:
        with pytest.raises(TypeError):
            W.configure(*bad)
    # A refused configure leaves the previous one in place.
    assert took_fast(W.encode_body, NewEvent("r", "stats", "p", STATS, 1), 65536)
    assert not took_fast(W.encode_body, NewEvent("r", "stats", "p", {"x": None}, 1), 65536)


def test_unconfigured_module_instance_refuses() -> None:
    spec = importlib.util.find_spec("registry._framing")
    assert spec is not None and spec.loader is not None
    fresh: Any = importlib.util.module_from_spec(spec)  # multi-phase init: its own state
    spec.loader.exec_module(fresh)
    assert fresh is not W
    for call in (lambda: fresh.encode_body(None, 1), lambda: fresh.encode_frames(1, [])):
        with pytest.raises(RuntimeError, match="configure"):
            call()
    fresh.configure(*(py_encode_body, py_encode_frames, orjson.dumps, 0, crc32c.crc32c))
    assert fresh.encode_frames(1, [b"x"]) == py_encode_frames(1, [b"x"])


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_no_reference_leaks_on_inputs() -> None:
    # Strings built at run time: an interned literal such as "stats" is shared with the
    # rest of the process, whose references come and go while this runs.
    run_id, etype = "".join(["leak", "-run"]), "".join(["leak", "_check"])
    ok = NewEvent(run_id, etype, "".join(["principal-", "é"]), dict(STATS), 1)
    nulls = NewEvent(run_id, etype, "".join(["p", "x"]), {"x": None}, 2**40)
    bad = NewEvent(run_id, etype, "".join(["p", "y"]), {"x": object(), "y": Level.LOW}, 2**40)
    limit = 12345678901234567890
    bodies = [py_encode_body(ok)] * 4
    watched = [ok, *ok, nulls, *nulls, bad, *bad, *bad.data.values(), limit, bodies, bodies[0]]
    before = [sys.getrefcount(obj) for obj in watched]
    for _ in range(10_000):
        W.encode_body(ok, limit)
        W.encode_body(ok, 65536)
        W.encode_body(nulls, limit)
        with pytest.raises(EventTooLargeError):
            W.encode_body(ok, 1)
        with pytest.raises(InvalidEventError):
            W.encode_body(bad, limit)
        W.encode_frames(7, bodies)
        with pytest.raises(struct.error):
            W.encode_frames(2**64 - 2, bodies)
    gc.collect()
    assert [sys.getrefcount(obj) for obj in watched] == before


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
@pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="under ASan (make sanitize) freed memory is held in quarantine: RSS grows",
)
def test_no_memory_growth_over_200k_calls_per_path() -> None:
    ok = NewEvent("run-1", "stats", "p", STATS, 1)
    body = py_encode_body(ok)
    calls: list[Callable[[], object]] = [
        lambda: W.encode_body(ok, 65536),
        lambda: W.encode_body(NewEvent("r", "stats", "p", {"n": None, "e": "é"}, 1), 65536),
        lambda: outcome(W.encode_body, NewEvent("r", "stats", "p", {"x": object()}, 1), 65536),
        lambda: outcome(W.encode_body, ok, 10),
        lambda: W.encode_frames(1, [body] * 16),
        lambda: outcome(W.encode_frames, 2**64 - 2, [body] * 4),
    ]
    for call in calls:
        for _ in range(2000):
            call()
    gc.collect()
    start = _rss()
    for call in calls:
        for _ in range(200_000):
            call()
    gc.collect()
    assert _rss() - start < 5 * 1024 * 1024
