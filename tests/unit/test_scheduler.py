"""The scheduler: requests batched into buckets give the tokens they would get one by one."""

from __future__ import annotations

import pytest
import torch

from prebake.artifacts.buckets.artifact import build_bucket_set
from prebake.artifacts.buckets.limits import BucketRange, BucketSettings, ServingLimits
from prebake.engine.bundled.runtime.model import KVCache, build_model, generate
from prebake.engine.bundled.runtime.scheduler import Request, RequestRejected, Scheduler
from prebake.engine.bundled.runtime.steps import CompiledSteps
from prebake.engine.bundled.runtime.weights import LlamaConfig, tiny_random_weights

LIMITS = ServingLimits(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=64, block_size=32)
CONFIG = LlamaConfig(
    model_type="llama",
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, tiny_random_weights(CONFIG, seed=3), torch.float32)


# Only batch-2 buckets: every step with one request in it runs one padding row.
BATCH_TWO_ONLY = BucketSettings(
    strategy="linear", prompt_bs=BucketRange(min=2, step=2, max=2), decode_bs=BucketRange(min=2, step=2, max=2)
)


def scheduler(model, settings: BucketSettings = BucketSettings()) -> Scheduler:
    cache = KVCache.allocate(CONFIG, LIMITS.max_num_seqs, LIMITS.max_model_len, dtype=torch.float32)
    buckets = build_bucket_set(LIMITS, settings)
    return Scheduler(CompiledSteps(model, cache, compile=False), buckets, {}, LIMITS.max_model_len)


def serve(sched: Scheduler, requests: list[Request]) -> list[tuple[tuple[int, ...], str]]:
    futures = [sched.submit(r) for r in requests]
    sched.run_until_idle()
    return [(f.result().tokens, f.result().finish_reason) for f in futures]


def prompt(n: int, start: int) -> tuple[int, ...]:
    return tuple((start + 7 * i) % CONFIG.vocab_size for i in range(n))


REQUESTS = [
    Request(prompt(5, 1), max_tokens=6),
    Request(prompt(40, 2), max_tokens=9),  # longer than the b2 prefill bucket: prefilled on its own
    Request(prompt(12, 3), max_tokens=3),
    Request(prompt(30, 4), max_tokens=12, temperature=0.9, top_p=0.8, seed=11),
    Request(prompt(2, 5), max_tokens=20, temperature=1.3, seed=5),
]


def test_concurrent_requests_get_the_tokens_they_get_one_by_one(model):
    together = serve(scheduler(model), REQUESTS)  # two cache slots: requests join as others finish
    alone = [serve(scheduler(model), [r])[0] for r in REQUESTS]
    assert together == alone
    assert [len(t) for t, _ in together] == [r.max_tokens for r in REQUESTS]
    assert {reason for _, reason in together} == {"length"}


def test_padding_rows_do_not_change_a_requests_tokens(model):
    short = [r for r in REQUESTS if len(r.prompt) <= 32]  # the batch-2-only set's one prefill bucket is 32 tokens
    padded = serve(scheduler(model, BATCH_TWO_ONLY), short)
    alone = [serve(scheduler(model), [r])[0] for r in short]
    assert padded == alone


def test_greedy_tokens_match_the_reference_generate_loop(model):
    request = REQUESTS[0]
    cache = KVCache.allocate(CONFIG, 1, LIMITS.max_model_len, dtype=torch.float32)
    expected = generate(model, cache, [list(request.prompt)], request.max_tokens)[0]
    assert list(serve(scheduler(model), [request])[0][0]) == expected


def test_a_stop_token_ends_the_completion_with_reason_stop(model):
    first = serve(scheduler(model), [REQUESTS[0]])[0][0]
    stopped = Request(REQUESTS[0].prompt, max_tokens=6, stop_ids=frozenset({first[1]}))
    assert serve(scheduler(model), [stopped]) == [(first[:2], "stop")]


def test_a_prompt_longer_than_the_largest_bucket_is_rejected_naming_the_limit(model):
    with pytest.raises(RequestRejected, match=r"65 tokens, more than the largest prefill bucket holds \(64 tokens\)"):
        scheduler(model).submit(Request(prompt(65, 1), max_tokens=1))


def test_prompt_plus_max_tokens_beyond_max_model_len_is_rejected(model):
    with pytest.raises(RequestRejected, match="max_model_len = 64; lower max_tokens to at most 4"):
        scheduler(model).submit(Request(prompt(60, 1), max_tokens=5))


def test_token_ids_outside_the_vocabulary_are_rejected(model):
    with pytest.raises(RequestRejected, match="outside the vocabulary 0..299"):
        scheduler(model).submit(Request((1, 300), max_tokens=1))


def test_a_sink_sees_every_token_and_ends_its_row_without_touching_the_others(model):
    alone = serve(scheduler(model), REQUESTS[:2])
    seen: list[int] = []

    def sink(token: int) -> bool:  # a client that wants three tokens, then goes away
        seen.append(token)
        return len(seen) < 3

    sched = scheduler(model)
    cut = sched.submit(REQUESTS[0], sink)
    other = sched.submit(REQUESTS[1])
    sched.run_until_idle()
    assert cut.result().tokens == alone[0][0][:3] == tuple(seen) and cut.result().finish_reason == "stop"
    assert (other.result().tokens, other.result().finish_reason) == alone[1]


def test_a_sink_that_raises_ends_only_its_own_request(model):
    def broken(token: int) -> bool:
        raise RuntimeError("client gone")

    sched = scheduler(model)
    failed = sched.submit(REQUESTS[0], broken)
    fine = sched.submit(REQUESTS[2])
    sched.run_until_idle()
    assert len(failed.result().tokens) == 1
    assert fine.result().tokens == serve(scheduler(model), [REQUESTS[2]])[0][0]
