"""`prebake bake --target`: one planned target, refused with a clear message when it is not for this host."""

from __future__ import annotations

from prebake.engine.cli import main
from tests.support.hosts import as_cpu_host, cpu_only_env


def test_a_target_of_another_platform_is_refused_naming_both(capsys, tmp_path, monkeypatch):
    as_cpu_host(monkeypatch)
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path))
    assert main(["bake", "--model", "llama3-8b", "--target", "llama3-8b/gaudi3/tp8/fp8"]) == 2
    err = capsys.readouterr().err
    assert "builds on a gaudi3 host" in err and "this host is cpu" in err and "Traceback" not in err


def test_an_unknown_target_id_names_the_plan_to_ask(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path))
    assert main(["bake", "--model", "tiny-llama", "--target", "tiny-llama/cpu/tp4/fp32"]) == 2
    err = capsys.readouterr().err
    assert "is not in recipe tiny-llama's matrix" in err and "prebake plan --model tiny-llama" in err


def test_a_nothing_to_do_bake_runs_doit_and_succeeds(tmp_path, monkeypatch):
    """Every key present: doit's tasks are all up to date, nothing is built (no torch import).
    A real `prebake` process: doit's reporter keeps the stdout it found at import."""
    import subprocess
    import sys
    from pathlib import Path

    from prebake.artifacts.recipe.kinds import target_keys
    from prebake.artifacts.recipe.schema import load_recipe, targets
    from prebake.engine.adapters import kinds_for
    from tests.support.fleet import write_entry

    host = as_cpu_host(monkeypatch)  # and the child below, through its PATH
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path))
    recipe = load_recipe("tiny-llama")
    fp32 = targets(recipe, dtype="fp32")[0]
    for key in target_keys(recipe, fp32, host, kinds_for(recipe, fp32)).keys.values():
        write_entry(tmp_path / "registry", key)
    env = {**cpu_only_env(), "PREBAKE_HOME": str(tmp_path), "PREBAKE_TRUSTED_KEYS": ""}
    argv = [str(Path(sys.executable).parent / "prebake"), "bake", "--model", "tiny-llama"]
    done = subprocess.run([*argv, "--target", "tiny-llama/cpu/tp1/fp32"], env=env, capture_output=True, text=True)
    out = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.count("-- bake:tiny-llama/cpu/tp1/fp32:") == 3 and "published" not in out
