"""Hostile H.265, AV1 and VP9 RTP into a live session (tests/support/hostile_rtp.py): every
refused packet and frame is counted by codec and reason, the session stays up, decoding
resumes at the next keyframe, nothing faults.

The well-formed media is FFmpeg's own packetization of PyAV-encoded clips
(``bench/support/rtp_reference.py``).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from itertools import groupby

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from bench.support.rtp_reference import reference_stream
from pipeline.rtp_payload.errors import PayloadError
from pipeline.rtp_payload.formats import depacketizer_for
from tests.support.eventually import eventually
from tests.test_hostile_media import WAIT_S, _hostile

CUT_FRAME = {
    # The first packet of a frame continues an earlier one: the frame lost its start.
    "H265": [bytes([49 << 1, 1, 0x40 | 1]) + bytes(range(40))],  # FU, E set, S clear
    "AV1": [bytes([0x90]) + bytes(range(1, 41))],  # Z: the first element continues
    "VP9": [bytes([0x04]) + bytes(range(40))],  # B clear, E set
}


def _frames(codec: str) -> list[list[bytes]]:
    """The reference clip, one list of RTP payloads per frame (by RTP timestamp)."""
    stream = reference_stream(codec, count=30)
    return [[p.payload for p in group] for _, group in groupby(stream.rtp, lambda p: p.timestamp)]


def _rejected(codec: str, payloads: list[bytes]) -> int:
    """How many of ``payloads`` the codec's depacketizer refuses (a fresh one: the
    per-packet step depends on the payload alone)."""
    depacketizer = depacketizer_for(codec, {})
    assert depacketizer is not None
    refused = 0
    for payload in payloads:
        try:
            depacketizer.depacketize(payload)
        except PayloadError:
            refused += 1
    return refused


@pytest.mark.parametrize("codec", ["H265", "AV1", "VP9"])
async def test_hostile_payloads_are_counted_by_reason_and_decoding_recovers(
    whip_servers: Callable[..., Awaitable[TestServer]], codec: str
) -> None:
    server = await whip_servers()
    frames = _frames(codec)
    rng = random.Random(12)
    noise = [rng.randbytes(rng.randrange(1, 1200)) for _ in range(80)]
    rejected = _rejected(codec, noise)
    assert rejected >= 5  # VP9's descriptor takes most random bytes

    async with _hostile(server, f"hostile-{codec.lower()}", video_mime=f"video/{codec}") as push:
        good = push.pub.stream()
        await push.frames(good, frames)
        await eventually(
            lambda: push.video().frames_decoded >= len(frames) - 8,
            within=WAIT_S,
            awaiting=push.awaiting(f"{codec} frames decoded"),
        )
        assert push.video().codec == codec and push.video().decode_errors == 0
        decoded = push.video().frames_decoded
        requests = push.intake().keyframe_requests

        # A frame cut at its start, on the stream itself: lost, and a keyframe requested.
        await push.frames(good, [CUT_FRAME[codec], CUT_FRAME[codec]])
        # Noise on a second SSRC (same payload type and receiver), so the first stream's
        # sequence numbers keep no hole.
        side = push.pub.stream(ssrc=0x5EED)
        await push.frames(side, ([p] for p in noise))
        await push.settled()
        await eventually(
            lambda: push.guard().rtp_malformed == rejected,
            within=WAIT_S,
            awaiting=push.awaiting("every refused packet counted malformed"),
        )
        await eventually(
            lambda: push.intake().lost_frames >= 1,
            within=WAIT_S,
            awaiting=push.awaiting("the cut frame lost"),
        )
        assert push.intake().keyframe_requests > requests

        # Well-formed again, from its keyframe: decoding resumes.
        await push.frames(good, frames)
        await eventually(
            lambda: push.video().frames_decoded >= decoded + len(frames) - 8,
            within=WAIT_S,
            awaiting=push.awaiting("decoding resumed"),
        )
        assert push.session.connected and push.session.pc.connectionState == "connected"

        body = await push.api()
        errors = body["rtp_payload_errors"][codec]
        assert sum(errors.values()) >= rejected + 1  # the refused packets, the lost frame
        assert body["rtp_discarded"]["malformed"] == rejected
        (track,) = body["tracks"]
        assert track["frames_lost"] >= 1 and track["worker_alive"] is True
        response = await push.http.get(server.make_url("/metrics"))
        samples = {
            (s.labels["codec"], s.labels["reason"]): s.value
            for family in text_string_to_metric_families(await response.text())
            for s in family.samples
            if s.name == "whip_rtp_payload_errors_total"
        }
        assert samples == {(codec, reason): count for reason, count in errors.items()}

        events = await push.delete()
        assert [e.data.get("reason") for e in events if e.type == "session_closed"] == ["deleted"]
        assert not [e for e in events if e.type in ("worker_fault", "forced_shutdown")]
