"""The traffic strategy: fitted sets cover every allowed shape, stay in budget, are deterministic,
key on the trace's content, export to vllm-gaudi's bucket file unchanged, and beat exponential on
traffic shapes they never saw."""

from __future__ import annotations

import json

import pytest

from prebake.artifacts.buckets.artifact import bucket_key_factors, build_bucket_set
from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.buckets.replay import ReplaySettings, replay
from prebake.artifacts.buckets.report import figures, strategy_set
from prebake.artifacts.buckets.traces import split_trace
from prebake.artifacts.buckets.traffic import cover_buckets, fit_bucket_set
from prebake.artifacts.errors import BucketError
from prebake.artifacts.keys import Key
from prebake.engine.cli import main
from prebake.engine.vllm.gaudi_file import bucket_file_text, parse_bucket_file, upstream_reading
from tests.support.synthetic_traces import synthetic_requests, write_jsonl
from tests.unit.test_buckets import LLAMA3_8B

TINY = ServingLimits(max_model_len=128, max_num_seqs=2, max_num_batched_tokens=128, block_size=16)


def tiny_set(budget: int = 10, kind: str = "chat"):
    requests = synthetic_requests(kind, 200, seed=3, max_len=120)
    return fit_bucket_set(TINY, replay(requests, TINY), budget=budget)


def test_every_shape_the_limits_allow_has_a_bucket():
    buckets = tiny_set()
    mml, block = TINY.max_model_len, TINY.block_size
    for batch in range(1, TINY.prefill_seqs + 1):
        for query in range(1, TINY.max_num_batched_tokens // batch + 1):
            for ctx in range(0, (mml - query) // block + 1):
                assert buckets.find_prompt(batch, query, ctx) is not None, (batch, query, ctx)
    per_seq = mml // block
    for batch in range(1, TINY.max_num_seqs + 1):
        for blocks in range(batch, batch * per_seq + 1):
            assert buckets.find_decode(batch, blocks) is not None, (batch, blocks)


def test_fit_stays_in_budget_and_is_deterministic():
    first, second = tiny_set(budget=9), tiny_set(budget=9)
    assert len(first.prompt) + len(first.decode) <= 9
    assert first.digest() == second.digest()


def test_decode_steps_busier_than_the_fit_climb_the_edges_not_to_the_cover():
    requests = synthetic_requests("chat", 600, seed=5)
    fit_shapes = replay(requests, LLAMA3_8B, ReplaySettings(rate=4.0))
    fitted = fit_bucket_set(LLAMA3_8B, fit_shapes, budget=43)
    cover = cover_buckets(LLAMA3_8B)[1]
    seen_batch, seen_blocks = max(b for b, _ in fit_shapes.decode), max(c for _, c in fit_shapes.decode)
    busier = replay(requests, LLAMA3_8B, ReplaySettings(rate=8.0)).decode
    beyond = [(b, c) for b, c in busier if b > seen_batch or c > seen_blocks]
    assert beyond, "the busier replay must reach past what the fit saw"
    for batch, blocks in beyond:
        if batch <= 2 * seen_batch and blocks <= 2 * seen_blocks:
            bucket = fitted.find_decode(batch, blocks)
            assert bucket is not None and bucket not in cover and bucket.ctx_blocks <= 2 * seen_blocks


def test_a_prompt_step_without_context_past_the_fit_pads_no_context():
    limits = LLAMA3_8B.model_copy(update={"max_num_prefill_seqs": 8, "max_num_batched_tokens": 8192})
    fitted = fit_bucket_set(limits, replay(synthetic_requests("chat", 300, seed=2), limits), budget=60)
    for batch in (1, 3, 8):
        query = limits.max_num_batched_tokens // batch
        bucket = fitted.find_prompt(batch, query, 0)
        assert bucket is not None and bucket.ctx_blocks == 0, (batch, bucket)


def test_a_budget_below_the_cover_is_refused_with_the_least_that_works():
    with pytest.raises(BucketError, match="raise budget to at least"):
        tiny_set(budget=3)


def test_max_waste_picks_the_smallest_set_under_it():
    shapes = replay(synthetic_requests("chat", 300, seed=1), LLAMA3_8B)
    loose = fit_bucket_set(LLAMA3_8B, shapes, max_waste=0.2)
    tight = fit_bucket_set(LLAMA3_8B, shapes, max_waste=0.05)
    assert len(loose.prompt) + len(loose.decode) < len(tight.prompt) + len(tight.decode)
    f = figures(tight, shapes)
    assert max(f.prefill_tokens, f.prefill_ctx, f.decode_batch, f.decode_blocks) <= 0.05


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"strategy": "traffic", "budget": 10}, "needs trace"),
        ({"strategy": "traffic", "trace": "t.csv"}, "exactly one of budget"),
        ({"strategy": "traffic", "trace": "t.csv", "budget": 10, "max_waste": 0.1}, "exactly one of budget"),
        ({"strategy": "linear", "trace": "t.csv"}, "only apply to strategy 'traffic'"),
        (
            {"strategy": "linear", "prompt_bs": {"min": 1, "step": 1, "max": 1, "pad_max": 2}},
            "only apply to strategy 'pad'",
        ),
    ],
)
def test_settings_that_do_not_fit_the_strategy_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        BucketSettings(**settings)


def test_the_trace_content_not_its_path_joins_the_key(tmp_path):
    trace = write_jsonl(synthetic_requests("chat", 50), tmp_path / "fit.jsonl")
    settings = BucketSettings(strategy="traffic", trace="fit.jsonl", budget=20)
    factors = bucket_key_factors(settings, tmp_path)
    assert "trace" not in factors and len(factors["trace_sha256"]) == 64
    key = Key.of("buckets", {"buckets": factors})  # keys refuse paths: this one holds none
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "fit.jsonl").write_bytes(trace.read_bytes())
    assert Key.of("buckets", {"buckets": bucket_key_factors(settings, moved)}).digest == key.digest
    write_jsonl(synthetic_requests("chat", 51), moved / "fit.jsonl")
    assert Key.of("buckets", {"buckets": bucket_key_factors(settings, moved)}).digest != key.digest
    assert build_bucket_set(TINY, settings, tmp_path).strategy == "traffic"


@pytest.mark.parametrize("limits", [TINY, LLAMA3_8B, LLAMA3_8B.model_copy(update={"enable_prefix_caching": False})])
@pytest.mark.parametrize("strategy", ["exponential", "pad", "traffic"])
def test_the_bucket_file_reads_back_upstream_as_exactly_the_baked_set(limits, strategy):
    shapes = replay(synthetic_requests("code", 200, seed=2), limits)
    baked = strategy_set(strategy, limits, shapes)
    prompt, decode = upstream_reading(bucket_file_text(baked), limits)
    assert prompt == [(b.batch, b.query, b.ctx_blocks) for b in baked.prompt]
    assert decode == [(b.batch, b.query, b.ctx_blocks) for b in baked.decode]


def test_upstream_file_syntax_lists_ranges_and_comments():
    text = "# c\n(1, 2048, 0)\n(1, [256, 512], [0, 4])\n(1, 1, range(256, 320, 32))\nbad line\n(1, 2)\n"
    prompt, decode = parse_bucket_file(text)
    assert prompt == [(1, 256, 0), (1, 256, 4), (1, 512, 0), (1, 512, 4), (1, 2048, 0)]
    assert decode == [(1, 1, 256), (1, 1, 288)]


@pytest.mark.parametrize("kind", ["chat", "code"])
def test_traffic_sets_beat_exponential_on_traffic_they_never_saw(kind):
    fit, unseen = split_trace(synthetic_requests(kind, 3000, seed=7))
    fit_shapes, eval_shapes = replay(fit, LLAMA3_8B), replay(unseen, LLAMA3_8B)
    exponential = build_bucket_set(LLAMA3_8B, BucketSettings())
    exp_count = len(exponential.prompt) + len(exponential.decode)
    exp = figures(exponential, eval_shapes)
    small = figures(fit_bucket_set(LLAMA3_8B, fit_shapes, budget=exp_count // 3), eval_shapes)
    same = figures(fit_bucket_set(LLAMA3_8B, fit_shapes, budget=exp_count), eval_shapes)
    assert small.unfitted == same.unfitted == 0
    assert same.prefill_tokens < exp.prefill_tokens
    assert small.decode_batch <= exp.decode_batch and small.decode_blocks <= exp.decode_blocks


@pytest.mark.parametrize("kind", ["chat", "code", "chat-busy", "code-long"])
def test_a_third_of_exponentials_count_pads_no_figure_more_than_exponential(kind):
    fit, unseen = split_trace(synthetic_requests(kind, 3000, seed=7))
    fit_shapes, eval_shapes = replay(fit, LLAMA3_8B), replay(unseen, LLAMA3_8B)
    exponential = build_bucket_set(LLAMA3_8B, BucketSettings())
    exp = figures(exponential, eval_shapes)
    budget = (len(exponential.prompt) + len(exponential.decode)) // 3
    small = figures(fit_bucket_set(LLAMA3_8B, fit_shapes, budget=budget), eval_shapes)
    same = figures(fit_bucket_set(LLAMA3_8B, fit_shapes, budget=budget * 3), eval_shapes)
    assert same.prefill_tokens <= exp.prefill_tokens / 3
    for name in ("prefill_tokens", "prefill_ctx", "decode_batch", "decode_blocks"):
        assert getattr(small, name) <= getattr(exp, name) + 1e-9, name


def test_cli_json_has_exactly_the_promised_shape(tmp_path, capsys):
    trace = write_jsonl(synthetic_requests("chat", 100, max_len=120), tmp_path / "fit.jsonl")
    out = tmp_path / "buckets.json"
    assert (
        main(["buckets", "--model", "tiny-llama", "--trace", str(trace), "--budget", "9", "--json", "--out", str(out)])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["exponential", "linear", "pad", "traffic"]
    for entry in report.values():
        assert set(entry) == {"prompt", "decode", "waste", "unfitted"}
        assert set(entry["waste"]) == {"prefill_tokens", "prefill_ctx", "decode_batch", "decode_blocks"}
    assert report["traffic"]["prompt"] + report["traffic"]["decode"] <= 9
    assert json.loads(out.read_text())["strategy"] == "traffic"


def test_cli_without_a_trace_shows_the_sets_and_says_what_to_pass_for_waste(capsys):
    assert main(["buckets", "--model", "tiny-llama"]) == 0
    assert "pass --trace FILE" in capsys.readouterr().out
    assert main(["buckets", "--model", "tiny-llama", "--strategy", "traffic"]) == 2
    assert "--trace" in capsys.readouterr().err
