"""`doit bake`'s variables are checked before anything runs: a typo is refused naming the nearest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.bake.tasks import BAKE_VARIABLES, request_from_variables
from prebake.artifacts.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
DOIT = str(Path(sys.executable).parent / "doit")


TYPOS = {"model": "modle", "precision": "precison", "tp": "tpp", "registry": "registy"}


def _typo(name: str) -> str:
    return TYPOS[name]


def test_every_variable_has_a_typo_case():
    assert set(TYPOS) == set(BAKE_VARIABLES)


@pytest.mark.parametrize("name", sorted(TYPOS))
def test_a_misspelt_variable_is_refused_naming_the_nearest_and_the_valid_ones(name):
    with pytest.raises(UsageError) as caught:
        request_from_variables({"model": "tiny-llama", _typo(name): "x"})
    message = str(caught.value)
    assert f"no variable {_typo(name)}=" in message and f"did you mean {name}=?" in message
    assert all(f"{v}=" in message for v in BAKE_VARIABLES)


def test_every_variable_is_read_into_the_request():
    request = request_from_variables({"model": "m", "precision": "bf16", "tp": "2", "registry": "/r"})
    assert (request.model, request.precision, request.tp, request.registry) == ("m", "bf16", 2, "/r")


@pytest.mark.parametrize("tp", ["two", "1.5", "0", "-1"])
def test_a_tp_that_is_no_positive_whole_number_is_refused(tp):
    with pytest.raises(UsageError, match=r"tp="):
        request_from_variables({"model": "tiny-llama", "tp": tp})


def _doit(*argv: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREBAKE_HOME": str(home), "PREBAKE_TRUSTED_KEYS": ""}
    return subprocess.run([DOIT, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_doit_bake_with_a_misspelt_precision_bakes_nothing(tmp_path):
    done = _doit(
        "run", "--db-file", str(tmp_path / "doit.db"), "bake", "model=tiny-llama", "precison=bf16", home=tmp_path
    )
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "did you mean precision=?" in out
    assert "bake:tiny-llama" not in out and "Traceback" not in out
    assert not (tmp_path / "registry").exists()  # nothing was built or published


def test_doit_bake_tp_two_is_one_clear_line_not_a_traceback(tmp_path):
    done = _doit("run", "--db-file", str(tmp_path / "doit.db"), "bake", "model=tiny-llama", "tp=two", home=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "tp='two' is not a whole number" in out and "Traceback" not in out


@pytest.mark.parametrize("command", [["list"], ["help", "bake"]])
def test_doit_list_and_help_show_the_variables(tmp_path, command):
    done = _doit(*command, home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert all(f"{v}=" in done.stdout for v in BAKE_VARIABLES), done.stdout


def test_doit_bake_on_a_home_that_is_a_file_names_prebake_home(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a folder")
    done = _doit("run", "--db-file", str(tmp_path / "doit.db"), "bake", "model=tiny-llama", home=home)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and f"PREBAKE_HOME={home} is a file, not a folder" in out and "Traceback" not in out
