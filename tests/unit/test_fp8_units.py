"""Whether this CPU runs FP8 matmuls natively, timed (engine/common/fp8_units): no CPU flag says it."""

from __future__ import annotations

from prebake.engine.common import fp8_units


def test_the_slowdown_is_measured_once_a_process_and_classifies_the_cpu():
    fp8_units.fp8_matmul_slowdown.cache_clear()
    factor = fp8_units.fp8_matmul_slowdown()
    assert factor > 0
    assert fp8_units.fp8_matmul_slowdown() == factor  # cached: one timing a process
    assert fp8_units.fp8_emulated() == (factor > fp8_units.EMULATED_ABOVE)


def test_the_median_leaves_the_first_call_out():
    calls = []
    seconds = fp8_units.median_time(lambda: calls.append(1), repeats=3)
    assert len(calls) == 4 and seconds >= 0


def test_the_bake_warns_once_with_the_measured_factor_only_where_fp8_is_emulated(monkeypatch):
    from types import SimpleNamespace

    from prebake.engine.bundled.runtime import fp8_speed

    config = SimpleNamespace(hidden_size=256, intermediate_size=512)  # the two widths it reads
    lines: list[str] = []
    monkeypatch.setattr(fp8_speed, "fp8_emulated", lambda: False)
    assert fp8_speed.warn_if_emulated(config, lines.append) is None and lines == []

    monkeypatch.setattr(fp8_speed, "fp8_emulated", lambda: True)
    factor = fp8_speed.warn_if_emulated(config, lines.append)
    assert factor is not None and factor > 0
    [line] = lines
    assert "no FP8 matmul units" in line and f"(256 -> 512) runs {factor:.1f}x slower in FP8" in line
    assert "serve bf16 for speed" in line
