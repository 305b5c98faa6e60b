"""registry._newevent (C) against its reference, the pure-Python ``NewEvent.__new__``.

Every comparison is of whole outcomes: the instance (its type, its fields, their types,
and which objects it holds) or the exception's type and message. The C module is
configured with a spy around the reference, so the tests also check which path a call
took: the fast path must not call it, everything else must.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import enum
import gc
import importlib.util
import os
import pickle
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry import events
from registry.errors import InvalidEventError
from registry.events import EventType, NewEvent

# Skipped (with the ImportError in the -ra summary) only when the extension is not built.
W: Any = pytest.importorskip("registry._newevent", exc_type=ImportError)

# The reference: once events.py installs the C new_event as NewEvent.__new__ it keeps the
# Python one as _py_new; before that, NewEvent.__new__ still is the Python function.
py_new: Any = getattr(events, "_py_new", None) or NewEvent.__new__

FIELDS = ("run_id", "type", "principal", "data", "ts_ms")


def _reference_problem() -> str:
    """Why the reference is not the pure Python (else every test compares C with C)."""
    names = getattr(getattr(py_new, "__code__", None), "co_names", ())
    if "_valid_ids" in names and "_checked_type" in names:
        return ""
    return (
        "registry.events must keep its pure-Python NewEvent.__new__ as _py_new when it "
        "installs registry._newevent.new_event"
    )


slow_calls = 0


def spy(*args: Any, **kwargs: Any) -> Any:
    """The reference, counting the calls that left the fast path."""
    global slow_calls
    slow_calls += 1
    return py_new(*args, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def _configured() -> Iterator[None]:
    if problem := _reference_problem():
        pytest.fail(problem, pytrace=False)
    W.configure(spy, events._valid_ids, events._valid_types, NewEvent)
    yield
    W.configure(py_new, events._valid_ids, events._valid_types, NewEvent)  # as events.py does


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:
        return ("raise", type(exc), str(exc))


def took_fast(cls: Any, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """(whether W.new_event kept off the reference, its result)."""
    before = slow_calls
    result = W.new_event(cls, *args, **kwargs)
    return slow_calls == before, result


# ------------------------------------------------------------------ test types


class Sub(NewEvent):
    __slots__ = ()


class SubWithDict(NewEvent):
    """No __slots__: instances get a __dict__ (tp_alloc must still be the one used)."""


class OtherTuple(tuple):  # type: ignore[type-arg]
    __slots__ = ()


class PlainStr(str):
    """A str subclass with str's own hash and comparison: may take the fast path."""


class HashedStr(str):
    """Python-level __hash__: the type-cache lookup would run Python code, so slow path."""

    def __hash__(self) -> int:
        return str.__hash__(self)


class LocalType(enum.StrEnum):
    TICK = "local_tick"


class DictSub(dict):  # type: ignore[type-arg]
    pass


def expect_fast(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The fast path's conditions, written independently of the C (cache state now)."""
    if len(args) > 5:
        return False
    bound = dict(zip(FIELDS, args, strict=False))
    for name, value in kwargs.items():
        if name not in FIELDS or name in bound:
            return False
        bound[name] = value
    if any(name not in bound for name in FIELDS[:3]):
        return False
    if not (isinstance(cls, type) and issubclass(cls, NewEvent)):
        return False
    run_id, etype, principal = bound["run_id"], bound["type"], bound["principal"]
    data, ts_ms = bound.get("data"), bound.get("ts_ms")
    return (
        type(run_id) is str
        and run_id in events._valid_ids
        and type(etype) in (str, PlainStr, EventType, LocalType)
        and bool(events._valid_types.get(etype))
        and type(principal) is str
        and len(principal) <= 64
        and (data is None or type(data) is dict)
        and (ts_ms is None or type(ts_ms) is int)
    )


def same(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """C and reference agree; asserts the path the C took. Returns the C outcome."""
    fast = expect_fast(cls, args, kwargs)
    before_ms = time.time_ns() // 1_000_000
    calls = slow_calls
    got = outcome(W.new_event, cls, *args, **kwargs)
    assert (slow_calls == calls) is fast, (fast, cls, args, kwargs)
    want = outcome(py_new, cls, *args, **kwargs)
    after_ms = time.time_ns() // 1_000_000
    assert got[0] == want[0], (got, want)
    if got[0] == "raise":
        assert got == want
        return got
    c, r = got[1], want[1]
    assert type(c) is type(r)
    assert len(c) == len(r) == 5
    assert [type(f) for f in c] == [type(f) for f in r]
    assert c[:4] == r[:4]
    assert c[0] is r[0] and c[2] is r[2]  # run_id and principal: the objects given
    assert type(c[1]) is str  # type: always the plain str, never the enum member
    bound = dict(zip(FIELDS, args, strict=False)) | kwargs
    if bound.get("data") is not None:
        assert c[3] is r[3] is bound["data"]
    else:
        assert c[3] == {} and c[3] is not r[3]
    if bound.get("ts_ms") is not None:
        assert c[4] is r[4] is bound["ts_ms"]
    else:
        assert before_ms <= c[4] <= after_ms and before_ms <= r[4] <= after_ms
    assert gc.is_tracked(c) == gc.is_tracked(r)
    return got


# ------------------------------------------------------------------ strategies

ids_ok = st.from_regex(events._ID_RE, fullmatch=True)
ids_bad = st.text(max_size=4) | st.sampled_from(
    ["", "x" * 129, "-ab", "_ab", "a b", "é", "a\n", "a\x00", "r/1", "\ud800"]
)
ids_odd = st.sampled_from([5, None, b"r0001", ["r0001"], 1.5, PlainStr("r0001"), HashedStr("r")])
run_ids = st.sampled_from(["r0001", "run-1", "a" * 128]) | ids_ok | ids_bad | ids_odd

types_ok = st.sampled_from(list(EventType)) | st.from_regex(events._TYPE_RE, fullmatch=True)
types_bad = st.sampled_from(["", "A", "1x", "x" * 65, "stats ", "Stats", "é", "\ud800"])
types_odd = st.sampled_from(
    [
        5,
        None,
        b"stats",
        ["stats"],  # unhashable: dict.get raises TypeError
        PlainStr("stats"),
        PlainStr("Bad"),
        HashedStr("stats"),
        HashedStr("zz_hashed"),
        LocalType.TICK,
    ]
)
event_types = types_ok | types_bad | types_odd

principals = (
    st.text(max_size=80)
    | st.text(st.characters(min_codepoint=0x800), min_size=60, max_size=90)  # 3-4 bytes each
    | st.sampled_from(
        [
            "",
            "p" * 64,
            "p" * 65,
            "p" * 256,
            "p" * 257,
            "é" * 128,
            "é" * 129,
            "😀" * 64,
            "😀" * 65,
            "\ud800" * 3,
            "\ud800" * 70,  # encode() raises UnicodeEncodeError
            5,
            None,
            b"p",
            PlainStr("p"),
            PlainStr("p" * 300),
        ]
    )
)
datas = (
    st.none()
    | st.dictionaries(st.text(max_size=3), st.integers() | st.text(max_size=3), max_size=3)
    | st.sampled_from([DictSub(a=1), collections.OrderedDict(a=1), [], "x", 5, (), {"k": None}])
)
timestamps = (
    st.none()
    | st.integers()
    | st.sampled_from([0, -1, True, False, 1.5, 2**100, -(2**70), "x", float("nan")])
)
classes = st.sampled_from(
    [NewEvent, NewEvent, Sub, SubWithDict, tuple, OtherTuple, time.struct_time, int, "cls"]
)


def mostly(good: st.SearchStrategy[Any], anything: st.SearchStrategy[Any]) -> Any:
    """``good`` four times in five: enough calls reach the fast path."""
    return st.integers(0, 4).flatmap(lambda k: good if k else anything)


@st.composite
def calls(draw: st.DrawFn) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(cls, args, kwargs): 0-5 fields, some by name, sometimes a bad extra argument."""
    values = [
        draw(mostly(st.sampled_from(["r0001", "run-1"]) | ids_ok, run_ids)),
        draw(mostly(types_ok, event_types)),
        draw(mostly(st.text(max_size=64), principals)),
        draw(mostly(st.none() | st.just({"fps": 29.97}), datas)),
        draw(mostly(st.none() | st.integers(), timestamps)),
    ]
    given_count = draw(mostly(st.integers(3, 5), st.integers(0, 5)))
    positional = draw(st.integers(0, given_count))
    args = tuple(values[:positional])
    names = list(FIELDS[positional:given_count])
    kwargs = {name: values[FIELDS.index(name)] for name in draw(st.permutations(names))}
    extra = draw(st.sampled_from([None] * 12 + ["pos", "unknown", "dup", "cls"]))
    if extra == "pos":
        args += ("extra",)
    elif extra == "unknown":
        kwargs["seq"] = 1
    elif extra == "dup" and positional:
        kwargs[FIELDS[0]] = values[0]
    elif extra == "cls":
        kwargs["cls"] = NewEvent
    return draw(mostly(st.sampled_from([NewEvent, Sub]), classes)), args, kwargs


# ----------------------------------------------------------------------- tests


@settings(max_examples=1500, deadline=None)
@given(calls())
def test_same_outcome_as_reference(call: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> None:
    cls, args, kwargs = call
    same(cls, args, kwargs)


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from([NewEvent, Sub, SubWithDict]),
    ids_ok,
    types_ok,
    st.text(max_size=64),
    st.none() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.none() | st.integers(),
    st.integers(3, 5),
    st.booleans(),
)
def test_valid_calls_are_fast_once_cached(
    cls: Any,
    run_id: str,
    etype: str,
    principal: str,
    data: Any,
    ts_ms: Any,
    count: int,
    by_name: bool,
) -> None:
    values = (run_id, etype, principal, data, ts_ms)[:count]
    args, kwargs = values[:3], dict(zip(FIELDS[3:count], values[3:], strict=True))
    if not by_name:
        args, kwargs = values, {}
    first = same(cls, args, kwargs)  # fast only if both were cached already
    assert first[0] == "ok"
    assert expect_fast(cls, args, kwargs)  # the reference cached both
    same(cls, args, kwargs)


def test_common_call_shapes_take_the_fast_path() -> None:
    data = {"fps": 29.97}
    NewEvent("r0001", "stats", "bench")  # caches the run id and the type
    for args, kwargs in [
        (("r0001", EventType.STATS, "bench", data), {}),
        (("r0001", EventType.RUN_CREATED, "bench", {"stream": "cam"}), {}),
        (("r0001", "stats", "bench"), {}),
        (("r0001", "stats", "bench", None, 1_700_000_000_000), {}),
        (("r0001", "stats", "bench", data), {"ts_ms": 5}),
        (("r0001", "stats", "bench"), {"ts_ms": 5, "data": data}),
        ((), {"run_id": "r0001", "type": "stats", "principal": "bench"}),
        (("r0001", "stats", "😀" * 64), {}),
    ]:
        for cls in (NewEvent, Sub):
            fast, event = took_fast(cls, *args, **kwargs)
            assert fast, (args, kwargs)
            assert type(event) is cls
            same(cls, args, kwargs)  # and again, compared with the reference


def test_slow_path_cases_match() -> None:
    NewEvent("r0001", "stats", "p")
    for args in [
        ("r0001", "stats", "p" * 65),  # long but valid principal
        ("r0001", "stats", "p", DictSub()),
        ("r0001", "stats", "p", None, 1.5),
        ("r0001", "stats", "p", None, True),
        ("r0001", "stats", PlainStr("p")),
        ("r0001", HashedStr("stats"), "p"),
        (PlainStr("r0001"), "stats", "p"),
    ]:
        fast, _ = took_fast(NewEvent, *args)
        assert not fast, args
        assert same(NewEvent, args, {})[0] == "ok"
    for args, message in [
        (("bad id", "stats", "p"), "invalid run id 'bad id'"),
        (("r0001", "Stats", "p"), "invalid event type 'Stats'"),
        (("r0001", "stats", 5), "principal must be a string"),
        (("r0001", "stats", "é" * 129), "principal longer than 256 bytes"),
        (("r0001", "stats", "p", []), "event data must be a JSON object"),
    ]:
        assert same(NewEvent, args, {}) == ("raise", InvalidEventError, message)
    assert same(NewEvent, ("r0001", "stats"), {})[1] is TypeError
    assert same(NewEvent, ("r0001", "stats", "p", None, 1, 2), {})[1] is TypeError
    assert same(NewEvent, ("r0001", "stats", "p"), {"seq": 1})[1] is TypeError
    assert same(NewEvent, ("r0001", "stats", "p"), {"run_id": "x"})[1] is TypeError
    assert same(NewEvent, ("r0001", ["stats"], "p"), {})[1] is TypeError  # unhashable
    assert same(time.struct_time, ("r0001", "stats", "p"), {})[1] is TypeError
    assert outcome(W.new_event)[1] is TypeError


def test_timestamp_is_wall_clock_ms() -> None:
    NewEvent("r0001", "stats", "p")
    for _ in range(1000):
        before = time.time_ns() // 1_000_000
        fast, event = took_fast(NewEvent, "r0001", "stats", "p")
        after = time.time_ns() // 1_000_000
        assert fast and type(event.ts_ms) is int and before <= event.ts_ms <= after


def test_instance_is_what_tuple_new_builds() -> None:
    NewEvent("r0001", "stats", "p")
    for cls in (NewEvent, Sub, SubWithDict):
        fast, event = took_fast(cls, "r0001", EventType.STATS, "p", {"a": 1}, 7)
        assert fast
        ref = tuple.__new__(cls, ("r0001", "stats", "p", {"a": 1}, 7))
        assert type(event) is cls and event == ref and repr(event) == repr(ref)
        assert event._fields == FIELDS and event.type == "stats" and type(event.type) is str
        assert gc.is_tracked(event) and gc.is_tracked(ref)
        assert set(map(id, gc.get_referents(event))) >= set(map(id, event))
        assert event._asdict() == ref._asdict()
        assert event.__getnewargs__() == tuple(ref)
        assert event == ("r0001", "stats", "p", {"a": 1}, 7)
        with pytest.raises(AttributeError):
            event.run_id = "x"  # type: ignore[misc]
    fast, event = took_fast(SubWithDict, "r0001", "stats", "p")
    event.note = 1  # a __dict__, as tuple.__new__ gives it
    assert fast and event.__dict__ == {"note": 1}
    hashable = W.new_event(NewEvent, "r0001", "stats", "p", None, 1)
    assert outcome(hash, hashable) == outcome(hash, py_new(NewEvent, "r0001", "stats", "p"))


def _expected_messages() -> list[tuple[Any, ...]]:
    return [
        outcome(NewEvent, "r"),
        outcome(NewEvent, "r", "stats", "p", None, 1, 2),
        outcome(NewEvent, "r", "stats", "p", seq=1),
        outcome(NewEvent, "bad id", "stats", "p"),
        outcome(NewEvent, "r", "stats", "é" * 129),
    ]


@pytest.mark.parametrize("wrap", [staticmethod, lambda f: f], ids=["staticmethod", "bare"])
def test_installed_as_dunder_new(monkeypatch: pytest.MonkeyPatch, wrap: Any) -> None:
    """What events.py does: NewEvent(...) dispatches to the C, subclasses included."""
    before_patch = _expected_messages()  # through whatever NewEvent.__new__ is now

    class Early(NewEvent):  # defined before the patch: inherits the new __new__
        __slots__ = ()

    monkeypatch.setattr(NewEvent, "__new__", wrap(W.new_event))

    class Late(NewEvent):
        __slots__ = ()

        def __new__(cls, *args: Any, **kwargs: Any) -> Late:
            return super().__new__(cls, *args, **kwargs)

    NewEvent("r0001", "stats", "p")
    data = {"fps": 29.97}
    for cls in (NewEvent, Early, Late):
        calls = slow_calls
        event = cls("r0001", EventType.STATS, "bench", data)
        event2 = cls("r0001", "stats", "bench", data, ts_ms=event.ts_ms)
        assert slow_calls == calls  # both on the fast path
        assert type(event) is cls and event == event2 and event.data is data
        assert type(event.type) is str and event.type == "stats"
    assert _expected_messages() == before_patch  # error messages unchanged
    event = NewEvent("r0001", "stats", "p", {"a": [1]}, 5)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(event, protocol))
        assert type(back) is NewEvent and back == event
    assert copy.copy(event) == event and copy.deepcopy(event) == event
    assert event._replace(ts_ms=6) == ("r0001", "stats", "p", {"a": [1]}, 6)
    assert NewEvent._make(event) == event


def test_cache_interplay() -> None:
    run_id = f"cache-{time.monotonic_ns()}"
    assert run_id not in events._valid_ids
    assert not took_fast(NewEvent, run_id, "stats", "p")[0]  # the reference caches it
    assert run_id in events._valid_ids
    assert took_fast(NewEvent, run_id, "stats", "p")[0]
    events._valid_ids.clear()
    events._valid_types.clear()
    assert not took_fast(NewEvent, run_id, EventType.STATS, "p")[0]
    assert events._valid_types == {"stats": "stats"}
    assert took_fast(NewEvent, run_id, EventType.STATS, "p")[0]
    # Past the cap the Python side clears the caches; the C keeps using the same objects.
    for i in range(events._VALIDATED_CAP * 2 + 10):
        rid, etype = f"cap-{i}", f"cap_type_{i}"
        got = same(NewEvent, (rid, etype, "p", None, i), {})
        assert got[1] == (rid, etype, "p", {}, i)
        assert took_fast(NewEvent, rid, etype, "p", None, i)[0] == (
            rid in events._valid_ids and etype in events._valid_types
        )
        assert len(events._valid_ids) <= events._VALIDATED_CAP
    assert len(events._valid_types) <= events._VALIDATED_CAP


def test_odd_cache_values_go_slow() -> None:
    """``_valid_types.get(type) or _checked_type(type)``: a falsy value is not used."""
    NewEvent("r0001", "stats", "p")
    try:
        events._valid_types["zz_odd"] = ""
        assert not took_fast(NewEvent, "r0001", "zz_odd", "p")[0]
        assert events._valid_types["zz_odd"] == "zz_odd"  # the reference fixed the entry
        assert took_fast(NewEvent, "r0001", "zz_odd", "p")[0]
    finally:
        events._valid_types.pop("zz_odd", None)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_no_leaks() -> None:
    NewEvent("r0001", "stats", "p")
    run_id, principal, data, ts = "r0001", "bench", {"fps": 29.97}, 2**70
    stats, plain = EventType.STATS, events._valid_types["stats"]
    watched = [run_id, principal, data, ts, stats, plain, NewEvent, Sub]

    def refcounts() -> list[int]:
        return [sys.getrefcount(o) for o in watched]

    def run(n: int) -> None:
        new = W.new_event
        for _ in range(n):
            new(NewEvent, run_id, stats, principal, data)
            new(Sub, run_id, "stats", principal, data, ts)
            new(NewEvent, run_id, stats, principal)
            new(NewEvent, run_id, stats, principal, data=data, ts_ms=ts)
            for args in (
                (run_id, stats, principal, []),  # error on the slow path
                (run_id, stats, 5),
                ("bad id", stats, principal, data, ts),
            ):
                with contextlib.suppress(InvalidEventError):
                    new(NewEvent, *args)
            new(NewEvent, run_id, stats, principal, DictSub(), 1.5)  # slow, succeeds

    run(20_000)  # warm up: free lists, caches, the allocator's arenas
    gc.collect()
    counts, rss = refcounts(), _rss()
    run(200_000)
    gc.collect()
    assert refcounts() == counts
    assert _rss() - rss < 5 * 1024 * 1024


def test_configure_checks_its_arguments() -> None:
    good = (spy, events._valid_ids, events._valid_types, NewEvent)
    for bad in [
        (spy, events._valid_ids, events._valid_types),
        (5, events._valid_ids, events._valid_types, NewEvent),
        (spy, frozenset(), events._valid_types, NewEvent),
        (spy, events._valid_ids, collections.OrderedDict(), NewEvent),
        (spy, events._valid_ids, events._valid_types, tuple),
        (spy, events._valid_ids, events._valid_types, int),
    ]:
        with pytest.raises(TypeError):
            W.configure(*bad)
    W.configure(*good)
    NewEvent("r0001", "stats", "p")
    assert took_fast(NewEvent, "r0001", "stats", "p", None, 1) == (
        True,
        ("r0001", "stats", "p", {}, 1),
    )


def test_unconfigured_module_instance_refuses() -> None:
    spec = importlib.util.find_spec("registry._newevent")
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)  # multi-phase init: its own state
    spec.loader.exec_module(fresh)
    assert fresh is not W
    with pytest.raises(RuntimeError, match="configure"):
        fresh.new_event(NewEvent, "r0001", "stats", "p")
    fresh.configure(py_new, events._valid_ids, events._valid_types, NewEvent)
    event = fresh.new_event(NewEvent, "r0001", "stats", "p", None, 1)
    assert event == ("r0001", "stats", "p", {}, 1)
