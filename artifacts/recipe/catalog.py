"""The recipes this process can load, as `prebake recipes` reports them: the folders searched, in
order, and every recipe found (a name found twice: the first wins, the later one is shadowed)."""

from __future__ import annotations

from dataclasses import dataclass

from prebake.artifacts.recipe.schema import FoundRecipe, RecipeFolder, find_recipes, recipe_folders


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
