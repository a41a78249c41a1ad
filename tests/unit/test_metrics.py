"""The metrics endpoint's text: Prometheus exposition format that a scraper parses."""

from __future__ import annotations

import pytest

from engine.runtime.metrics import Metrics


def test_counters_gauges_and_the_latency_histogram_render_as_prometheus_text():
    m = Metrics()
    m.set("prebake_startup_step_seconds", 0.25, step="fetch")
    m.add("prebake_bundle_hits_total", kind="graphs", source="registry")
    m.add("prebake_bundle_hits_total", kind="graphs", source="registry")
    for seconds in (0.003, 0.2, 0.2, 40.0):
        m.observe_latency(seconds)
    lines = m.render().splitlines()
    assert 'prebake_startup_step_seconds{step="fetch"} 0.250000' in lines
    assert 'prebake_bundle_hits_total{kind="graphs",source="registry"} 2' in lines
    assert "# TYPE prebake_bundle_hits_total counter" in lines
    assert 'prebake_request_latency_seconds_bucket{le="0.005"} 1' in lines
    assert 'prebake_request_latency_seconds_bucket{le="0.25"} 3' in lines  # cumulative
    assert 'prebake_request_latency_seconds_bucket{le="30.0"} 3' in lines
    assert 'prebake_request_latency_seconds_bucket{le="+Inf"} 4' in lines
    assert "prebake_request_latency_seconds_count 4" in lines


def test_label_values_are_escaped():
    m = Metrics()
    m.add("prebake_requests_total", outcome='a"b\\c')
    assert 'prebake_requests_total{outcome="a\\"b\\\\c"} 1' in m.render().splitlines()


def test_an_undeclared_metric_is_refused():
    with pytest.raises(KeyError, match="declare it"):
        Metrics().add("prebake_typo_total")
