"""The metrics endpoint's text, read back with prometheus_client's own parser, as a scraper would."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from prebake.engine.bundled.runtime.metrics import Metrics
from tests.support.serving import VLLM_ROUTER_SERIES


def _samples(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_gauges_and_the_latency_histogram_parse_back():
    m = Metrics()
    m.set("prebake_startup_step_seconds", 0.25, step="fetch")
    m.add("prebake_bundle_hits_total", kind="graphs", source="registry")
    m.add("prebake_bundle_hits_total", kind="graphs", source="registry")
    for seconds in (0.003, 0.2, 0.2, 40.0):
        m.observe_latency(seconds)
    samples = _samples(m)
    assert samples[("prebake_startup_step_seconds", (("step", "fetch"),))] == 0.25
    assert samples[("prebake_bundle_hits_total", (("kind", "graphs"), ("source", "registry")))] == 2
    assert samples[("prebake_request_latency_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("prebake_request_latency_seconds_bucket", (("le", "0.25"),))] == 3  # cumulative
    assert samples[("prebake_request_latency_seconds_bucket", (("le", "30.0"),))] == 3
    assert samples[("prebake_request_latency_seconds_bucket", (("le", "+Inf"),))] == 4
    assert samples[("prebake_request_latency_seconds_count", ())] == 4
    assert m.get("prebake_bundle_hits_total", kind="graphs", source="registry") == 2
    assert m.get("prebake_bundle_misses_total", kind="graphs") == 0


def test_every_declared_family_and_the_process_metrics_are_exported():
    text = Metrics().render().decode()
    names = {family.name for family in text_string_to_metric_families(text)}
    for name in ("prebake_ready", "prebake_requests", "prebake_request_latency_seconds", "prebake_steps"):
        assert name in names
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info"} <= names


def test_label_values_with_quotes_backslashes_and_newlines_survive_the_round_trip():
    m = Metrics()
    odd = 'a"b\\c\nd'
    m.add("prebake_requests_total", outcome=odd)
    assert _samples(m)[("prebake_requests_total", (("outcome", odd),))] == 1


def test_an_undeclared_metric_is_refused():
    with pytest.raises(KeyError, match="declare it"):
        Metrics().add("prebake_typo_total")


def test_two_engines_in_one_process_keep_separate_figures():
    a, b = Metrics(), Metrics()
    a.add("prebake_generated_tokens_total", 5)
    assert a.get("prebake_generated_tokens_total") == 5 and b.get("prebake_generated_tokens_total") == 0


def test_vllms_series_are_there_from_the_start_with_the_model_name_label():
    samples = _samples(Metrics("org/model-7b"))
    labels = (("engine", "0"), ("model_name", "org/model-7b"))
    for name in VLLM_ROUTER_SERIES:
        assert samples[(name, labels)] == 0, name
    for reason in ("stop", "length", "abort"):
        assert samples[("vllm:request_success_total", (labels[0], ("finished_reason", reason), labels[1]))] == 0


def test_the_load_is_set_by_prebakes_names_and_vllms_alike():
    from types import SimpleNamespace

    m = Metrics("m")
    m.set_load(SimpleNamespace(running=3, waiting=2, kv_cache_usage=0.25))  # a Load's fields
    assert m.get("prebake_num_requests_running") == m.get("vllm:num_requests_running") == 3
    assert m.get("prebake_num_requests_waiting") == m.get("vllm:num_requests_waiting") == 2
    assert m.get("vllm:kv_cache_usage_perc") == m.get("vllm:gpu_cache_usage_perc") == 0.25
