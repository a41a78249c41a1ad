"""Every shipped recipe's key digests, pinned: a refactor of how variants, options or engines are
declared cannot move a key (a moved key disowns every bundle baked before it).

The host is a fixed stand-in (its platform and software factors are constants), so the digests
depend on the recipes and the key code alone. A change that means to move keys updates DIGESTS
and says so in its commit
(recipe_key_digests.json beside this file).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.recipe.kinds import target_keys
from prebake.artifacts.recipe.schema import Recipe, load_recipe, targets
from prebake.engine.adapters import kinds_for


@dataclass(frozen=True)
class _Platform:
    device: str = "cpu"
    arch: str = "x86_64"

    def factors(self) -> dict[str, str]:
        return {"device": self.device, "arch": self.arch, "device_name": "pinned-cpu", "isa": "avx2,avx512f"}


@dataclass(frozen=True)
class _Software:
    def factors(self) -> dict[str, str]:
        return {"python": "3.12", "torch": "2.13.0", "triton": "none"}

    def package_factors(self, names: Sequence[str]) -> dict[str, str]:
        return {name: "1.0.0" for name in names}


@dataclass(frozen=True)
class _PinnedHost:
    platform: _Platform = _Platform()
    software: _Software = _Software()

    def can_build(self, device: str, dtype: str) -> tuple[bool, str]:
        return True, "pinned"


def _with_compile(recipe: Recipe, **update: object) -> Recipe:
    return recipe.model_copy(update={"compile": recipe.compile.model_copy(update=update)})


def _recipes() -> dict[str, Recipe]:
    """The shipped recipes, and tiny-llama in every graphs variant (and the package's opt-in fallback)."""
    shipped = {name: load_recipe(name) for name in ("tiny-llama", "tiny-llama-vllm", "llama3-8b", "smollm2-135m")}
    tiny = shipped["tiny-llama"]
    return {
        **shipped,
        "tiny-llama+inductor-cache": _with_compile(tiny, variant="inductor-cache"),
        "tiny-llama+dynamo-precompile": _with_compile(tiny, variant="dynamo-precompile"),
        "tiny-llama+aoti-package": _with_compile(tiny, variant="aoti-package"),
        "tiny-llama+aoti-package+fallback": _with_compile(tiny, variant="aoti-package", fallback="dynamo-precompile"),
    }


def _digests() -> dict[str, str]:
    found = {}
    for name, recipe in _recipes().items():
        for target in targets(recipe):
            plan = target_keys(recipe, target, _PinnedHost(), kinds_for(recipe, target))
            for kind, key in plan.keys.items():
                found[f"{name} {target.platform}/tp{target.tp}/{target.dtype} {kind}"] = key.digest
    return found


PINNED = Path(__file__).with_name("recipe_key_digests.json")  # recipe target kind -> digest


def test_every_recipe_targets_key_digests_are_unchanged(monkeypatch):
    monkeypatch.delenv("PREBAKE_KEY_SALT", raising=False)
    found, pinned = _digests(), json.loads(PINNED.read_text())
    assert sorted(found) == sorted(pinned)  # every recipe x target x kind, no row more or less
    moved = [row for row in pinned if found[row] != pinned[row]]
    assert not moved, f"keys moved (bundles baked before no longer match): {moved}"
