"""Transport-wide congestion control feedback, receiver side: arrivals in, RTCP out. Sans-IO.

The format is draft-holmer-rmcat-transport-wide-cc-extensions-01: every RTP packet of the
bundle carries a 16-bit transport-wide sequence number (header extension
:data:`TRANSPORT_CC_URI`); the receiver reports, in RTCP transport-layer feedback packets
(RTPFB, PT 205, FMT 15), which of those packets arrived and when. The sender's estimator
(Chromium's GoogCC) turns the arrival pattern into its bandwidth estimate.

Rules:

- **Who owns what.** A :class:`FeedbackRecorder` belongs to one DTLS transport (with BUNDLE,
  one session) and is used from the event loop thread only: :meth:`FeedbackRecorder.record`
  per packet, :meth:`FeedbackRecorder.build` on the feedback timer. Nothing here does I/O,
  reads a clock or logs; the adapter (:mod:`whip.rtc.congestion`) does.
- **Time.** Arrival times are integer microseconds on any monotonic clock. The wire unit is
  250 us (a *tick*): an arrival is reported as ``arrival_us // 250`` ticks, exactly, and
  reference times are ticks // 256 (64 ms), modulo 2**24, as the draft says.
- **Sequence numbers.** 16-bit numbers are unwrapped against the highest seen (a step of
  more than 32767 either way reads as the other direction, as RTP's rule goes). The first
  arrival of a number counts; a duplicate is ignored (``duplicates``).
- **What a build reports.** Every sequence number from the first not yet reported to the
  highest received: received ones with their arrival, the rest as lost. A packet that
  arrives after its number was reported lost (reordering across a feedback) moves the start
  back, and the next build reports that span again with what is known now. After a build
  the recorder keeps the last :data:`REORDER_WINDOW` numbers before the reported point and
  forgets the rest: a packet numbered below what it kept is dropped (``too_late``), so a
  span reported again never calls a packet lost that was reported received.
- **Splitting.** One build may make several packets: a new one starts when a receive delta
  does not fit 16 signed bits (over 8.19 s between two reported arrivals) and before a
  packet would pass :data:`MAX_FEEDBACK_BYTES`. Each packet's first received arrival sets its
  reference time, so the first delta always fits a small (1-byte) delta.
- **Bounded.** At most :data:`MAX_SPAN` numbers are reported per build (older unreported
  ones are given up: ``given_up``), and the recorder holds at most ``MAX_SPAN +
  REORDER_WINDOW`` arrivals, whatever arrives and whether or not anybody builds.
- **Feedback packet count.** One 8-bit counter per recorder, incremented per packet built.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

TRANSPORT_CC_URI = "http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01"
"""The RTP header extension carrying the transport-wide sequence number."""

RTCP_RTPFB = 205
"""RTCP packet type: transport layer feedback (RFC 4585)."""
TRANSPORT_CC_FMT = 15
"""RTPFB feedback message type of a transport-wide feedback packet."""

TICK_US = 250
"""The receive delta unit."""
TICKS_PER_REFERENCE = 256
"""Ticks per unit of the reference time (64 ms)."""
REFERENCE_MODULO = 1 << 24

NOT_RECEIVED, SMALL_DELTA, LARGE_DELTA = 0, 1, 2
"""Packet status symbols (two bits on the wire; 3 is reserved)."""

MAX_RUN = (1 << 13) - 1
"""Longest run a run-length chunk holds."""
MAX_FEEDBACK_BYTES = 1200
"""Largest feedback packet built (before SRTCP's trailer), so one fits any path's MTU."""
MAX_SPAN = 8192
"""Most sequence numbers one build reports (also under the 16-bit status count)."""
REORDER_WINDOW = 256
"""How far behind the reported point a late packet may still be reported (about 1.5 s of
720p video; libwebrtc keeps 500 ms)."""

_HEADER_BYTES = 20
_ONE_BIT_CAPACITY = 14
_TWO_BIT_CAPACITY = 7
_SEQ_OFFSET = 1 << 20
"""Added to the first unwrapped number, so a packet older than the first stays positive."""


@dataclass(frozen=True, slots=True)
class RecorderCounts:
    """What a recorder saw besides reportable arrivals."""

    recorded: int
    duplicates: int
    too_late: int
    given_up: int


class _ChunkWriter:
    """Packet status symbols in, 16-bit status chunks out, greedily.

    The pending symbols are held until they cannot grow into one chunk: all the same
    (a run-length chunk, up to :data:`MAX_RUN`), or mixed (a status vector: up to 14
    one-bit symbols with no large delta, or 7 two-bit ones). :attr:`chunk_count` is
    exact at every step (the pending symbols always close into one chunk), which is what
    the builder's size check needs.
    """

    __slots__ = ("_mixed", "_same", "_symbol", "chunks")

    def __init__(self) -> None:
        self.chunks: list[int] = []
        self._same = 0
        """How many pending symbols, while they are all ``_symbol`` (``_mixed`` empty)."""
        self._symbol = NOT_RECEIVED
        self._mixed: list[int] = []
        """The pending symbols once they differ (at most 14)."""

    @property
    def chunk_count(self) -> int:
        return len(self.chunks) + (1 if self._same or self._mixed else 0)

    def add(self, symbol: int, count: int = 1) -> None:
        while count > 0:
            if not self._mixed and (self._same == 0 or symbol == self._symbol):
                if self._same == MAX_RUN:
                    self._flush()
                    continue
                taken = min(count, MAX_RUN - self._same)
                self._symbol = symbol
                self._same += taken
                count -= taken
            elif self._can_mix(symbol):
                if not self._mixed:
                    self._mixed = [self._symbol] * self._same
                    self._same = 0
                self._mixed.append(symbol)
                count -= 1
            else:
                self._flush()

    def _can_mix(self, symbol: int) -> bool:
        size = len(self._mixed) if self._mixed else self._same
        if size < _TWO_BIT_CAPACITY:
            return True
        if size >= _ONE_BIT_CAPACITY or symbol == LARGE_DELTA:
            return False
        # 8 to 14 symbols fit only a one-bit vector: no large delta among them.
        if self._mixed:
            return LARGE_DELTA not in self._mixed
        return self._symbol != LARGE_DELTA

    def _flush(self) -> None:
        """Close what is pending into chunks, keeping any tail that can still grow."""
        if not self._mixed:
            if self._same:
                self.chunks.append((self._symbol << 13) | self._same)
                self._same = 0
            return
        mixed = self._mixed
        if len(mixed) == _ONE_BIT_CAPACITY:  # (never holds a large delta: _can_mix)
            self.chunks.append(_one_bit_vector(mixed))
            self._mixed = []
            return
        self.chunks.append(_two_bit_vector(mixed[:_TWO_BIT_CAPACITY]))
        rest = mixed[_TWO_BIT_CAPACITY:]
        self._mixed = []
        for symbol in rest:
            self.add(symbol)

    def finish(self) -> list[int]:
        """Every chunk, the pending symbols closed into the last one."""
        if self._mixed:
            mixed = self._mixed
            if LARGE_DELTA in mixed:
                self.chunks.append(_two_bit_vector(mixed))
            else:
                self.chunks.append(_one_bit_vector(mixed))
            self._mixed = []
        elif self._same:
            self.chunks.append((self._symbol << 13) | self._same)
            self._same = 0
        return self.chunks


def status_chunks(symbols: list[int]) -> list[int]:
    """The 16-bit status chunks the builder writes for ``symbols`` (the greedy rule of
    :class:`_ChunkWriter`)."""
    writer = _ChunkWriter()
    for symbol in symbols:
        writer.add(symbol)
    return writer.finish()


def _one_bit_vector(symbols: list[int]) -> int:
    chunk = 0x8000
    for i, symbol in enumerate(symbols):
        chunk |= symbol << (13 - i)
    return chunk


def _two_bit_vector(symbols: list[int]) -> int:
    chunk = 0xC000
    for i, symbol in enumerate(symbols):
        chunk |= symbol << (12 - 2 * i)
    return chunk


class _Draft:
    """One feedback packet being built: statuses from ``base`` on, and their deltas."""

    __slots__ = ("base", "count", "delta_bytes", "deltas", "last_tick", "reference", "writer")

    def __init__(self, base: int) -> None:
        self.base = base
        self.count = 0
        self.writer = _ChunkWriter()
        self.deltas: list[int] = []
        self.delta_bytes = 0
        self.reference: int | None = None
        self.last_tick = 0

    def size_after(self, extra_chunks: int, extra_delta_bytes: int) -> int:
        chunks = self.writer.chunk_count + extra_chunks
        raw = _HEADER_BYTES + 2 * chunks + self.delta_bytes + extra_delta_bytes
        return (raw + 3) & ~3

    def delta_for(self, tick: int) -> int:
        if self.reference is None:
            return tick - (tick // TICKS_PER_REFERENCE) * TICKS_PER_REFERENCE
        return tick - self.last_tick

    def lost(self, count: int) -> None:
        self.writer.add(NOT_RECEIVED, count)
        self.count += count

    def received(self, tick: int) -> None:
        delta = self.delta_for(tick)
        if self.reference is None:
            self.reference = tick // TICKS_PER_REFERENCE
        symbol = SMALL_DELTA if _is_small(delta) else LARGE_DELTA
        self.writer.add(symbol)
        self.deltas.append(delta)
        self.delta_bytes += 1 if symbol == SMALL_DELTA else 2
        self.last_tick = tick
        self.count += 1

    def encode(self, sender_ssrc: int, media_ssrc: int, feedback_count: int) -> bytes:
        chunks = self.writer.finish()
        body = bytearray(
            struct.pack(
                "!IIHHI",
                sender_ssrc,
                media_ssrc,
                self.base & 0xFFFF,
                self.count,
                ((self.reference or 0) % REFERENCE_MODULO) << 8 | (feedback_count & 0xFF),
            )
        )
        for chunk in chunks:
            body += chunk.to_bytes(2, "big")
        for delta in self.deltas:
            if _is_small(delta):
                body.append(delta)
            else:
                body += delta.to_bytes(2, "big", signed=True)
        padding = -(4 + len(body)) % 4
        if padding:
            body += bytes(padding - 1) + bytes([padding])
        words = (4 + len(body)) // 4 - 1
        first = 0x80 | (0x20 if padding else 0) | TRANSPORT_CC_FMT
        return struct.pack("!BBH", first, RTCP_RTPFB, words) + bytes(body)


def _is_small(delta: int) -> bool:
    """A delta that fits one unsigned byte (symbol :data:`SMALL_DELTA`)."""
    return 0 <= delta <= 0xFF


def _fits_large(delta: int) -> bool:
    return -0x8000 <= delta <= 0x7FFF


class FeedbackRecorder:
    """Arrivals of one transport's transport-wide sequence numbers, and the feedback
    packets that report them (module doc). Event loop thread only."""

    __slots__ = (
        "_arrivals",
        "_duplicates",
        "_feedback_count",
        "_floor",
        "_given_up",
        "_highest",
        "_recorded",
        "_report_from",
        "_too_late",
    )

    def __init__(self, feedback_count: int = 0) -> None:
        self._arrivals: dict[int, int] = {}
        """Unwrapped sequence number -> arrival (us), first arrival only."""
        self._highest: int | None = None
        self._report_from = 0
        self._floor = 0
        """Every arrival numbered from here on is held; one below it is too late."""
        self._feedback_count = feedback_count & 0xFF
        self._recorded = 0
        self._duplicates = 0
        self._too_late = 0
        self._given_up = 0

    @property
    def counts(self) -> RecorderCounts:
        return RecorderCounts(self._recorded, self._duplicates, self._too_late, self._given_up)

    @property
    def held(self) -> int:
        """Arrivals held now (at most ``MAX_SPAN + REORDER_WINDOW``)."""
        return len(self._arrivals)

    @property
    def pending(self) -> bool:
        """True when a build would make at least one packet."""
        return self._highest is not None and self._report_from <= self._highest

    def record(self, sequence_number: int, arrival_us: int) -> None:
        """One RTP packet with transport-wide ``sequence_number`` (16 bits) arrived."""
        highest = self._highest
        if highest is None:
            seq = _SEQ_OFFSET + sequence_number
            self._highest = self._report_from = seq
        else:
            step = (sequence_number - highest) & 0xFFFF
            seq = highest + (step - 0x10000 if step >= 0x8000 else step)
            if seq < self._floor or seq <= highest - MAX_SPAN:
                self._too_late += 1
                return
        arrivals = self._arrivals
        if seq in arrivals:
            self._duplicates += 1
            return
        arrivals[seq] = arrival_us
        self._recorded += 1
        if highest is None:
            return
        if seq > highest:
            self._highest = highest = seq
            self._give_up(highest - MAX_SPAN + 1)
        elif seq < self._report_from:
            self._report_from = seq
        if len(arrivals) > MAX_SPAN + REORDER_WINDOW:
            # Nobody builds: give up the older half of the span at once (amortized cost).
            self._give_up(highest - MAX_SPAN // 2 + 1)
            self._forget_before(self._report_from)

    def _give_up(self, oldest: int) -> None:
        """Never report the numbers before ``oldest`` that are not reported yet."""
        if self._report_from < oldest:
            self._given_up += oldest - self._report_from
            self._report_from = oldest

    def _forget_before(self, seq: int) -> None:
        """Forget every arrival before ``seq``; a packet numbered below it is too late."""
        self._floor = max(self._floor, seq)
        self._arrivals = {s: t for s, t in self._arrivals.items() if s >= self._floor}

    def build(self, sender_ssrc: int, media_ssrc: int) -> list[bytes]:
        """The feedback packets reporting everything not reported yet (module doc); an
        empty list when nothing arrived since the last build."""
        highest = self._highest
        if highest is None or self._report_from > highest:
            return []
        start = self._report_from
        received = sorted(s for s in self._arrivals if start <= s <= highest)
        drafts: list[_Draft] = []
        draft = _Draft(start)
        next_seq = start
        for seq in received:
            tick = self._arrivals[seq] // TICK_US
            lost = seq - next_seq
            delta = draft.delta_for(tick)
            # A lost run adds at most 2 chunks (closing a vector, then the run), the
            # packet itself at most 1 more.
            too_big = draft.size_after(3 if lost else 1, 2) > MAX_FEEDBACK_BYTES
            if draft.count and (too_big or not _fits_large(delta)):
                drafts.append(draft)
                draft = _Draft(next_seq)
            if lost:
                draft.lost(lost)
            draft.received(tick)
            next_seq = seq + 1
        drafts.append(draft)
        self._report_from = highest + 1
        packets = []
        for done in drafts:
            packets.append(done.encode(sender_ssrc, media_ssrc, self._feedback_count))
            self._feedback_count = (self._feedback_count + 1) & 0xFF
        self._forget_before(self._report_from - REORDER_WINDOW)
        return packets
