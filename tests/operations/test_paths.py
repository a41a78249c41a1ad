"""The store and the registries never overlap, and every path prebake hands out is absolute."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from prebake.registry.backends.file import FileRegistry
from tests.operations.target import fetch_args, prebake, prebake_env, publish, target_set

EXIT_INVALID = 2
EXIT_STORE = 5  # a home that is not a store of ours (prebake.artifacts.store.mark)


def _published(folder, workdir, scenario):
    targets = target_set(workdir)
    registry = FileRegistry(folder)
    publish(registry, targets)
    scenario.registry(registry, *targets.manifests.values())
    return registry, targets


def _same(tmp_path):
    return tmp_path / "home", "{home}"


def _inside(tmp_path):
    return tmp_path / "home", "{home}/team-registry"


def _holding(tmp_path):
    return tmp_path / "shared" / "home", str(tmp_path / "shared")


def _through_a_link(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "home", target_is_directory=True)
    return tmp_path / "home", str(tmp_path / "link")


def _as_a_url_in_a_chain(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "home", f"{tmp_path / 'elsewhere'},file://{{home}}"


@pytest.mark.parametrize(
    "layout",
    [_same, _inside, _holding, _through_a_link, _as_a_url_in_a_chain],
    ids=["same", "inside", "holding", "link", "chain-url"],
)
def test_a_registry_folder_that_overlaps_the_store_is_refused_at_open(tmp_path, layout):
    home, address = layout(tmp_path)
    home.mkdir(parents=True, exist_ok=True)
    address = address.format(home=home)
    for args in (fetch_args(address), ["ls", "--registry", address], ["verify", "--registry", address]):
        got = prebake(*args, env=prebake_env(home))
        assert got.returncode == EXIT_INVALID, (args, got.stdout, got.stderr)
        assert "the store's gc would delete the registry's bundles" in got.stderr, got.stderr
        assert "Traceback" not in got.stderr


def test_gc_refuses_to_run_beside_a_registry_that_lives_in_the_store(tmp_path, scenario):
    home = tmp_path / "home"
    registry, targets = _published(home, tmp_path / "bake", scenario)  # made before the check existed
    env = prebake_env(home, PREBAKE_REGISTRY=str(home))
    for args in (["gc", "--max-size", "0"], ["store", "verify", "--fix"], ["store", "rm", "tiny-llama"]):
        got = prebake(*args, env=env)
        assert got.returncode == EXIT_STORE and f"{home} looks like a folder registry" in got.stderr, (args, got.stderr)
    for manifest in targets.manifests.values():  # nothing of the registry went
        assert registry.lookup(manifest.kind, manifest.key_digest) is not None
        assert registry.blob_path(manifest.blob.digest).is_file()


def test_the_embedded_default_registry_is_the_one_folder_inside_the_store_allowed(tmp_path, scenario):
    home = scenario.store(tmp_path / "home")
    _published(home / "registry", tmp_path / "bake", scenario)
    for address in ([], ["--registry", str(home / "registry")]):
        got = prebake(*(fetch_args(home / "registry")[:-2] + address), env=prebake_env(home))
        assert got.returncode == 0, got.stderr


def test_a_relative_home_and_registry_give_absolute_paths_that_work_from_any_folder(tmp_path, scenario):
    work = tmp_path / "work"
    registry, targets = _published(work / "reg", tmp_path / "bake", scenario)
    scenario.store(work / "rel" / "home")
    got = prebake(*fetch_args("reg", "--json"), env=prebake_env("rel/home"), cwd=work)
    assert got.returncode == 0, got.stderr
    payload = json.loads(got.stdout)
    trees = [b["tree"] for b in payload["bundles"].values()]
    assert all(os.path.isabs(t) and os.path.isdir(t) for t in trees), trees
    # an installed tree, or the writable cache seeded from one under the store's caches/ (read-only trees)
    places = [*trees, str((work / "rel" / "home" / "caches").resolve())]
    assert payload["env"] and all(any(v.startswith(p) for p in places) for v in payload["env"].values())
    exports = prebake(*fetch_args("./reg/../reg"), env=prebake_env("./rel/../rel/home"), cwd=work)
    assert exports.returncode == 0, exports.stderr
    for line in exports.stdout.splitlines():
        value = shlex.split(line.split("=", 1)[1])[0]
        assert os.path.isabs(value) and ".." not in value.split(os.sep), line
        assert any(value.startswith(p) for p in places), line
