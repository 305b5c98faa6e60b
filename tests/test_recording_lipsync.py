"""Lip-sync of a recording from RTCP sender reports, end to end: a real aiortc push whose
audio reaches the server later than the video captured with it, the real server, the
segment decoded with PyAV.

aiortc's senders start each track's RTP timestamps at a random offset and send sender
reports (every 0.5 to 1.5 s) that tie them to one wall clock. The publisher flashes and
beeps at the same capture instant (:mod:`tests.support.flash_beep`) but hands its audio
over 0.6 s late: aligned by arrival (the fallback) the beep would be 0.6 s after the flash
in the file; aligned by the reports, at it. How close is bounded by the publisher, not by
the server: aiortc's sender report pairs the wall time it is sent at with the RTP timestamp
of the last packet sent, whose frame was captured an encode earlier, so on a loaded machine
(a slow VP8 encode) the video's report is late by up to ~130 ms. On a quiet machine the
beep lands 5-6 ms from the flash; the bound here is :data:`SYNC_BOUND_S`, a third of the
skew (aligned by arrival the gap is ~0.58 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp.test_utils import TestServer

from bench.support.publisher import AiortcPublisher
from pipeline.recording.recorder import SessionRecorder
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.flash_beep import FlashBeep, flash_and_beep
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY

ServerFactory = Callable[..., Awaitable[TestServer]]
AUDIO_LATE_S = 0.6
SYNC_BOUND_S = 0.2


async def test_audio_and_video_are_aligned_by_sender_reports(
    whip_servers: ServerFactory,
) -> None:
    server = await whip_servers(recording__enabled=True, recording__segment_s=30.0)
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager = server.app[SESSIONS_KEY]
    probe = FlashBeep(mark_s=2.5, audio_late_s=AUDIO_LATE_S)
    publisher = AiortcPublisher(video_track=probe.video, audio_track=probe.audio)
    async with aiohttp.ClientSession() as http:
        answer = await publisher.publish(http, str(server.make_url("/whip/lipsync")))
        assert answer.status == 201
        session = await eventually(
            lambda: manager.find_by_run(publisher.run_id), within=15, awaiting="the session"
        )
        recorder = session.recorder
        assert isinstance(recorder, SessionRecorder)
        # Past the marks, by the media the recorder was given (not by a clock).
        await eventually(
            lambda: recorder.frames_in >= 30 * 3 + 50 * 3 or None,
            within=20,
            awaiting="3 s of audio and video at the recorder",
        )
        await publisher.close()
        await wait_for_type(timeline, publisher.run_id, "session_closed")

    segment = await wait_for_type(timeline, publisher.run_id, "recording_segment")
    path = manager.recordings.store.run_dir(publisher.run_id) / segment.data["name"]
    marks = await asyncio.to_thread(flash_and_beep, path)
    assert marks.flash_s is not None and marks.beep_s is not None, marks
    assert abs(marks.beep_s - marks.flash_s) <= SYNC_BOUND_S, marks
    # The reports moved the early track (video: its audio arrived late) later, by about
    # the arrival skew in all; nothing went backwards in the file. Usually in one move; in
    # one full run the first move fell short and a later report completed it (0.047 then
    # 0.526 s; most likely a first video report late by the encoder's backlog).
    moves = recorder.sync.moves
    assert moves and moves[0].kind == "video"
    net = sum(move.by_s if move.kind == "video" else -move.by_s for move in moves)
    assert abs(net - probe.audio_late_s) < SYNC_BOUND_S, moves
    assert marks.video_pts_monotonic and marks.audio_pts_monotonic
