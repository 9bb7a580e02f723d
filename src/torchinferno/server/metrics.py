"""Prometheus metrics of one server (own registry per app, so several apps can coexist)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        r = self.registry = CollectorRegistry()
        lbl = ["model_name"]
        self.model = model_name
        self.running = Gauge("torchinferno_num_requests_running", "Requests in the running batch", lbl, registry=r)
        self.waiting = Gauge("torchinferno_num_requests_waiting", "Requests waiting to be scheduled", lbl, registry=r)
        self.kv_usage = Gauge("torchinferno_kv_cache_usage_perc", "Fraction of KV blocks in use (0-1; hybrid KV "
                              "caches: the fuller of the whole and sliding-window pools)", lbl, registry=r)
        self.sliding_usage = Gauge("torchinferno_kv_cache_sliding_usage_perc", "Fraction of the sliding-window KV "
                                   "pool in use (0-1; 0 without one)", lbl, registry=r)
        self.ttft = Histogram("torchinferno_time_to_first_token_seconds", "Time to first token", lbl, buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("torchinferno_inter_token_latency_seconds", "Inter-token latency", lbl, buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("torchinferno_e2e_request_latency_seconds", "End-to-end request latency", lbl, buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("torchinferno_prompt_tokens", "Prompt tokens processed", lbl, registry=r)
        self.generation_tokens = Counter("torchinferno_generation_tokens", "Tokens generated", lbl, registry=r)
        self.prefix_queries = Gauge("torchinferno_prefix_cache_queries", "Prompt tokens looked up in the prefix cache (cumulative)", lbl, registry=r)
        self.prefix_hits = Gauge("torchinferno_prefix_cache_hits", "Prompt tokens found in the prefix cache (cumulative)", lbl, registry=r)
        self.preemptions = Gauge("torchinferno_num_preemptions", "Preemptions so far (cumulative)", lbl, registry=r)
        self.requests = Counter("torchinferno_request_success", "Finished requests by finish reason", lbl + ["finished_reason"], registry=r)
        self.bad_requests = Counter("torchinferno_request_errors", "Rejected requests by status code", lbl + ["status"], registry=r)

    def refresh(self, stats) -> None:
        m = self.model
        self.running.labels(m).set(stats.num_running)
        self.waiting.labels(m).set(stats.num_waiting)
        self.kv_usage.labels(m).set(stats.kv_usage)
        n = getattr(stats, "num_sliding_blocks", 0)
        self.sliding_usage.labels(m).set(1.0 - stats.num_free_sliding_blocks / n if n else 0.0)
        self.prefix_queries.labels(m).set(stats.prefix_queries)
        self.prefix_hits.labels(m).set(stats.prefix_hits)
        self.preemptions.labels(m).set(stats.num_preemptions)

    def refresh_replicas(self, engine) -> None:
        """Per-replica gauges and the router's counters, for an engine with replicas (``DataParallelLLM``, the
        remote ``router``); nothing for a single engine (the series appear on first use)."""
        per = getattr(engine, "replica_stats", None)
        if per is None:
            return
        if not hasattr(self, "replica_running"):
            r, lbl = self.registry, ["model_name", "replica"]
            g = lambda name, doc: Gauge(name, doc, lbl, registry=r)
            self.replica_running = g("torchinferno_replica_num_requests_running", "Requests running on a replica")
            self.replica_waiting = g("torchinferno_replica_num_requests_waiting", "Requests waiting on a replica")
            self.replica_kv_usage = g("torchinferno_replica_kv_cache_usage_perc", "KV blocks in use on a replica (0-1)")
            self.replica_prefix_queries = g("torchinferno_replica_prefix_cache_queries", "Prompt tokens looked up (cumulative)")
            self.replica_prefix_hits = g("torchinferno_replica_prefix_cache_hits", "Prompt tokens found (cumulative)")
            self.replica_routed = g("torchinferno_replica_requests_routed", "Requests the router sent to a replica (cumulative)")
            self.router_hit_rate = Gauge("torchinferno_router_prefix_hit_rate", "Prompt tokens the router found in the "
                                         "chosen replica's prefix tree / prompt tokens routed", ["model_name", "policy"], registry=r)
        m, policy = self.model, engine.policy
        for i, st in enumerate(per()):
            k = str(i)
            self.replica_running.labels(m, k).set(st.num_running)
            self.replica_waiting.labels(m, k).set(st.num_waiting)
            self.replica_kv_usage.labels(m, k).set(st.kv_usage)
            self.replica_prefix_queries.labels(m, k).set(st.prefix_queries)
            self.replica_prefix_hits.labels(m, k).set(st.prefix_hits)
            self.replica_routed.labels(m, k).set(policy.stats.per_replica[i])
        self.router_hit_rate.labels(m, policy.name).set(policy.stats.hit_rate)

    def observe_request(self, ttft: float | None, itls: list[float], e2e: float, prompt_tokens: int, completion_tokens: int, reason: str | None) -> None:
        m = self.model
        if ttft is not None:
            self.ttft.labels(m).observe(ttft)
        for x in itls:
            self.itl.labels(m).observe(x)
        self.e2e.labels(m).observe(e2e)
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(completion_tokens)
        self.requests.labels(m, reason or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
