"""The buckets artifact: one entry point from serving limits and bucket settings to a BucketSet.

    exponential | linear | pad   vllm-gaudi's own rules (bucket_rules, the commit it follows)
    traffic                      fitted to a request trace (traces -> replay -> traffic)

`vllm_gaudi_env` gives the environment that makes vllm-gaudi build the same set (for traffic:
a VLLM_BUCKETING_FROM_FILE file, see gaudi_file), `bucket_key_factors` what joins the buckets key.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from prebake.artifacts.buckets import rules as bucket_rules
from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.buckets.rules import RANGE_VARIABLES, UPSTREAM, exponential_range, linear_range, padded_range
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
    "vllm_gaudi_env",
]
_UPSTREAM_NAMES = {"exponential": "exp", "linear": "lin", "pad": "pad"}


def build_bucket_set(limits: ServingLimits, settings: BucketSettings, recipe_dir: Path | None = None) -> BucketSet:
    """The buckets for these limits: vllm-gaudi's for its strategies, fitted ones for traffic
    (the trace path read relative to recipe_dir when it is relative)."""
    _check_overrides(limits, settings)
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


def vllm_gaudi_env(limits: ServingLimits, settings: BucketSettings, bucket_file: Path | None = None) -> dict[str, str]:
    """The environment that makes vllm-gaudi build the same buckets as build_bucket_set.

    The caller hands it to the server process; nothing here touches os.environ. Exponential takes
    no ranges, only the prefill batch (VLLM_PROMPT_BS_BUCKET_MAX); its decode blocks follow the
    device's KV block count, so pass limits.num_device_blocks for an exact match. Linear sets
    every range; pad only the recipe's overrides. Traffic sets have no rule upstream: export them
    with gaudi_file.write_bucket_file and pass that file here.
    """
    _check_overrides(limits, settings)
    contiguous = "false" if limits.enable_prefix_caching else "true"
    if settings.strategy == "traffic":
        if bucket_file is None:
            raise BucketError(
                "a traffic bucket set reaches vllm-gaudi only as a file: write it with "
                "prebake.artifacts.buckets.gaudi_file.write_bucket_file and pass bucket_file"
            )
        return {"VLLM_BUCKETING_FROM_FILE": str(bucket_file), "VLLM_CONTIGUOUS_PA": contiguous}
    env = {"VLLM_BUCKETING_STRATEGY": _UPSTREAM_NAMES[settings.strategy], "VLLM_CONTIGUOUS_PA": contiguous}
    if settings.strategy != "pad":  # deprecated but still read, and it wins when set: pad must leave it out
        env["VLLM_EXPONENTIAL_BUCKETING"] = "true" if settings.strategy == "exponential" else "false"
    if settings.strategy == "exponential":
        return env | {"VLLM_PROMPT_BS_BUCKET_MAX": str(limits.prefill_seqs)}
    configs = bucket_rules.configs(limits, settings)
    names = ("MIN", "STEP", "MAX", "PAD_MAX", "PAD_PERCENT")
    for field, config in configs.items():
        if settings.strategy == "pad" and getattr(settings, field) is None and field != "prompt_bs":
            continue
        for name, value in zip(names, config):
            if settings.strategy == "pad" and field == "prompt_bs" and settings.prompt_bs is None and name != "MAX":
                continue
            env[f"{RANGE_VARIABLES[field]}_BUCKET_{name}"] = str(value)
    return env


def _check_overrides(limits: ServingLimits, settings: BucketSettings) -> None:
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
