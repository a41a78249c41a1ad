"""The bundled engine serves a traffic bucket set fitted on a trace the test writes.

A tiny recipe variant names `[buckets] strategy = "traffic"` with a trace beside it; a cold start
with --write-back fits the set, compiles its steps and publishes; the buckets bundle in the
registry holds the fitted set and its key names the trace by digest, never by path. The set is
the smallest the fit allows at one sequence (budget 4: three prompt buckets and one decode), so the
cold start compiles four step shapes, not the six that two sequences and a budget of 6 took.
"""

from __future__ import annotations

import json

import pytest

from prebake.artifacts.bundle.manifest import Manifest
from tests.support.serving import SERVE_TEST_RECIPE, ServeProcess, serve_env
from tests.support.synthetic_traces import synthetic_requests, write_jsonl

pytestmark = pytest.mark.slow

NAME = "serve-traffic"


def test_bundled_engine_serves_a_traffic_fitted_bucket_set(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    write_jsonl(synthetic_requests("chat", 200, seed=5, max_len=30), recipes / "chat.jsonl")
    recipe = SERVE_TEST_RECIPE.format(name=NAME, variant="inductor-cache", seqs=1, seed=0)
    recipe = recipe.replace(
        "[compile]", '[buckets]\nstrategy = "traffic"\ntrace = "chat.jsonl"\nbudget = 4\n\n[compile]'
    )
    (recipes / f"{NAME}.toml").write_text(recipe)
    registry = tmp_path / "registry"
    registry.mkdir()
    server = ServeProcess(
        ["--model", NAME, "--registry", str(registry), "--write-back"],
        serve_env(
            tmp_path / "home", recipes, PREBAKE_WRITE_BACK="index"
        ),  # a single-user setup: write-back straight to the index, said so (registry/review/writeback.py)
    )
    try:
        server.wait_ready()
        completion = server.complete(prompt=[5, 17, 300, 42, 7], max_tokens=6, temperature=0)
    finally:
        server.stop()
    assert len(completion["choices"][0]["text"]) > 0 or completion["usage"]["completion_tokens"] == 6
    manifests = [Manifest.read(p) for p in (registry / "index" / "buckets").glob("*.json")]
    assert len(manifests) == 1
    factors = manifests[0].key["buckets"]
    assert factors["strategy"] == "traffic" and len(factors["trace_sha256"]) == 64
    assert str(tmp_path) not in json.dumps(manifests[0].key)
