"""No sampling option adds a compile at serving time: every option runs on the logits the compiled
steps return (runtime.sampling), so after warm-up the steps compile nothing, whatever a request asks."""

from __future__ import annotations

import pytest
import torch

from prebake.artifacts.buckets.artifact import build_bucket_set
from prebake.artifacts.buckets.limits import BucketRange, BucketSettings, ServingLimits
from prebake.engine.bundled.runtime.model import KVCache, build_model
from prebake.engine.bundled.runtime.sampling import SamplingOptions
from prebake.engine.bundled.runtime.scheduler import Request, Scheduler
from prebake.engine.bundled.runtime.shapes import step_shapes
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
from prebake.engine.bundled.runtime.weights import LlamaConfig, tiny_random_weights

pytestmark = pytest.mark.slow

LIMITS = ServingLimits(max_model_len=32, max_num_seqs=1, max_num_batched_tokens=32, block_size=32)
ONE_OF_EACH = BucketSettings(  # one prefill shape and one decode shape: two compiles in all
    strategy="linear", prompt_bs=BucketRange(min=1, step=1, max=1), decode_bs=BucketRange(min=1, step=1, max=1)
)
CONFIG = LlamaConfig(
    model_type="llama",
    vocab_size=300,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=32,
)
EVERY_OPTION = SamplingOptions(
    top_k=5,
    min_p=0.05,
    repetition_penalty=1.3,
    presence_penalty=0.5,
    frequency_penalty=0.5,
    logit_bias=((7, 2.0), (9, -50.0)),
    min_tokens=3,
)


def test_no_sampling_option_compiles_anything_after_warm_up():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]  # another module's compiles, on this worker
    model = build_model(CONFIG, tiny_random_weights(CONFIG, seed=1), torch.float32)
    cache = KVCache.allocate(CONFIG, LIMITS.max_num_seqs, LIMITS.max_model_len, dtype=torch.float32)
    buckets = build_bucket_set(LIMITS, ONE_OF_EACH)
    steps = CompiledSteps(model, cache)
    shapes = step_shapes(buckets, LIMITS.max_model_len)
    steps.warm_up({shape: Tactic() for shape in shapes}, log=lambda line: None)
    compiled = counters["stats"]["unique_graphs"]
    assert compiled - before == len(shapes) == 2
    scheduler = Scheduler(steps, buckets, {}, LIMITS.max_model_len)
    requests = [
        Request(
            (1, 2, 3), max_tokens=8, temperature=0.9, top_p=0.9, seed=3, stop_ids=frozenset({2}), options=EVERY_OPTION
        ),
        Request((4, 5), max_tokens=8, options=EVERY_OPTION),  # greedy, with penalties and bias
        Request((6,), max_tokens=8, temperature=1.5, seed=1, options=SamplingOptions(top_k=1)),
    ]
    futures = [scheduler.submit(r) for r in requests]
    scheduler.run_until_idle()
    assert all(len(f.result().tokens) >= 3 for f in futures)
    assert counters["stats"]["unique_graphs"] == compiled, "a sampling option compiled a graph at serving time"
