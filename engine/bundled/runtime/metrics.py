"""The engine's figures for Prometheus, kept by prometheus_client in one registry per engine.

    prebake_startup_*, prebake_time_to_ready_seconds, prebake_ready      the start-up, by step and part
    prebake_bundle_*, prebake_*fallback*, prebake_write_backs_total      bundles, and compiles in place
    prebake_requests_total, prebake_*_seconds histograms, prebake_*tokens*, prebake_step*   serving
    prebake_num_requests_running, _waiting, prebake_kv_cache_usage_perc  vLLM's gauges, by vLLM's names
    vllm:*                                                               vLLM's own names (runtime.vllm_metrics)
    process_*, python_gc_*, python_info                                  prometheus_client's collectors

Callers name a metric and its labels (`metrics.add("prebake_steps_total", shape=...)`); an undeclared
name is refused, so a typo fails loudly; the vllm: series get model_name and engine labels here.
Every series with its labels and meaning: docs/http-api.md ("Metrics").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

from prebake.engine.bundled.runtime import vllm_metrics

if TYPE_CHECKING:  # torch: the scheduler comes once the engine has started
    from prebake.engine.bundled.runtime.scheduler import Load

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
_DECLARED.update(
    {
        name: (kind, text, (*vllm_metrics.LABELS, *labels))
        for name, (kind, text, labels, _) in vllm_metrics.DECLARED.items()
    }
)
_BUCKETS = {name: buckets for name, (_, _, _, buckets) in vllm_metrics.DECLARED.items() if buckets}


class Metrics:
    """The engine's metrics (thread-safe, as prometheus_client's are) and the process collectors."""

    def __init__(self, model_name: str = "") -> None:
        """`model_name`: the served model, the vllm: series' model_name label."""
        self.registry = CollectorRegistry(auto_describe=True)
        self._vllm_labels = {"model_name": model_name, "engine": "0"}
        self._metrics = {}
        for name, (kind, text, labels) in _DECLARED.items():
            extra = {"buckets": _BUCKETS.get(name, LATENCY_BUCKETS)} if kind is Histogram else {}
            self._metrics[name] = kind(name, text, labels, registry=self.registry, **extra)
        for name, (
            _,
            _,
            extra_labels,
            _,
        ) in vllm_metrics.DECLARED.items():  # every series there from the start, as vLLM's
            if not extra_labels:
                self._metrics[name].labels(**self._vllm_labels)
        for reason in vllm_metrics.FINISHED_REASONS:
            self._metrics["vllm:request_success_total"].labels(**self._vllm_labels, finished_reason=reason)
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

    def set_load(self, load: Load) -> None:
        """The scheduler's load as of a scrape, by prebake's names and vLLM's."""
        usage = round(load.kv_cache_usage, 6)
        for prefix in ("prebake_", "vllm:"):
            self.set(f"{prefix}num_requests_running", load.running)
            self.set(f"{prefix}num_requests_waiting", load.waiting)
            self.set(f"{prefix}kv_cache_usage_perc", usage)
        self.set("vllm:gpu_cache_usage_perc", usage)

    def get(self, name: str, **labels: str) -> float:
        """A counter's or gauge's current value (0 for a series never touched)."""
        self._check(name)
        labels = {**self._vllm_labels, **labels} if name.startswith("vllm:") else labels
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
        if name.startswith("vllm:"):
            labels = {**self._vllm_labels, **labels}
        return metric.labels(**{k: str(v) for k, v in labels.items()}) if labels else metric

    @staticmethod
    def _check(name: str) -> None:
        if name not in _DECLARED:
            raise KeyError(f"unknown metric {name!r}; declare it in prebake.engine.bundled.runtime.metrics._DECLARED")
