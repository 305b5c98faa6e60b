"""Transport-wide feedback builder (:mod:`whip.rtc.twcc`): hand-computed packets from the
draft's layout and examples, the edge cases one by one, and hypothesis: whatever arrives,
the packets read back (``tests/support/twcc_feedback.py``, an independent reader) into
exactly what arrived, and the recorder stays bounded."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.twcc_feedback import ParsedFeedback, parse_feedback
from whip.rtc.twcc import (
    LARGE_DELTA,
    MAX_FEEDBACK_BYTES,
    MAX_SPAN,
    NOT_RECEIVED,
    REORDER_WINDOW,
    SMALL_DELTA,
    TICK_US,
    FeedbackRecorder,
    status_chunks,
)

SENDER, MEDIA = 0x01020304, 0x0A0B0C0D


def build(recorder: FeedbackRecorder) -> list[ParsedFeedback]:
    return [parse_feedback(packet) for packet in recorder.build(SENDER, MEDIA)]


def statuses(packets: list[ParsedFeedback]) -> list[tuple[int, int | None]]:
    return [status for packet in packets for status in packet.statuses]


# -- the draft's chunk examples (section 3.1.3 and 3.1.4) --------------------------------


def test_the_drafts_run_length_example_221_not_received() -> None:
    assert status_chunks([NOT_RECEIVED] * 221) == [0x00DD]


def test_the_drafts_one_bit_status_vector_example() -> None:
    # 1 not received, 5 received, 3 not received, 3 received, 2 not received
    symbols = [0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0]
    assert status_chunks(symbols) == [0x9F1C]


def test_a_two_bit_vector_when_a_large_delta_is_among_mixed_symbols() -> None:
    # 11 | 01 10 00 00 00 00 00: small, large, five not received
    assert status_chunks([SMALL_DELTA, LARGE_DELTA, *[NOT_RECEIVED] * 5]) == [0xD800]


def test_long_runs_split_at_8191_and_a_mixed_tail_closes_into_one_vector() -> None:
    chunks = status_chunks([NOT_RECEIVED] * 8192 + [SMALL_DELTA] * 20 + [NOT_RECEIVED])
    # 8191 lost | 1 lost + 13 received (one-bit vector) | 7 received + 1 lost (one-bit)
    assert chunks == [0x1FFF, 0x9FFF, 0xBF80]


# -- whole packets, computed by hand -------------------------------------------------------


def test_a_whole_packet_by_hand_loss_reordering_and_a_negative_delta() -> None:
    recorder = FeedbackRecorder()
    recorder.record(100, 1_000_000)  # tick 4000: reference 15 (3840), first delta 160
    recorder.record(102, 1_010_000)  # tick 4040: delta 40 (101 never arrives)
    recorder.record(103, 1_005_000)  # tick 4020: delta -20, a large delta
    (packet,) = recorder.build(SENDER, MEDIA)
    assert packet == bytes.fromhex(
        "afcd0006"  # V=2 P=1 FMT=15, PT=205, 6 words follow
        "01020304"
        "0a0b0c0d"  # sender SSRC, media SSRC
        "0064"
        "0004"  # base sequence 100, 4 statuses
        "00000f"
        "00"  # reference time 15 (x 64 ms), feedback packet count 0
        "d180"  # two-bit vector: small, not received, small, large, (3 unused)
        "a0"
        "28"
        "ffec"  # deltas 160, 40, -20 ticks
        "0002"  # padding: 2 bytes, the last one says 2
    )
    assert parse_feedback(packet).statuses == [(100, 4000), (101, None), (102, 4040), (103, 4020)]


def test_the_bytes_of_a_chromium_captured_packet_are_rebuilt_exactly() -> None:
    # A feedback packet of libwebrtc's (pion/rtcp's test vector "example1"): one packet,
    # base 153, reference 4057090, feedback count 23, one small delta of 148 ticks.
    recorder = FeedbackRecorder(feedback_count=23)
    recorder.record(153, (4057090 * 256 + 148) * TICK_US)
    (packet,) = recorder.build(0xFA17FA17, 0x43032FA0)
    assert packet == bytes.fromhex("afcd0005fa17fa1743032fa0009900013de8021720019401")


def test_sequence_numbers_wrap_and_the_count_goes_on() -> None:
    recorder = FeedbackRecorder(feedback_count=255)
    for i, seq in enumerate([65534, 65535, 0, 1]):
        recorder.record(seq, 1000 * i)
    (first,) = build(recorder)
    assert [s for s, _ in first.statuses] == [65534, 65535, 0, 1]
    assert first.feedback_count == 255
    recorder.record(2, 5000)
    (second,) = build(recorder)
    assert (second.base_sequence, second.feedback_count) == (2, 0)


def test_duplicates_are_reported_once_with_their_first_arrival() -> None:
    recorder = FeedbackRecorder()
    recorder.record(7, 1000)
    recorder.record(7, 9000)
    recorder.record(8, 2000)
    assert statuses(build(recorder)) == [(7, 4), (8, 8)]
    assert recorder.counts.duplicates == 1


def test_nothing_new_builds_nothing() -> None:
    recorder = FeedbackRecorder()
    assert recorder.build(SENDER, MEDIA) == []
    recorder.record(1, 0)
    assert len(recorder.build(SENDER, MEDIA)) == 1
    assert recorder.build(SENDER, MEDIA) == [] and not recorder.pending


def test_a_packet_reported_lost_then_arriving_is_reported_again_from_there() -> None:
    recorder = FeedbackRecorder()
    recorder.record(10, 1000)
    recorder.record(12, 3000)
    assert statuses(build(recorder)) == [(10, 4), (11, None), (12, 12)]
    recorder.record(11, 4000)  # late: after the feedback that said lost
    recorder.record(13, 5000)
    assert statuses(build(recorder)) == [(11, 16), (12, 12), (13, 20)]


def test_a_packet_far_behind_the_report_is_dropped_as_too_late() -> None:
    recorder = FeedbackRecorder()
    recorder.record(1000, 0)
    recorder.record(1000 + REORDER_WINDOW + 10, 1000)
    build(recorder)
    recorder.record(1005, 2000)  # more than REORDER_WINDOW behind what was reported
    assert recorder.counts.too_late == 1 and not recorder.pending


def test_a_receive_delta_past_16_bits_starts_a_new_packet() -> None:
    recorder = FeedbackRecorder()
    recorder.record(1, 1_000_000)
    recorder.record(2, 1_000_000 + 9_000_000)  # 9 s later: 36000 ticks > 32767
    recorder.record(3, 1_000_000 + 9_001_000)
    first, second = build(recorder)
    assert first.statuses == [(1, 4000)]
    assert second.base_sequence == 2
    assert second.statuses == [(2, 40000), (3, 40004)]
    assert (first.feedback_count, second.feedback_count) == (0, 1)


def test_deltas_at_the_edges_of_one_byte_and_of_16_bits() -> None:
    recorder = FeedbackRecorder()
    ticks = [0, 255, 511, 32767 + 511, 32767 + 511 - 32768]  # 255, 256, 32767, -32768
    for seq, tick in enumerate(ticks):
        recorder.record(seq, tick * TICK_US)
    (packet,) = recorder.build(SENDER, MEDIA)
    assert packet[20:22] == bytes.fromhex("d6a0")  # small, small, large, large, large
    assert packet[22:30] == bytes.fromhex("00ff01007fff8000")
    assert parse_feedback(packet).statuses == list(enumerate(ticks))
    recorder = FeedbackRecorder()
    recorder.record(0, 40000 * TICK_US)
    recorder.record(1, (40000 - 32769) * TICK_US)  # -32769: does not fit, a new packet
    first, second = build(recorder)
    assert (first.statuses, second.statuses) == ([(0, 40000)], [(1, 40000 - 32769)])


def test_a_large_gap_is_run_lengths_and_a_big_report_splits_by_size() -> None:
    recorder = FeedbackRecorder()
    recorder.record(0, 0)
    recorder.record(5000, 1000)  # 4999 lost between: one run-length chunk
    (packet,) = build(recorder)
    assert packet.size == 28 and packet.statuses[-1] == (5000, 4)
    for seq in range(5001, 6001):  # alternating 0 and 300 ticks: every other one large
        recorder.record(seq, 2000 + (seq % 2) * 300 * TICK_US)
    packets = build(recorder)
    assert len(packets) > 1
    assert all(p.size <= MAX_FEEDBACK_BYTES for p in packets)
    assert [s for s, _ in statuses(packets)] == list(range(5001, 6001))


def test_nobody_building_never_grows_the_recorder_past_its_bound() -> None:
    recorder = FeedbackRecorder()
    for i in range(4 * (MAX_SPAN + REORDER_WINDOW)):
        recorder.record(i & 0xFFFF, i)
        assert recorder.held <= MAX_SPAN + REORDER_WINDOW
    packets = build(recorder)
    assert sum(len(p.statuses) for p in packets) <= MAX_SPAN
    assert recorder.counts.given_up > 0


# -- any arrival pattern -------------------------------------------------------------------

_steps = st.lists(
    st.tuples(
        st.integers(min_value=-40, max_value=300),  # sequence step: reorder, loss, gap
        st.one_of(  # time step (us): mostly small, the edges, sometimes past 16 bits
            st.integers(min_value=0, max_value=70_000),
            st.sampled_from([255 * TICK_US, 256 * TICK_US, 32767 * TICK_US, 32768 * TICK_US]),
            st.integers(min_value=8_000_000, max_value=20_000_000),
        ),
        st.booleans(),  # build after this arrival
    ),
    max_size=150,
)


@settings(max_examples=150, deadline=None)
@given(start=st.integers(min_value=0, max_value=0xFFFF), steps=_steps)
def test_any_arrival_pattern_reads_back_into_exactly_the_arrivals(
    start: int, steps: list[tuple[int, int, bool]]
) -> None:
    recorder = FeedbackRecorder()
    seq, now = start, 0
    first_arrival: dict[int, int] = {}  # 16-bit number -> first arrival (ticks)
    reported_received: set[int] = set()
    expected_count = 0

    def check_build() -> None:
        nonlocal expected_count
        packets = build(recorder)
        assert not recorder.pending
        for before, after in itertools.pairwise(packets):
            assert after.base_sequence == (before.base_sequence + len(before.statuses)) & 0xFFFF
        for packet in packets:
            assert packet.size <= MAX_FEEDBACK_BYTES
            assert packet.feedback_count == expected_count
            expected_count = (expected_count + 1) & 0xFF
            for number, tick in packet.statuses:
                if tick is None:
                    assert number not in first_arrival  # lost: nothing with it arrived yet
                else:
                    assert first_arrival[number] == tick
                    reported_received.add(number)

    for seq_step, time_step, then_build in steps:
        seq = (seq + seq_step) & 0xFFFF
        now += time_step
        accepted = recorder.counts.recorded
        recorder.record(seq, now)
        if recorder.counts.recorded > accepted:
            assert seq not in first_arrival  # a number is taken once
            first_arrival[seq] = now // TICK_US
        assert recorder.held <= MAX_SPAN + REORDER_WINDOW
        if then_build:
            check_build()
    check_build()
    counts = recorder.counts
    # every accepted arrival was reported received
    assert reported_received == set(first_arrival)
    assert counts.recorded + counts.duplicates + counts.too_late == len(steps)
