"""The engine's figures for Prometheus, kept by prometheus_client in one registry per engine.

prebake_startup_step_seconds{step}          how long each start-up step took
prebake_startup_part_seconds{part}          the warm-up's parts: inductor-init (not hidden by the load),
                                            deserialise, kernels, bind, first-runs (or trace-and-cache-load)
prebake_time_to_ready_seconds               process start to ready
prebake_ready                               0 while starting, 1 once serving
prebake_bundle_hits_total{kind,source}      bundles used from the store or the registry
prebake_bundle_misses_total{kind}           keys nothing answered (or failed verification)
prebake_fallback_compiles_total{kind}       artifacts compiled in place after a miss
prebake_write_backs_total{kind,outcome}     compiled-in-place artifacts published (or not)
prebake_requests_total{outcome}             completions served, rejected or failed
prebake_request_latency_seconds             histogram of completion latency
prebake_time_to_first_token_seconds         histogram of the wait for a request's first token
prebake_generated_tokens_total              tokens generated
prebake_steps_total{shape}                  model steps run per step shape (bucket)
prebake_step_rows_total{shape}              real rows in those steps (the rest was padding)
prebake_num_requests_running                requests in the running batch (vLLM: num_requests_running)
prebake_num_requests_waiting                requests queued for a slot (vLLM: num_requests_waiting)
prebake_kv_cache_usage_perc                 fraction of the KV cache's positions held, 0 to 1 (vLLM's name)
process_*, python_gc_*, python_info         prometheus_client's process, GC and platform collectors

Callers name a metric and its labels (`metrics.add("prebake_steps_total", shape=...)`); a name
not declared in `_DECLARED` is refused, so a typo fails loudly instead of exporting a new series.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# name -> (type, help, label names)
_DECLARED: dict[str, tuple[type, str, tuple[str, ...]]] = {
    "prebake_startup_step_seconds": (Gauge, "Seconds each start-up step took.", ("step",)),
    "prebake_startup_part_seconds": (
        Gauge,
        "Seconds of each part of the warm-up step (loading compiled functions, Inductor's init, first runs).",
        ("part",),
    ),
    "prebake_time_to_ready_seconds": (Gauge, "Seconds from process start to ready.", ()),
    "prebake_ready": (Gauge, "1 once the engine serves, 0 while it starts.", ()),
    "prebake_bundle_hits_total": (Counter, "Bundles used, by kind and where they came from.", ("kind", "source")),
    "prebake_bundle_misses_total": (Counter, "Artifact keys no usable bundle answered, by kind.", ("kind",)),
    "prebake_fallback_compiles_total": (Counter, "Artifacts built in place after a miss, by kind.", ("kind",)),
    "prebake_variant_fallbacks_total": (
        Counter,
        "Starts whose graphs variant did not load here and took the next one in the same tree, by variant.",
        ("variant",),
    ),
    "prebake_write_backs_total": (
        Counter,
        "Artifacts built in place and published back, by kind and outcome.",
        ("kind", "outcome"),
    ),
    "prebake_requests_total": (Counter, "Completion requests, by outcome.", ("outcome",)),
    "prebake_generated_tokens_total": (Counter, "Tokens generated.", ()),
    "prebake_steps_total": (Counter, "Model steps run, by step shape (bucket).", ("shape",)),
    "prebake_step_rows_total": (
        Counter,
        "Real (unpadded) rows run, by step shape; rows / steps is the batch filled.",
        ("shape",),
    ),
    "prebake_num_requests_running": (Gauge, "Requests in the running batch.", ()),
    "prebake_num_requests_waiting": (Gauge, "Requests waiting for a slot.", ()),
    "prebake_kv_cache_usage_perc": (Gauge, "Fraction of the KV cache's positions held by running requests.", ()),
    "prebake_request_latency_seconds": (Histogram, "Seconds from a completion request to its response.", ()),
    "prebake_time_to_first_token_seconds": (Histogram, "Seconds from a request to its first token.", ()),
}


class Metrics:
    """The engine's metrics (thread-safe, as prometheus_client's are) and the process collectors."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics = {}
        for name, (kind, text, labels) in _DECLARED.items():
            extra = {"buckets": LATENCY_BUCKETS} if kind is Histogram else {}
            self._metrics[name] = kind(name, text, labels, registry=self.registry, **extra)
        process_collector.ProcessCollector(registry=self.registry)
        platform_collector.PlatformCollector(registry=self.registry)
        gc_collector.GCCollector(registry=self.registry)

    def set(self, name: str, value: float, **labels: str) -> None:
        self._series(name, Gauge, labels).set(value)

    def add(self, name: str, by: float = 1, **labels: str) -> None:
        self._series(name, Counter, labels).inc(by)

    def observe(self, name: str, value: float, **labels: str) -> None:
        self._series(name, Histogram, labels).observe(value)

    def observe_latency(self, seconds: float) -> None:
        self.observe("prebake_request_latency_seconds", seconds)

    def get(self, name: str, **labels: str) -> float:
        """A counter's or gauge's current value (0 for a series never touched)."""
        self._check(name)
        value = self.registry.get_sample_value(name, {k: str(v) for k, v in labels.items()})
        return 0 if value is None else value

    def render(self) -> bytes:
        """The text exposition format (CONTENT_TYPE)."""
        return generate_latest(self.registry)

    def _series(self, name: str, kind: type, labels: dict[str, str]):
        self._check(name)
        metric = self._metrics[name]
        if _DECLARED[name][0] is not kind:
            raise TypeError(f"metric {name!r} is a {_DECLARED[name][0].__name__}, not a {kind.__name__}")
        return metric.labels(**{k: str(v) for k, v in labels.items()}) if labels else metric

    @staticmethod
    def _check(name: str) -> None:
        if name not in _DECLARED:
            raise KeyError(f"unknown metric {name!r}; declare it in prebake.engine.bundled.runtime.metrics._DECLARED")
