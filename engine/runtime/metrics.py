"""The engine's figures in Prometheus text format: start-up steps, bundle outcomes, requests.

prebake_startup_step_seconds{step}          how long each start-up step took
prebake_time_to_ready_seconds               process start to ready
prebake_ready                               0 while starting, 1 once serving
prebake_bundle_hits_total{kind,source}      bundles used from the store or the registry
prebake_bundle_misses_total{kind}           keys nothing answered (or failed verification)
prebake_fallback_compiles_total{kind}       artifacts compiled in place after a miss
prebake_write_backs_total{kind,outcome}     compiled-in-place artifacts published (or not)
prebake_requests_total{outcome}             completions served, rejected or failed
prebake_request_latency_seconds             histogram of completion latency
prebake_generated_tokens_total              tokens generated
prebake_steps_total{shape}                  model steps run per step shape (bucket)
prebake_step_rows_total{shape}              real rows in those steps (the rest was padding)
"""

from __future__ import annotations

import threading
from collections import defaultdict

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_HELP = {
    "prebake_startup_step_seconds": ("gauge", "Seconds each start-up step took."),
    "prebake_time_to_ready_seconds": ("gauge", "Seconds from process start to ready."),
    "prebake_ready": ("gauge", "1 once the engine serves, 0 while it starts."),
    "prebake_bundle_hits_total": ("counter", "Bundles used, by kind and where they came from."),
    "prebake_bundle_misses_total": ("counter", "Artifact keys no usable bundle answered, by kind."),
    "prebake_fallback_compiles_total": ("counter", "Artifacts built in place after a miss, by kind."),
    "prebake_write_backs_total": ("counter", "Artifacts built in place and published back, by kind and outcome."),
    "prebake_requests_total": ("counter", "Completion requests, by outcome."),
    "prebake_generated_tokens_total": ("counter", "Tokens generated."),
    "prebake_steps_total": ("counter", "Model steps run, by step shape (bucket)."),
    "prebake_step_rows_total": (
        "counter",
        "Real (unpadded) rows run, by step shape; rows / steps is the batch filled.",
    ),
}
_LATENCY = "prebake_request_latency_seconds"

Labels = tuple[tuple[str, str], ...]


class Metrics:
    """Thread-safe counters, gauges and one latency histogram."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._latency = [0] * (len(LATENCY_BUCKETS) + 1)
        self._latency_sum = 0.0

    def set(self, name: str, value: float, **labels: str) -> None:
        self._check(name)
        with self._lock:
            self._values[name][_labels(labels)] = value

    def add(self, name: str, by: float = 1, **labels: str) -> None:
        self._check(name)
        with self._lock:
            key = _labels(labels)
            self._values[name][key] = self._values[name].get(key, 0) + by

    def get(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._values[name].get(_labels(labels), 0)

    def observe_latency(self, seconds: float) -> None:
        with self._lock:
            index = next((i for i, bound in enumerate(LATENCY_BUCKETS) if seconds <= bound), len(LATENCY_BUCKETS))
            self._latency[index] += 1
            self._latency_sum += seconds

    def render(self) -> str:
        lines = []
        with self._lock:
            for name, (kind, text) in _HELP.items():
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                lines += [f"{name}{_render_labels(k)} {_number(v)}" for k, v in sorted(self._values[name].items())]
            lines += [
                f"# HELP {_LATENCY} Seconds from a completion request to its response.",
                f"# TYPE {_LATENCY} histogram",
            ]
            total = 0
            for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self._latency):
                total += count
                lines.append(f'{_LATENCY}_bucket{{le="{bound}"}} {total}')
            lines += [f"{_LATENCY}_sum {_number(self._latency_sum)}", f"{_LATENCY}_count {total}"]
        return "\n".join(lines) + "\n"

    @staticmethod
    def _check(name: str) -> None:
        if name not in _HELP:
            raise KeyError(f"unknown metric {name!r}; declare it in engine.runtime.metrics._HELP")


def _labels(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _render_labels(labels: Labels) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels)
    return "{" + ",".join(escaped) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}"
