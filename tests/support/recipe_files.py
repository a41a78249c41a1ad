"""Writing a Recipe back to a TOML file, for tests that change a shipped recipe and load it by name,
and a shipped recipe whose weights are a folder."""

from __future__ import annotations

import json
from pathlib import Path

from prebake.artifacts.recipe.schema import Recipe


def write_recipe(recipe: Recipe, folder: Path) -> Path:
    """recipes/<name>.toml in `folder`, loadable with PREBAKE_RECIPES=folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{recipe.model.name}.toml"
    path.write_text(_toml(recipe.model_dump(mode="json", exclude_none=True)))
    return path


def with_folder_weights(recipe: Recipe, folder: Path, **matrix: list) -> Recipe:
    """`recipe` with its weights a folder holding only its config.json (engines that read the
    folder, not the weights: no transformers run), and [matrix] entries replaced by `matrix`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(recipe.model.config))
    data = recipe.model_dump(mode="json")
    data["model"]["weights"] = str(folder)
    data["matrix"].update(matrix)
    return Recipe.model_validate(data)


def _toml(data: dict, prefix: str = "") -> str:
    plain = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"[{prefix}]"] if prefix and plain else []
    lines += [f"{k} = {json.dumps(v)}" for k, v in plain.items()]  # JSON scalars and arrays are TOML too
    text = "\n".join(lines) + "\n"
    for name, table in tables.items():
        text += _toml(table, f"{prefix}.{name}" if prefix else name)
    return text
