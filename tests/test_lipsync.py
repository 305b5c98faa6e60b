"""The recording's media time (sans-IO, :mod:`pipeline.recording.lipsync`): arrival
alignment before sender reports, report alignment after, never a step back."""

from __future__ import annotations

import pytest

from pipeline.recording.lipsync import TOLERANCE_S, LipSync, Move, SenderReport

NTP = 3_900_000_000.0  # a wall clock in 2023, NTP seconds


def test_before_reports_the_tracks_are_aligned_by_first_arrival() -> None:
    sync = LipSync()
    assert sync.media_s("video", 0, arrival=100.0) == 0.0
    assert sync.media_s("audio", 0, arrival=100.25) == pytest.approx(0.25)
    assert sync.media_s("video", 9000, arrival=100.4) == pytest.approx(0.1)
    assert sync.media_s("audio", 4800, arrival=101.0) == pytest.approx(0.35)
    # One track's report alone changes nothing.
    assert sync.report("video", SenderReport(0, NTP)) is None
    assert list(sync.moves) == []


@pytest.mark.parametrize(
    ("audio_anchor_s", "moved"),
    [
        # The audio was captured with the first video frame but arrived 0.25 s late:
        # video moves later by 0.25 s.
        (0.0, Move("video", 0.25)),
        # The audio was captured 0.4 s after the video's start: audio moves later.
        (0.4, Move("audio", 0.15)),
    ],
)
def test_reports_move_the_early_track_later(audio_anchor_s: float, moved: Move) -> None:
    sync = LipSync()
    sync.media_s("video", 0, arrival=100.0)
    sync.media_s("audio", 0, arrival=100.25)
    before = {k: sync.media_s(k, 48000 if k == "audio" else 90000, 0.0) for k in sync.offsets}
    sync.report("video", SenderReport(90000, NTP + 1.0))  # video ts 0 at NTP
    move = sync.report("audio", SenderReport(48000, NTP + audio_anchor_s + 1.0))
    assert move is not None
    assert (move.kind, move.by_s) == (moved.kind, pytest.approx(moved.by_s))
    after = {k: sync.media_s(k, 48000 if k == "audio" else 90000, 0.0) for k in sync.offsets}
    # Nothing earlier; the tracks now differ as the reports say.
    assert all(after[k] >= before[k] for k in after)
    assert after["audio"] - after["video"] == pytest.approx(audio_anchor_s)
    # Agreeing reports, and jitter within the tolerance, move nothing.
    assert sync.report("audio", SenderReport(96000, NTP + audio_anchor_s + 2.0)) is None
    jitter = TOLERANCE_S / 2
    assert sync.report("video", SenderReport(180000, NTP + 2.0 + jitter)) is None
    assert list(sync.moves) == [move] and sync.moves_made == 1


def test_a_track_that_starts_after_the_reports_starts_at_arrival_then_aligns() -> None:
    sync = LipSync()
    sync.media_s("video", 0, arrival=50.0)
    sync.report("video", SenderReport(0, NTP))
    sync.report("audio", SenderReport(0, NTP))  # kept: no audio frame yet
    assert list(sync.moves) == []
    # First audio frame 1 s late by arrival; the reports say it is at video time 0.
    first_audio = sync.media_s("audio", 0, arrival=51.0)
    assert list(sync.moves) == [Move("video", pytest.approx(1.0))]
    assert first_audio == pytest.approx(1.0)
    assert sync.media_s("video", 0, 0.0) == pytest.approx(1.0)
