"""Live-session figures (:mod:`whip.live_stats`): one reading, for every reader.

Through a real server on 127.0.0.1 and a real aiortc publisher (video + audio), pinned
here as the module docstring states them:

- ``GET /v1/sessions`` (and ``GET /v1/sessions/{id}``) answer exactly
  :meth:`SessionFigures.to_json` of :func:`read_figures` (same keys, same values);
- ``fps`` and ``bitrate_bps`` are those of ``session.analysis.track_rates(kind)``, the
  one definition (rounded fps, null while not measurable); the summary's are the first
  video track's fps and the sum of the tracks' bitrates;
- ``jitter_ms`` is milliseconds: aiortc's RTP-unit jitter divided by the codec clock
  (90 kHz video, 48 kHz audio); the session's is its worst track's;
- ``/metrics`` ``whip_session_frames_decoded`` is the same reading's ``frames_decoded``,
  and the process counter ``whip_frames_decoded`` is the closed totals plus the live;
- once the session closes, :class:`ClosedTotals` holds its figures: the process counter
  does not drop.

The figures move with every decoded frame, so the publisher's tracks are stopped first
(its connection stays up) and each comparison is made inside a bracket of two readings
that agree: nothing moved while the server answered.

Checked to fail (then restored): with ``GET /v1/sessions`` answering anything but
``to_json`` (one figure overwritten), the shape test fails; with ``to_json``'s ``"fps"``
taken from the last track instead of the first video one, and with ``fps`` not rounded,
the rates test fails; with the jitter divided by 90 000 for every kind, the jitter test
fails; with ``/metrics`` counting only the first track of a session, and with
``add_closed`` not adding ``frames_decoded``, the metrics test fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from tests.support.peers import AiortcPublisher
from tests.support.servers import wait_for_type
from whip.appkeys import SESSIONS_KEY, TIMELINE_KEY
from whip.live_session import LiveSession
from whip.live_stats import SessionFigures, read_figures
from whip.session_manager import SessionManager

CLOCK_HZ = {"video": 90_000, "audio": 48_000}
"""RTP clocks of VP8 and Opus (RFC 7741, RFC 7587)."""
STABLE_ATTEMPTS = 50
STATS_INTERVAL_S = 0.5
"""The first ``stats`` event (both tracks' rates measurable) comes this soon."""
CONNECT_WAIT_S = 15.0


@dataclass
class Live:
    server: TestServer
    http: aiohttp.ClientSession
    publisher: AiortcPublisher
    manager: SessionManager
    session: LiveSession

    @property
    def base(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def get_json(self, path: str) -> Any:
        async with self.http.get(f"{self.base}{path}") as response:
            assert response.status == 200, await response.text()
            return await response.json()


@pytest.fixture
async def live(
    whip_servers: Callable[..., Awaitable[TestServer]],
) -> AsyncIterator[Live]:
    """A connected publisher whose video and audio have been decoded, then stopped
    (the peer stays connected, the figures stop moving)."""
    server = await whip_servers(pipeline__stats_interval_s=STATS_INTERVAL_S)
    manager = server.app[SESSIONS_KEY]
    timeline = server.app[TIMELINE_KEY]
    publisher = AiortcPublisher()
    async with aiohttp.ClientSession() as http:
        try:
            response = await publisher.publish(http, str(server.make_url("/whip/main")))
            assert response.status == 201
            async with asyncio.timeout(CONNECT_WAIT_S):
                await publisher.connected.wait()
            await wait_for_type(timeline, publisher.run_id, "first_frame")
            await wait_for_type(timeline, publisher.run_id, "stats")
            session = manager.table.get(publisher.location.rsplit("/", 1)[1])
            assert session is not None
            for sender in publisher.pc.getSenders():
                if sender.track is not None:
                    sender.track.stop()
            yield Live(server, http, publisher, manager, session)
        finally:
            await publisher.close()


def comparable(figures: SessionFigures) -> dict[str, Any]:
    """The reading as ``GET /v1/sessions`` shows it, less its age (time moves)."""
    shown = figures.to_json()
    del shown["age_s"]
    return shown


async def steady(
    live: Live, answer: Callable[[], Awaitable[Any]]
) -> tuple[SessionFigures, Any, dict[str, tuple[float, int, float]]]:
    """``answer()`` bracketed by two readings (figures and the analysis's rates) that
    agree; returns the reading, the answer and the rates."""
    analysis = live.session.analysis
    assert analysis is not None
    for _ in range(STABLE_ATTEMPTS):
        before = await read_figures(live.session)
        rates = {kind: analysis.track_rates(kind) for kind in ("video", "audio")}
        got = await answer()
        after = await read_figures(live.session)
        again = {kind: analysis.track_rates(kind) for kind in ("video", "audio")}
        if comparable(before) == comparable(after) and rates == again:
            return after, got, rates
    raise AssertionError(f"the figures never held still over {STABLE_ATTEMPTS} readings")


Sample = tuple[str, dict[str, str], float]


async def scrape(live: Live) -> list[Sample]:
    """Every sample of ``/metrics`` (parsed by ``prometheus_client``, which wrote it)."""
    async with live.http.get(f"{live.base}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The one sample of ``name`` with exactly ``labels``."""
    [found] = [v for n, got, v in samples if n == name and got == labels]
    return found


def of_session(samples: list[Sample], name: str, session: LiveSession) -> float:
    return value(
        samples,
        name,
        session_id=session.session_id,
        run_id=session.run_id,
        principal=session.principal,
    )


async def test_sessions_answer_the_one_reading(live: Live) -> None:
    figures, listing, _ = await steady(live, lambda: live.get_json("/v1/sessions"))
    [item] = listing["items"]
    expected = figures.to_json()
    assert set(item) == set(expected)
    assert [set(t) for t in item["tracks"]] == [set(t) for t in expected["tracks"]]
    assert {k: v for k, v in item.items() if k != "age_s"} == comparable(figures)
    assert listing["next"] is None
    assert [t["kind"] for t in item["tracks"]] == ["video", "audio"]
    assert item["connected"] is True and item["state"] == "connected"

    figures, one, _ = await steady(
        live, lambda: live.get_json(f"/v1/sessions/{live.session.session_id}")
    )
    assert {k: v for k, v in one.items() if k != "age_s"} == comparable(figures)


async def test_fps_and_bitrate_are_the_analysis_track_rates(live: Live) -> None:
    _, listing, rates = await steady(live, lambda: live.get_json("/v1/sessions"))
    [item] = listing["items"]
    tracks = {t["kind"]: t for t in item["tracks"]}
    for kind, (fps, bits, window) in rates.items():
        assert window > 0, f"{kind}: no rate measured yet"
        assert (tracks[kind]["fps"], tracks[kind]["bitrate_bps"]) == (round(fps, 2), bits)
    assert tracks["video"]["fps"] > 0 and tracks["audio"]["bitrate_bps"] > 0
    assert item["fps"] == tracks["video"]["fps"]
    assert item["bitrate_bps"] == tracks["video"]["bitrate_bps"] + tracks["audio"]["bitrate_bps"]


async def test_jitter_is_milliseconds(live: Live) -> None:
    async def raw_jitter() -> dict[str, float]:
        found = {}
        for transceiver in live.session.pc.getTransceivers():
            for entry in (await transceiver.receiver.getStats()).values():
                if getattr(entry, "type", None) == "inbound-rtp":
                    found[str(entry.kind)] = float(entry.jitter)
        return found

    figures, raw, _ = await steady(live, raw_jitter)
    assert set(raw) == {"video", "audio"}
    assert any(units > 0 for units in raw.values()), "no jitter measured: nothing to convert"
    shown = figures.to_json()
    tracks = {t["kind"]: t for t in shown["tracks"]}
    for kind, units in raw.items():
        assert tracks[kind]["jitter_ms"] == round(units * 1000 / CLOCK_HZ[kind], 3)
    assert shown["jitter_ms"] == max(t["jitter_ms"] for t in tracks.values())


async def test_metrics_count_the_same_reading_and_keep_it_after_the_close(live: Live) -> None:
    figures, metrics, _ = await steady(live, lambda: scrape(live))
    assert figures.frames_decoded > 0
    session_decoded = of_session(metrics, "whip_session_frames_decoded_total", live.session)
    assert session_decoded == figures.frames_decoded
    assert of_session(metrics, "whip_session_bytes_in_total", live.session) == figures.bytes_in
    totals = live.manager.totals
    decoded_before_close = value(metrics, "whip_frames_decoded_total")
    assert decoded_before_close == totals.frames_decoded + figures.frames_decoded
    closed_before = totals.frames_decoded

    async with live.http.delete(f"{live.base}{live.publisher.location}") as response:
        assert response.status == 200
    assert len(live.manager.table) == 0
    assert totals.frames_decoded - closed_before >= figures.frames_decoded
    assert totals.inbound_bytes >= figures.bytes_in
    after_close = await scrape(live)
    assert not [s for s in after_close if s[0] == "whip_session_frames_decoded_total"]
    decoded_after_close = value(after_close, "whip_frames_decoded_total")
    assert decoded_after_close == totals.frames_decoded
    assert decoded_after_close >= decoded_before_close
