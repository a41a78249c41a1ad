"""Bucket sets: vllm-gaudi's ranges and bucket sets reproduced, looked up, padded and serialised.

Cases marked "vllm-gaudi" come from its tests/unit_tests (test_bucketing.py and the warm-up
regression tests next to it) or from the docstrings and docs of vllm_gaudi/extension/bucketing/.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.buckets.artifact import (
    Bucket,
    BucketSet,
    build_bucket_set,
    exponential_range,
    linear_range,
)
from prebake.artifacts.buckets.limits import BucketRange, BucketSettings, ServingLimits
from prebake.artifacts.errors import BucketError
from prebake.engine.vllm.gaudi import vllm_gaudi_env

REPO = Path(__file__).resolve().parents[2]

# Llama-3.1-8B on Gaudi as REFERENCE.md counts it, with vllm-gaudi's own defaults for what the
# recipe leaves open: vLLM enables prefix caching by default, and vllm-gaudi's runner prefills one
# prompt per step unless VLLM_PROMPT_BS_BUCKET_MAX says otherwise.
LLAMA3_8B = ServingLimits(
    max_model_len=8192,
    max_num_seqs=128,
    max_num_batched_tokens=2048,
    block_size=128,
    max_num_prefill_seqs=1,
    enable_prefix_caching=True,
)
EXPONENTIAL = BucketSettings(strategy="exponential")
LINEAR = BucketSettings(strategy="linear")


def linear_with(**ranges: tuple[int, int, int]) -> BucketSettings:
    return BucketSettings(
        strategy="linear", **{name: BucketRange(min=a, step=b, max=c) for name, (a, b, c) in ranges.items()}
    )


# --- ranges ---------------------------------------------------------------------------------------


def test_linear_range_ramps_by_doubling_up_to_step():
    assert linear_range(2, 64, 128) == [2, 4, 8, 16, 32, 64, 128]  # vllm-gaudi test_warmup_range
    assert linear_range(1, 64, 128) == [1, 2, 4, 8, 16, 32, 64, 128]  # test_warmup_range_with_one
    assert linear_range(2, 32, 64) == [2, 4, 8, 16, 32, 64]  # docs: "Example with ramp-up"
    assert linear_range(128, 128, 512) == [128, 256, 384, 512]  # docs: "Example without ramp-up"


def test_linear_range_with_min_zero_starts_at_step_and_keeps_zero():
    assert linear_range(0, 32, 128) == [0, 32, 64, 96, 128]
    assert linear_range(0, 1, 4) == [0, 1, 2, 3, 4]


def test_linear_range_whose_start_passes_max_keeps_only_zero_as_upstream_does():
    # vllm-gaudi 091bbad's warmup_range: min 0 ramps from step, which is above max: only 0 stays.
    assert linear_range(0, 8, 4) == [0]


def test_exponential_range_matches_upstream_docstring_example():
    # warmup_range_with_limit's docstring: bmin=128, bstep=128, bmax=2048, num_buckets=10
    assert exponential_range(128, 128, 2048, 10) == [128, 256, 384, 512, 640, 896, 1152, 1536, 2048]


def test_exponential_range_matches_upstream_decode_batch_log():
    # vllm-gaudi test_real_scenario_decode_bs_range_matches_log: bs cfg [1, 2, 256, 9]
    assert exponential_range(1, 2, 256, 9) == [1, 2, 4, 8, 14, 24, 42, 78, 140, 256]


def test_exponential_range_never_passes_max():
    # vllm-gaudi test_exponential_warmup_range_respects_max: (1, 256, 10779, 14)
    values = exponential_range(1, 256, 10779, 14)
    assert min(values) == 1 and max(values) == 10779
    assert values == sorted(set(values))


def test_exponential_range_with_limit_one_is_just_max():
    assert exponential_range(1, 2, 1, 1) == [1]
    assert exponential_range(0, 1, 48, 7) == [0, 1, 2, 4, 7, 14, 26, 48]


def test_exponential_range_refuses_a_zero_limit():
    with pytest.raises(BucketError, match="limit 0"):
        exponential_range(128, 128, 1, 0)


# --- whole bucket sets ----------------------------------------------------------------------------


def test_llama3_8b_bucket_counts_per_strategy():
    exponential = build_bucket_set(LLAMA3_8B, EXPONENTIAL)
    linear = build_bucket_set(LLAMA3_8B, LINEAR)
    # REFERENCE.md says "about 130" for exponential: exactly 130 here. It says "about 1,200" for
    # linear: 1,212 here (1,009 prompt + 203 decode), as vllm-gaudi 091bbad builds them.
    assert (len(exponential.prompt), len(exponential.decode)) == (72, 58)
    assert (len(linear.prompt), len(linear.decode)) == (1009, 203)


def test_without_prefix_caching_decode_uses_contiguous_blocks():
    # vllm-gaudi turns contiguous PA on when prefix caching is off: no one-block-per-sequence
    # filter, no max_model_len correction, block max = the device's blocks.
    buckets = build_bucket_set(LLAMA3_8B.model_copy(update={"enable_prefix_caching": False}), EXPONENTIAL)
    assert len(buckets.prompt) == 72
    assert len(buckets.decode) == 9 * 14
    assert Bucket(128, 1, 1) in buckets.decode


def test_with_prefix_caching_a_decode_batch_needs_a_block_per_sequence():
    buckets = build_bucket_set(LLAMA3_8B, EXPONENTIAL)
    assert all(b.batch <= b.ctx_blocks <= b.batch * 64 for b in buckets.decode)
    assert Bucket(1, 1, 64) in buckets.decode  # 128 and above, capped at one full sequence


def test_prompt_buckets_fit_the_token_budget_and_model_length():
    limits = LLAMA3_8B.model_copy(update={"max_num_prefill_seqs": 16})
    for settings in (EXPONENTIAL, LINEAR):
        prompt = build_bucket_set(limits, settings).prompt
        assert all(b.batch * b.query <= 2048 for b in prompt)
        # vllm-gaudi's filter since April 2026: ctx <= ceil((max_model_len - 1) / block), query <= max_model_len
        assert all(b.ctx_blocks <= 64 and b.query <= 8192 for b in prompt)


def test_long_context_prompt_config_matches_upstream_log():
    # vllm-gaudi test_real_scenario_prompt_cfg_matches_log (Qwen3-32B, max_model_len 91964):
    # query cfg [128, 128, 2048, 11], ctx cfg [0, 1, 702, 11]; from 8192 tokens on, the top ctx
    # bucket becomes the most context each query can have: (91964 - query) // 128.
    limits = ServingLimits(
        max_model_len=91964,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        block_size=128,
        max_num_prefill_seqs=1,
        enable_prefix_caching=True,
        num_device_blocks=3593,
    )
    prompt = build_bucket_set(limits, EXPONENTIAL).prompt
    queries = exponential_range(128, 128, 2048, 11)
    assert sorted({b.query for b in prompt}) == queries
    edges = {(91964 - q) // 128 for q in queries}
    assert sorted({b.ctx_blocks for b in prompt}) == sorted(set(exponential_range(0, 1, 702, 11)[:-1]) | edges)


def test_linear_crossing_matches_upstream_generate_buckets_cases():
    # vllm-gaudi test_generate_prompt_buckets: bs [1..16], query [512, 1024], ctx [0..4] -> 25
    prompt_limits = ServingLimits(
        max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=2048, block_size=64, enable_prefix_caching=True
    )
    prompt = build_bucket_set(
        prompt_limits, linear_with(prompt_bs=(1, 16, 16), prompt_seq=(512, 512, 1024), prompt_ctx=(0, 1, 4))
    ).prompt
    assert len(prompt) == 25
    # test_generate_decode_buckets: bs [1..64], blocks 128..2048 step 128, max_model_len 2048 -> 18
    decode_limits = ServingLimits(
        max_model_len=2048, max_num_seqs=64, max_num_batched_tokens=131072, block_size=128, enable_prefix_caching=True
    )
    decode = build_bucket_set(decode_limits, linear_with(decode_bs=(1, 64, 64), decode_block=(128, 128, 2048))).decode
    assert len(decode) == 18


def test_device_blocks_cap_linear_decode_blocks():
    limits = LLAMA3_8B.model_copy(update={"num_device_blocks": 3593})
    assert max(b.ctx_blocks for b in build_bucket_set(limits, LINEAR).decode) == 3584
    contiguous = limits.model_copy(update={"enable_prefix_caching": False})
    for settings in (LINEAR, EXPONENTIAL):  # contiguous PA always reaches the last device block
        assert max(b.ctx_blocks for b in build_bucket_set(contiguous, settings).decode) == 3593


def test_exponential_decode_blocks_follow_upstream_sharing_headroom():
    # With prefix caching, upstream (091bbad) caps decode blocks at min(ceil(len / block) * seqs,
    # 3 * device blocks): shared prefixes let a block list name more blocks than the device holds.
    limits = LLAMA3_8B.model_copy(update={"num_device_blocks": 3593})
    assert max(b.ctx_blocks for b in build_bucket_set(limits, EXPONENTIAL).decode) == 8192
    small = LLAMA3_8B.model_copy(update={"num_device_blocks": 100})
    assert max(b.ctx_blocks for b in build_bucket_set(small, EXPONENTIAL).decode) == 3 * 100


# --- overrides ------------------------------------------------------------------------------------


def test_linear_overrides_set_their_dimension():
    buckets = build_bucket_set(LLAMA3_8B, linear_with(prompt_seq=(256, 256, 1024), decode_bs=(2, 2, 8)))
    assert sorted({b.query for b in buckets.prompt}) == [256, 512, 768, 1024]
    assert sorted({b.batch for b in buckets.decode}) == [2, 4, 6, 8]


def test_linear_ctx_override_holds_back_long_context_edge_buckets():
    # vllm-gaudi keeps an edge ctx only below VLLM_PROMPT_CTX_BUCKET_MAX; vllm_gaudi_env sets it.
    buckets = build_bucket_set(LLAMA3_8B, linear_with(prompt_ctx=(0, 1, 32)))
    assert max(b.ctx_blocks for b in buckets.prompt) == 32
    # Range (0, 4, 62) tops out at 60; an edge of exactly 62 is not below the max, so query 256
    # keeps the carried 60, and query 384 gets its edge 61.
    prompt = build_bucket_set(LLAMA3_8B, linear_with(prompt_ctx=(0, 4, 62))).prompt
    assert Bucket(1, 256, 60) in prompt and Bucket(1, 256, 62) not in prompt
    assert Bucket(1, 384, 61) in prompt


def test_ranges_given_to_the_exponential_strategy_are_refused():
    with pytest.raises(ValueError, match="strategy = 'linear'"):
        BucketSettings(strategy="exponential", decode_bs=BucketRange(min=1, step=2, max=64))


def test_a_prompt_batch_above_max_num_prefill_seqs_is_refused():
    with pytest.raises(BucketError, match="max_num_prefill_seqs"):
        build_bucket_set(LLAMA3_8B, linear_with(prompt_bs=(1, 1, 4)))


def test_ranges_that_leave_no_bucket_are_refused():
    with pytest.raises(BucketError, match="no prompt bucket"):
        build_bucket_set(LLAMA3_8B, linear_with(prompt_seq=(4096, 4096, 8192)))


# --- lookup and padding ---------------------------------------------------------------------------


SMALL = BucketSet(
    "linear",
    128,
    prompt=(Bucket(1, 128, 0), Bucket(1, 256, 0), Bucket(1, 256, 4), Bucket(2, 128, 0)),
    decode=(Bucket(1, 1, 16), Bucket(2, 1, 8), Bucket(2, 1, 32), Bucket(4, 1, 32)),
)


def test_lookup_takes_the_first_bucket_that_holds_the_step():
    assert SMALL.find_prompt(1, 100) == Bucket(1, 128, 0)
    assert SMALL.find_prompt(1, 129) == Bucket(1, 256, 0)
    assert SMALL.find_prompt(1, 200, 3) == Bucket(1, 256, 4)
    assert SMALL.find_prompt(2, 1) == Bucket(2, 128, 0)
    assert SMALL.find_decode(1, 9) == Bucket(1, 1, 16)
    assert SMALL.find_decode(2, 9) == Bucket(2, 1, 32)
    assert SMALL.find_decode(3, 1) == Bucket(4, 1, 32)


def test_lookup_beyond_every_bucket_is_none():
    assert SMALL.find_prompt(1, 257) is None
    assert SMALL.find_prompt(2, 128, 1) is None
    assert SMALL.find_decode(5, 1) is None
    assert SMALL.find_decode(1, 33) is None


def test_real_llama_lookup_pads_to_the_next_exponential_query():
    buckets = build_bucket_set(LLAMA3_8B, EXPONENTIAL)
    assert buckets.find_prompt(1, 600) == Bucket(1, 768, 0)
    assert buckets.find_decode(3, 100) == Bucket(4, 1, 128)
    assert buckets.find_prompt(2, 128) is None


def test_padding_counts_real_and_padded_work():
    report = SMALL.padding("prompt", [(1, 100, 0), (1, 200, 3), (2, 64, 0), (1, 999, 0)])
    assert (report.fitted, report.unfitted) == (3, 1)
    assert (report.real_tokens, report.padded_tokens) == (100 + 200 + 128, 128 + 256 + 256)
    assert (report.real_blocks, report.padded_blocks) == (3, 4)
    assert report.token_waste == pytest.approx(1 - 428 / 640)
    decode = SMALL.padding("decode", [(1, 4), (3, 20)])
    assert (decode.real_tokens, decode.padded_tokens, decode.real_blocks, decode.padded_blocks) == (4, 5, 24, 48)
    assert decode.block_waste == pytest.approx(0.5)


def test_padding_of_nothing_wastes_nothing():
    assert SMALL.padding("decode", []).token_waste == 0.0


def test_padding_refuses_a_shape_of_the_wrong_width():
    with pytest.raises(BucketError, match="decode shape has 2"):
        SMALL.padding("decode", [(1, 1, 4)])


# --- serialisation --------------------------------------------------------------------------------


def test_json_round_trips_exactly():
    for settings in (EXPONENTIAL, LINEAR):
        buckets = build_bucket_set(LLAMA3_8B, settings)
        data = json.loads(json.dumps(buckets.to_json()))
        assert BucketSet.from_json(data) == buckets
        assert BucketSet.from_json(data).to_json() == buckets.to_json()


def test_digest_is_sha256_of_canonical_json_and_stable():
    buckets = build_bucket_set(LLAMA3_8B, EXPONENTIAL)
    canonical = json.dumps(buckets.to_json(), sort_keys=True, separators=(",", ":"))
    assert buckets.digest() == hashlib.sha256(canonical.encode()).hexdigest()
    # Pinned: a change here changes every baked "buckets" key, so it must be deliberate.
    assert buckets.digest() == "9b7894d2d13e8cfc65842d6a746347dcc44eff4348d43f3a1cd79d990ba0f890"
    assert build_bucket_set(LLAMA3_8B, LINEAR).digest() != buckets.digest()


@pytest.mark.parametrize(
    "change",
    [
        {"version": 2},
        {"strategy": "fixed"},
        {"block_size": 0},
        {"prompt": [[1, 256, 0], [1, 128, 0]]},
        {"decode": [[1, 1]]},
        {"decode": [[1, 1, True]]},
        {"extra": 1},
    ],
)
def test_malformed_json_is_refused(change):
    data = SMALL.to_json() | change
    with pytest.raises(BucketError):
        BucketSet.from_json(data)


# --- the vllm-gaudi environment -------------------------------------------------------------------


def test_exponential_env_selects_the_strategy_and_prefill_batch():
    assert vllm_gaudi_env(LLAMA3_8B, EXPONENTIAL) == {
        "VLLM_BUCKETING_STRATEGY": "exp",
        "VLLM_EXPONENTIAL_BUCKETING": "true",
        "VLLM_CONTIGUOUS_PA": "false",
        "VLLM_PROMPT_BS_BUCKET_MAX": "1",
    }


def test_linear_env_pins_every_range_it_used():
    env = vllm_gaudi_env(LLAMA3_8B, linear_with(prompt_seq=(256, 256, 1024)))
    assert env["VLLM_BUCKETING_STRATEGY"] == "lin" and env["VLLM_EXPONENTIAL_BUCKETING"] == "false"
    assert [env[f"VLLM_PROMPT_QUERY_BUCKET_{p}"] for p in ("MIN", "STEP", "MAX")] == ["256", "256", "1024"]
    assert env["VLLM_PROMPT_CTX_BUCKET_MAX"] == str((8192 - 256) // 128)
    assert env["VLLM_DECODE_BLOCK_BUCKET_MAX"] == "8192"
    assert len([name for name in env if name.endswith(("_MIN", "_STEP", "_MAX"))]) == 15


def test_bucket_module_imports_neither_torch_nor_boto3():
    code = "import sys, prebake.artifacts.buckets.artifact; print(sorted({'torch', 'boto3'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "decode",
    [
        (Bucket(2, 1, 4), Bucket(1, 1, 4)),  # out of order
        (Bucket(1, 1, 4), Bucket(1, 1, 4)),  # twice
        (Bucket(1, 1, 8), Bucket(1, 1, 4)),  # out of order in the last field only
    ],
)
def test_a_set_whose_buckets_are_not_sorted_and_unique_is_refused_naming_the_phase(decode):
    with pytest.raises(BucketError, match="decode buckets are not sorted and unique"):
        BucketSet("exponential", 128, (Bucket(1, 128, 0),), decode)
