"""The server's Prometheus metrics, each defined once here (docs/serving.md lists them).

Request-level series are observed by the server as it answers; engine series
are read from ``LLM.stats()`` at each scrape (a custom collector), so they are
never stale. Every name starts with ``ssd_``.
"""
from __future__ import annotations

import logging
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("ssd.serve")

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)

# stats() key -> (metric name, help); counters only grow, gauges are values now.
_ENGINE_COUNTERS = {
    "num_preemptions": ("ssd_preemptions", "Requests preempted because the KV cache was full"),
    "draft_tokens_proposed": ("ssd_draft_tokens_proposed", "Draft tokens verified (sd, ssd)"),
    "draft_tokens_accepted": ("ssd_draft_tokens_accepted", "Draft tokens accepted (sd, ssd)"),
    "cache_lookups": ("ssd_cache_lookups", "ssd speculation-cache lookups"),
    "cache_hits": ("ssd_cache_hits", "ssd speculation-cache hits"),
}
_ENGINE_GAUGES = {
    "num_running": ("ssd_num_requests_running", "Requests running in the engine"),
    "num_waiting": ("ssd_num_requests_waiting", "Requests queued in the engine"),
    "acceptance_rate": ("ssd_acceptance_rate", "Accepted / proposed draft tokens since start"),
    "mean_accepted_len": ("ssd_mean_accepted_length", "Accepted draft tokens per round since start"),
    "cache_hit_rate": ("ssd_cache_hit_rate", "ssd cache hits / lookups since start"),
    "predicted_speedup": ("ssd_predicted_speedup", "The speed model's speedup over ar at the measured values"),
}


class _EngineCollector:
    def __init__(self, stats):
        self._stats = stats

    def collect(self):
        s = self._stats()
        for key, (name, doc) in _ENGINE_COUNTERS.items():
            c = CounterMetricFamily(name, doc)
            c.add_metric([], float(s.get(key, 0)))
            yield c
        for key, (name, doc) in _ENGINE_GAUGES.items():
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(s.get(key, 0)))
            yield g
        used = GaugeMetricFamily("ssd_kv_blocks_used", "KV-cache blocks in use")
        used.add_metric([], float(s.get("kv_blocks_total", 0) - s.get("kv_blocks_free", 0)))
        yield used
        bubble = GaugeMetricFamily("ssd_bubble_ratio", "1 - the target's busy fraction (time it waits)")
        bubble.add_metric([], 1.0 - float(s.get("target_busy_fraction", 0)) if s.get("active_seconds") else 0.0)
        yield bubble
        fallbacks = CounterMetricFamily("ssd_fallbacks", "ssd cache misses answered, by fallback kind",
                                        labels=["kind"])
        fallbacks.add_metric(["neural"], float(s.get("fallback_neural", 0)))
        fallbacks.add_metric(["fast"], float(s.get("fallback_fast", 0)))
        yield fallbacks


class ServerMetrics:
    """The registry behind /metrics. stats: a callable returning LLM.stats()."""

    def __init__(self, stats):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ssd_requests", "Requests finished, by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("ssd_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("ssd_generation_tokens", "Tokens sent to clients", registry=r)
        self.rejected = Counter("ssd_requests_rejected", "Requests refused, by reason", ["reason"], registry=r)
        self.ttft = Histogram("ssd_time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self.itl = Histogram("ssd_inter_token_latency_seconds", "Time between two chunks, per token",
                             registry=r, buckets=_TOKEN_LATENCY_BUCKETS)
        self.e2e = Histogram("ssd_e2e_request_latency_seconds", "Request latency, admission to last token",
                             registry=r, buckets=_LATENCY_BUCKETS)
        self.in_flight = Gauge("ssd_num_requests_in_server", "Requests admitted by the server, not finished",
                               registry=r)
        r.register(_EngineCollector(stats))


class HitRateWatch:
    """Logs a warning when the ssd cache hit rate over the last `window_s` seconds is below `threshold`.

    check() is called periodically; windows with fewer than `min_lookups` lookups say nothing.
    """

    def __init__(self, stats, threshold: float = 0.6, window_s: float = 30.0, min_lookups: int = 50):
        self._stats, self.threshold, self.window_s, self.min_lookups = stats, threshold, window_s, min_lookups
        self._lock = threading.Lock()
        self._last = (time.monotonic(), 0, 0)

    def check(self) -> float | None:
        """The window's hit rate when a window ended with enough lookups, else None."""
        now = time.monotonic()
        with self._lock:
            t0, lookups0, hits0 = self._last
            if now - t0 < self.window_s:
                return None
            s = self._stats()
            lookups, hits = int(s.get("cache_lookups", 0)), int(s.get("cache_hits", 0))
            self._last = (now, lookups, hits)
        if lookups - lookups0 < self.min_lookups:
            return None
        rate = (hits - hits0) / (lookups - lookups0)
        if rate < self.threshold:
            log.warning("ssd cache hit rate %.2f over the last %.0f s is below %.2f: the speculation may be set "
                        "too aggressively for this load (a smaller fanout budget or k, or mode sd)",
                        rate, now - t0, self.threshold)
        return rate
