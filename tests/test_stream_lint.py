"""Ingest linting (pipeline.stream_lint, pipeline.offered_profile) driven by real
encoders' frames through a real FrameIntake and Analysis, decoded by PyAV."""

from __future__ import annotations

import fractions
import time
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.analysis import Analysis, AnalysisSettings
from pipeline.decoder import FrameMeta
from pipeline.frame import EncodedFrame
from pipeline.intake import FrameIntake
from pipeline.keyframes import is_keyframe
from pipeline.offered_profile import OfferedProfile, read_offered_profile
from pipeline.stream_lint import LintSettings, StreamLint

CLOCK = 90000


def x264_packets(
    profile: str, *, bframes: int = 0, gop: int = 30, frames: int = 30, size: tuple[int, int]
) -> Iterator[tuple[bytes, int, bool]]:
    """``(annexb, pts in 1/30 s, keyframe)`` of a libx264 encode, in decode order."""
    width, height = size
    context = av.CodecContext.create("libx264", "w")
    context.width, context.height, context.pix_fmt = width, height, "yuv420p"
    context.time_base = fractions.Fraction(1, 30)
    context.framerate = fractions.Fraction(30)
    context.gop_size = gop
    context.options = {
        "profile": profile,
        "x264-params": f"log-level=error:bframes={bframes}:keyint={gop}:scenecut=0",
    }
    for i in range(frames + 1):
        if i == frames:
            packets = context.encode(None)
        else:
            rgb = np.full((height, width, 3), (i * 7) % 255, np.uint8)
            rgb[: (i * 5) % height] = 255
            picture = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
            picture.pts = i
            packets = context.encode(picture)
        for packet in packets:
            assert packet.pts is not None
            yield bytes(packet), packet.pts, packet.is_keyframe


class Pipeline:
    """A real intake, a real Analysis and a PyAV decoder on this thread (the worker's
    part of decoder_worker, without a thread: the frames are decoded in order here)."""

    def __init__(self, fmtp: dict[str, object] | None) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.analysis = Analysis(
            lambda t, d: self.events.append((t, d)),
            run_id="r1",
            kinds=("video",),
            settings=AnalysisSettings(stats_interval_s=1.0),
            posted_at=time.monotonic(),
        )
        self.intake = FrameIntake("video", depth=1000, payload_limit=1 << 20)
        self.analysis.watch([self.intake])
        self.intake.codec_parameters = fmtp
        self.decoder = av.CodecContext.create("h264", "r")
        self.index = 0
        self.clock = 0.0

    def push(self, data: bytes, ts: int, fps: float = 30.0) -> None:
        frame = EncodedFrame("video", "H264", data, ts, is_keyframe("H264", data), 0.0)
        self.intake.put(frame)
        queued = self.intake.get(timeout=1)
        assert queued is frame
        packet = av.Packet(data)
        packet.pts = ts
        for picture in self.decoder.decode(packet):
            assert isinstance(picture, av.VideoFrame)
            self.clock += 1 / fps
            meta = FrameMeta("video", "H264", self.index, ts, frame.keyframe, 0.0, self.clock)
            self.index += 1
            self.analysis.on_frame(picture, meta)

    def of_type(self, etype: str) -> list[dict[str, Any]]:
        return [d for t, d in self.events if t == etype]


def test_lying_offer_gives_one_profile_warning_and_fields() -> None:
    pipeline = Pipeline({"profile-level-id": "42e01f", "packetization-mode": 1})
    for data, pts, _key in x264_packets("high", frames=90, size=(320, 240)):
        pipeline.push(data, pts * 3000)
    first = pipeline.of_type("first_frame")[0]
    assert (first["profile"], first["level"]) == ("high", "1.3")
    assert (first["offered_profile"], first["offered_level"]) == ("constrained-baseline", "3.1")
    assert first["b_frames"] is False
    warnings = pipeline.of_type("stream_warning")
    assert [w["warning"] for w in warnings] == ["profile_mismatch"], "once per track per kind"
    assert (warnings[0]["profile"], warnings[0]["offered_profile"]) == (
        "high",
        "constrained-baseline",
    )
    stats = pipeline.of_type("stats")
    assert stats, "periodic stats events: one a second of frames"
    assert stats[-1]["keyframe_interval_s"] == 1.0
    assert pipeline.analysis.final_stats()["profile"] == "high"


def test_honest_offer_and_subset_profiles_give_no_warning() -> None:
    for fmtp in ({"profile-level-id": "640020"}, {"profile-level-id": "42001f"}):
        profile = "high" if fmtp["profile-level-id"].startswith("64") else "baseline"
        pipeline = Pipeline(fmtp)
        for data, pts, _key in x264_packets(profile, frames=20, size=(320, 240)):
            pipeline.push(data, pts * 3000)
        assert pipeline.of_type("stream_warning") == []
        assert pipeline.of_type("first_frame")[0]["offered_profile"] == (
            "high" if profile == "high" else "baseline"
        )


def test_level_above_the_offer_warns() -> None:
    pipeline = Pipeline({"profile-level-id": "42e00a"})  # level 1
    for data, pts, _key in x264_packets("baseline", frames=5, size=(640, 480)):
        pipeline.push(data, pts * 3000)
    warnings = pipeline.of_type("stream_warning")
    assert [(w["warning"], w["offered_level"]) for w in warnings] == [("level_mismatch", "1")]


def test_b_frames_from_the_parameter_set_and_from_timestamps() -> None:
    pipeline = Pipeline({"profile-level-id": "640028"})
    for data, pts, _key in x264_packets("high", bframes=2, frames=30, size=(320, 240)):
        pipeline.push(data, pts * 3000)
    warnings = pipeline.of_type("stream_warning")
    assert [(w["warning"], w["source"]) for w in warnings] == [("b_frames", "parameter_set")]
    assert pipeline.of_type("first_frame")[0]["b_frames"] is True
    assert pipeline.analysis.final_stats()["b_frames"] is True

    # The same stream's frames without their parameter set's reorder field: the RTP
    # timestamps (presentation times, in decode order) still show the reordering.
    lint = StreamLint()
    for data, pts, key in x264_packets("high", bframes=2, frames=30, size=(320, 240)):
        without_sps = b"" if key else data
        lint.observe(EncodedFrame("video", "H264", without_sps, pts * 3000, key, 0), {})
    assert lint.warnings() == {"b_frames"}
    assert lint.fields()["b_frames"] is True


def test_keyframe_interval_over_ten_seconds_warns_once() -> None:
    lint = StreamLint()
    keyframe = next(iter(x264_packets("main", frames=1, size=(64, 64))))[0]
    lint.observe(EncodedFrame("video", "H264", keyframe, 0, True, 0), None)
    for i in range(1, 400):
        lint.observe(EncodedFrame("video", "H264", b"\x00\x00\x01\x41", i * 3000, False, 0), None)
    assert lint.warnings() == {"keyframe_interval"}
    assert lint.fields()["keyframe_interval_s"] is None
    lint.observe(EncodedFrame("video", "H264", keyframe, 400 * 3000, True, 0), None)
    assert lint.fields()["keyframe_interval_s"] == round(400 / 30, 3)
    events = lint.process(av.VideoFrame(64, 64, "yuv420p"), _meta(0.0), 30.0, 0.0)
    assert [(t, d["warning"], d["since_keyframe_s"]) for t, d in events] == [
        ("stream_warning", "keyframe_interval", 10.033)
    ]


def _meta(at: float) -> FrameMeta:
    return FrameMeta("video", "H264", 0, 0, False, 0.0, at)


def test_fps_change_needs_the_hold_and_jitter_does_not_count() -> None:
    lint = StreamLint(LintSettings(fps_hold_s=5.0, rate_window_s=2.0))
    picture = av.VideoFrame(64, 64, "yuv420p")
    readings = [30.0, 31.5, 28.5, 30.0] * 10  # jitter within 2 fps for 40 s
    readings += [15.0] * 100 + [30.0] + [15.0] * 100  # a dip back resets the hold once
    changes = []
    for i, fps in enumerate(readings):
        for etype, data in lint.process(picture, _meta(i * 0.1), fps, 2.0):
            assert etype == "stream_changed"
            changes.append((data["old"], data["new"], round(i * 0.1, 1)))
    # 15 fps is first seen at i=40 (4.0 s): it is due at 9.0 s (i=90).
    assert changes == [({"fps": 30.0}, {"fps": 15.0}, 9.0)]


def test_resolution_change_is_one_stream_changed() -> None:
    pipeline = Pipeline(None)
    for size, start in (((320, 240), 0), ((640, 360), 30)):
        for data, pts, _key in x264_packets("main", frames=30, size=size):
            pipeline.push(data, (start + pts) * 3000)
    changes = pipeline.of_type("stream_changed")
    assert changes == [
        {
            "kind": "video",
            "codec": "H264",
            "change": "resolution",
            "old": {"width": 320, "height": 240},
            "new": {"width": 640, "height": 360},
        }
    ]
    assert pipeline.of_type("first_frame")[0]["offered_profile"] is None


def test_offered_profiles() -> None:
    assert read_offered_profile("H264", {"profile-level-id": "42e01f"}) == OfferedProfile(
        "constrained-baseline", "3.1", None
    )
    assert read_offered_profile("H264", {"profile-level-id": "4d0032"}) == OfferedProfile(
        "main", "5", None
    )
    assert read_offered_profile("H265", {"profile-id": "2", "level-id": "120"}) == OfferedProfile(
        "main10", "4", None
    )
    assert read_offered_profile("AV1", {"profile": 0, "level-idx": 8, "tier": 0}) == (
        OfferedProfile("main", "4.0", "main")
    )
    assert read_offered_profile("VP9", {"profile-id": "2"}) == OfferedProfile(
        "profile-2", None, None
    )
    assert read_offered_profile("H264", {"packetization-mode": "1"}) is None
    assert read_offered_profile("H264", {"profile-level-id": "zz0000"}) is None
    assert read_offered_profile("VP8", {"profile-id": "1"}) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    codec=st.sampled_from(["H264", "H265", "AV1", "VP9", "VP8"]),
    fmtp=st.dictionaries(
        st.sampled_from(["profile-level-id", "profile-id", "level-id", "tier-flag", "profile"]),
        st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none()),
    ),
)
def test_offered_profile_never_raises(codec: str, fmtp: dict[str, object]) -> None:
    read_offered_profile(codec, fmtp)


@pytest.mark.parametrize("reorder_first", [True, False])
def test_codec_change_resets_the_order(reorder_first: bool) -> None:
    lint = StreamLint()
    lint.observe(EncodedFrame("video", "VP8", b"x", 9000, False, 0), None)
    # A new codec restarts the timestamps: not a reordering.
    lint.observe(EncodedFrame("video", "H264", b"x", 0 if reorder_first else 3000, False, 0), None)
    assert lint.warnings() == frozenset()


def test_intake_hands_the_offers_fmtp_of_each_payload_type() -> None:
    """aiortc's codec carries its own local parameters; the intake passes the offer's,
    by the frame's payload type."""
    from aiortc import RTCRtpCodecParameters
    from aiortc.jitterbuffer import JitterFrame

    offered = {106: {"profile-level-id": "640028"}, 108: {"profile-level-id": "42e01f"}}
    intake = FrameIntake("video", depth=8, payload_limit=1 << 20, offered_fmtp=offered)
    seen: list[tuple[int, object]] = []
    intake.set_observer(lambda frame, fmtp: seen.append((frame.timestamp, fmtp)))
    local = {"profile-level-id": "42001f", "packetization-mode": "1"}
    for payload_type, ts in ((106, 0), (108, 3000), (111, 6000)):
        codec = RTCRtpCodecParameters(
            mimeType="video/H264", clockRate=90000, payloadType=payload_type, parameters=local
        )
        intake.offer(codec, JitterFrame(data=b"\x00\x00\x01\x41\x9a", timestamp=ts))
    assert seen == [(0, offered[106]), (3000, offered[108]), (6000, None)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.lists(
        st.tuples(
            st.sampled_from(["H264", "H265", "AV1", "VP9", "VP8"]),
            st.binary(max_size=64).map(lambda b: b"\x00\x00\x01" + b),
            st.integers(min_value=0, max_value=1 << 40),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_observe_never_raises_and_warns_at_most_once_each(
    frames: list[tuple[str, bytes, int, bool]],
) -> None:
    lint = StreamLint()
    for codec, data, ts, key in frames:
        lint.observe(EncodedFrame("video", codec, data, ts, key, 0.0), {"profile-id": "1"})
    events = lint.process(av.VideoFrame(16, 16, "yuv420p"), _meta(0.0), 0.0, 0.0)
    kinds = [d["warning"] for _t, d in events]
    assert len(kinds) == len(set(kinds))
    assert set(kinds) == lint.warnings()


def test_only_the_first_video_intake_feeds_the_linting() -> None:
    """Two video intakes (simulcast layers): the second one's frames, interleaved with
    earlier timestamps, must not read as reordering."""
    analysis = Analysis(lambda t, d: None, run_id="r2", kinds=("video",))
    first, second = (FrameIntake("video", depth=8, payload_limit=1 << 20) for _ in range(2))
    analysis.watch([first, second])
    first.put(EncodedFrame("video", "VP8", b"\x01", 9000, False, 0.0))
    second.put(EncodedFrame("video", "VP8", b"\x01", 3000, False, 0.0))
    first.put(EncodedFrame("video", "VP8", b"\x01", 12000, False, 0.0))
    assert analysis.lint.warnings() == frozenset()
    assert analysis.lint.fields()["b_frames"] is None
