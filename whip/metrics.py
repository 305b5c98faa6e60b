"""``GET /metrics``: Prometheus text exposition, computed at scrape time.

Nothing is incremented on hot paths for this module: gauges are read from the live
objects (session table, budget, WAL queue, snapshot), counters from the totals the
owners already keep (:class:`~whip.session_manager.SessionManager` ``totals``/``admissions``,
the WAL's :class:`~registry.wal.WalStats`, the timeline's ``event_counts``), histograms
from :class:`registry.histogram.Histogram`. Each app has its own ``CollectorRegistry``
(tests run several apps in one process). Per-session series exist only for live
sessions, so they disappear when the session closes (bounded cardinality).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from registry.histogram import Histogram
from registry.timeline import Timeline
from whip.admission import ADMISSION_OUTCOMES
from whip.appkeys import ICE_SOCKETS_KEY, LIMITER_KEY, METRICS_KEY, REGISTRY_KEY
from whip.live_stats import SessionFigures, read_figures
from whip.ratelimit import RequestLimiter
from whip.rtc.session_sockets import SessionSockets
from whip.rtc.udp_mux import UdpMux
from whip.rtc.udp_mux_routes import DropReason
from whip.session_manager import SessionManager

if TYPE_CHECKING:
    from registry.pg.timeline import ClusterTimeline

PREFIX = "whip_"


def _histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    reading = histogram.read()
    buckets = [
        (repr(b) if b != int(b) else f"{b:g}", c)
        for b, c in zip(reading.bounds, reading.cumulative, strict=False)
    ]
    buckets.append(("+Inf", reading.count))
    return HistogramMetricFamily(PREFIX + name, doc, buckets=buckets, sum_value=reading.total)


class ServerCollector(Collector):
    """Reads the server's state at scrape time; ``live`` is refreshed by the handler."""

    def __init__(
        self,
        manager: SessionManager,
        timeline: Timeline | ClusterTimeline,
        limiter: RequestLimiter | None = None,
        ice_sockets: UdpMux | SessionSockets | None = None,
    ) -> None:
        self.manager = manager
        self.timeline = timeline
        self.limiter = limiter
        self.ice_sockets = ice_sockets
        self.live: list[SessionFigures] = []

    def collect(self) -> Iterator[Metric]:
        yield from self._gauges()
        yield from self._counters()
        yield from self._ice_udp()
        yield from self._histograms()
        yield from self._per_session()
        yield from self._ice_tcp()

    def _ice_udp(self) -> Iterator[Metric]:
        """The ICE sockets: the shared port's routing table (``ice.udp_mux``) or the
        per-session sockets' tables, one set of figures either way."""
        sockets = self.ice_sockets
        if sockets is None:
            return
        if isinstance(sockets, UdpMux):
            routes = sockets.routes.counters.as_dict()
            learned, registered = sockets.routes.learned_addresses, sockets.registered_sessions
        else:
            routes = sockets.route_counters.as_dict()
            learned, registered = sockets.addresses_learned, sockets.registered_sessions
        yield GaugeMetricFamily(
            PREFIX + "ice_udp_sessions_registered",
            "sessions whose ICE credentials route datagrams",
            value=registered,
        )
        yield GaugeMetricFamily(
            PREFIX + "ice_udp_addresses_learned",
            "remote addresses verified by a STUN check and routed by address",
            value=learned,
        )
        routed = CounterMetricFamily(
            PREFIX + "ice_udp_datagrams_routed",
            "datagrams routed to a session: by a learned address, or after a verified check",
            labels=["by"],
        )
        routed.add_metric(["learned"], routes["routed_by_address"])
        routed.add_metric(["verified"], routes["routed_verified"])
        yield routed
        dropped = CounterMetricFamily(
            PREFIX + "ice_udp_datagrams_dropped",
            "datagrams from unverified addresses or failing verification, by reason",
            labels=["reason"],
        )
        for reason in DropReason:
            dropped.add_metric([reason.value], routes["dropped_" + reason.value])
        yield dropped
        addresses = CounterMetricFamily(
            PREFIX + "ice_udp_address_changes",
            "learned addresses: new, moved to another session, evicted by a cap",
            labels=["change"],
        )
        for change, field in (
            ("learned", "addresses_learned"),
            ("rebound", "addresses_rebound"),
            ("evicted_session_cap", "evicted_session_cap"),
            ("evicted_table_cap", "evicted_table_cap"),
        ):
            addresses.add_metric([change], routes[field])
        yield addresses
        for name, doc, value in (
            (
                "ice_delivery_errors",
                "routed datagrams aioice raised on (dropped)",
                sockets.counters.delivery_errors,
            ),
            (
                "ice_selected_pair_moves",
                "selected ICE pairs moved to a publisher's new address (NAT rebinding)",
                sockets.counters.selected_pair_moves,
            ),
            (
                "ice_udp_ports_exhausted",
                "sessions refused: no free port in ice.port_min..port_max",
                sockets.counters.ports_exhausted,
            ),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)

    def _cluster(self, timeline: ClusterTimeline) -> Iterator[Metric]:
        """Cluster mode's figures: the store, the group commit, the lease."""
        lease, committer = timeline.lease, timeline.committer
        for name, doc, value in (
            ("cluster_nodes_live", "nodes holding a lease (at the last renewal)", lease.live_nodes),
            ("cluster_lease_held", "1 while this node holds its lease", int(lease.held)),
            ("cluster_commit_queue_depth", "appends waiting for the store", committer.queue_depth),
        ):
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        for name, doc, value in (
            ("cluster_lease_renewals", "lease renewals", lease.renewals),
            ("cluster_lease_failures", "failed lease renewals", lease.renewal_failures),
            ("cluster_fenced", "times this node fenced itself", lease.fenced_count),
            (
                "cluster_runs_reaped",
                "run_interrupted this node wrote for dead nodes",
                lease.reaped_runs,
            ),
            ("cluster_events_dropped", "analyzer events dropped (buffer full)", committer.dropped),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        for name, doc, histogram in (
            ("cluster_store_round_trip_seconds", "one read from the store", timeline.round_trip),
            ("cluster_commit_seconds", "one group commit's transaction", committer.commit_latency),
            ("cluster_confirm_seconds", "append to committed", committer.confirm_latency),
            ("cluster_batch_events", "events per group commit", committer.batch_sizes),
        ):
            yield _histogram(name, doc, histogram)

    def _gauges(self) -> Iterator[Metric]:
        manager, timeline = self.manager, self.timeline
        budget = manager.budget.figures()
        for name, doc, value in (
            ("sessions_live", "live WHIP sessions", len(manager.table)),
            ("sessions_max", "session cap", manager.table.max_sessions),
            ("media_budget_bytes_reserved", "media budget bytes reserved", budget.bytes_reserved),
            ("media_budget_bytes_total", "media budget bytes", budget.bytes_total),
            ("media_budget_threads_reserved", "decode threads reserved", budget.threads_reserved),
            ("media_budget_threads_total", "decode threads budget", budget.threads_total),
            ("forced_shutdown_bytes_kept", "bytes kept by forced shutdowns", budget.bytes_kept),
            (
                "forced_shutdown_threads_kept",
                "threads kept by forced shutdowns",
                budget.threads_kept,
            ),
        ):
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        if not isinstance(timeline, Timeline):
            yield from self._cluster(timeline)
            return
        for name, doc, value in (
            (
                "stream_slots_in_use",
                "active runs plus reservations in flight",
                timeline.runs.count_active_runs() + manager.slots.reserved(),
            ),
            ("wal_queue_depth", "events waiting for the WAL writer", timeline.wal.queue_depth),
            ("warm_runs", "runs with a warm tail", len(timeline.snapshot.tails)),
            ("wal_broken", "1 when the WAL refuses appends", int(timeline.wal.broken is not None)),
            (
                "recording_bytes",
                "bytes of complete recording segments on disk",
                manager.recordings.store.total_bytes,
            ),
            ("recordings_live", "sessions being recorded now", len(manager.recordings.recorders)),
        ):
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)

    def _counters(self) -> Iterator[Metric]:
        manager, timeline = self.manager, self.timeline
        admissions = CounterMetricFamily(
            PREFIX + "admissions", "WHIP POSTs by outcome", labels=["outcome"]
        )
        for outcome in ADMISSION_OUTCOMES:
            admissions.add_metric([outcome], manager.admissions.get(outcome, 0))
        yield admissions
        if isinstance(timeline, Timeline):
            yield from self._wal_counters(timeline)
        live = self.live
        totals = manager.totals
        for name, doc, value in (
            (
                "frames_decoded",
                "decoded frames",
                totals.frames_decoded + sum(s.frames_decoded for s in live),
            ),
            (
                "frames_dropped",
                "encoded frames dropped by full intakes",
                totals.frames_dropped + sum(s.frames_dropped for s in live),
            ),
            (
                "frames_oversized",
                "encoded frames dropped for exceeding the payload limit",
                totals.frames_oversized + sum(s.frames_oversized for s in live),
            ),
            (
                "decode_errors",
                "decode errors",
                totals.decode_errors + sum(s.decode_errors for s in live),
            ),
            (
                "inbound_bytes",
                "encoded media bytes received",
                totals.inbound_bytes + sum(s.bytes_in for s in live),
            ),
            (
                "rtp_packets_lost",
                "RTP packets lost (receiver reports)",
                totals.rtp_packets_lost + sum(s.packets_lost for s in live),
            ),
            ("worker_faults", "decode worker faults", totals.worker_faults),
            (
                "requests_rate_limited",
                "requests answered 429",
                self.limiter.refused if self.limiter is not None else 0,
            ),
            (
                "request_body_timeouts",
                "requests answered 408 (slow body)",
                self.limiter.body_timeouts if self.limiter is not None else 0,
            ),
            (
                "forced_shutdowns",
                "sessions whose workers missed the join deadline",
                totals.forced_shutdowns,
            ),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        discarded = CounterMetricFamily(
            PREFIX + "rtp_discarded",
            "datagrams and RTP packets that never reached a frame, by reason",
            labels=["reason"],
        )
        for reason, count in totals.rtp_discarded.items():
            discarded.add_metric([reason], count + sum(s.rtp_discarded[reason] for s in live))
        yield discarded
        payload = CounterMetricFamily(
            PREFIX + "rtp_payload_errors",
            "H.265/AV1/VP9 packets and frames the depacketizer refused, by codec and reason",
            labels=["codec", "reason"],
        )
        errors = dict(totals.rtp_payload_errors)
        for s in live:
            for codec, reasons in s.rtp_payload_errors.items():
                for reason, count in reasons.items():
                    errors[(codec, reason)] = errors.get((codec, reason), 0) + count
        for (codec, reason), count in sorted(errors.items()):
            payload.add_metric([codec, reason], count)
        yield payload
        closed = CounterMetricFamily(
            PREFIX + "sessions_closed",
            "closed sessions by session_closed reason",
            labels=["reason"],
        )
        for reason, count in totals.closed_by_reason.items():
            closed.add_metric([reason], count)
        yield closed
        restarts = CounterMetricFamily(
            PREFIX + "ice_restarts", "settled ICE restarts by outcome", labels=["outcome"]
        )
        for outcome, count in manager.patches.restarts.items():
            restarts.add_metric([outcome], count)
        yield restarts

    def _ice_tcp(self) -> Iterator[Metric]:
        """The ICE-TCP port (-1 when off) and its counters (:mod:`whip.rtc.ice_tcp`)."""
        listener = self.manager.ice_tcp
        yield GaugeMetricFamily(
            PREFIX + "ice_tcp_port",
            "the ICE-TCP listening port (-1: off)",
            value=listener.port if listener is not None else -1,
        )
        if listener is None:
            return
        counters = listener.counters
        for name, doc, value in (
            ("ice_tcp_connections_open", "ICE-TCP connections open", listener.open_connections),
            ("ice_tcp_sessions_registered", "sessions registered for ICE-TCP", listener.registered),
        ):
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        for name, doc, value in (
            ("ice_tcp_connections_accepted", "ICE-TCP connections accepted", counters.accepted),
            ("ice_tcp_connections_bound", "ICE-TCP connections bound to a session", counters.bound),
            ("ice_tcp_connections_closed", "ICE-TCP connections ended", counters.closed),
            (
                "ice_tcp_frames_received",
                "RFC 4571 frames read on bound connections",
                counters.frames_in,
            ),
            ("ice_tcp_frames_sent", "RFC 4571 frames written", counters.frames_out),
            (
                "ice_tcp_frames_dropped",
                "frames dropped (full write buffer, empty)",
                counters.frames_dropped,
            ),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        refused = CounterMetricFamily(
            PREFIX + "ice_tcp_connections_refused",
            "ICE-TCP connections the server closed, by reason",
            labels=["reason"],
        )
        for reason, count in counters.refused.items():
            refused.add_metric([reason.value], count)
        yield refused

    def _wal_counters(self, timeline: Timeline) -> Iterator[Metric]:
        counts = dict(timeline.event_counts)
        for name, etype in (
            ("runs_created", "run_created"),
            ("runs_deleted", "run_deleted"),
            ("runs_interrupted", "run_interrupted"),
            ("recording_segments", "recording_segment"),
            ("recording_failures", "recording_failed"),
        ):
            yield CounterMetricFamily(
                PREFIX + name, f"durable {etype} events", value=counts.get(etype, 0)
            )
        wal = timeline.wal.stats
        yield CounterMetricFamily(PREFIX + "events_appended", "durable events", value=wal.appended)
        yield CounterMetricFamily(PREFIX + "fsyncs", "WAL fdatasync calls", value=wal.fsyncs)

    def _histograms(self) -> Iterator[Metric]:
        if isinstance(self.timeline, Timeline):
            yield _histogram(
                "wal_confirm_seconds",
                "append to durable confirmation",
                self.timeline.confirm_latency,
            )
            yield _histogram(
                "wal_fsync_seconds",
                "fdatasync of one group commit (the disk's share of the confirmation)",
                self.timeline.sync_latency,
            )
            yield _histogram(
                "wal_batch_events", "events per fsync (group commit)", self.timeline.batch_sizes
            )
        yield _histogram("post_seconds", "WHIP POST to 201", self.manager.post_latency)
        yield _histogram(
            "first_frame_seconds",
            "POST to the first decoded video frame",
            self.manager.first_frame_latency,
        )

    def _per_session(self) -> Iterator[Metric]:
        labels = ["session_id", "run_id", "principal"]
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "session_bytes_in": CounterMetricFamily(
                PREFIX + "session_bytes_in", "encoded bytes received", labels=labels
            ),
            "session_frames_decoded": CounterMetricFamily(
                PREFIX + "session_frames_decoded", "decoded frames", labels=labels
            ),
            "session_frames_dropped": CounterMetricFamily(
                PREFIX + "session_frames_dropped", "dropped frames", labels=labels
            ),
            "session_packets_lost": CounterMetricFamily(
                PREFIX + "session_packets_lost", "RTP packets lost", labels=labels
            ),
            "session_frames_oversized": CounterMetricFamily(
                PREFIX + "session_frames_oversized",
                "frames dropped for exceeding the payload limit",
                labels=labels,
            ),
            "session_queue_depth": GaugeMetricFamily(
                PREFIX + "session_queue_depth", "frames queued for decoding", labels=labels
            ),
        }
        discarded = CounterMetricFamily(
            PREFIX + "session_rtp_discarded",
            "datagrams and RTP packets that never reached a frame, by reason",
            labels=[*labels, "reason"],
        )
        for s in self.live:
            key = [s.session_id, s.run_id, s.principal]
            families["session_bytes_in"].add_metric(key, s.bytes_in)
            families["session_frames_decoded"].add_metric(key, s.frames_decoded)
            families["session_frames_dropped"].add_metric(key, s.frames_dropped)
            families["session_packets_lost"].add_metric(key, s.packets_lost)
            families["session_frames_oversized"].add_metric(key, s.frames_oversized)
            families["session_queue_depth"].add_metric(key, s.queue_depth)
            for reason, count in s.rtp_discarded.items():
                discarded.add_metric([*key, reason], count)
        yield from families.values()
        yield discarded


def install(
    app: web.Application, manager: SessionManager, timeline: Timeline | ClusterTimeline
) -> None:
    """Create this app's registry and collector (called at startup)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = ServerCollector(manager, timeline, app.get(LIMITER_KEY), app.get(ICE_SOCKETS_KEY))
    registry.register(collector)
    app[REGISTRY_KEY] = registry
    app[METRICS_KEY] = collector


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format (version 0.0.4)."""
    collector = request.app[METRICS_KEY]
    collector.live = [await read_figures(s) for s in collector.manager.table.live()]
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})
