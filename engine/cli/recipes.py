"""`prebake recipes`: every recipe the search order finds, and from where (artifacts/recipe/catalog.py).

The order is the same for `doit bake` and `prebake`: $PREBAKE_RECIPES's folders, then ./recipes
in the working folder, then the shipped recipes; the first file of a name wins.
"""

from __future__ import annotations

import argparse
import json

from prebake.artifacts.recipe.catalog import RecipeCatalog
from prebake.engine.cli.common import command, json_option


def add(sub) -> None:
    recipes = command(
        sub,
        "recipes",
        group="bake and plan",
        help="list the recipes found and where from ($PREBAKE_RECIPES, ./recipes, the shipped ones)",
        examples=["prebake recipes", "PREBAKE_RECIPES=~/my-recipes prebake recipes --json"],
    )
    json_option(recipes, "the recipes and the folders searched")
    recipes.set_defaults(run=cmd_recipes)


def cmd_recipes(args: argparse.Namespace) -> int:
    catalog = RecipeCatalog.here()
    if args.json:
        print(json.dumps(catalog.to_json(), indent=2, sort_keys=True))
        return 0
    print(catalog.render())
    return 0
