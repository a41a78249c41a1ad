"""One recipe search order for `doit bake` and `prebake`: $PREBAKE_RECIPES, ./recipes, the shipped
recipes; `prebake recipes` lists what is found and from where."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prebake.artifacts.recipe.catalog import find_recipes, recipe_folders
from prebake.artifacts.recipe.schema import load_recipe

ROOT = Path(__file__).resolve().parents[2]
PREBAKE = str(Path(sys.executable).parent / "prebake")


def _recipe(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "recipes" / "tiny-llama.toml").read_text().replace('name = "tiny-llama"', f'name = "{name}"', 1)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PREBAKE_HOME": str(cwd / "home"), **env}
    full.pop("PREBAKE_RECIPES", None) if "PREBAKE_RECIPES" not in env else None
    return subprocess.run([PREBAKE, *argv], cwd=cwd, env=full, capture_output=True, text=True, timeout=120)


def test_a_recipe_added_to_the_working_folder_is_found_by_prebake(tmp_path):
    _recipe(tmp_path / "recipes", "my-model")
    done = _run(["plan", "--model", "my-model", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["recipe"] == "my-model"


def test_the_search_order_is_prebake_recipes_then_the_working_folder_then_the_shipped(tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    (tmp_path / "recipes").mkdir()
    folders = recipe_folders({"PREBAKE_RECIPES": str(extra)}, cwd=tmp_path)
    assert [f.source for f in folders] == ["PREBAKE_RECIPES", "working folder", "shipped"]
    assert folders[0].path == extra and folders[1].path == tmp_path / "recipes"


def test_the_first_copy_of_a_name_wins_and_the_later_one_is_shown_shadowed(tmp_path, monkeypatch):
    mine = _recipe(tmp_path / "mine", "tiny-llama")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "mine"))
    found = [r for r in find_recipes() if r.name == "tiny-llama"]
    assert found[0].path == mine and found[0].shadowed_by is None
    assert all(r.shadowed_by == tmp_path / "mine" for r in found[1:]) and len(found) >= 2
    assert load_recipe("tiny-llama").model.name == "tiny-llama"


def test_prebake_recipes_lists_each_recipe_and_where_it_came_from(tmp_path):
    _recipe(tmp_path / "extra", "extra-model")
    done = _run(["recipes", "--json"], tmp_path, PREBAKE_RECIPES=str(tmp_path / "extra"))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    by_name = {r["name"]: r for r in data["recipes"] if r["shadowed_by"] is None}
    assert by_name["extra-model"]["source"] == "PREBAKE_RECIPES"
    assert by_name["tiny-llama"]["source"] == "shipped"
    assert data["search_order"][0] == {"path": str(tmp_path / "extra"), "source": "PREBAKE_RECIPES"}
    text = _run(["recipes"], tmp_path, PREBAKE_RECIPES=str(tmp_path / "extra")).stdout
    assert "extra-model" in text and "searched, first match wins" in text


def test_doit_and_prebake_read_the_same_folders(tmp_path):
    """doit runs dodo.py from the checkout, whose ./recipes is the shipped folder: the same list."""
    code = "import json; from prebake.artifacts.recipe.catalog import recipe_dirs; print(json.dumps([str(p.resolve()) for p in recipe_dirs()]))"
    doit_side = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    prebake_side = _run(["recipes", "--json"], ROOT)
    folders = [f["path"] for f in json.loads(prebake_side.stdout)["search_order"]]
    assert [str(Path(f).resolve()) for f in folders] == json.loads(doit_side.stdout)
