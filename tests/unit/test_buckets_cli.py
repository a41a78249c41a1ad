"""`prebake buckets` without a trace shows the rule-based sets for the recipe's limits and their counts."""

from __future__ import annotations

import json

import pytest

from prebake.artifacts.buckets.artifact import build_bucket_set
from prebake.artifacts.buckets.limits import BucketSettings
from prebake.artifacts.errors import ExitCode
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.cli import main


@pytest.mark.parametrize("model", ["tiny-llama", "llama3-8b"])
def test_without_a_trace_each_rule_set_is_shown_with_its_counts(model, capsys):
    assert main(["buckets", "--model", model, "--json"]) == ExitCode.OK
    shown = json.loads(capsys.readouterr().out)
    limits = load_recipe(model).serving
    assert set(shown) == {"exponential", "linear", "pad"}
    for strategy, row in shown.items():
        expected = build_bucket_set(limits, BucketSettings(strategy=strategy))
        assert (row["prompt"], row["decode"]) == (len(expected.prompt), len(expected.decode))
        assert row["waste"] is None  # waste is measured on traffic, and there is none


def test_one_strategy_shows_its_buckets(capsys):
    assert main(["buckets", "--model", "tiny-llama", "--strategy", "pad"]) == ExitCode.OK
    out = capsys.readouterr().out
    expected = build_bucket_set(load_recipe("tiny-llama").serving, BucketSettings(strategy="pad"))
    first = expected.prompt[0]
    assert f"({first.batch},{first.query},{first.ctx_blocks})" in out and "need traffic: pass --trace" in out


def test_the_traffic_strategy_without_a_trace_says_it_needs_one(capsys):
    assert main(["buckets", "--model", "tiny-llama", "--strategy", "traffic"]) == ExitCode.INVALID
    assert "the traffic strategy fits a set on traffic: pass --trace FILE" in capsys.readouterr().err
