"""One reader for every operator TOML file (recipes, policy files, profiles): each problem names the
file, the line and the fix (prebake.artifacts.tomlfile)."""

from __future__ import annotations

import pytest
from pydantic import Field, field_validator

from prebake.artifacts.errors import RecipeError, UnknownModelError
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.tomlfile import field_path, load_toml


class _Step(Frozen):
    name: str
    seconds: float = Field(gt=0)


class _Plan(Frozen):
    title: str
    steps: tuple[_Step, ...] = ()

    @field_validator("title")
    @classmethod
    def _short(cls, value: str) -> str:
        if len(value) > 8:
            raise ValueError("a title has at most 8 letters; shorten it")
        return value


def _load(tmp_path, text: str) -> str:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    with pytest.raises(RecipeError) as raised:
        load_toml(path, _Plan, what="plan file", error=RecipeError, fix="see the plan docs")
    message = str(raised.value)
    assert message.startswith(f"plan file {path} ")
    return message


def test_each_problem_names_its_line_and_field(tmp_path):
    text = 'title = "far too long"\n\n[[steps]]\nname = "a"\nseconds = 1\n\n[[steps]]\nname = "b"\nsecnods = 2\n'
    message = _load(tmp_path, text)
    assert "line 1: title: a title has at most 8 letters; shorten it" in message
    assert "line 9: steps[1].secnods: unknown field; remove it or check its spelling" in message
    assert "line 7: steps[1].seconds: required field is missing; add it" in message  # the table that lacks it


def test_bad_syntax_names_the_line_and_a_missing_file_its_own_error(tmp_path):
    assert "is not valid TOML" in _load(tmp_path, 'title = "x"\n[steps\n') and "line 2" in _load(
        tmp_path, "x = 1\n[s\n"
    )
    with pytest.raises(UnknownModelError, match="plan file .*nowhere.toml does not exist; see the plan docs"):
        load_toml(tmp_path / "nowhere.toml", _Plan, what="plan file", error=RecipeError, fix="see the plan docs",
                  not_found=UnknownModelError)  # fmt: skip
    assert load_toml(_written(tmp_path), _Plan, what="plan file", error=RecipeError, fix="").title == "ok"


def test_a_field_path_reads_as_the_file_writes_it():
    assert field_path(("rules", 0, "keys")) == "rules[0].keys" and field_path(()) == "(top level)"


def _written(tmp_path):
    path = tmp_path / "good.toml"
    path.write_text('title = "ok"\n[[steps]]\nname = "a"\nseconds = 0.5\n')
    return path
