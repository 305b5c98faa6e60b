"""Peer liveness and shutdown, end to end over loopback UDP (docs/INTEROP.md 2).

- FFmpeg's WHIP muxer never answers ICE consent checks, so stock aioice drops it ~33 s
  after connecting; media-or-consent liveness (:func:`whip.rtc.liveness.install_media_liveness`)
  must keep a long push up until the publisher's own DELETE.
- A publisher process killed with SIGKILL says nothing: the session must be reclaimed as
  ``peer_gone`` within ``reclaim_after_s`` (+ slack) and every counter returned.
- A server process that gets SIGTERM closes its live sessions durably (``shutdown``) and
  exits 0; reopening its data dir finds nothing to interrupt.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from bench.support.server_process import wait_ready
from registry.events import Event, now_ms
from registry.record import ScanOutcome, decode_frame_at, scan_segment
from registry.segments import SEGMENT_SUFFIX
from registry.timeline import Timeline, TimelineConfig
from tests.support.eventually import eventually
from tests.support.peers import AiortcPublisher, ffmpeg_whip_push
from tests.support.servers import serve_argv, wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.live_session import LiveSession
from whip.rtc.host_addresses import restrict_host_addresses
from whip.session_manager import SessionManager

ROOT = Path(__file__).resolve().parent.parent

STOCK_CONSENT_EXPIRY_S = 33.0
"""When stock aioice drops an FFmpeg publisher after connecting (INTEROP.md 2): six failed
consent checks 4-6 s apart, so 24-36 s."""
LONG_PUSH_S = 50.0
"""Past the latest stock expiry (36 s) with the probe at expiry + 10 s and room after it."""
RECLAIM_AFTER_S = 3.0
DETECTION_SLACK_S = 2.0
CONNECT_WAIT_S = 30.0
MID_STREAM_PACKETS = 100
"""Media packets the server must have taken before the publisher is killed (~1-2 s)."""
SHUTDOWN_WAIT_S = 10.0

MEDIA_EVENTS = frozenset({"first_frame", "stats", "scene_change", "audio_silence", "video_black"})
"""Events the pipeline adds while media flows; lifecycle assertions skip them."""


@pytest.fixture
def ingest(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> Callable[..., Awaitable[TestServer]]:
    """Real servers on 127.0.0.1 (the shared ``whip_servers`` fixture)."""
    return whip_servers


async def wait_for_single_run(timeline: Timeline, wait_s: float = CONNECT_WAIT_S) -> str:
    """The id of the one run the server has created (bounded poll)."""

    def the_run() -> str:
        runs = timeline.runs.list_runs()
        if runs:
            assert len(runs) == 1
            return runs[0].run_id
        return ""

    return await eventually(the_run, within=wait_s, awaiting="a run created", every=0.05)


def assert_nothing_held(manager: SessionManager) -> None:
    assert len(manager.table) == 0
    figures = manager.budget.figures()
    assert (figures.bytes_reserved, figures.threads_reserved) == (0, 0)
    assert (figures.bytes_kept, figures.threads_kept) == (0, 0)
    assert manager.slots.reserved() == 0


# --------------------------------------------------------------- a. long FFmpeg push


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_ffmpeg_push_outlives_stock_consent_expiry(
    ingest: Callable[..., Awaitable[TestServer]],
) -> None:
    server = await ingest()
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager: SessionManager = server.app[SESSIONS_KEY]
    url = str(server.make_url("/whip/long"))
    pushing = asyncio.create_task(
        asyncio.to_thread(ffmpeg_whip_push, url, LONG_PUSH_S), name="ffmpeg-push"
    )
    try:
        run_id = await wait_for_single_run(timeline)
        connected = await wait_for_type(timeline, run_id, "session_connected", CONNECT_WAIT_S)
        session = manager.find_by_run(run_id)
        assert session is not None
        # Well past the point where stock aioice gives up on FFmpeg, the push is still
        # running and the session still stands.
        probe_at = time.monotonic() + STOCK_CONSENT_EXPIRY_S + 10.0
        done, _ = await asyncio.wait({pushing}, timeout=probe_at - time.monotonic())
        assert not done, "the push ended early"
        assert manager.table.get(session.session_id) is session
        assert session.pc.connectionState == "connected"
        early = await timeline.read_events(run_id, 0, 1000)
        assert "session_closed" not in [e.type for e in early]
    finally:
        await asyncio.wait({pushing})  # bounded by LONG_PUSH_S; re-raised just below
    sent = pushing.result()  # FFmpeg raises ConnectionRefusedError if it was dropped
    assert sent == int(LONG_PUSH_S * 30)

    closed = await wait_for_type(timeline, run_id, "session_closed", CONNECT_WAIT_S)
    events = await timeline.read_events(run_id, 0, 1000)
    assert [e.type for e in events][:2] == ["run_created", "session_connected"]
    assert [e.data for e in events if e.type == "session_closed"] == [{"reason": "deleted"}]
    lived_s = (closed.ts_ms - connected.ts_ms) / 1000
    assert lived_s >= LONG_PUSH_S - 3.0, f"connected for only {lived_s:.1f}s"
    history = session.state_history
    assert history[-1] == "closed" and history.count("closed") == 1, history
    assert "connected" in history and not {"failed", "disconnected"} & set(history), history
    liveness = session.liveness
    assert liveness is not None and not liveness.expired
    assert liveness.media_packets > LONG_PUSH_S * 30
    print(
        f"\nlong push: connected {connected.data['ms_since_post']} ms after POST, "
        f"lived {lived_s:.1f}s; media_packets={liveness.media_packets} "
        f"consent_sent={liveness.consent_sent} consent_ok={liveness.consent_ok}; "
        f"states {history}"
    )
    assert_nothing_held(manager)


# --------------------------------------------------------------- b. SIGKILLed publisher


async def read_until_connected(proc: asyncio.subprocess.Process, wait_s: float) -> None:
    """Read the publisher's stdout until it prints ``connected`` (bounded)."""
    assert proc.stdout is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    lines: list[bytes] = []
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), deadline - loop.time())
        if line.strip() == b"connected":
            return
        if not line:
            raise AssertionError(
                f"publisher exited ({await proc.wait()}) before connecting: {lines}"
            )
        lines.append(line)


async def wait_for_media(session: LiveSession, packets: int, wait_s: float) -> None:
    """Wait until the server has taken ``packets`` authenticated media packets (bounded
    poll): a publisher killed before its media starts would measure something else."""
    liveness = session.liveness
    assert liveness is not None
    await eventually(
        lambda: liveness.media_packets >= packets,
        within=wait_s,
        awaiting=lambda: f"{packets} media packets, {liveness.media_packets} taken",
        every=0.05,
    )


@pytest.mark.parametrize("kind", ["aiortc", "ffmpeg"])
async def test_sigkilled_publisher_is_reclaimed_as_peer_gone(
    ingest: Callable[..., Awaitable[TestServer]], tmp_path: Path, kind: str
) -> None:
    server = await ingest(limits__reclaim_after_s=RECLAIM_AFTER_S)
    timeline: Timeline = server.app[TIMELINE_KEY]
    manager: SessionManager = server.app[SESSIONS_KEY]
    url = str(server.make_url(f"/whip/{kind}"))
    with (tmp_path / f"publisher-{kind}.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.publisher_proc",
            "--kind",
            kind,
            url,
            "60",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    try:
        await read_until_connected(proc, CONNECT_WAIT_S)
        run_id = await wait_for_single_run(timeline)
        await wait_for_type(timeline, run_id, "session_connected", CONNECT_WAIT_S)
        session = manager.find_by_run(run_id)
        assert session is not None
        await wait_for_media(session, MID_STREAM_PACKETS, CONNECT_WAIT_S)
        proc.send_signal(signal.SIGKILL)
        killed_at, killed_ms = time.monotonic(), now_ms()
        await proc.communicate()  # reap it, drain its stdout
        assert proc.returncode == -signal.SIGKILL
        closed = await wait_for_type(
            timeline, run_id, "session_closed", wait_s=RECLAIM_AFTER_S + 10.0
        )
        detected_s = time.monotonic() - killed_at
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    durable_s = (closed.ts_ms - killed_ms) / 1000
    assert session.liveness is not None
    print(
        f"\n{kind} publisher SIGKILLed after {session.liveness.media_packets} media packets: "
        f"session_closed {detected_s:.2f}s later (event ts {durable_s:.2f}s)"
    )
    assert detected_s <= RECLAIM_AFTER_S + DETECTION_SLACK_S, detected_s
    assert closed.data == {"reason": "peer_gone"}
    events = await timeline.read_events(run_id, 0, 1000)
    assert [e.type for e in events if e.type not in MEDIA_EVENTS] == [
        "run_created",
        "session_connected",
        "session_closed",
    ]
    assert session.liveness.expired
    assert session.state_history[-1] == "closed", session.state_history
    assert_nothing_held(manager)
    view = timeline.runs.get(run_id)
    assert view is not None and view.state == "ended"


# --------------------------------------------------------------- c. SIGTERM shutdown


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def peek_wal(data_dir: Path) -> list[Event]:
    """The durable events in a live server's WAL, read-only (its lock stays untouched).

    A record being written shows up as a torn tail and is simply not returned yet.
    """
    events: list[Event] = []
    for path in sorted((data_dir / "wal").glob(f"*{SEGMENT_SUFFIX}")):
        buf = path.read_bytes()
        expect = events[-1].seq + 1 if events else int(path.name.removesuffix(SEGMENT_SUFFIX))
        for info in scan_segment(buf, expect, ScanOutcome(), is_last=True):
            events.append(decode_frame_at(buf, info.offset))
    return events


async def wait_in_wal(data_dir: Path, run_id: str, etype: str, wait_s: float) -> None:
    async def durable() -> bool:
        events = await asyncio.to_thread(peek_wal, data_dir)
        return any(e.run_id == run_id and e.type == etype for e in events)

    await eventually(durable, within=wait_s, awaiting=f"a durable {etype} for {run_id}", every=0.05)


async def wait_until_sent(publisher: AiortcPublisher, packets: int, wait_s: float) -> None:
    """Wait until the publisher has sent ``packets`` RTP packets in all (bounded poll)."""

    sent = [0]

    async def enough_sent() -> bool:
        sent[0] = 0
        for sender in publisher.pc.getSenders():
            for stats in (await sender.getStats()).values():
                if stats.type == "outbound-rtp":
                    sent[0] += stats.packetsSent
        return sent[0] >= packets

    await eventually(
        enough_sent,
        within=wait_s,
        awaiting=lambda: f"{packets} RTP packets sent, {sent[0]} were",
        every=0.05,
    )


async def test_sigterm_closes_sessions_durably_and_exits_zero(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHIP_INGEST_")}
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *serve_argv(port, data_dir),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    restrict_host_addresses(["127.0.0.1"])  # our own publisher: loopback only
    publisher = AiortcPublisher()
    try:
        await wait_ready(base, lambda: proc.returncode, CONNECT_WAIT_S)
        async with aiohttp.ClientSession() as http:
            response = await publisher.publish(http, f"{base}/whip/term")
            assert response.status == 201
        await asyncio.wait_for(publisher.connected.wait(), CONNECT_WAIT_S)
        await wait_in_wal(data_dir, publisher.run_id, "session_connected", CONNECT_WAIT_S)
        await wait_until_sent(publisher, MID_STREAM_PACKETS, CONNECT_WAIT_S)  # mid-stream

        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            code = await asyncio.wait_for(proc.wait(), SHUTDOWN_WAIT_S)
        except TimeoutError:
            raise AssertionError(
                f"no exit within {SHUTDOWN_WAIT_S}s of SIGTERM:\n{log_path.read_text()}"
            ) from None
        took_s = time.monotonic() - signalled
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await publisher.close()
    server_log = log_path.read_text()
    print(f"\nSIGTERM -> exit {code} in {took_s:.2f}s")
    assert code == 0, server_log
    assert "Traceback" not in server_log and "cleanup failed" not in server_log, server_log

    timeline = await asyncio.to_thread(Timeline.open, TimelineConfig(data_dir))
    try:
        assert timeline.interrupted == []
        events = timeline.read_run_events(publisher.run_id, 0, 1000)
        types = [e.type for e in events]
        lifecycle = [t for t in types if t not in MEDIA_EVENTS]
        assert lifecycle == ["run_created", "session_connected", "session_closed"], types
        assert events[-1].data == {"reason": "shutdown"}
        everything = await asyncio.to_thread(peek_wal, data_dir)
        assert "run_interrupted" not in [e.type for e in everything]
        view = timeline.runs.get(publisher.run_id)
        assert view is not None and view.state == "ended"
    finally:
        await timeline.aclose()
