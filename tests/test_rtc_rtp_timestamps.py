"""Frame timestamps as ``whip/rtc/rtp_timestamps.py`` maps them: B-frames stay earlier, a
32-bit wrap goes forward, a taking-over stream continues the timeline."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from whip.rtc.rtp_timestamps import VIDEO_CLOCK_HZ, FrameTimestamps

WRAP = 1 << 32
FRAME = VIDEO_CLOCK_HZ // 30


def test_b_frames_map_below_the_frame_sent_before_them() -> None:
    mapper = FrameTimestamps()
    # Decode order of I P B B P B B at 30 fps: presentation 0 3 1 2 6 4 5.
    sent = [1000 + FRAME * p for p in (0, 3, 1, 2, 6, 4, 5)]
    assert [mapper.map(t) for t in sent] == [FRAME * p for p in (0, 3, 1, 2, 6, 4, 5)]
    assert mapper.highest_mapped == FRAME * 6


def test_a_wrap_goes_forward_and_b_frames_across_it_stay_in_order() -> None:
    mapper = FrameTimestamps()
    start = WRAP - FRAME  # the stream's second P-frame lands past the wrap
    sent = [(start + FRAME * p) % WRAP for p in (0, 3, 1, 2)]
    assert [mapper.map(t) for t in sent] == [0, 3 * FRAME, FRAME, 2 * FRAME]


@given(
    base=st.integers(0, WRAP - 1),
    order=st.permutations(list(range(8))),
)
def test_any_reordering_within_half_the_clock_keeps_presentation_order(
    base: int, order: list[int]
) -> None:
    mapper = FrameTimestamps()
    mapped = [mapper.map((base + FRAME * p) % WRAP) for p in order]
    assert mapped == [FRAME * (p - order[0]) for p in order]


def test_the_next_stream_starts_after_the_highest_frame_plus_the_gap() -> None:
    first = FrameTimestamps()
    for t in (5000, 5000 + 2 * FRAME, 5000 + FRAME):
        first.map(t)
    taking_over = first.following(0.5)
    assert taking_over.map(123456) == 2 * FRAME + VIDEO_CLOCK_HZ // 2
    assert taking_over.map(123456 + FRAME) == 3 * FRAME + VIDEO_CLOCK_HZ // 2
    assert FrameTimestamps().following(1.0).map(7) == 0  # nothing mapped yet: from start
    assert first.following(0.0).map(0) == 2 * FRAME + 1  # at least one tick later
