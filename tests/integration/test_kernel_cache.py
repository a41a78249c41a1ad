"""Kernel-cache images for KServe and GKM: a vLLM graphs bundle pushed to Debian's docker-registry
in the "compat" layout (kernelcache/mcv/docs/spec-compat.md at the revision docs/registries.md pins),
read back with skopeo and unpacked with umoci, checked field by field; its io.vllm.cache/ linked
into a fresh VLLM_CACHE_ROOT with `cp -sr` as KServe's init container links it, and the engine
started from there loads instead of compiling.

The graphs are baked here by the vLLM stand-in (tests/support/vllm_standin.py: vLLM's keying and
its log lines, no torch), so this runs everywhere; tests/integration/test_kernel_cache_vllm.py
does the same with real vLLM (marker `vllm`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.recipe.schema import Recipe, load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine.common.adapter import StartRequest
from prebake.engine.compose import Context, plans_for
from prebake.engine.vllm.cache_tree import read_cache_tree
from prebake.engine.vllm.process import CACHE_DIR, Spawn, compile_report, start, stop, wait_ready
from prebake.engine.vllm.start import prepare
from prebake.registry import open_registry
from prebake.registry.oci.kernel_cache import (
    KernelCacheError,
    build_image,
    push_image,
)
from tests.support.oci_server import oci_available, oci_server, umoci_unpack
from tests.support.ports import free_port
from tests.support.recipe_files import write_recipe
from tests.support.vllm_hosts import STANDIN, bake_all, vllm_cpu_host

pytestmark = pytest.mark.skipif(
    not oci_available() or shutil.which("skopeo") is None or shutil.which("umoci") is None,
    reason="docker-registry, skopeo and umoci are needed (apt-get install; .ci/run does)",
)
SPEC_LABELS = ("entry-count", "summary", "cache-size-bytes", "format")


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    """tiny-llama-vllm's graphs, baked by the stand-in on a vLLM-on-CPU host, into a folder registry."""
    root = tmp_path_factory.mktemp("kernel-cache")
    saved = os.environ.get("PREBAKE_VLLM_COMMAND")
    os.environ["PREBAKE_VLLM_COMMAND"] = f"{sys.executable} {STANDIN}"
    try:
        recipe = load_recipe("tiny-llama-vllm")
        (root / "weights").mkdir()
        (root / "weights" / "config.json").write_text(json.dumps(recipe.model.config))
        data = recipe.model_dump(mode="json")
        data["model"]["weights"] = str(root / "weights")
        recipe = Recipe.model_validate(data)
        host = vllm_cpu_host(root / "host")
        plan = plans_for(recipe, host)[0]
        registry = open_registry(str(root / "registry"))
        graphs = bake_all(plan, Store(root / "baker"), registry)["graphs"]
    finally:
        if saved is None:
            os.environ.pop("PREBAKE_VLLM_COMMAND", None)
        else:
            os.environ["PREBAKE_VLLM_COMMAND"] = saved
    yield root, recipe, host, registry, graphs


@pytest.fixture(scope="module")
def pushed(baked, tmp_path_factory):
    root, recipe, host, registry, graphs = baked
    scratch = tmp_path_factory.mktemp("kc-image")
    image = build_image(
        read_cache_tree(graphs.installed.tree, graphs.manifest),
        graphs.manifest,
        scratch,
        runtime_image="quay.io/acme/vllm-cpu:v0.32.0",
        model_uri="hf://acme/tiny-llama?revision=main",
    )
    with oci_server(root / "server") as server:
        env = {**os.environ, **server.env()}
        digest = push_image(image, server.address("team/vllm-cache"), "tiny", env)
        yield server, image, digest, scratch


def _skopeo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=120)


def test_the_image_reads_back_with_skopeo_field_by_field_as_the_spec_and_mcv_lay_it_out(baked, pushed):
    _, _, _, _, graphs = baked
    server, image, digest, _ = pushed
    ref = f"docker://{server.host}/team/vllm-cache:tiny"

    raw = _skopeo("inspect", "--tls-verify=false", "--raw", ref)
    config = _skopeo("inspect", "--tls-verify=false", "--config", "--raw", ref)
    shown = _skopeo("inspect", "--tls-verify=false", ref)

    assert raw.returncode == config.returncode == shown.returncode == 0, raw.stderr + config.stderr + shown.stderr
    manifest, cfg, inspect = json.loads(raw.stdout), json.loads(config.stdout), json.loads(shown.stdout)
    # The compat variant: exactly one layer, tar+gzip; the optional variant annotation.
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json" and manifest["schemaVersion"] == 2
    assert [layer["mediaType"] for layer in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar+gzip"]
    assert manifest["annotations"]["cache.vllm.image/variant"] == "compat"
    assert inspect["Digest"] == digest and inspect["Os"] == "linux" and inspect["Architecture"] == "amd64"
    # MCV's four labels, as skopeo shows them.
    labels = inspect["Labels"]
    assert {f"cache.vllm.image/{name}" for name in SPEC_LABELS} <= set(labels) and labels == cfg["config"]["Labels"]
    cache = graphs.installed.tree / CACHE_DIR
    hashes = [p for p in (cache / "torch_compile_cache").iterdir() if p.is_dir()]
    assert labels["cache.vllm.image/entry-count"] == str(len(hashes)) == "1"
    size = sum(f.size for f in graphs.manifest.files if f.path.startswith(f"{CACHE_DIR}/") and f.link is None)
    assert labels["cache.vllm.image/cache-size-bytes"] == str(size)
    assert labels["cache.vllm.image/format"] == "binary"
    platform = graphs.manifest.key["platform"]  # the stand-in's host: vLLM on an AVX-512 CPU
    assert json.loads(labels["cache.vllm.image/summary"]) == {"targets": [{"backend": "cpu", "arch": platform["arch"]}]}
    # The footprint KServe compares, from the bundle's key, in KServe's normalization.
    assert image.factors == {
        "option.tensorParallelSize": "1",
        "option.maxModelLen": "128",
        "option.dtype": "bfloat16",
        "option.blockSize": "64",
        "option.maxNumBatchedTokens": "128",
        "option.maxNumSeqs": "2",
        "env.VLLM_USE_AOT_COMPILE": "false",
    }
    for name, value in image.factors.items():
        assert labels[f"org.prebake.kernelcache.factor.{name}"] == manifest["annotations"][
            f"org.prebake.kernelcache.factor.{name}"
        ] == value  # fmt: skip
    assert labels["org.prebake.kernelcache.compatibility-footprint"] == image.compatibility_footprint
    assert manifest["annotations"]["org.prebake.key-digest"] == graphs.manifest.key_digest


def test_umoci_unpacks_the_cache_the_mcv_manifest_and_the_signed_prebake_manifest(baked, pushed, tmp_path):
    _, _, _, _, graphs = baked
    server, _, _, _ = pushed
    layout = tmp_path / "layout"
    copied = _skopeo(
        "copy", "--src-tls-verify=false", f"docker://{server.host}/team/vllm-cache:tiny", f"oci:{layout}:kc"
    )
    assert copied.returncode == 0, copied.stderr
    rootfs = umoci_unpack(f"{layout}:kc", tmp_path / "unpacked")

    assert sorted(p.name for p in rootfs.iterdir()) == ["io.prebake.manifest", "io.vllm.cache", "io.vllm.manifest"]
    assert _files(rootfs / "io.vllm.cache") == _files(graphs.installed.tree / CACHE_DIR)
    mcv = json.loads((rootfs / "io.vllm.manifest" / "manifest.json").read_text())
    (entry,) = mcv["vllm"]
    hash_dir = next((graphs.installed.tree / CACHE_DIR / "torch_compile_cache").iterdir())
    assert entry["vllmHash"] == hash_dir.name and entry["cacheFormat"] == "binary"
    (binary,) = entry["binary"]
    factors = json.loads((hash_dir / "rank_0_0" / "backbone" / "cache_key_factors.json").read_text())
    assert (binary["rank"], binary["prefix"], binary["cache_save_format"]) == ("rank_0_0", "backbone", "binary")
    assert binary["env"] == factors["env"]
    signed = (rootfs / "io.prebake.manifest" / "manifest.json").read_bytes()
    assert signed == graphs.manifest.to_bytes()


def test_kserves_cp_sr_link_of_the_unpacked_cache_gives_the_engine_a_warm_start(baked, pushed, tmp_path, monkeypatch):
    root, recipe, host, registry, _ = baked
    server, _, _, _ = pushed
    layout = tmp_path / "layout"
    assert (
        _skopeo(
            "copy", "--src-tls-verify=false", f"docker://{server.host}/team/vllm-cache:tiny", f"oci:{layout}:kc"
        ).returncode
        == 0
    )
    rootfs = umoci_unpack(f"{layout}:kc", tmp_path / "volume")
    cache_root = tmp_path / "home" / ".cache" / "vllm"
    cache_root.mkdir(parents=True)
    linked = subprocess.run(["cp", "-sr", f"{rootfs / 'io.vllm.cache'}/.", str(cache_root)], capture_output=True)
    assert linked.returncode == 0, linked.stderr
    assert any(p.is_symlink() for p in cache_root.rglob("*"))

    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    write_recipe(recipe, tmp_path / "recipes")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "recipes"))
    served = prepare(
        StartRequest(model=recipe.model.name, engine="vllm"),
        Context(Store(tmp_path / "node"), host, registry.url, given_registry=registry),
    )
    env = served.child_env(dict(os.environ)) | {"VLLM_CACHE_ROOT": str(cache_root)}
    port, log = free_port(), tmp_path / "engine.log"
    running = start(Spawn((*served.argv, "--host", "127.0.0.1", "--port", str(port)), env, served.cwd, log))
    try:
        wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=60)
    finally:
        stop(running)
    report = compile_report(log.read_text())
    assert report.warm and not report.compiled, log.read_text()[-2000:]


def test_the_same_bundle_gives_the_same_image_digest_and_a_bundle_of_another_engine_is_refused(baked, pushed, tmp_path):
    _, _, _, _, graphs = baked
    _, image, _, _ = pushed
    again = build_image(
        read_cache_tree(graphs.installed.tree, graphs.manifest),
        graphs.manifest,
        tmp_path / "again",
        runtime_image="quay.io/acme/vllm-cpu:v0.32.0",
        model_uri="hf://acme/tiny-llama?revision=main",
    )
    assert (again.digest, again.layer_ref.digest) == (image.digest, image.layer_ref.digest)
    with pytest.raises(KernelCacheError, match="not a vLLM graphs bundle"):
        read_cache_tree(graphs.installed.tree, graphs.manifest.model_copy(update={"kind": "autotune"}))


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


# KServe's option and variable names for the factors (pkg/kernelcache/identity/factors.go), to read the
# example InferenceService the way its admission webhook reads a runtime container.
_OPTIONS = {
    "--tensor-parallel-size": ("option.tensorParallelSize", int),
    "--max-model-len": ("option.maxModelLen", int),
    "--dtype": ("option.dtype", str),
    "--quantization": ("option.quantization", str),
    "--kv-cache-dtype": ("option.kvCacheDtype", str),
    "--block-size": ("option.blockSize", int),
    "--max-num-batched-tokens": ("option.maxNumBatchedTokens", int),
    "--max-num-seqs": ("option.maxNumSeqs", int),
}
_VARIABLES = ("VLLM_USE_AOT_COMPILE", "VLLM_USE_MEGA_AOT_ARTIFACT", "VLLM_USE_STANDALONE_COMPILE")


def _kserve_factors(container: dict) -> dict[str, str]:
    out: dict[str, str] = {}
    for arg in container.get("args", []):
        name, _, value = arg.partition("=")
        if name in _OPTIONS:
            key, kind = _OPTIONS[name]
            out[key] = str(int(value)) if kind is int else value.lower()
    for variable in container.get("env", []):
        if variable["name"] in _VARIABLES:
            out[f"env.{variable['name']}"] = {"1": "true", "0": "false"}.get(variable["value"], variable["value"])
    return out


def test_the_kserve_example_names_the_images_factors_and_its_inferenceservice_passes_them(pushed):
    import re

    import yaml

    _, image, _, _ = pushed
    path = Path(__file__).parents[2] / "examples" / "kubernetes" / "kserve" / "kernel-cache.yaml"
    cache, service = list(yaml.safe_load_all(path.read_text()))
    assert (cache["apiVersion"], cache["kind"]) == ("serving.kserve.io/v1alpha1", "KernelCache")
    artifact = cache["spec"]["artifact"]
    assert re.fullmatch(r".+@sha256:[a-f0-9]{64}", artifact["imageReference"])
    assert [p["ociPath"] for p in artifact["cachePaths"]] == ["io.vllm.cache"]
    factors = dict(artifact["identity"]["factors"])
    container = service["spec"]["predictor"]["containers"][0]
    assert factors.pop("runtimeImage") == container["image"]
    assert factors == image.factors == _kserve_factors(container)
    root = next(v["value"] for v in container["env"] if v["name"] == "VLLM_CACHE_ROOT")
    assert artifact["cachePaths"][0]["containerPath"] == root


def test_paths_vllm_wrote_into_the_cache_are_rewritten_for_the_containers_cache_root(baked, tmp_path):
    """vLLM's standalone artifact handles and Triton's group files name the bake's cache root; the
    image names the container's, as prebake's own serve rewrites them for its private copy. Empty
    lock files stay out (real vLLM on CPU failed to start on a linked one)."""
    import tarfile

    _, _, _, _, graphs = baked
    tree = tmp_path / "tree"
    shutil.copytree(graphs.installed.tree, tree)
    baked_root = json.loads((tree / "vllm.json").read_text())["site"]["cache_root"]
    prefix = next((tree / CACHE_DIR / "torch_compile_cache").iterdir()) / "rank_0_0" / "backbone"
    (prefix / "vllm_compile_cache.py").write_text(repr({(1, 128): f"{baked_root}/torch_compile_cache/x/artifact"}))
    kernels = tree / CACHE_DIR / "triton_cache" / "ABC"
    kernels.mkdir(parents=True)
    (kernels / "k.cubin").write_bytes(b"\0" * 10)
    (kernels / "__grp__k.json").write_text(
        json.dumps({"child_paths": {"k.cubin": f"{baked_root}/triton_cache/ABC/k.cubin"}})
    )

    locks = tree / CACHE_DIR / "inductor_cache" / "locks"
    locks.mkdir(parents=True)
    (locks / "c73e.lock").touch()  # Inductor's: a symbolic link to it cannot be opened (ELOOP)

    image = build_image(read_cache_tree(tree, graphs.manifest, "/srv/vllm/"), graphs.manifest, tmp_path / "image")

    with tarfile.open(image.layer) as tar:
        handles = tar.extractfile(
            f"io.vllm.cache/{prefix.relative_to(tree / CACHE_DIR).as_posix()}/vllm_compile_cache.py"
        )
        group = tar.extractfile("io.vllm.cache/triton_cache/ABC/__grp__k.json")
        assert handles is not None and group is not None
        assert handles.read().decode() == repr({(1, 128): "/srv/vllm/torch_compile_cache/x/artifact"})
        assert json.loads(group.read())["child_paths"] == {"k.cubin": "/srv/vllm/triton_cache/ABC/k.cubin"}
        cached = sum(m.size for m in tar.getmembers() if m.isfile() and m.name.startswith("io.vllm.cache/"))
        names = tar.getnames()
    assert "io.vllm.cache/inductor_cache/locks" in names and not [n for n in names if n.endswith(".lock")]
    assert image.labels["cache.vllm.image/cache-size-bytes"] == str(cached)  # what MCV's extract counts
    notes = json.loads(image.manifest)["annotations"]
    assert (
        notes["org.prebake.kernelcache.cache-path"] == "/srv/vllm" and notes["org.prebake.kernelcache.relocated"] == "2"
    )
