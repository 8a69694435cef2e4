"""Prometheus metrics of one service instance (its own registry, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "ServiceMetrics"]

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class ServiceMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "argusdiff_requests", "Images requested, by serving level and outcome", ["level", "outcome"], registry=r
        )
        self.http = Counter(
            "argusdiff_http_responses", "HTTP responses by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "argusdiff_request_latency_seconds",
            "End-to-end latency of one image from arrival to result, by level",
            ["level"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "argusdiff_router_overhead_seconds",
            "Router time per image: validate, classify, route, admit, enqueue",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("argusdiff_queue_depth", "Images queued or running per level", ["level"], registry=r)
        self.level_latency = Gauge(
            "argusdiff_level_latency_seconds", "One image's execution time per level: profiled and measured",
            ["level", "source"], registry=r,
        )  # fmt: skip
        self.queue_depth_tier = Gauge(
            "argusdiff_queue_depth_by_tier", "Images queued or running per level and tier, per control tick",
            ["level", "tier"], registry=r,
        )  # fmt: skip
        self.backlog = Gauge(
            "argusdiff_queue_backlog", "Items in the level's queue (queued + taken, not acked), per control tick",
            ["level"], registry=r,
        )  # fmt: skip
        self.plan_changes = Counter("argusdiff_plan_changes", "Plans published with a changed allocation", registry=r)
        self.plan_version = Gauge("argusdiff_plan_version", "Version of the plan in force", registry=r)
        self.predicted_qpm = Gauge("argusdiff_predicted_qpm", "Demand the plan was made for (QPM)", registry=r)
        self.capacity_qpm = Gauge(
            "argusdiff_capacity_qpm", "Throughput of the plan's assigned workers at their levels and batch sizes (QPM)",
            registry=r,
        )  # fmt: skip
        self.slo = Gauge(
            "argusdiff_slo_seconds", "Latency SLO of a request of each tier that sets no slo_s of its own", ["tier"],
            registry=r,
        )  # fmt: skip
        self.saturated = Gauge("argusdiff_saturated", "1 when the plan cannot meet the predicted demand", registry=r)
        self.workers_up = Gauge("argusdiff_workers_up", "Workers with a recent heartbeat", registry=r)
        self.workers_at = Gauge("argusdiff_workers_at_level", "Workers assigned to each level", ["level"], registry=r)
        self.requeued = Counter("argusdiff_requeued", "Work items re-queued from dead workers", registry=r)
        self.cancels = Counter(
            "argusdiff_cancels",
            "Images cancelled, by how (delete: DELETE of the generation; disconnect: the client went away) and "
            "where they were (queued: taken out of the queue; running: stopped where a worker runs them)",
            ["how", "stage"],
            registry=r,
        )
        self.cascade_handoffs = Counter(
            "argusdiff_cascade_handoffs",
            "Cascade deferrals by the policy's decision (heavy: redone at the heavy level)",
            ["outcome"],
            registry=r,
        )
        self.cache_lookups = Counter(
            "argusdiff_cache_lookups", "Latent cache lookups by result (hit, miss, error)", ["result"], registry=r
        )
        self.cache_hit_ratio = Gauge("argusdiff_cache_hit_ratio", "Hits over lookups in the recent window", registry=r)
        self.cache_lookup = Histogram(
            "argusdiff_cache_lookup_seconds", "Latent cache lookup + fetch latency", buckets=_FAST_BUCKETS, registry=r
        )
        self.cache_similarity_lookup = Histogram(
            "argusdiff_cache_similarity_seconds",
            "Router-side nearest-cached-prompt lookup (embed + index) for policies that route by cache similarity",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.slo_violations = Counter(
            "argusdiff_slo_violations", "Images finished after their deadline, by level", ["level"], registry=r
        )
        self.strategy = Gauge(
            "argusdiff_strategy",
            "1 for the strategy in force (ac: approximate caching, sm: smaller models)",
            ["strategy"],
            registry=r,
        )
        self.strategy_switches = Counter(
            "argusdiff_strategy_switches", "AC<->SM switches by direction", ["to"], registry=r
        )
        self.refused = Counter(
            "argusdiff_refused",
            "Requests refused with 429 overloaded, by who refused (policy; admission: definitely late, queue cap)",
            ["reason"],
            registry=r,
        )
        self.routed = Counter(
            "argusdiff_routed",
            "The policy's decisions, per image on arrival and per cascade deferral: outcome (served, escalated, "
            "deferred, kept, refused, dropped) and cause (plan, or the rule that moved it)",
            ["outcome", "cause"],
            registry=r,
        )
        self.queue_errors = Counter(
            "argusdiff_queue_errors",
            "Requests refused because the queue (Redis) failed or is unreachable, and outages the results listener saw",
            registry=r,
        )
        self.result_memory = Gauge(
            "argusdiff_result_memory_bytes", "Router memory held by finished results and their images", registry=r
        )
        self.results_evicted = Gauge(
            "argusdiff_results_evicted", "Results evicted from router memory over its budget (since start)", registry=r
        )

        # the live drift loop (argusdiff.service.drift)
        self.classifier_version = Gauge(
            "argusdiff_classifier_version", "Version of the level classifier serving (1 + retrains swapped in)",
            registry=r,
        )  # fmt: skip
        self.classifier_retrains = Counter(
            "argusdiff_classifier_retrains", "Drift-triggered retrains swapped in", registry=r
        )
        self.drift_window_quality = Gauge(
            "argusdiff_drift_window_quality", "Median quality score of the last completed drift window", registry=r
        )
        self.drift_baseline = Gauge(
            "argusdiff_drift_baseline", "Moving average of earlier window medians at the last drift flag", registry=r
        )
        self.drift_events = Counter("argusdiff_drift_events", "Windows flagged as drifted", registry=r)
        self.drift_scored = Counter("argusdiff_drift_scored", "Served images scored by the drift loop", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
