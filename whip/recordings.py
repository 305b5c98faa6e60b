"""The server's recordings: which sessions are recorded, their recorders, start-up recovery.

Rules:

- Who is recorded: a push by a principal whose ``[[principals]] record`` says so, else
  every push when ``recording.enabled`` (:meth:`whip.config.Config.records`); decided
  once, at admission, so the media permit can reserve the recorder's queue and thread
  (:meth:`Recordings.permit_need`).
- One :class:`pipeline.recording.recorder.SessionRecorder` per recorded session, fed by
  the session's first video and first audio intake (:meth:`Recordings.attach`); the
  session manager stops it after the decode workers, before ``session_closed``, so the
  last ``recording_segment`` precedes ``session_closed`` in the run's timeline.
- Lip-sync: the RTCP sender reports of the receivers feeding those two intakes reach the
  recorder (:func:`whip.rtc.sender_reports.watch_sender_reports` ->
  :meth:`pipeline.recording.recorder.SessionRecorder.sender_report`), which aligns the
  tracks on the publisher's wall clock once both have one.
- The store (:class:`pipeline.recording.store.RecordingStore`) is the one index of
  complete segments; ``recording_bytes`` of a run is read from it.
- Start-up (:meth:`Recordings.recover`, before any session): the directory is scanned,
  every run's ``recording_segment`` events give the listed segments their durations, and a
  segment file with no such event (the previous process died while writing it) is
  closed as it is (:func:`pipeline.recording.recovery.recover_segment`) and gets its
  event, durable, with ``"recovered": true``. File work runs off the event loop. A file
  that cannot be read is logged and left as it is; the server starts anyway.
- Recordings outlive their runs: a deleted run keeps them until an operator deletes them
  (``DELETE /v1/runs/{id}/recordings``) or the disk budget evicts them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.intake import FrameIntake
from pipeline.recording.recorder import RecorderSettings, SessionRecorder
from pipeline.recording.recovery import recover_segment
from pipeline.recording.store import RecordingStore, SegmentEntry
from registry.events import EventType, NewEvent
from registry.runs import ACTIVE_STATES
from registry.timeline import MAX_READ_LIMIT, Timeline
from whip.config import Config
from whip.rtc.sender_reports import watch_sender_reports

logger = logging.getLogger(__name__)

RECORDER_THREADS = 1

Emit = Callable[[str, dict[str, object]], None]


class Recordings:
    """The recordings of one server (module doc)."""

    def __init__(self, config: Config, timeline: Timeline | None) -> None:
        """``timeline``: the embedded one; None in cluster mode, where the config refuses
        recording (nothing is recorded, nothing recovered)."""
        self.config = config
        self.timeline = timeline
        recording = config.recording
        self.settings = RecorderSettings(segment_s=recording.segment_s, format=recording.format)
        self.store = RecordingStore(
            recording.directory(config.server.data_dir),
            max_bytes=recording.max_bytes,
            run_order=self._run_order,
        )
        self.recorders: dict[str, SessionRecorder] = {}
        """Live recorders by run id (loop thread only)."""

    def _run_order(self, run_id: str) -> tuple[bool, int] | None:
        if self.timeline is None:
            return None
        view = self.timeline.runs.get(run_id)
        if view is None:
            return None
        ended = view.state == "deleted" or view.stream_state not in ACTIVE_STATES
        return ended and run_id not in self.recorders, view.created_ms

    def records(self, principal: str) -> bool:
        return self.config.records(principal)

    def permit_need(self, principal: str) -> tuple[int, int]:
        """(bytes, threads) a recorded push adds to its media permit."""
        if not self.records(principal):
            return 0, 0
        return self.settings.max_bytes, RECORDER_THREADS

    def attach(
        self,
        run_id: str,
        session_id: str,
        intakes: list[FrameIntake],
        emit: Emit,
        loop: asyncio.AbstractEventLoop,
        *,
        receivers: Mapping[FrameIntake, Any] | None = None,
    ) -> SessionRecorder:
        """Make, wire and start the recorder of a session (module doc). ``receivers``:
        the aiortc receiver feeding each intake, whose sender reports time the tracks
        (without them, the tracks stay aligned by arrival). Loop thread."""
        video = next((i for i in intakes if i.kind == "video" and i.layer is None), None)
        audio = next((i for i in intakes if i.kind == "audio"), None)
        recorder = SessionRecorder(
            run_id,
            session_id,
            self.store,
            emit,
            settings=self.settings,
            has_video=video is not None,
            has_audio=audio is not None,
            loop=loop,
        )
        for intake in (video, audio):
            if intake is not None:
                intake.add_observer(recorder.observe)
                receiver = (receivers or {}).get(intake)
                if receiver is not None:
                    watch_sender_reports(
                        receiver,
                        functools.partial(recorder.sender_report, intake.kind),
                        label=f"run {run_id} {intake.label}",
                    )
        self.recorders[run_id] = recorder
        recorder.start()
        return recorder

    async def detach(self, recorder: SessionRecorder, deadline_s: float) -> None:
        """Stop a session's recorder (it writes what it has queued and closes its
        segment), waiting up to ``deadline_s``. Cancellation: the recorder is closed;
        only the wait is abandoned."""
        try:
            await recorder.stop_async(deadline_s)
        finally:
            self.recorders.pop(recorder.run_id, None)

    def is_recording(self, run_id: str) -> bool:
        return run_id in self.recorders

    # ------------------------------------------------------------ start-up

    async def recover(self) -> int:
        """Index the disk, then record every unfinished segment (module doc); the number
        of segments recovered. Cancellation: what was appended stays appended."""
        timeline = self.timeline
        if timeline is None:
            return 0
        found = await asyncio.to_thread(self.store.scan)
        recovered = 0
        for run_id, names in found.items():
            described = await self._describe(timeline, run_id)
            for name in names:
                if name in described:
                    continue
                if await self._recover_one(timeline, run_id, name):
                    recovered += 1
        if found:
            logger.info(
                "recordings: %d runs, %d bytes on disk, %d unfinished segments recovered",
                len(found),
                self.store.total_bytes,
                recovered,
            )
        return recovered

    async def _describe(self, timeline: Timeline, run_id: str) -> set[str]:
        """Give ``run_id``'s listed segments their durations from its events; the names
        that have a ``recording_segment``."""
        named: set[str] = set()
        if timeline.runs.get(run_id) is None:
            return named
        after = 0
        while True:
            events = await timeline.read_events(run_id, after, MAX_READ_LIMIT)
            if not events:
                return named
            after = events[-1].seq
            for event in events:
                if event.type != EventType.RECORDING_SEGMENT:
                    continue
                name = event.data.get("name")
                duration = event.data.get("duration_ms")
                start = event.data.get("start_ms")
                if isinstance(name, str) and isinstance(duration, int):
                    named.add(name)
                    self.store.describe(
                        run_id, name, duration, start if isinstance(start, int) else None
                    )

    async def _recover_one(self, timeline: Timeline, run_id: str, name: str) -> bool:
        path = self.store.path(run_id, name)
        if path is None:
            return False
        try:
            result = await asyncio.to_thread(recover_segment, path)
        except OSError as exc:
            logger.error("recordings: %s/%s cannot be recovered: %s", run_id, name, exc)
            return False
        view = timeline.runs.get(run_id)
        if result is None:
            await asyncio.to_thread(self.store.delete_segment, run_id, name)
            return False
        self.store.add(run_id, SegmentEntry(name, result.bytes, result.duration_ms))
        if view is None:
            logger.warning("recordings: %s/%s belongs to no known run; listed only", run_id, name)
            return True
        await timeline.append(
            NewEvent(
                run_id,
                EventType.RECORDING_SEGMENT,
                view.principal,
                {
                    "index": int(name.split(".")[0]),
                    "name": name,
                    "start_ms": None,
                    "duration_ms": result.duration_ms,
                    "bytes": result.bytes,
                    "video_frames": result.video_frames,
                    "audio_frames": result.audio_frames,
                    "recovered": True,
                    "truncated_bytes": result.truncated_bytes,
                },
            )
        )
        return True
