"""Simulcast receive: one video receiver, several RID layers, each told apart and measured;
the layer ``pipeline.simulcast`` names is the one aiortc's receive path sees.

aiortc 1.16 has one jitter buffer, one NACK generator and one timestamp mapper per
receiver, keyed by nothing: packets of several SSRCs in one receiver interleave into
garbage frames. :func:`install_simulcast` puts a :class:`SimulcastDemux` in front of the
receiver's ``_handle_rtp_packet`` (outside :mod:`whip.rtc.rtp_guard`'s wrapper and the
tap), so exactly one layer's packets reach it.

Rules:

- **Which layer a packet is.** By the RTP stream id header extension (RFC 8852) while the
  sender includes it, which binds that SSRC to the layer; by the repaired stream id for
  RTX, which binds the RTX SSRC; by SSRC once bound. Works with or without ``a=ssrc``
  lines (OBS 32.1 sends none). A later SSRC for a layer replaces the earlier one (an
  encoder restart), counted in ``ssrc_changes``.
- **Bounded.** Only offered RIDs are accepted (the offer itself is bounded by
  :data:`whip.sdp.simulcast.MAX_LAYERS`): a packet naming another RID is dropped and
  counted (``unknown_rid``), so is a packet of an SSRC no RID ever named
  (``unknown_ssrc``). The SSRC table holds at most two entries per offered layer.
- **Which layer is decoded.** ``all``: every layer through its own
  :class:`whip.rtc.layer_path.LayerPath` into its own intake (:meth:`decode_all`);
  aiortc's receive path gets none. ``highest`` / ``lowest``: one layer at a time through
  aiortc's receive path, ranked by its picture size (read from the RTP payloads by
  :mod:`whip.rtc.layer_size`: VP8 and VP9 keyframes, H.264/H.265 SPSs, AV1 sequence
  headers; 0 until one arrived) then by its bitrate.
  The first choice waits until every unpaused offered layer has sent and can be ranked
  (a size, or one :data:`RATE_WINDOW_S` of bitrate), at most :data:`STARTUP_WAIT_S`
  after the first packet. A layer is **stopped** after
  :data:`STOP_AFTER_S` without a packet, and **active** again on its next packet.
  Hysteresis: when the decoded layer stops, the best active layer is decoded at once;
  a better layer than the decoded one takes over only after it has been active for
  :data:`SWITCH_UP_AFTER_S` without a stop, and only when it is clearly better (a larger
  picture; at equal or unknown sizes a bitrate past :data:`BITRATE_MARGIN` times). A
  switch resets aiortc's jitter buffer and NACK generator (nothing of the old layer can
  be completed) and asks the new layer for a keyframe (PLI).
- **One timeline across switches.** Each layer has its own random RTP timestamp base;
  the receiver's timestamp mapper is a :class:`whip.rtc.rtp_timestamps.FrameTimestamps`,
  and a switch starts a new one after the old layer's highest frame time plus the wall
  time since that layer's last packet (90 kHz). The decoded track's timestamps so keep
  growing (the linting's order check, recording and the analyzers see one stream). Every
  stop, resume and switch is logged and reported through ``on_change(kind, data)`` (the
  session writes it as a ``simulcast_layer`` event; a stopped layer is not a fault).
- **Keyframe requests** go to decoded layers only: a PLI (aiortc's, the intake's) for the
  SSRC of a layer that is not decoded is withheld and counted (``pli_withheld``); a
  browser would otherwise encode a keyframe on every layer for each request.

aiortc private names touched (:func:`internals_problems` verifies each):

- ``RTCRtpReceiver._handle_rtp_packet`` and ``._send_rtcp_pli`` (shadowed per instance),
  ``.__jitter_buffer``, ``.__nack_generator`` (replaced with new instances of their own
  classes on a switch), ``.__timestamp_mapper`` (on a switch, by the next
  :class:`whip.rtc.rtp_timestamps.FrameTimestamps`), ``.__rtx_ssrc`` (RTX
  SSRC -> media SSRC, filled as RTX SSRCs are learned), ``._send_rtcp_pli(media_ssrc)``
- ``RtpPacket.extensions.rtp_stream_id`` / ``.repaired_rtp_stream_id`` (parsed when the
  transceiver's header extensions name the URIs: ``RTCRtpTransceiver._headerExtensions``)

Threads: everything runs on the event loop thread; ``figures`` may be read from any
thread (a list of small dicts built from plain ints and floats).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import aiortc.jitterbuffer
import aiortc.rtcrtpreceiver
import aiortc.rtp
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters

from whip.rtc.layer_path import LayerPath, Sink
from whip.rtc.layer_size import SizeReader, size_reader
from whip.rtc.rtp_timestamps import MAPPER_ATTRIBUTE, install_frame_timestamps
from whip.sdp.simulcast import REPAIRED_RID_URI, RID_URI, SIMULCAST_URIS, SimulcastOffer

logger = logging.getLogger(__name__)

STOP_AFTER_S = 1.0
"""Silence after which a layer counts as stopped."""
SWITCH_UP_AFTER_S = 2.0
"""How long a better layer must stay active before it replaces the decoded one."""
STARTUP_WAIT_S = 1.5
"""How long the first choice waits for every unpaused layer to send and be ranked (a
size read from the payloads, or a first bitrate window)."""
RATE_WINDOW_S = 1.0
CHECK_EVERY_S = 0.05
"""Stops and the layer choice are evaluated at most this often (on a packet's arrival),
and on every packet until a first layer is chosen."""

_RECEIVER = aiortc.rtcrtpreceiver.RTCRtpReceiver
_JITTER = "_RTCRtpReceiver__jitter_buffer"
_NACK = "_RTCRtpReceiver__nack_generator"
_RTX = "_RTCRtpReceiver__rtx_ssrc"
_CODECS = "_RTCRtpReceiver__codecs"
_MARK = "_whip_ingest_simulcast"

Handler = Callable[..., Coroutine[Any, Any, None]]
ChangeSink = Callable[[str, dict[str, object]], object]


@dataclass(slots=True)
class Layer:
    """One offered RID and what arrived on it (loop thread writes, anyone reads)."""

    rid: str
    paused_at_start: bool
    ssrc: int | None = None
    rtx_ssrc: int | None = None
    width: int | None = None
    height: int | None = None
    packets: int = 0
    bytes_in: int = 0
    frames_in: int = 0
    last_packet: float | None = None
    active_since: float | None = None
    stopped: bool = False
    window_start: float = 0.0
    window_frames: int = 0
    window_bytes: int = 0
    fps: float = 0.0
    bitrate_bps: int = 0

    def rank(self) -> tuple[int, int]:
        return ((self.width or 0) * (self.height or 0), self.bitrate_bps)

    def account(self, payload_bytes: int, marker: bool, now: float) -> None:
        self.packets += 1
        self.bytes_in += payload_bytes
        if marker:
            self.frames_in += 1
        if self.last_packet is None or self.stopped:
            self.active_since = now
            self.window_start = now
            self.window_frames = self.frames_in
            self.window_bytes = self.bytes_in
        self.last_packet = now
        elapsed = now - self.window_start
        if elapsed >= RATE_WINDOW_S:
            self.fps = round((self.frames_in - self.window_frames) / elapsed, 2)
            self.bitrate_bps = int((self.bytes_in - self.window_bytes) * 8 / elapsed)
            self.window_start = now
            self.window_frames = self.frames_in
            self.window_bytes = self.bytes_in


class SimulcastDemux:
    """The RID demultiplexer of one receiver (module rules). Loop thread."""

    def __init__(
        self,
        receiver: Any,
        offer: SimulcastOffer,
        mode: str,
        label: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.receiver = receiver
        self.mode = mode
        self.label = label
        self.clock = clock
        self.layers = {rid: Layer(rid, rid in offer.paused) for rid in offer.rids}
        self._by_ssrc: dict[int, tuple[Layer, bool]] = {}
        self.decoding: str | None = None
        self.switches = 0
        self.unknown_rid = 0
        self.unknown_ssrc = 0
        self.ssrc_changes = 0
        self.on_change: ChangeSink | None = None
        self._first_packet: float | None = None
        self._checked_at = float("-inf")
        self._inner: Handler | None = None
        self.pli_withheld = 0
        """Keyframe requests for a layer nobody decodes, not sent (module rules)."""
        self.paths: dict[str, LayerPath] = {}
        """``all``: each layer's own receive path (:meth:`decode_all`)."""
        self._size_readers: dict[int, SizeReader | None] = {}
        """Per payload type whose codec is known (at most 128 entries)."""

    def decode_all(self, sinks: dict[str, Sink]) -> None:
        """``all``: every layer of ``sinks`` gets its own :class:`LayerPath` into its sink;
        aiortc's own receive path then gets no packet. Call before media flows."""
        for rid, sink in sinks.items():
            if rid in self.layers:
                self.paths[rid] = LayerPath(self.receiver, rid, sink, self.label)

    def wants_keyframe_from(self, ssrc: int) -> bool:
        """False for the SSRC of a layer that is not decoded (``highest``/``lowest``)."""
        bound = self._by_ssrc.get(ssrc)
        return bool(self.paths) or bound is None or bound[0].rid == self.decoding

    async def send_layer_pli(self, rid: str) -> int:
        """Ask layer ``rid`` for a keyframe; 1 when its SSRC is known, else 0."""
        layer = self.layers.get(rid)
        if layer is None or layer.ssrc is None:
            return 0
        await self.receiver._send_rtcp_pli(layer.ssrc)
        return 1

    # -- classification -------------------------------------------------------------
    def _bind(self, layer: Layer, ssrc: int, rtx: bool) -> None:
        old = layer.rtx_ssrc if rtx else layer.ssrc
        if old == ssrc:
            return
        if old is not None:
            self.ssrc_changes += 1
            self._by_ssrc.pop(old, None)
        previous = self._by_ssrc.get(ssrc)
        if previous is not None:  # the SSRC moved to another layer: unbind it there
            other, other_rtx = previous
            if other_rtx:
                other.rtx_ssrc = None
            else:
                other.ssrc = None
        self._by_ssrc[ssrc] = (layer, rtx)
        if rtx:
            layer.rtx_ssrc = ssrc
        else:
            layer.ssrc = ssrc
        if layer.ssrc is not None and layer.rtx_ssrc is not None:
            rtx_table = getattr(self.receiver, _RTX, None)
            if isinstance(rtx_table, dict):
                rtx_table[layer.rtx_ssrc] = layer.ssrc
        kind = "RTX" if rtx else "media"
        logger.info("session %s: simulcast layer %s: %s SSRC %d", self.label, layer.rid, kind, ssrc)

    def classify(self, packet: Any) -> Layer | None:
        """The layer of ``packet`` (binding SSRCs as RIDs name them), or None: dropped."""
        extensions = packet.extensions
        rid = extensions.rtp_stream_id
        repaired = extensions.repaired_rtp_stream_id
        named = rid if rid is not None else repaired
        if named is not None:
            layer = self.layers.get(named)
            if layer is None:
                self.unknown_rid += 1
                if self.unknown_rid == 1:
                    logger.warning(
                        "session %s: RTP names RID %r, never offered (dropped, counted)",
                        self.label,
                        named[:16],
                    )
                return None
            self._bind(layer, packet.ssrc, rid is None)
            return layer
        bound = self._by_ssrc.get(packet.ssrc)
        if bound is None:
            self.unknown_ssrc += 1
            if self.unknown_ssrc == 1:
                logger.warning(
                    "session %s: RTP of SSRC %d without a RID (dropped, counted)",
                    self.label,
                    packet.ssrc,
                )
            return None
        return bound[0]

    # -- the handler ----------------------------------------------------------------
    async def handle(self, packet: Any, arrival_time_ms: int) -> None:
        """Stands in for the receiver's ``_handle_rtp_packet`` (module rules)."""
        layer = self.classify(packet)
        if layer is None:
            return
        now = self.clock()
        if self._first_packet is None:
            self._first_packet = now
        is_rtx = packet.ssrc == layer.rtx_ssrc
        if not is_rtx:
            if layer.stopped:
                layer.stopped = False
                self._report("layer_resumed", layer)
            layer.account(len(packet.payload), bool(packet.marker), now)
            if packet.payload:
                read_size = self._size_reader(packet.payload_type)
                size = read_size(packet.payload) if read_size is not None else None
                if size is not None:
                    layer.width, layer.height = size
        due = now - self._checked_at >= CHECK_EVERY_S
        if due:
            self._checked_at = now
            self._detect_stops(now)
        if self.paths:
            path = self.paths.get(layer.rid)
            if path is not None:
                await path.handle(packet, layer.ssrc)
            return
        switch_to = self._choose(now) if due or self.decoding is None else None
        if switch_to is not None:
            await self._switch(switch_to)
        if layer.rid == self.decoding and self._inner is not None:
            await self._inner(packet, arrival_time_ms=arrival_time_ms)

    def _size_reader(self, payload_type: int) -> SizeReader | None:
        """The layer size reader of ``payload_type``'s codec (cached once it is known)."""
        if payload_type in self._size_readers:
            return self._size_readers[payload_type]
        codec = getattr(self.receiver, _CODECS, {}).get(payload_type)
        if codec is None:
            return None
        reader = size_reader(codec.mimeType, codec.parameters)
        self._size_readers[payload_type] = reader
        return reader

    def _detect_stops(self, now: float) -> None:
        for layer in self.layers.values():
            if (
                not layer.stopped
                and layer.last_packet is not None
                and now - layer.last_packet >= STOP_AFTER_S
            ):
                layer.stopped = True
                self._report("layer_stopped", layer)

    def _choose(self, now: float) -> Layer | None:
        """The layer to switch to now, or None (module rules: hysteresis)."""
        active = [
            layer
            for layer in self.layers.values()
            if layer.last_packet is not None and not layer.stopped
        ]
        if not active:
            return None
        pick = max if self.mode != "lowest" else min
        current = self.layers.get(self.decoding) if self.decoding is not None else None
        if current is None:
            waiting = [
                layer for layer in self.layers.values()
                if layer.last_packet is None and not layer.paused_at_start
            ]  # fmt: skip
            assert self._first_packet is not None
            unranked = any(layer.rank() == (0, 0) for layer in active)
            if (waiting or unranked) and now - self._first_packet < STARTUP_WAIT_S:
                return None
            return pick(active, key=Layer.rank)
        if current.stopped:
            return pick(active, key=Layer.rank)
        settled = [
            layer for layer in active
            if layer is current or (
                layer.active_since is not None and now - layer.active_since >= SWITCH_UP_AFTER_S
            )
        ]  # fmt: skip
        best = pick(settled, key=Layer.rank)
        if best is current:
            return None
        ahead, behind = (best, current) if self.mode != "lowest" else (current, best)
        return best if _clearly_above(ahead, behind) else None

    async def _switch(self, layer: Layer) -> None:
        previous = self.decoding
        self.decoding = layer.rid
        if previous is not None:
            self.switches += 1
            receiver = self.receiver
            for name in (_JITTER, _NACK):
                old = getattr(receiver, name, None)
                if old is not None:
                    setattr(receiver, name, _fresh(old))
            mapper = install_frame_timestamps(receiver)
            before = self.layers.get(previous)
            quiet_since = before.last_packet if before is not None else None
            elapsed = self.clock() - quiet_since if quiet_since is not None else 0.0
            setattr(receiver, MAPPER_ATTRIBUTE, mapper.following(elapsed))
        logger.info(
            "session %s: simulcast decodes layer %s (was %s)", self.label, layer.rid, previous
        )
        self._report("layer_decoded", layer, previous=previous)
        if layer.ssrc is not None:
            try:
                await self.receiver._send_rtcp_pli(layer.ssrc)
            except ConnectionError:
                logger.debug("session %s: PLI on a closing transport", self.label)

    def _report(self, kind: str, layer: Layer, **extra: object) -> None:
        if kind != "layer_decoded":
            logger.info("session %s: simulcast layer %s %s", self.label, layer.rid, kind[6:])
        if self.on_change is None:
            return
        try:
            decoding = sorted(self.paths) if self.paths else self.decoding
            self.on_change(kind, {"rid": layer.rid, **extra, "decoding": decoding})
        except Exception:
            logger.exception("session %s: simulcast change sink failed", self.label)

    def figures(self) -> list[dict[str, object]]:
        """Per-layer figures, in the offer's order (``stats`` and ``GET /v1/sessions``)."""
        now = self.clock()
        out: list[dict[str, object]] = []
        for layer in self.layers.values():
            fresh = layer.last_packet is not None and now - layer.last_packet < STOP_AFTER_S
            out.append(
                {
                    "rid": layer.rid,
                    "width": layer.width,
                    "height": layer.height,
                    "fps": layer.fps if fresh else 0.0,
                    "bitrate_bps": layer.bitrate_bps if fresh else 0,
                    "frames_in": layer.frames_in,
                    "decoding": layer.rid == self.decoding or layer.rid in self.paths,
                }
            )
        return out

    def counters(self) -> dict[str, int]:
        return {
            "unknown_rid": self.unknown_rid,
            "unknown_ssrc": self.unknown_ssrc,
            "ssrc_changes": self.ssrc_changes,
            "switches": self.switches,
            "pli_withheld": self.pli_withheld,
        }


BITRATE_MARGIN = 1.5
"""Layers of one size (or of unknown sizes) rank by bitrate only past this ratio, so two
layers of close bitrates do not take turns."""


def _clearly_above(upper: Layer, lower: Layer) -> bool:
    """True when ``upper`` ranks above ``lower`` by size, or by bitrate past the margin."""
    upper_pixels, upper_bits = upper.rank()
    lower_pixels, lower_bits = lower.rank()
    if upper_pixels != lower_pixels:
        return upper_pixels > lower_pixels
    return upper_bits > lower_bits * BITRATE_MARGIN


def _fresh(old: Any) -> Any:
    """A new instance like ``old`` (aiortc's jitter buffer keeps its capacity and kind)."""
    if isinstance(old, aiortc.jitterbuffer.JitterBuffer):
        return aiortc.jitterbuffer.JitterBuffer(
            capacity=old._capacity, prefetch=old._prefetch, is_video=old._is_video
        )
    return type(old)()


def install_simulcast(
    transceiver: Any, offer: SimulcastOffer, mode: str, label: str
) -> SimulcastDemux:
    """Demultiplex ``transceiver``'s receiver by RID (module rules).

    Call after ``setRemoteDescription`` and after :func:`whip.rtc.tap.install_tap` (the
    demux wraps the guarded, tapped handler), before ``createAnswer`` (the answer's
    ``a=extmap`` lines come from the header extensions added here).
    """
    extensions = [e for e in transceiver._headerExtensions if e.uri not in SIMULCAST_URIS]
    taken = {e.id for e in extensions}
    for uri in SIMULCAST_URIS:
        number = offer.extension_id(uri)
        if number is not None and number not in taken:
            extensions.append(RTCRtpHeaderExtensionParameters(id=number, uri=uri))
            taken.add(number)
    transceiver._headerExtensions = extensions
    receiver = transceiver.receiver
    demux = SimulcastDemux(receiver, offer, mode, label)
    demux._inner = receiver._handle_rtp_packet
    receiver._handle_rtp_packet = demux.handle
    install_frame_timestamps(receiver)
    send_pli = receiver._send_rtcp_pli

    async def send_rtcp_pli(media_ssrc: int) -> None:
        if demux.wants_keyframe_from(media_ssrc):
            await send_pli(media_ssrc)
        else:
            demux.pli_withheld += 1

    receiver._send_rtcp_pli = send_rtcp_pli
    setattr(receiver, _MARK, demux)
    return demux


def simulcast_of(receiver: Any) -> SimulcastDemux | None:
    """The demux :func:`install_simulcast` put on ``receiver``, if any."""
    found = getattr(receiver, _MARK, None)
    return found if isinstance(found, SimulcastDemux) else None


def simulcast_figures(receivers: Iterable[Any]) -> list[dict[str, object]] | None:
    """The per-layer figures of the first simulcast receiver among ``receivers``, or None."""
    for receiver in receivers:
        demux = simulcast_of(receiver)
        if demux is not None:
            return demux.figures()
    return None


def simulcast_counters(receivers: Iterable[Any]) -> dict[str, int] | None:
    """The demux counters of the first simulcast receiver among ``receivers``, or None."""
    for receiver in receivers:
        demux = simulcast_of(receiver)
        if demux is not None:
            return demux.counters()
    return None


def internals_problems() -> list[str]:
    """What the demux relies on that moved (:func:`whip.rtc.compat.check_internals`)."""
    problems: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    init = inspect.getsource(_RECEIVER.__init__)
    for name in ("__jitter_buffer", "__nack_generator", "__timestamp_mapper", "__rtx_ssrc"):
        need(f"self.{name}" in init, f"RTCRtpReceiver.{name}")
    handle = inspect.getsource(_RECEIVER._handle_rtp_packet)
    need("self.__rtx_ssrc.get(packet.ssrc)" in handle, "_handle_rtp_packet unwraps RTX by SSRC")
    need(callable(getattr(_RECEIVER, "_send_rtcp_pli", None)), "RTCRtpReceiver._send_rtcp_pli")
    buffer = aiortc.jitterbuffer.JitterBuffer(capacity=8, prefetch=0, is_video=True)
    need(
        all(hasattr(buffer, n) for n in ("_capacity", "_prefetch", "_is_video")),
        "JitterBuffer._capacity/_prefetch/_is_video",
    )
    extensions = aiortc.rtp.HeaderExtensionsMap()
    extensions.configure(
        aiortc.RTCRtpParameters(
            headerExtensions=[
                RTCRtpHeaderExtensionParameters(id=10, uri=RID_URI),
                RTCRtpHeaderExtensionParameters(id=11, uri=REPAIRED_RID_URI),
            ]
        )
    )
    parsed = extensions.get(0xBEDE, bytes([0xA0, 0x66, 0xB0, 0x68]))
    need(parsed.rtp_stream_id == "f", "HeaderExtensionsMap parses rtp-stream-id")
    need(parsed.repaired_rtp_stream_id == "h", "HeaderExtensionsMap parses repaired-rtp-stream-id")
    return problems
