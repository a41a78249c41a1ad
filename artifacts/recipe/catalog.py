"""Where recipes are found: the folders searched, in order, and every recipe file along them (a
name found twice: the first wins, the later one is shadowed), as `load_recipe` searches them and
`prebake recipes` reports them. Reads folder listings only; recipe.schema reads the files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.tables import table

RECIPES_ENV = "PREBAKE_RECIPES"


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


@dataclass(frozen=True)
class RecipeCatalog:
    """The search order and the recipes found along it."""

    folders: tuple[RecipeFolder, ...]
    recipes: tuple[FoundRecipe, ...]

    @classmethod
    def here(cls) -> RecipeCatalog:
        """The catalog under this process's environment ($PREBAKE_RECIPES, the working folder, the wheel's)."""
        return cls(tuple(recipe_folders()), tuple(find_recipes()))

    def to_json(self) -> dict[str, object]:
        return {
            "search_order": [{"path": str(f.path), "source": f.source} for f in self.folders],
            "recipes": [
                {
                    "name": r.name,
                    "path": str(r.path),
                    "source": r.source,
                    "shadowed_by": str(r.shadowed_by) if r.shadowed_by else None,
                }
                for r in self.recipes
            ],
        }

    def render(self) -> str:
        """`prebake recipes`: a row per recipe file (shadowed ones say by which), then the search order."""
        rows = [
            (r.name, r.source, str(r.path), f"shadowed by {r.shadowed_by}" if r.shadowed_by else "")
            for r in self.recipes
        ]
        found = table(("NAME", "FROM", "PATH", ""), rows) if rows else "no recipes found"
        return found + "\nsearched, first match wins: " + "; ".join(f"{f.path} ({f.source})" for f in self.folders)
