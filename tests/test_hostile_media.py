"""Hostile media (issue 6), end to end: a real aiortc publisher on loopback UDP, once
DTLS/SRTP is up, sends hand-crafted RTP through its own SRTP (tests/support/hostile_rtp.py) into
the in-process server. Garbage payloads, payload types nobody negotiated, SSRC changes
and churn, sequence-number jumps, frames far over the payload limit, datagrams aiortc
cannot take, a publisher that stops mid-frame or vanishes: each is counted where an
operator looks (the run's events, ``GET /v1/sessions/{id}``, ``/metrics``), nothing
crashes, memory stays bounded, and the server then serves a normal push.

Waits are bounded polls for an exact expected counter (a failure is a timeout with the
counters in the message), never sleeps that assume a speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from aiortc.codecs import CODECS, depayload
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from aiortc.rtcrtpreceiver import NackGenerator
from aiortc.rtcrtpsender import RTCRtpSender
from aiortc.rtp import RtpPacket
from prometheus_client.parser import text_string_to_metric_families

from pipeline.decoder import DecodeStats
from pipeline.frame import EncodedFrame
from pipeline.intake import FrameIntake
from registry.events import Event
from registry.timeline import Timeline
from tests.support.eventually import eventually
from tests.support.hostile_rtp import HostilePublisher, RtpStream, h264_frames
from tests.support.peers import AiortcPublisher
from tests.support.servers import normal_push, wait_for_type
from whip.appkeys import ICE_SOCKETS_KEY, SESSIONS_KEY, TIMELINE_KEY
from whip.live_session import LiveSession
from whip.rtc.pli import remote_media_ssrcs
from whip.rtc.rtp_guard import (
    MAX_SSRCS,
    SRTP_MAX_DATAGRAM,
    BoundedNackGenerator,
    RtpGuard,
    guards_of,
)
from whip.rtc.udp_mux import UdpMux
from whip.session_manager import SessionManager

KiB = 1024
MiB = 1024 * KiB
H264 = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)
FU_A_CHUNK = 1300
"""Payload bytes per FU-A packet of the oversized frames (aiortc's own packet size)."""
WAIT_S = 15
"""The bound of every wait for the server's side to catch up."""
RSS_SLACK = 24 * MiB
"""Memory outside the session's media reservation that a huge frame may cost: aiortc's
jitter buffer (512 RTP packets, each held twice: payload and depayloaded copy, about
1.5 MB), the partial frame it joins (up to 750 KB), FFmpeg's decoder and allocator noise.
The same process runs the publisher, whose encoder is warmed up before the baseline."""


@functools.cache
def _frames() -> tuple[tuple[bytes, ...], ...]:
    """90 frames of real H.264 (IDR at 0, 30, 60), packetized; encoded once per run."""
    return tuple(tuple(payloads) for payloads in h264_frames(90))


def _rejected_by_aiortc(payload: bytes) -> bool:
    try:
        depayload(H264, payload)
    except ValueError:
        return True
    return False


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KiB
    raise AssertionError("no VmRSS")


def _task_state(task: asyncio.Task[Any] | None) -> str:
    if task is None or not task.done():
        return "running" if task is not None else "none"
    return "cancelled" if task.cancelled() else f"ended: {task.exception()!r}"


@dataclass
class Push:
    """One hostile publisher's live session, seen from both ends."""

    server: TestServer
    http: aiohttp.ClientSession
    pub: HostilePublisher
    session: LiveSession
    wire0: int = 0
    acked0: int = 0

    @property
    def timeline(self) -> Timeline:
        return self.server.app[TIMELINE_KEY]

    def acked(self) -> int:
        """Packets the server has unprotected (the senders' flow control)."""
        assert self.session.liveness is not None
        return self.session.liveness.media_packets

    async def frames(self, stream: RtpStream, frames: Any) -> None:
        """Send whole frames, each once the server has taken everything sent before it
        and the decode worker has caught up (at most one frame queued): no frame meets a
        full queue, so drops stay exact."""
        for payloads in frames:
            await self.settled()
            await eventually(
                lambda: self.intake().depth <= 1,
                within=WAIT_S,
                awaiting=self.awaiting("the decode worker caught up (one frame queued at most)"),
                every=0.001,
            )
            await self.pub.send(stream.packets(payloads), self.acked)

    async def settled(self) -> None:
        """Wait until the server has unprotected every SRTP/SRTCP packet sent so far
        (packets are handled in order, to the end of aiortc's receive path)."""
        await eventually(
            lambda: self.acked() - self.acked0 >= self.pub.wire - self.wire0,
            within=WAIT_S,
            awaiting=self.awaiting("every packet sent so far unprotected"),
            every=0.001,
        )

    async def packets(self, packets: Any) -> None:
        await self.pub.send(packets, self.acked)

    def intake(self) -> FrameIntake:
        (video,) = [i for i in self.session.intakes if i.kind == "video"]
        return video

    def video(self) -> DecodeStats:
        assert self.session.supervisor is not None
        return self.session.supervisor.stats()["decode-video"]

    def receiver(self) -> Any:
        return next(t for t in self.session.pc.getTransceivers() if t.kind == "video").receiver

    def guard(self) -> RtpGuard:
        (guard,) = guards_of(t.receiver for t in self.session.pc.getTransceivers())
        return guard

    def awaiting(self, what: str) -> Callable[[], str]:
        """A wait's failure text: ``what`` it awaited, then :meth:`figures`."""
        return lambda: f"{what}; {self.figures()}"

    def figures(self) -> dict[str, object]:
        """Everything a failed wait should print."""
        return {
            "intake": self.intake().stats(),
            "decode": self.video().as_dict(),
            "guard": self.guard().counts(),
            "state": self.session.pc.connectionState,
            "rtcp": _task_state(self.receiver()._RTCRtpReceiver__rtcp_task),
        }

    async def api(self) -> dict[str, Any]:
        """``GET /v1/sessions/{id}``."""
        response = await self.http.get(self.server.make_url(f"/v1/sessions/{self.session_id}"))
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body

    async def metrics(self) -> dict[tuple[str, str], float]:
        """This session's ``/metrics`` samples: (sample name, reason label or "") -> value."""
        response = await self.http.get(self.server.make_url("/metrics"))
        assert response.status == 200
        found: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(await response.text()):
            for sample in family.samples:
                if sample.labels.get("session_id") == self.session_id:
                    found[(sample.name, sample.labels.get("reason", ""))] = sample.value
        return found

    async def process_counter(self, name: str, reason: str) -> float:
        """A process-wide ``/metrics`` sample with the ``reason`` label."""
        response = await self.http.get(self.server.make_url("/metrics"))
        assert response.status == 200
        for family in text_string_to_metric_families(await response.text()):
            for sample in family.samples:
                if sample.name == name and sample.labels == {"reason": reason}:
                    return sample.value
        raise AssertionError(f"no {name}{{reason={reason!r}}} in /metrics")

    @property
    def session_id(self) -> str:
        return self.session.session_id

    async def delete(self) -> list[Event]:
        """DELETE the session URL; every event of the run once ``session_closed`` is in."""
        response = await asyncio.wait_for(
            self.http.delete(self.server.make_url(self.pub.location)), 15
        )
        assert response.status == 200
        return await self.closed_events()

    async def closed_events(self, wait_s: float = 20) -> list[Event]:
        await wait_for_type(self.timeline, self.session.run_id, "session_closed", wait_s)
        return list(await self.timeline.read_events(self.session.run_id, 0, 1000))


@contextlib.asynccontextmanager
async def _hostile(
    server: TestServer, stream: str, *, audio: bool = False, video_mime: str = "video/H264"
) -> AsyncIterator[Push]:
    """A connected :class:`HostilePublisher` and its server session; closed on exit."""
    manager: SessionManager = server.app[SESSIONS_KEY]
    pub = HostilePublisher(audio=audio, video_mime=video_mime)
    try:
        async with aiohttp.ClientSession() as http:
            response = await pub.publish(http, str(server.make_url(f"/whip/{stream}")))
            assert response.status == 201, await response.text()
            await asyncio.wait_for(pub.connected.wait(), 15)
            session = manager.find_by_run(pub.run_id)
            assert session is not None and session.supervisor is not None
            push = Push(server, http, pub, session)
            await eventually(
                lambda: push.session.connected,
                within=WAIT_S,
                awaiting=push.awaiting("the session connected"),
            )
            push.wire0, push.acked0 = pub.wire, push.acked()
            yield push
    finally:
        await pub.close()


def _ice_datagrams_dropped(server: TestServer) -> int:
    """Datagrams the ICE routing dropped as unverified (either socket mode)."""
    sockets = server.app[ICE_SOCKETS_KEY]
    counters = sockets.routes.counters if isinstance(sockets, UdpMux) else sockets.route_counters
    return counters.dropped_total()


def _final_stats(events: list[Event]) -> dict[str, Any]:
    (final,) = [e.data for e in events if e.type == "stats" and e.data.get("final")]
    return dict(final)


def _closed_reason(events: list[Event]) -> list[object]:
    return [e.data.get("reason") for e in events if e.type == "session_closed"]


def _decode_threads(session: LiveSession) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith(session.session_id)]


async def _serves_a_normal_push(server: TestServer) -> None:
    """The server is still up: a well-behaved aiortc publisher is admitted, its first
    frame is decoded, and its session closes cleanly."""
    publisher = await normal_push(server, "normal")
    timeline: Timeline = server.app[TIMELINE_KEY]
    closed = await wait_for_type(timeline, publisher.run_id, "session_closed")
    assert closed.data == {"reason": "deleted"}
    manager: SessionManager = server.app[SESSIONS_KEY]
    assert manager.budget.figures().bytes_reserved == 0


@pytest.fixture
async def server(whip_servers: Callable[..., Awaitable[TestServer]]) -> TestServer:
    return await whip_servers()


# ---------------------------------------------------------------- 1. garbage payloads


async def test_garbage_payloads_are_counted_and_decoding_recovers(server: TestServer) -> None:
    """Random NAL units in a valid stream become decode errors (and a resync: drops,
    keyframe requests); random payloads aiortc cannot depayload are counted exactly as
    ``malformed``. Decoding resumes at the next IDR; nothing faults."""
    frames = _frames()
    rng = random.Random(6)
    # Garbage aiortc's depayloader takes: single NAL units of the slice, IDR slice, SPS
    # and PPS types with random bodies, in the stream's own sequence.
    nal_garbage = [
        [bytes([0x60 | rng.choice((1, 5, 7, 8))]) + rng.randbytes(rng.randrange(8, 1200))]
        for _ in range(40)
    ]
    # Random bytes: what aiortc's depayloader rejects is "malformed". They go on a second
    # SSRC (same payload type, same receiver) with its own sequence numbers, so that they
    # leave no hole in the first one's: a hole would stall aiortc's video for 512 packets
    # (whip/rtc/rtp_guard.py).
    noise = [rng.randbytes(rng.randrange(1, 1200)) for _ in range(120)]
    rejected = sum(_rejected_by_aiortc(p) for p in noise)
    assert 15 <= rejected <= 60  # about 7/32 of the NAL types, plus truncated STAP-A

    async with _hostile(server, "garbage") as push:
        good = push.pub.stream()
        await push.frames(good, frames[:30])
        await eventually(
            lambda: push.video().frames_decoded == 29,
            within=WAIT_S,
            awaiting=push.awaiting("29 frames decoded"),
        )
        await push.frames(good, nal_garbage)
        side = push.pub.stream(ssrc=0x51DE)
        await push.frames(side, ([p] for p in noise))
        await eventually(
            lambda: push.guard().rtp_malformed == rejected,
            within=WAIT_S,
            awaiting=push.awaiting("every malformed packet rejected"),
        )
        await eventually(
            lambda: push.video().decode_errors >= 1,
            within=WAIT_S,
            awaiting=push.awaiting("a decode error"),
        )
        errors = push.video().decode_errors
        decoded = push.video().frames_decoded
        # Back to well-formed media (IDR frames at 30 and 60): decoding resumes.
        await push.frames(good, frames[30:90])
        await push.settled()
        await eventually(
            lambda: push.video().frames_decoded >= decoded + 55,
            within=WAIT_S,
            awaiting=push.awaiting("55 more frames decoded"),
        )

        intake, video = push.intake().stats(), push.video()
        print(f"\ngarbage: rejected {rejected}; {push.figures()}")
        assert push.guard().counts() == {
            "datagram_refused": 0,
            "unroutable": 0,
            "ssrc_limit": 0,
            "malformed": rejected,
        }
        # The 40 garbage frames reached the intake (the last one, pending in aiortc's jitter
        # buffer when the SSRC switched, is lost: a jump that large resets the buffer).
        assert intake.frames_in >= 30 + 39 + 55
        assert intake.dropped_frames + video.skipped >= 1  # resync after the errors
        assert intake.keyframe_requests >= 1
        assert push.session.connected and push.session.pc.connectionState == "connected"
        (track,) = (await push.api())["tracks"]
        assert track["decode_errors"] >= errors >= 1
        assert track["frames_in"] == intake.frames_in
        assert track["worker_alive"] is True
        metrics = await push.metrics()
        assert metrics[("whip_session_rtp_discarded_total", "malformed")] == rejected
        assert metrics[("whip_session_rtp_discarded_total", "unroutable")] == 0

        events = await push.delete()
    final = _final_stats(events)
    assert final["decode_errors"] >= errors
    assert final["frames_decoded"] >= 29 + 55
    assert "worker_fault" not in [e.type for e in events]
    assert _closed_reason(events) == ["deleted"]
    await _serves_a_normal_push(server)


# ---------------------------------------------------------------- 2. wrong payload types


async def test_payload_types_nobody_negotiated_are_counted_not_decoded(
    server: TestServer,
) -> None:
    """Payload types not negotiated (or negotiated on the other m-line) are counted,
    packet for packet, as ``unroutable`` (aiortc used to drop them silently); none
    becomes a frame or an RTP statistic, and the stream goes on."""
    frames = _frames()
    async with _hostile(server, "wrong-pt", audio=True) as push:
        negotiated = push.pub.negotiated_payload_types
        # RFC 5761: 64-95 would read as RTCP on a muxed port; stay clear of them.
        wrong = [pt for pt in (0, 8, 9, 13, 34, 45, 100, 110, 120, 127) if pt not in negotiated]
        audio_pt = next(
            int(c.payloadType)
            for t in push.pub.pc.getTransceivers()
            if t.kind == "audio"
            for c in t._codecs
        )
        good = push.pub.stream()
        await push.frames(good, frames[:30])
        await eventually(
            lambda: push.video().frames_decoded == 29,
            within=WAIT_S,
            awaiting=push.awaiting("29 frames decoded"),
        )
        received = sum(len(f) for f in frames[:30])
        sent = 0
        # On the announced SSRC, continuing its sequence (SRTP refuses to go back).
        bad = RtpStream(good.ssrc, good.payload_type, good.sequence, good.timestamp)
        for pt in wrong:  # real H.264 under a payload type the answer never offered
            bad.payload_type = pt
            await push.frames(bad, frames[:10])
            sent += sum(len(f) for f in frames[:10])
        # The audio payload type on the video SSRC: negotiated, but on another m-line.
        bad.payload_type = audio_pt
        await push.frames(bad, frames[:5])
        sent += sum(len(f) for f in frames[:5])
        # An SSRC nobody announced, with a payload type no receiver takes: not learned.
        # (PCMU/PCMA/G722 on a new SSRC, which the audio receiver used to take although
        # the answer offered Opus only: test_g711_and_g722_on_a_new_ssrc_are_unroutable...)
        router = push.receiver().transport._rtp_router
        assert 127 not in router.payload_type_table
        await push.frames(push.pub.stream(ssrc=0xBAD5, payload_type=127), frames[:5])
        sent += sum(len(f) for f in frames[:5])
        await eventually(
            lambda: push.guard().rtp_unroutable == sent,
            within=WAIT_S,
            awaiting=push.awaiting("every packet counted unroutable"),
        )

        print(f"\nwrong payload types {wrong} + {audio_pt}: {sent} packets; {push.figures()}")
        assert push.intake().frames_in == 29  # not one of them became a frame
        assert 0xBAD5 not in remote_media_ssrcs(push.receiver())
        body = await push.api()
        assert body["packets_received"] == received  # aiortc counts routed packets only
        assert body["drops"] == 0 and body["tracks"][0]["decode_errors"] == 0
        assert body["rtp_discarded"]["unroutable"] == sent
        metrics = await push.metrics()
        assert metrics[("whip_session_rtp_discarded_total", "unroutable")] == sent
        assert await push.process_counter("whip_rtp_discarded_total", "unroutable") == sent
        # The stream goes on after a jump past aiortc's jitter buffer (512 packets): the
        # refused packets left a hole in its sequence that would otherwise hold it up.
        # Frame 29, still waiting there for the next frame to start, is lost with it.
        good.sequence = (bad.sequence + 600) & 0xFFFF
        await push.frames(good, frames[30:60])
        await eventually(
            lambda: push.video().frames_decoded == 58,
            within=WAIT_S,
            awaiting=push.awaiting("58 frames decoded"),
        )
        assert push.intake().frames_in == 58
        assert push.guard().counts()["unroutable"] == sent
        events = await push.delete()
        # Closed: the session's count moves into the process total, which keeps it.
        assert await push.process_counter("whip_rtp_discarded_total", "unroutable") == sent
    final = _final_stats(events)
    assert (final["frames_decoded"], final["decode_errors"], final["frames_dropped"]) == (58, 0, 0)
    assert _closed_reason(events) == ["deleted"]
    await _serves_a_normal_push(server)


# ---------------------------------------------------------------- 3. SSRCs and sequences


async def test_ssrc_changes_churn_and_sequence_jumps_are_bounded(server: TestServer) -> None:
    """An SSRC that stops mid-frame and a new one that takes over: decoding carries on
    without an error. Sequence numbers jumping 32767 per packet: NACK bookkeeping stays
    bounded. 80 SSRCs: all but the first MAX_SSRCS counted as ``ssrc_limit``, the
    server's receiver reports keep flowing and fitting, and the session still closes."""
    frames = _frames()
    async with _hostile(server, "ssrc") as push:
        a = push.pub.stream()
        await push.frames(a, frames[:30])
        # SSRC A stops mid-frame (half of IDR 30, no marker); an encoder restart follows
        # on SSRC B: new sequence numbers (far from A's) and timestamps, IDR first.
        await push.packets(a.packets(frames[30][: len(frames[30]) // 2], marker=False))
        b = RtpStream(0xB0B, a.payload_type, sequence=(a.sequence + 20000) & 0xFFFF)
        await push.frames(b, frames[30:90])
        await eventually(
            lambda: push.video().frames_decoded == 89,
            within=WAIT_S,
            awaiting=push.awaiting("89 frames decoded"),
        )
        assert push.intake().frames_in == 89  # A's cut frame never became one
        assert push.video().decode_errors == 0
        assert {a.ssrc, b.ssrc} <= set(remote_media_ssrcs(push.receiver()))

        # Sequence numbers that jump by 32767 on every packet (aiortc's NACK generator
        # would walk each gap: 14 ms of event loop per packet). On SSRC A, forward (SRTP
        # allows any forward jump).
        jumpy = RtpStream(a.ssrc, a.payload_type, a.sequence, a.timestamp)
        nack = push.receiver()._RTCRtpReceiver__nack_generator
        assert isinstance(nack, BoundedNackGenerator)
        jumps = []
        for _ in range(200):
            jumps.extend(jumpy.packets(frames[31]))
            jumpy.sequence = (jumpy.sequence + 32766) & 0xFFFF
        before = push.acked()
        await push.packets(jumps)
        await eventually(
            lambda: push.acked() >= before + len(jumps),
            within=WAIT_S,
            awaiting=push.awaiting("every jump taken by the server"),
        )
        assert len(nack.missing) <= 128
        assert push.session.pc.connectionState == "connected"

        # Churn: 80 SSRCs, one packet each (aiortc would remember every one of them; past
        # ~56 its receiver report overflows SRTCP and the session can no longer close).
        router = push.receiver().transport._rtp_router
        room = MAX_SSRCS - len(router.ssrc_table)
        churn = 80
        stream = push.pub.stream(ssrc=0x5000)
        for index in range(churn):
            stream.ssrc = 0x5000 + index
            await push.packets(stream.packets(frames[31]))
        refused = churn - room
        await eventually(
            lambda: push.guard().rtp_ssrc_refused == refused,
            within=WAIT_S,
            awaiting=push.awaiting("every extra SSRC refused"),
        )
        assert len(router.ssrc_table) == MAX_SSRCS
        reports = len(push.pub.receiver_reports)
        # The server's RTCP goes on, and each receiver report fits.
        await eventually(
            lambda: len(push.pub.receiver_reports) >= reports + 2,
            within=WAIT_S,
            awaiting=push.awaiting("two more receiver reports"),
        )
        assert max(push.pub.receiver_reports) <= MAX_SSRCS

        metrics = await push.metrics()
        assert metrics[("whip_session_rtp_discarded_total", "ssrc_limit")] == refused
        print(f"\nssrc: room {room}, refused {refused}; {push.figures()}")

        events = await push.delete()  # regression: this never finished (RTCP task died)
    assert _closed_reason(events) == ["deleted"]
    assert "worker_fault" not in [e.type for e in events]
    assert _final_stats(events)["frames_decoded"] >= 89
    assert not _decode_threads(push.session)
    await _serves_a_normal_push(server)


# ---------------------------------------------------------------- 4. huge frames, datagrams


def _fu_a(total: int, chunk: bytes) -> list[bytes]:
    """One IDR frame of about ``total`` bytes as FU-A fragments (start and end bits set)."""
    count = max(2, total // len(chunk))
    return [
        bytes([0x7C, (0x80 if i == 0 else 0) | (0x40 if i == count - 1 else 0) | 5]) + chunk
        for i in range(count)
    ]


async def test_huge_frames_are_dropped_as_oversized_within_the_reservation(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    """A 560 kB frame and a 6 MB one (over a 64 KiB payload limit) are each dropped and
    counted as oversized, the queue never holds more than its depth, RSS grows by less
    than the reservation plus a stated slack, and decoding resumes at the next IDR.
    Datagrams aiortc cannot take (empty, or SRTP-range over 1500 bytes; from anyone)
    are refused and counted and the session lives on."""
    depth, limit = 4, 64 * KiB
    server = await whip_servers(pipeline__queue_depth=depth, pipeline__payload_limit_bytes=limit)
    frames = _frames()
    chunk = random.Random(4).randbytes(FU_A_CHUNK)
    whole = _fu_a(560 * KiB, chunk)  # fits aiortc's jitter buffer (512 packets): one frame
    huge = _fu_a(6 * MiB, chunk)  # does not: the buffer slides, its tail becomes a frame
    assert len(whole) < 512 < len(huge)
    async with _hostile(server, "huge") as push:
        reservation = push.session.permit.nbytes
        assert reservation == depth * limit  # one video track
        good = push.pub.stream()
        await push.frames(good, frames[:30])
        await eventually(
            lambda: push.video().frames_decoded == 29,
            within=WAIT_S,
            awaiting=push.awaiting("29 frames decoded"),
        )
        baseline = peak = _rss()

        async def send_sampling(payloads: list[bytes]) -> None:
            nonlocal peak
            packets = good.packets(payloads)
            for start in range(0, len(packets), 64):
                await push.packets(packets[start : start + 64])
                peak = max(peak, _rss())

        await send_sampling(whole)
        await push.frames(good, frames[30:60])
        await send_sampling(huge)
        await push.frames(good, frames[60:90])
        await eventually(
            lambda: push.video().frames_decoded >= 88,
            within=WAIT_S,
            awaiting=push.awaiting("88 frames decoded"),
        )
        peak = max(peak, _rss())
        intake = push.intake().stats()
        growth = peak - baseline
        print(
            f"\nhuge frames: {len(whole)} + {len(huge)} packets of {FU_A_CHUNK} B; RSS "
            f"baseline {baseline / MiB:.1f} MiB, peak {peak / MiB:.1f} MiB, growth "
            f"{growth / MiB:.1f} MiB; reservation {reservation / MiB:.2f} MiB + slack "
            f"{RSS_SLACK / MiB:.0f} MiB; {intake}"
        )
        assert (intake.oversized_frames, intake.dropped_frames) == (2, 2)
        assert intake.dropped_bytes > 2 * limit
        assert intake.max_depth <= depth
        assert growth <= reservation + RSS_SLACK
        assert push.video().decode_errors == 0
        assert intake.keyframe_requests >= 1

        # Datagrams aiortc's DTLS transport cannot take (each used to end the session).
        # From a host no STUN check verified they never reach it: the ICE routing (the
        # shared port, or a per-session socket's table) drops them, counted; from the
        # peer's own socket, the RTP guard refuses the one aiortc cannot take.
        junk = random.Random(5).randbytes(9000)
        dropped_before = _ice_datagrams_dropped(server)
        push.pub.send_raw([b"", b"", b"\x80" + junk[:SRTP_MAX_DATAGRAM], b"\x90" + junk])
        push.pub.send_raw([b"\x81" + junk[:4000]], stranger=False)  # (asyncio sends no b"")
        push.pub.send_raw([b"\x80" + junk[: SRTP_MAX_DATAGRAM - 1]])  # fits; fails SRTP
        await eventually(
            lambda: _ice_datagrams_dropped(server) == dropped_before + 5,
            within=WAIT_S,
            awaiting=push.awaiting("5 unverified datagrams dropped by the ICE routing"),
        )
        await eventually(
            lambda: push.guard().datagrams_refused == 1,
            within=WAIT_S,
            awaiting=push.awaiting("1 datagram refused by the guard"),
        )
        tail = push.pub.stream(ssrc=0x7A11)  # still connected and decoding: a fresh IDR
        decoded = push.video().frames_decoded
        await push.frames(tail, frames[60:62])
        await eventually(
            lambda: push.video().frames_decoded == decoded + 1,
            within=WAIT_S,
            awaiting=push.awaiting("one more frame decoded"),
        )
        assert push.session.pc.connectionState == "connected"

        body = await push.api()
        assert body["drops"] == 2
        assert body["tracks"][0]["queue_max_depth"] <= body["tracks"][0]["queue_limit"] == depth
        metrics = await push.metrics()
        assert metrics[("whip_session_frames_oversized_total", "")] == 2
        assert metrics[("whip_session_frames_dropped_total", "")] == 2
        assert metrics[("whip_session_rtp_discarded_total", "datagram_refused")] == 1
        events = await push.delete()
    final = _final_stats(events)
    assert (final["frames_dropped"], final["decode_errors"]) == (2, 0)
    assert _closed_reason(events) == ["deleted"]
    await _serves_a_normal_push(server)


# ---------------------------------------------------------------- 5. stops mid-frame


async def test_a_publisher_that_stops_mid_frame_and_goes_silent_closes_cleanly(
    server: TestServer,
) -> None:
    """Half a frame, then silence: nothing is delivered or dropped, the session stays up,
    and a DELETE closes it with exact final counters."""
    frames = _frames()
    async with _hostile(server, "silent") as push:
        good = push.pub.stream()
        await push.frames(good, frames[:30])
        await push.packets(good.packets(frames[30][:5], marker=False))  # 5 of 13 packets
        await eventually(
            lambda: push.video().frames_decoded == 30,
            within=WAIT_S,
            awaiting=push.awaiting("30 frames decoded"),
        )
        # Silence. Two more receiver reports from the server: time passed, the loop ran.
        reports = len(push.pub.receiver_reports)
        await eventually(
            lambda: len(push.pub.receiver_reports) >= reports + 2,
            within=WAIT_S,
            awaiting=push.awaiting("two more receiver reports"),
        )
        intake = push.intake().stats()
        assert (intake.frames_in, intake.depth, intake.dropped_frames) == (30, 0, 0)
        assert push.session.pc.connectionState == "connected"
        events = await push.delete()
    final = _final_stats(events)
    assert (final["frames_in"], final["frames_decoded"]) == (30, 30)
    assert (final["frames_dropped"], final["decode_errors"]) == (0, 0)
    assert _closed_reason(events) == ["deleted"]
    assert not _decode_threads(push.session)
    await _serves_a_normal_push(server)


async def test_a_publisher_that_vanishes_mid_frame_is_reclaimed(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    """Half a frame, then the publisher's sockets close without a BYE: the server
    reclaims the session (``peer_gone``) after ``reclaim_after_s``, releases its permit
    and threads, and its final counters are exact."""
    server = await whip_servers(limits__reclaim_after_s=2)
    manager: SessionManager = server.app[SESSIONS_KEY]
    frames = _frames()
    async with _hostile(server, "vanish") as push:
        good = push.pub.stream()
        await push.frames(good, frames[:30])
        await push.packets(good.packets(frames[30][:5], marker=False))
        await eventually(
            lambda: push.video().frames_decoded == 30,
            within=WAIT_S,
            awaiting=push.awaiting("30 frames decoded"),
        )
        vanished = time.monotonic()
        push.pub.vanish()  # no RTCP BYE, no DTLS close_notify: just gone
        events = await push.closed_events()
        print(f"\nvanished: reclaimed after {time.monotonic() - vanished:.1f}s")
    assert _closed_reason(events) == ["peer_gone"]
    final = _final_stats(events)
    assert (final["frames_in"], final["frames_decoded"], final["decode_errors"]) == (30, 30, 0)
    assert manager.table.get(push.session_id) is None
    assert manager.budget.figures().bytes_reserved == 0
    assert not _decode_threads(push.session)
    assert push.session.state_history[-1] in ("closed", "failed")
    await _serves_a_normal_push(server)


# ---------------------------------------------------------------- the counters alone


def test_oversized_frames_are_counted_apart_from_full_queue_drops() -> None:
    intake = FrameIntake("video", depth=2, payload_limit=100)

    def frame(size: int, key: bool) -> EncodedFrame:
        return EncodedFrame("video", "H264", b"x" * size, 0, key, 0.0)

    assert intake.put(frame(50, True)) and intake.put(frame(50, False))
    assert not intake.put(frame(50, False))  # queue full: dropped, not oversized
    assert not intake.put(frame(101, True))  # oversized keyframe
    assert intake.get(0) is not None and intake.get(0) is not None
    assert not intake.put(frame(500, False))  # oversized, and in a drop episode anyway
    assert not intake.put(frame(50, False))  # drop episode
    assert intake.put(frame(100, True))  # exactly the limit fits and ends the episode
    stats = intake.stats()
    assert (stats.dropped_frames, stats.oversized_frames) == (4, 2)
    assert stats.dropped_bytes == 50 + 101 + 500 + 50


# ---------------------------------------------------------------- the NACK generator


def test_bounded_nack_generator_answers_like_aiortcs() -> None:
    """Same ``missing`` set and return value as aiortc's, packet by packet, over in-order
    runs, reordering, loss, wraps and jumps of every size; and a jump costs at most 128
    steps instead of up to 32767 (the cost is printed, not asserted)."""
    rng = random.Random(11)
    stock, bounded = NackGenerator(), BoundedNackGenerator()
    seq = rng.randrange(1 << 16)
    for _ in range(3000):  # aiortc's side costs up to 40 ms per big jump
        roll = rng.random()
        if roll < 0.6:
            step = 1
        elif roll < 0.75:
            step = rng.randrange(2, 20)  # loss
        elif roll < 0.85:
            step = -rng.randrange(1, 200)  # reordering, late packets
        elif roll < 0.99:
            step = rng.randrange(100, 1000)
        else:
            step = rng.randrange(1000, 1 << 16)  # jumps either way
        seq = (seq + step) & 0xFFFF
        packet = RtpPacket(sequence_number=seq)
        assert stock.add(packet) == bounded.add(packet)
        assert stock.missing == bounded.missing
        assert stock.max_seq == bounded.max_seq

    def cost(generator: NackGenerator) -> float:
        started, seq = time.perf_counter(), 0
        for _ in range(10):
            generator.add(RtpPacket(sequence_number=seq))
            seq = (seq + 32767) & 0xFFFF
        return (time.perf_counter() - started) / 10 * 1000

    print(
        f"\nNACK bookkeeping per 32767-jump packet: aiortc {cost(NackGenerator()):.2f} ms, "
        f"bounded {cost(BoundedNackGenerator()):.3f} ms"
    )


# ---------------------------------------------------------------- 6. codecs the answer left out


def _opus_payloads(count: int) -> list[bytes]:
    """``count`` Opus packets (20 ms of stereo silence each, aiortc's own encoder)."""
    import fractions

    import av
    import numpy as np
    from aiortc.codecs.opus import OpusEncoder

    encoder, payloads = OpusEncoder(), []
    while len(payloads) < count:
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 960 * 2), dtype=np.int16), format="s16", layout="stereo"
        )
        frame.sample_rate = 48000
        frame.pts, frame.time_base = 960 * len(payloads), fractions.Fraction(1, 48000)
        payloads.extend(encoder.encode(frame)[0])
    return payloads[:count]


async def test_g711_and_g722_on_a_new_ssrc_are_unroutable_when_the_answer_offered_opus(
    server: TestServer,
) -> None:
    """The publisher offers Opus, G722, PCMU and PCMA; the answer accepts Opus only, and
    so does the server's audio transceiver (aiortc kept every codec both sides support,
    so PCMU/PCMA/G722 on an SSRC nobody announced used to reach the audio receiver and
    be decoded). Each such packet is counted ``unroutable`` and none becomes a frame;
    Opus on a new SSRC still routes (payload-type routing itself works) and decodes."""
    async with _hostile(server, "g711", audio=True) as push:
        offered = {int(c.payloadType) for c in CODECS["audio"]}
        assert {0, 8, 9} <= offered  # aiortc's publisher offers them (and Opus)
        transceivers = {t.kind: t for t in push.session.pc.getTransceivers()}
        audio_codecs = transceivers["audio"]._codecs
        assert [c.mimeType for c in audio_codecs] == ["audio/opus"]
        assert [c.mimeType for c in transceivers["video"]._codecs] == ["video/H264"]
        opus_pt = int(audio_codecs[0].payloadType)
        router = push.receiver().transport._rtp_router
        await eventually(
            lambda: bool(router.payload_type_table),
            within=WAIT_S,
            awaiting=push.awaiting("the payload type table built"),
        )
        # Exactly the answer's payload types are routed (audio: Opus; video: H.264).
        assert set(router.payload_type_table) == {opus_pt, push.pub.video_payload_type}
        answer = push.session.pc.localDescription.sdp
        assert "PCMU" not in answer and "PCMA" not in answer and "G722" not in answer

        audio_receiver = transceivers["audio"].receiver
        (audio_intake,) = [i for i in push.session.intakes if i.kind == "audio"]
        assert push.session.supervisor is not None

        def audio_stats() -> DecodeStats:
            assert push.session.supervisor is not None
            return push.session.supervisor.stats()["decode-audio"]

        sent = 0
        for ssrc, pt, payload in (
            (0x0711, 0, b"\xff" * 160),  # PCMU: 20 ms of mu-law silence
            (0x0712, 8, b"\xd5" * 160),  # PCMA: 20 ms of A-law silence
            (0x0722, 9, b"\x00" * 160),  # G722
        ):
            stream = push.pub.stream(ssrc=ssrc, payload_type=pt)
            for _ in range(25):  # far past the audio jitter buffer's prefetch (4 frames)
                await push.packets(stream.packets([payload]))
            sent += 25
        await push.settled()
        await eventually(
            lambda: push.guard().rtp_unroutable == sent,
            within=WAIT_S,
            awaiting=push.awaiting("every packet counted unroutable"),
        )
        assert audio_intake.stats().frames_in == 0  # not one of them became a frame
        assert (audio_stats().frames_in, audio_stats().frames_decoded) == (0, 0)
        assert {0x0711, 0x0712, 0x0722}.isdisjoint(router.ssrc_table)
        assert {0x0711, 0x0712, 0x0722}.isdisjoint(remote_media_ssrcs(audio_receiver))
        metrics = await push.metrics()
        assert metrics[("whip_session_rtp_discarded_total", "unroutable")] == sent

        # Opus on a new SSRC: routed by its payload type, learned, decoded.
        opus = push.pub.stream(ssrc=0x0915, payload_type=opus_pt)
        for payload in _opus_payloads(25):
            await push.packets(opus.packets([payload]))
        await push.settled()
        await eventually(
            lambda: audio_stats().frames_decoded >= 1,
            within=WAIT_S,
            awaiting=push.awaiting("an audio frame decoded"),
        )
        print(f"\ng711/g722: {sent} unroutable; audio {audio_stats().as_dict()}")
        assert router.ssrc_table.get(0x0915) is audio_receiver
        assert audio_stats().codec == "opus" and audio_stats().decode_errors == 0
        assert push.guard().counts() == {
            "datagram_refused": 0,
            "unroutable": sent,
            "ssrc_limit": 0,
            "malformed": 0,
        }
        events = await push.delete()
    assert _closed_reason(events) == ["deleted"]
    assert "worker_fault" not in [e.type for e in events]


# ---------------------------------------------------------------- 7. pictures over max_pixels


async def test_pictures_over_max_pixels_are_decode_errors_not_faults(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> None:
    """``pipeline.max_pixels`` reaches the session's decoder: a 320x176 stream against a
    bound one pixel smaller is never decoded, each IDR counted as a decode error (the P
    frames skipped), and the session stays up and closes cleanly."""
    server = await whip_servers(pipeline__max_pixels=320 * 176 - 1)
    frames = _frames()  # 320x176, IDR at 0, 30 and 60
    async with _hostile(server, "max-pixels") as push:
        good = push.pub.stream()
        await push.frames(good, frames[:62])  # frame 61 completes IDR 60 (jitter buffer)
        await push.settled()
        await eventually(
            lambda: push.video().decode_errors == 3,
            within=WAIT_S,
            awaiting=push.awaiting("3 decode errors"),
        )
        video = push.video()
        print(f"\nmax_pixels: {video.as_dict()}")
        assert (video.frames_decoded, video.width) == (0, None)
        assert push.session.pc.connectionState == "connected"
        (track,) = (await push.api())["tracks"]
        assert track["decode_errors"] == 3 and track["worker_alive"] is True
        events = await push.delete()
    assert "worker_fault" not in [e.type for e in events]
    assert "first_frame" not in [e.type for e in events]
    assert _final_stats(events)["decode_errors"] == 3
    assert _closed_reason(events) == ["deleted"]


async def test_a_section_the_answer_rejects_gets_no_receiver(server: TestServer) -> None:
    """Audio offered as PCMU only: the answer rejects the section (port 0), and the
    server's audio transceiver is inactive: aiortc never starts its receiver (no payload
    type of it is routed) and it gets no intake or decode worker, which the session's
    media permit (one track) never paid for. It used to receive PCMU all the same."""
    manager: SessionManager = server.app[SESSIONS_KEY]
    publisher = AiortcPublisher()
    publisher.pc.addTransceiver(VideoStreamTrack(), direction="sendonly")
    audio = publisher.pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
    pcmu = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType == "audio/PCMU"]
    audio.setCodecPreferences(pcmu)
    try:
        await publisher.pc.setLocalDescription(await publisher.pc.createOffer())
        async with aiohttp.ClientSession() as http:
            response = await http.post(
                server.make_url("/whip/pcmu-only"),
                data=publisher.pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
            answer = await response.text()
            assert response.status == 201, answer
            media = [line for line in answer.splitlines() if line.startswith("m=")]
            assert media[1] == "m=audio 0 UDP/TLS/RTP/SAVPF 0"
            session = manager.find_by_run(response.headers["X-Run-Id"])
            assert session is not None
            directions = [(t.kind, t.currentDirection) for t in session.pc.getTransceivers()]
            assert directions == [("video", "recvonly"), ("audio", "inactive")]
            assert [intake.kind for intake in session.intakes] == ["video"]
            assert session.permit.nbytes == manager.config.pipeline.media_bytes(1)
            delete = await http.delete(server.make_url(response.headers["Location"]))
            assert delete.status == 200
    finally:
        await publisher.close()
