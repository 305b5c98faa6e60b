"""Hypothesis strategies for event data: what producers may hand the timeline, odd
values included (surrogates, huge ints, nan, enums, str subclasses, bytes, complex).

Shared by the record codec's tests and the C framing's tests, so both draw from one
definition of "event data"."""

from __future__ import annotations

import enum

from hypothesis import strategies as st


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
    | st.integers(-(2**63) - 2, 2**64 + 1)
    | st.integers(-(2**300), 2**300)
    | st.floats()  # nan, inf, -0.0, subnormals
    | st.floats(allow_nan=False, allow_infinity=False)
    | printable
    | any_text
    | st.sampled_from([Level.LOW, Mode.FAST, Key("v"), b"x", 1 + 2j, "null", "nul"])
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
