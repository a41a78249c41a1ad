"""vLLM's sampling options change the answer as vLLM's sampler would, checked against a reference
written here in plain Python on the logits the model gives for each prefix of the answer."""

from __future__ import annotations

import math
import random

import pytest
import torch

from prebake.artifacts.buckets.artifact import build_bucket_set
from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.engine.bundled.runtime.model import KVCache, build_model
from prebake.engine.bundled.runtime.sampling import SamplingOptions, adjusted_logits, draw
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
PROMPT = (5, 17, 42, 99, 17, 5, 230)
TOKENS = 12


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, tiny_random_weights(CONFIG, seed=7), torch.float32)


def serve(model, request: Request) -> tuple[tuple[int, ...], str]:
    cache = KVCache.allocate(CONFIG, LIMITS.max_num_seqs, LIMITS.max_model_len, dtype=torch.float32)
    steps = CompiledSteps(model, cache, compile=False)
    sched = Scheduler(steps, build_bucket_set(LIMITS, BucketSettings()), {}, LIMITS.max_model_len)
    future = sched.submit(request)
    sched.run_until_idle()
    return future.result().tokens, future.result().finish_reason


def logits_after(model, ids: list[int]) -> list[float]:
    """The model's next-token logits after `ids`, from a fresh one-row prefill."""
    cache = KVCache.allocate(CONFIG, 1, LIMITS.max_model_len, dtype=torch.float32)
    out = model.prefill(torch.tensor([ids]), torch.tensor([len(ids)]), torch.tensor([0]), cache)
    return out[0].tolist()


def reference_row(row: list[float], o: SamplingOptions, prompt, output: list[int], stop: frozenset[int]) -> list[float]:
    """vLLM's order, one token at a time: logit_bias, min_tokens, repetition, frequency, presence."""
    row = list(row)
    for token, bias in o.logit_bias:
        row[token] += min(100.0, max(-100.0, bias))
    if len(output) < o.min_tokens:
        for token in stop:
            row[token] = -math.inf
    for token in set(prompt) | set(output):
        row[token] = row[token] / o.repetition_penalty if row[token] > 0 else row[token] * o.repetition_penalty
    for token in output:
        row[token] -= o.frequency_penalty
    for token in set(output):
        row[token] -= o.presence_penalty
    return row


def argmax(row: list[float]) -> int:
    return max(range(len(row)), key=lambda i: row[i])


def greedy_replay(model, options: SamplingOptions, stop: frozenset[int] = frozenset()) -> list[int]:
    """The greedy answer the reference gives, token by token on the model's own logits."""
    out: list[int] = []
    for _ in range(TOKENS):
        out.append(argmax(reference_row(logits_after(model, [*PROMPT, *out]), options, PROMPT, out, stop)))
        if out[-1] in stop:
            break
    return out


PLAIN = SamplingOptions()
LEAN = ((123, 3.0),)  # a bias that makes the random model repeat token 123, so penalties have repeats to act on
BIASED = SamplingOptions(logit_bias=LEAN)
GREEDY_OPTIONS = {  # name: (options, the options whose answer they must change)
    "logit_bias": (SamplingOptions(logit_bias=((123, 7.5), (35, -100.0))), PLAIN),
    "repetition_penalty": (SamplingOptions(logit_bias=LEAN, repetition_penalty=1.8), BIASED),
    "repetition_penalty below 1": (SamplingOptions(repetition_penalty=0.5), PLAIN),
    "frequency_penalty": (SamplingOptions(logit_bias=LEAN, frequency_penalty=0.8), BIASED),
    "presence_penalty": (SamplingOptions(logit_bias=LEAN, presence_penalty=2.0), BIASED),
    "negative presence_penalty": (SamplingOptions(presence_penalty=-2.0), PLAIN),
}


@pytest.mark.parametrize("name", list(GREEDY_OPTIONS))
def test_each_logits_option_gives_the_references_greedy_answer_and_changes_it(model, name):
    options, before = GREEDY_OPTIONS[name]
    baseline, _ = serve(model, Request(PROMPT, max_tokens=TOKENS, options=before))
    served, reason = serve(model, Request(PROMPT, max_tokens=TOKENS, options=options))
    assert list(served) == greedy_replay(model, options) and reason == "length"
    assert served != baseline, f"{name} did not change the answer; make it stronger"
    assert list(baseline) == greedy_replay(model, before)


def test_min_tokens_keeps_the_stop_tokens_out_until_reached(model):
    plain, _ = serve(model, Request(PROMPT, max_tokens=TOKENS))
    stop = frozenset({plain[1], plain[3]})
    early, reason = serve(model, Request(PROMPT, max_tokens=TOKENS, stop_ids=stop))
    assert early == plain[:2] and reason == "stop"
    options = SamplingOptions(min_tokens=6)
    held, _ = serve(model, Request(PROMPT, max_tokens=TOKENS, stop_ids=stop, options=options))
    assert len(held) >= 6 and not set(held[:6]) & stop
    assert list(held) == greedy_replay(model, options, stop)


def test_top_k_one_at_any_temperature_is_the_greedy_answer(model):
    plain, _ = serve(model, Request(PROMPT, max_tokens=TOKENS))
    hot = SamplingOptions(top_k=1)
    for seed in (1, 2, 3):
        assert serve(model, Request(PROMPT, max_tokens=TOKENS, temperature=1.8, seed=seed, options=hot))[0] == plain


@pytest.mark.parametrize("options", [SamplingOptions(top_k=3), SamplingOptions(min_p=0.4)], ids=["top_k", "min_p"])
def test_every_token_sampled_with_top_k_or_min_p_is_one_the_reference_allows(model, options):
    for seed in range(4):
        tokens, _ = serve(model, Request(PROMPT, max_tokens=TOKENS, temperature=1.5, seed=seed, options=options))
        for k, token in enumerate(tokens):
            allowed = reference_allowed(logits_after(model, [*PROMPT, *tokens[:k]]), 1.5, options)
            assert token in allowed, f"token {k} ({token}) is outside the {options} set {sorted(allowed)}"


def reference_probs(row: list[float], temperature: float, o: SamplingOptions, top_p: float = 1.0) -> list[float]:
    """vLLM's distribution after temperature: min_p, then top_k, then top_p, renormalized."""
    top = max(row)
    p = [math.exp((x - top) / temperature) for x in row]
    p = [x / sum(p) for x in p]
    if o.min_p:
        p = [x if x >= o.min_p * max(p) else 0.0 for x in p]
    if o.top_k >= 1:
        kth = sorted(p, reverse=True)[o.top_k - 1]
        p = [x if x >= kth else 0.0 for x in p]
    p = [x / sum(p) for x in p]
    if top_p < 1:
        mass, keep = 0.0, set()
        for i in sorted(range(len(p)), key=lambda i: -p[i]):
            if mass >= top_p:
                break
            keep.add(i)
            mass += p[i]
        p = [x if i in keep else 0.0 for i, x in enumerate(p)]
        p = [x / sum(p) for x in p]
    return p


def reference_allowed(row: list[float], temperature: float, options: SamplingOptions) -> set[int]:
    return {i for i, x in enumerate(reference_probs(row, temperature, options)) if x > 0}


ROW = [2.0, 1.6, 1.5, 0.9, 0.2, -0.5, -1.0, -3.0]


@pytest.mark.parametrize(
    "options, top_p",
    [(SamplingOptions(top_k=3), 1.0), (SamplingOptions(min_p=0.3), 1.0), (SamplingOptions(top_k=5, min_p=0.1), 0.8)],
    ids=["top_k", "min_p", "top_k+min_p+top_p"],
)
def test_draws_follow_the_references_distribution(options, top_p):
    expected = reference_probs(ROW, 0.9, options, top_p)
    generator = torch.Generator().manual_seed(0)
    row = torch.tensor(ROW)
    n = 12000
    counts = [0] * len(ROW)
    for _ in range(n):
        counts[draw(row, 0.9, top_p, options, generator)] += 1
    for i, p in enumerate(expected):
        assert abs(counts[i] / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (i, counts[i] / n, p)


def test_neutral_options_leave_the_row_untouched_and_draw_as_before():
    row = torch.tensor(ROW)
    assert adjusted_logits(row, PLAIN, (1, 2), [3], frozenset({0})) is row
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    from prebake.engine.bundled.runtime.model import sample

    assert [draw(row, 0.7, 0.9, PLAIN, a) for _ in range(50)] == [
        int(sample(row[None], 0.7, 0.9, b)[0]) for _ in range(50)
    ]


@pytest.mark.parametrize(
    "options, words",
    [
        (SamplingOptions(top_k=-2), "top_k must be -1 or 0"),
        (SamplingOptions(min_p=1.5), "min_p must be in [0, 1]"),
        (SamplingOptions(repetition_penalty=0.0), "repetition_penalty must be above 0"),
        (SamplingOptions(presence_penalty=2.5), "presence_penalty must be in [-2, 2]"),
        (SamplingOptions(logit_bias=((300, 1.0),)), "logit_bias names token ids [300] outside the vocabulary"),
        (SamplingOptions(min_tokens=20), "min_tokens (20) is more than max_tokens (12)"),
    ],
)
def test_out_of_range_options_are_refused_naming_the_bound(model, options, words):
    cache = KVCache.allocate(CONFIG, 1, LIMITS.max_model_len, dtype=torch.float32)
    sched = Scheduler(CompiledSteps(model, cache, compile=False), build_bucket_set(LIMITS, BucketSettings()), {}, 64)
    with pytest.raises(RequestRejected) as caught:
        sched.submit(Request(PROMPT, max_tokens=TOKENS, options=options))
    assert words in str(caught.value)


def test_options_batched_with_others_give_the_answers_they_give_alone(model):
    rng = random.Random(3)
    requests = [
        Request(PROMPT, max_tokens=TOKENS, options=GREEDY_OPTIONS["repetition_penalty"][0]),
        Request(tuple(rng.randrange(300) for _ in range(9)), max_tokens=TOKENS, temperature=1.0, seed=4),
        Request(PROMPT, max_tokens=TOKENS, temperature=1.2, seed=9, options=SamplingOptions(top_k=4, min_p=0.05)),
    ]
    cache = KVCache.allocate(CONFIG, LIMITS.max_num_seqs, LIMITS.max_model_len, dtype=torch.float32)
    sched = Scheduler(CompiledSteps(model, cache, compile=False), build_bucket_set(LIMITS, BucketSettings()), {}, 64)
    futures = [sched.submit(r) for r in requests]
    sched.run_until_idle()
    assert [f.result().tokens for f in futures] == [serve(model, r)[0] for r in requests]
