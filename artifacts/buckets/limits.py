"""Serving limits and bucket settings: the part of a recipe that decides the shape set.

These are the same knobs vLLM and vLLM on Gaudi take (max_model_len, max_num_seqs,
max_num_batched_tokens, block_size, and the VLLM_{PROMPT,DECODE}_*_BUCKET_{MIN,STEP,MAX}
overrides), validated once when a recipe is read.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from prebake.artifacts.frozen import Frozen


class ServingLimits(Frozen):
    """What the engine promises to serve: the limits every bucket set is derived from."""

    max_model_len: int = Field(gt=0, description="longest prompt + generation, in tokens")
    max_num_seqs: int = Field(gt=0, description="most sequences decoded in one step")
    max_num_batched_tokens: int = Field(gt=0, description="most prompt tokens in one prefill step")
    block_size: int = Field(gt=0, description="KV-cache block size, in tokens")
    max_num_prefill_seqs: int | None = Field(
        default=None, gt=0, description="most prompts in one prefill step (default: max_num_seqs)"
    )
    enable_prefix_caching: bool = Field(default=False, description="prefill buckets also cover cached context blocks")
    num_device_blocks: int | None = Field(
        default=None, gt=0, description="KV blocks the device holds; caps decode block buckets"
    )

    @model_validator(mode="after")
    def _limits_fit_together(self) -> ServingLimits:
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is below block_size "
                f"({self.block_size}): no prefill bucket could hold one block; raise "
                f"max_num_batched_tokens to at least {self.block_size}"
            )
        if self.max_model_len < self.block_size:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) is below block_size ({self.block_size}); "
                f"lower block_size or raise max_model_len"
            )
        if self.prefill_seqs > self.max_num_seqs:
            raise ValueError(
                f"max_num_prefill_seqs ({self.max_num_prefill_seqs}) exceeds max_num_seqs "
                f"({self.max_num_seqs}); lower it to at most {self.max_num_seqs}"
            )
        return self

    @property
    def prefill_seqs(self) -> int:
        return self.max_num_prefill_seqs or self.max_num_seqs


class BucketRange(Frozen):
    """One dimension's range, as vllm-gaudi's VLLM_*_BUCKET_{MIN,STEP,MAX} variables give it
    (and, for the pad strategy, VLLM_*_BUCKET_PAD_MAX and _PAD_PERCENT)."""

    min: int = Field(ge=0)
    step: int = Field(gt=0)
    max: int = Field(gt=0)
    pad_max: int | None = Field(default=None, ge=0, description="pad strategy: most padded positions (0: max)")
    pad_percent: int | None = Field(default=None, ge=0, le=50, description="pad strategy: most padding, in %")

    @model_validator(mode="after")
    def _ordered(self) -> BucketRange:
        if self.min > self.max:
            raise ValueError(f"bucket range min ({self.min}) exceeds max ({self.max}); swap them")
        return self


RANGE_FIELDS = ("prompt_bs", "prompt_seq", "prompt_ctx", "decode_bs", "decode_block")
TRAFFIC_FIELDS = ("trace", "budget", "max_waste", "rate")


class BucketSettings(Frozen):
    """How to turn serving limits into buckets.

    exponential | linear | pad: vllm-gaudi's own strategies (linear and pad take per-dimension
    ranges). traffic: buckets fitted to a request trace (`trace`, a CSV or JSONL file, relative to
    the recipe) with at most `budget` buckets in all, or as few as keep padding under `max_waste`;
    `rate` replays the trace at that many requests per second (default: its own timestamps).
    """

    strategy: Literal["exponential", "linear", "pad", "traffic"] = "exponential"
    prompt_bs: BucketRange | None = None
    prompt_seq: BucketRange | None = None
    prompt_ctx: BucketRange | None = None
    decode_bs: BucketRange | None = None
    decode_block: BucketRange | None = None
    trace: str | None = Field(default=None, description="traffic: the request trace to fit on")
    budget: int | None = Field(default=None, gt=0, description="traffic: most buckets, prompt and decode together")
    max_waste: float | None = Field(default=None, gt=0, lt=1, description="traffic: most padded share per figure")
    rate: float | None = Field(default=None, gt=0, description="traffic: replay load, requests per second")

    @model_validator(mode="after")
    def _settings_fit_strategy(self) -> BucketSettings:
        ranges = [f for f in RANGE_FIELDS if getattr(self, f) is not None]
        traffic = [f for f in TRAFFIC_FIELDS if getattr(self, f) is not None]
        padding = [
            f for f in ranges if getattr(self, f).pad_max is not None or getattr(self, f).pad_percent is not None
        ]
        if self.strategy in ("exponential", "traffic") and ranges:
            raise ValueError(
                f"bucket ranges {ranges} have no effect with strategy {self.strategy!r}; remove them "
                f"or set strategy = 'linear' or 'pad' (set max_num_prefill_seqs for the prompt batch)"
            )
        if padding and self.strategy != "pad":
            raise ValueError(f"pad_max / pad_percent in {padding} only apply to strategy 'pad'; remove them")
        if self.strategy != "traffic" and traffic:
            raise ValueError(f"{traffic} only apply to strategy 'traffic'; remove them or set strategy = 'traffic'")
        if self.strategy == "traffic":
            if not self.trace:
                raise ValueError("strategy 'traffic' needs trace = '<file>.csv' or '<file>.jsonl' to fit on")
            if (self.budget is None) == (self.max_waste is None):
                raise ValueError(
                    "strategy 'traffic' needs exactly one of budget = N (most buckets in all) or "
                    "max_waste = x (most padded share, 0 < x < 1)"
                )
        return self
