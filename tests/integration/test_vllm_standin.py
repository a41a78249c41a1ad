"""Baking and serving vLLM through the stand-in server (tests/support/vllm_standin.py), which keys,
compiles and loads as vLLM does: the packed cache root, mounted trees, a miss (a slow or broken
registry too) starting from an empty root, write-back to quarantine, the random-weight model."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.errors import BundleError, HostCannotBuildError
from prebake.artifacts.recipe.schema import Recipe, load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine.common.adapter import StartRequest
from prebake.engine.compose import Context, plans_for
from prebake.engine.vllm.process import (
    CACHE_DIR,
    REPORT_FILE,
    Spawn,
    compile_report,
    model_location,
    start,
    stop,
    wait_ready,
)
from prebake.engine.vllm.start import prepare, write_back
from prebake.registry import open_registry
from tests.support.baking import REPO
from tests.support.ports import free_port
from tests.support.recipe_files import write_recipe
from tests.support.vllm_hosts import STANDIN, bake_all, vllm_cpu_host


@pytest.fixture
def recipe() -> Recipe:
    return load_recipe("tiny-llama-vllm")


@pytest.fixture
def folder_model_recipe(recipe, tmp_path) -> Recipe:
    """The vLLM recipe with its weights in a folder, so no transformers run is needed."""
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "config.json").write_text(json.dumps(recipe.model.config))
    data = recipe.model_dump(mode="json")
    data["model"]["weights"] = str(tmp_path / "weights")
    return Recipe.model_validate(data)


def test_bake_packs_the_cache_root_the_engine_filled_and_a_start_from_it_loads(
    folder_model_recipe, tmp_path, monkeypatch
):
    """Plumbing, not reuse: the cache root the engine filled is packed, and a start from the bundle
    hands it back under the same key. The "load" line read here is printed by the stand-in, under
    the keying rule the stand-in implements; that real vLLM reuses a baked root is checked by
    tests/integration/test_vllm.py (make vllm-check)."""
    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    host = vllm_cpu_host(tmp_path / "host")
    the_plan = plans_for(folder_model_recipe, host)[0]
    store, registry = Store(tmp_path / "home"), open_registry(str(tmp_path / "registry"))

    baked = bake_all(the_plan, store, registry)["graphs"]
    files = [f.path for f in baked.manifest.files]
    report = json.loads((baked.installed.tree / REPORT_FILE).read_text())

    assert any(p.startswith(f"{CACHE_DIR}/torch_compile_cache/") and p.endswith("graph.bin") for p in files)
    assert "--max-model-len" in report["flags"] and len(report["report"]["compiled"]) == 1

    served = _prepare(folder_model_recipe, Store(tmp_path / "home2"), registry, host, monkeypatch, tmp_path)
    log = tmp_path / "serve.log"
    port = free_port()
    running = start(
        Spawn(
            (*served.argv, "--host", "127.0.0.1", "--port", str(port)),
            served.child_env(dict(os.environ)),
            served.cwd,
            log,
        )
    )
    try:
        wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=60)
    finally:
        stop(running)

    assert served.misses == () and compile_report(log.read_text()).warm
    assert served.variables["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "home2"))


def _prepare(recipe: Recipe, store: Store, registry, host, monkeypatch, tmp_path):
    write_recipe(recipe, tmp_path / "recipes")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "recipes"))
    return prepare(
        StartRequest(model=recipe.model.name, engine="vllm"),
        Context(store, host, registry.url, given_registry=registry),
    )


def _read_only_copy(tree: Path, dest: Path) -> Path:
    """`tree` as an image volume presents it: the same files, nothing writable."""
    shutil.copytree(tree, dest, symlinks=True)
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)
    return dest


def test_a_mounted_graphs_tree_serves_vllm_from_a_private_root_and_a_tampered_one_is_refused(
    folder_model_recipe, tmp_path, monkeypatch
):
    """The image-volume path for vLLM (`prebake fetch|serve --engine vllm --mounted graphs=PATH`): a
    read-only tree that matches the key's signed manifest file for file is used without a fetch of
    its blob, and vLLM gets a private, writable cache root copied from it (vLLM writes beside what
    it reads); a tree with one file changed is refused naming that file, and nothing is copied."""
    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    host = vllm_cpu_host(tmp_path / "host")
    the_plan = plans_for(folder_model_recipe, host)[0]
    registry = open_registry(str(tmp_path / "registry"))
    baked = bake_all(the_plan, Store(tmp_path / "baker"), registry)["graphs"]
    good = _read_only_copy(baked.installed.tree, tmp_path / "volumes" / "good")
    bad = _read_only_copy(baked.installed.tree, tmp_path / "volumes" / "bad")
    victim = next(p for p in sorted(bad.rglob("graph.bin")))
    victim.chmod(0o644)
    victim.write_bytes(victim.read_bytes() + b"\0")
    write_recipe(folder_model_recipe, tmp_path / "recipes")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "recipes"))
    name = folder_model_recipe.model.name

    node = Store(tmp_path / "node")
    context = Context(node, host, registry.url, given_registry=registry)
    served = prepare(StartRequest(model=name, engine="vllm", mounted=(f"graphs={good}",)), context)
    root = Path(served.variables["VLLM_CACHE_ROOT"])

    assert served.misses == () and served.installed["graphs"].tree == good
    graphs_digest = baked.manifest.blob.digest.removeprefix("sha256:")
    assert not [p for p in node.home.rglob(f"*{graphs_digest}*")]  # its blob was neither fetched nor unpacked
    assert sorted(p.name for p in root.rglob("graph.bin")) == sorted(p.name for p in good.rglob("graph.bin"))
    assert os.access(root, os.W_OK) and not root.is_relative_to(good)
    with pytest.raises(BundleError, match=r"is not the graphs bundle .*wrong bytes in .*graph\.bin"):
        prepare(
            StartRequest(model=name, engine="vllm", mounted=(f"graphs={bad}",)),
            Context(Store(tmp_path / "node2"), host, registry.url, given_registry=registry),
        )


def test_a_miss_starts_from_an_empty_root_and_write_back_publishes_what_vllm_compiled(
    folder_model_recipe, tmp_path, monkeypatch
):
    """Plumbing: a miss starts from an empty root and the write-back publishes every kind, upstream
    first; the stand-in's compile output stands for vLLM's (real reuse: tests/integration/test_vllm.py)."""
    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    monkeypatch.setenv(
        "PREBAKE_WRITE_BACK", "index"
    )  # straight to the index: tests/integration/test_writeback_quarantine.py
    host = vllm_cpu_host(tmp_path / "host")
    registry = open_registry(str(tmp_path / "registry"))
    store = Store(tmp_path / "home")
    cold = _prepare(folder_model_recipe, store, registry, host, monkeypatch, tmp_path)
    assert {m.key.kind for m in cold.misses} == {"buckets", "autotune", "graphs"}
    assert not any((cold.cache_root / CACHE_DIR).iterdir())

    published = _serve_and_write_back(cold, store, host, registry, tmp_path)
    warm = _prepare(folder_model_recipe, Store(tmp_path / "home2"), registry, host, monkeypatch, tmp_path)

    assert [line.split(":")[0] for line in published] == ["buckets", "autotune", "graphs"]
    assert warm.misses == ()
    assert list((warm.cache_root / CACHE_DIR).rglob("graph.bin"))


def test_a_start_of_vllm_fp8_on_a_cpu_without_amx_is_refused_before_vllm_runs(
    folder_model_recipe, tmp_path, monkeypatch
):
    """`prebake serve|fetch --engine vllm --precision fp8` on a CPU whose FP8 matmuls torch would
    emulate in fp32: refused with the fix named, no vLLM command line made."""
    data = folder_model_recipe.model_dump(mode="json")
    data["matrix"].update({"platform": ["cpu"], "tp": [1], "dtype": ["fp8"]})
    host = vllm_cpu_host(tmp_path / "host")
    registry = open_registry(str(tmp_path / "registry"))

    with pytest.raises(HostCannotBuildError, match=r"(?s)this CPU has no AMX .*at bf16 \(precision=bf16\)"):
        _prepare(Recipe.model_validate(data), Store(tmp_path / "home"), registry, host, monkeypatch, tmp_path)


def test_fetch_for_vllm_refuses_a_recipe_of_the_bundled_engine(tmp_path):
    env = {**os.environ, "PREBAKE_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "prebake.engine.cli", "fetch", "--engine", "vllm", "--model", "tiny-llama"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert (
        done.returncode == 2
        and "recipe tiny-llama is served by engine 'prebake', not 'vllm'; use --engine prebake" in done.stderr
    )


@pytest.mark.slow  # two transformers saves in child processes: about 40 s on two cores
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_random_weight_model_is_saved_once_and_identically_for_the_same_seed(recipe, tmp_path):
    first = model_location(recipe, tmp_path / "a")
    again = model_location(recipe, tmp_path / "a")
    other = model_location(recipe, tmp_path / "b")

    weights = [loc.cwd / loc.name / "model.safetensors" for loc in (first, other)]
    assert first == again and first.name == "tiny-llama-vllm"
    assert json.loads((first.cwd / first.name / "config.json").read_text())["num_hidden_layers"] == 4
    assert weights[0].read_bytes() == weights[1].read_bytes()


class _HangingRegistry:
    url = "s3://hangs/forever"

    def lookup(self, kind, key_digest):
        import time

        time.sleep(30)


class _BrokenRegistry:
    url = "s3://down"

    def lookup(self, kind, key_digest):
        from prebake.artifacts.ports.errors import RegistryUnavailable

        raise RegistryUnavailable("s3://down answered 503; retry later")


@pytest.mark.parametrize(
    ("registry", "reason"),
    [
        (_HangingRegistry(), "did not answer within 0.5 s"),
        (_BrokenRegistry(), "registry s3://down failed: RegistryUnavailable: s3://down answered 503"),
    ],
)
def test_a_slow_or_broken_registry_is_a_miss_and_vllm_starts_from_an_empty_root(
    folder_model_recipe, tmp_path, monkeypatch, registry, reason
):
    import time

    write_recipe(folder_model_recipe, tmp_path / "recipes")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "recipes"))
    started = time.monotonic()

    prepared = prepare(
        StartRequest(model="tiny-llama-vllm", engine="vllm", registry_timeout=0.5, fetch_timeout=0.5),
        Context(Store(tmp_path / "home"), vllm_cpu_host(tmp_path / "host"), registry.url, given_registry=registry),
    )

    assert time.monotonic() - started < 10
    assert {m.key.kind for m in prepared.misses} == {"buckets", "autotune", "graphs"}
    assert all(reason in m.reason for m in prepared.misses)
    assert not any((prepared.cache_root / CACHE_DIR).iterdir())


def test_by_default_vllm_write_back_lands_in_quarantine_and_serves_others_only_once_promoted(
    folder_model_recipe, tmp_path, monkeypatch
):
    from prebake.registry.review.promote import promote
    from prebake.registry.review.writeback import quarantine_address
    from prebake.registry.trust.signing import KeySigner, load_private_key, write_keypair

    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    monkeypatch.delenv("PREBAKE_WRITE_BACK", raising=False)
    host = vllm_cpu_host(tmp_path / "host")
    registry = open_registry(str(tmp_path / "registry"))
    store = Store(tmp_path / "home")
    cold = _prepare(folder_model_recipe, store, registry, host, monkeypatch, tmp_path)
    published = _serve_and_write_back(cold, store, host, registry, tmp_path)
    assert all("quarantine: awaiting `prebake promote`" in line for line in published), published
    assert list(registry.list()) == []  # nothing a pod compiled reached the index
    incoming = open_registry(quarantine_address(registry.url))
    assert {m.kind for m in incoming.list()} == {"buckets", "autotune", "graphs"}
    assert all(m.labels["writeback"] == "quarantine" for m in incoming.list())
    other_pod = _prepare(folder_model_recipe, Store(tmp_path / "home2"), registry, host, monkeypatch, tmp_path)
    assert {m.key.kind for m in other_pod.misses} == {"buckets", "autotune", "graphs"}

    private, _public = write_keypair("builder", tmp_path / "keys")
    from prebake.registry.trust.model_signatures import SIDE_NAME, Anchor, ModelSigner, check_signature
    from tests.integration.test_model_signing import ec_keypair

    models_key, models_pub, _ = ec_keypair(tmp_path / "models", "models")
    results = promote(
        incoming,
        registry,
        signer=KeySigner("builder", load_private_key(private)),
        attest=None,
        model_sign=ModelSigner(models_key).sign,
    )
    assert [r.outcome for r in results] == ["promoted"] * 3, results
    assert all(m.signatures[0].signer == "builder" and "writeback" not in m.labels for m in registry.list())
    for m in registry.list():  # each reviewed tree carries its OpenSSF model signature too
        signature = registry.get_side(m.blob.digest, SIDE_NAME)
        assert signature is not None and check_signature(signature, [Anchor("models", models_pub)], m) == "models"
    assert list(incoming.list()) == []  # moved out of the quarantine's index
    warm = _prepare(folder_model_recipe, Store(tmp_path / "home3"), registry, host, monkeypatch, tmp_path)
    assert warm.misses == ()


def _serve_and_write_back(cold, store, host, registry, tmp_path):
    """Start the stand-in from a cold start's prepared command, write back what it compiled, stop it;
    the write-back's lines."""
    port = free_port()
    running = start(
        Spawn((*cold.argv, "--port", str(port)), cold.child_env(dict(os.environ)), cold.cwd, tmp_path / "cold.log")
    )
    try:
        seconds = wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=60)
        return write_back(cold, Context(store, host, registry.url, given_registry=registry), seconds)
    finally:
        stop(running)
