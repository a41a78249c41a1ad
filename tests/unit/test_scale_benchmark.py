"""benchmarks/scale.py: a decode speed it cannot measure is said so, never a huge number."""

from __future__ import annotations

from benchmarks import scale


def _answers(monkeypatch, timings: dict[int, list[float]]) -> None:
    def complete(port: int, tokens: int) -> tuple[float, int]:
        return timings[tokens].pop(0), tokens

    monkeypatch.setattr(scale, "_complete", complete)


def test_decode_speed_is_the_extra_tokens_over_the_extra_seconds_of_the_faster_tries(monkeypatch):
    _answers(monkeypatch, {1: [2.0, 1.0], 16: [4.0, 6.0]})
    assert scale._decode_tokens_per_s(0, 16) == 15 / (4.0 - 1.0)


def test_a_long_request_no_slower_than_the_short_one_is_not_measured(monkeypatch):
    # a burst of load on both one-token tries: before, this printed 1.5e10 tokens/s
    _answers(monkeypatch, {1: [9.0, 8.0], 16: [7.5, 8.0]})
    assert scale._decode_tokens_per_s(0, 16) is None
    runs = [
        {"ready_s": 1.0, "steps": {}, "parts": {}, "decode_tokens_per_s": None},
        {"ready_s": 3.0, "steps": {}, "parts": {}, "decode_tokens_per_s": 2.0},
    ]
    assert scale._mean_start(runs)["decode_tokens_per_s"] == 2.0
    assert "not measured" in scale._tokens_per_s(None)
