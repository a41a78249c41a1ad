"""Traces and the replay of the engine's batching, against small cases computed by hand."""

from __future__ import annotations

import pytest

from prebake.artifacts.buckets.limits import ServingLimits
from prebake.artifacts.buckets.replay import ReplaySettings, replay
from prebake.artifacts.buckets.traces import Request, read_trace, split_trace
from prebake.artifacts.errors import BucketError

SMALL = ServingLimits(
    max_model_len=256,
    max_num_seqs=2,
    max_num_batched_tokens=64,
    block_size=16,
    max_num_prefill_seqs=1,
    enable_prefix_caching=True,
)


def run(*requests: Request, limits: ServingLimits = SMALL, **settings):
    shapes = replay(tuple(requests), limits, ReplaySettings(**settings))
    return shapes.prompt, shapes.decode


def test_one_request_prefills_then_decodes_over_its_growing_blocks():
    # prefill 40 tokens (first token out), then 2 decodes over ceil(41/16) and ceil(42/16) blocks
    assert run(Request(0, 40, 3)) == ({(1, 40, 0): 1}, {(1, 3): 2})


def test_a_prompt_beside_decodes_gets_the_budget_they_leave_and_counts_partial_blocks():
    prompt, decode = run(Request(0, 10, 3), Request(0, 100, 1))
    # step 2: one decode leaves 63 tokens for the second prompt; step 3: the other 37 over
    # ceil(63 / 16) = 4 context blocks
    assert prompt == {(1, 10, 0): 1, (1, 63, 0): 1, (1, 37, 4): 1}
    assert decode == {(1, 1): 2}


def test_a_long_prompt_is_chunked_with_its_context():
    # 100 tokens, 64 a step: 64 new over no context, then 36 new over 4 cached blocks
    assert run(Request(0, 100, 1)) == ({(1, 64, 0): 1, (1, 36, 4): 1}, {})


def test_decodes_run_beside_the_next_prompt_and_take_their_share_of_the_budget():
    prompt, decode = run(Request(0, 10, 2), Request(0, 20, 2))
    assert prompt == {(1, 10, 0): 1, (1, 20, 0): 1}  # one prompt a step (max_num_prefill_seqs = 1)
    assert decode == {(1, 1): 1, (1, 2): 1}


def test_prompts_batch_up_to_the_prefill_limit_and_decode_as_one_batch():
    limits = SMALL.model_copy(update={"max_num_prefill_seqs": 2})
    assert run(Request(0, 10, 2), Request(0, 20, 2), limits=limits) == ({(2, 20, 0): 1}, {(2, 3): 1})


def test_a_prompt_waits_when_the_batch_padded_to_its_longest_would_pass_the_token_limit():
    # 50 + 10 tokens fit the 64-token budget, but padded to 50 the pair is 100 tokens: no bucket
    # vllm-gaudi warms up holds that (its prompt filter), so the short prompt waits a step
    limits = SMALL.model_copy(update={"max_num_prefill_seqs": 2})
    prompt, _ = run(Request(0, 50, 1), Request(0, 10, 1), limits=limits)
    assert prompt == {(1, 50, 0): 1, (1, 10, 0): 1}


def test_a_prefix_cache_hit_becomes_context_whole_blocks_only():
    assert run(Request(0, 50, 1, cached_tokens=35)) == ({(1, 18, 2): 1}, {})


def test_without_prefix_caching_a_cache_hit_is_recomputed():
    limits = SMALL.model_copy(update={"enable_prefix_caching": False})
    assert run(Request(0, 50, 1, cached_tokens=35), limits=limits) == ({(1, 50, 0): 1}, {})


def test_closed_loop_clients_send_the_next_request_when_one_finishes():
    limits = SMALL.model_copy(update={"max_num_seqs": 1})
    prompt, _ = run(*(Request(0, 10, 1) for _ in range(3)), limits=limits, closed_loop=True)
    assert prompt == {(1, 10, 0): 3}


def test_rate_scales_arrivals_so_requests_overlap():
    spaced = (Request(0, 10, 3), Request(100, 10, 3))
    assert run(*spaced)[1] == {(1, 1): 4}  # 100 s apart: each decodes alone
    assert run(*spaced, rate=1e6)[1] == {(1, 1): 2, (2, 2): 1}  # squeezed together: one shared step


def test_requests_are_cut_to_the_model_length():
    assert run(Request(0, 1000, 5))[0] == {(1, 64, c): 1 for c in range(0, 12, 4)} | {(1, 63, 12): 1}


def test_rate_and_closed_loop_together_are_refused():
    with pytest.raises(BucketError, match="not both"):
        run(Request(0, 10, 1), rate=1.0, closed_loop=True)


def test_azure_csv_and_jsonl_read_alike(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:48.1805900,10,2\n"
    )
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(
        '{"prompt_tokens": 374, "output_tokens": 44, "arrival_s": 5}\n\n{"prompt_tokens": 10, "output_tokens": 2, "arrival_s": 6.5}\n'
    )
    assert read_trace(csv) == read_trace(jsonl) == (Request(0.0, 374, 44), Request(1.5, 10, 2))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("t.csv", "time,prompt\n1,2\n", "lacks the Azure trace columns"),
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "line 2"),
        ("t.jsonl", '{"prompt_tokens": 1}\n', "line 1"),
        ("t.jsonl", "not json\n", "is not JSON"),
        ("t.jsonl", '{"prompt_tokens": 0, "output_tokens": 1}\n', "prompt_tokens must be >= 1"),
        ("t.jsonl", "", "holds no requests"),
        ("t.txt", "", "neither .csv"),
    ],
)
def test_bad_traces_are_refused_with_the_line_and_fix(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(BucketError, match=message):
        read_trace(path)


def test_split_trace_restarts_the_second_half_at_zero():
    first, second = split_trace((Request(0, 1, 1), Request(2, 1, 1), Request(5, 1, 1), Request(9, 1, 1)))
    assert [r.arrival_s for r in first] == [0, 2] and [r.arrival_s for r in second] == [0, 4]
