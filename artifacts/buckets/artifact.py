"""The buckets artifact: one entry point from serving limits and bucket settings to a BucketSet.

    exponential | linear | pad   vllm-gaudi's own rules (bucket_rules, the commit it follows)
    traffic                      fitted to a request trace (traces -> replay -> traffic)

`bucket_key_factors` gives what joins the buckets key. The environment that makes vllm-gaudi
build the same set is the vLLM engine's (prebake.engine.vllm.gaudi).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from prebake.artifacts.buckets import rules as bucket_rules
from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.buckets.rules import UPSTREAM, exponential_range, linear_range, padded_range
from prebake.artifacts.buckets.sets import STRATEGIES, Bucket, BucketSet, PaddingReport, Phase
from prebake.artifacts.errors import BucketError

__all__ = [
    "STRATEGIES",
    "UPSTREAM",
    "Bucket",
    "BucketSet",
    "PaddingReport",
    "Phase",
    "bucket_key_factors",
    "build_bucket_set",
    "exponential_range",
    "linear_range",
    "padded_range",
]


def build_bucket_set(limits: ServingLimits, settings: BucketSettings, recipe_dir: Path | None = None) -> BucketSet:
    """The buckets for these limits: vllm-gaudi's for its strategies, fitted ones for traffic
    (the trace path read relative to recipe_dir when it is relative)."""
    check_overrides(limits, settings)
    if settings.strategy == "traffic":
        from prebake.artifacts.buckets.traffic import fit_recipe_settings  # numpy: only for traffic

        return fit_recipe_settings(limits, settings, _trace_path(settings, recipe_dir))
    return bucket_rules.upstream_set(limits, settings)


def bucket_key_factors(settings: BucketSettings, recipe_dir: Path | None = None) -> dict[str, object]:
    """The buckets key's `buckets` group: the settings, with a traffic trace given by the sha256
    of its bytes instead of its path (paths differ per host; the content is what matters)."""
    factors = settings.model_dump(mode="json", exclude={"trace"})
    if settings.strategy == "traffic":
        factors["trace_sha256"] = trace_digest(_trace_path(settings, recipe_dir))
        factors["fitter"] = "traffic-v2"
    else:
        factors["upstream"] = UPSTREAM.split(" ")[0]
    return factors


def trace_digest(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError as exc:
        raise BucketError(f"cannot read the traffic trace {path}: {exc.strerror}; fix buckets.trace") from exc
    return h.hexdigest()


def _trace_path(settings: BucketSettings, recipe_dir: Path | None) -> Path:
    path = Path(settings.trace or "").expanduser()
    return path if path.is_absolute() or recipe_dir is None else recipe_dir / path


def check_overrides(limits: ServingLimits, settings: BucketSettings) -> None:
    ceilings = {
        "prompt_bs": ("max_num_prefill_seqs", limits.prefill_seqs),
        "decode_bs": ("max_num_seqs", limits.max_num_seqs),
    }
    for field, (limit_name, ceiling) in ceilings.items():
        override = getattr(settings, field)
        if override is not None and override.max > ceiling:
            raise BucketError(
                f"{field}.max ({override.max}) exceeds {limit_name} ({ceiling}): the "
                f"server never runs such a batch; lower {field}.max to {ceiling}"
            )
