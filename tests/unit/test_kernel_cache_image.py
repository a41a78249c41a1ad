"""A kernel-cache image built from a vLLM cache tree, without a registry: what vLLM's side says of
the tree (engine/vllm/cache_tree.py: entries, relocation, files left out) and what the image side
makes of it (registry/oci/kernel_cache.py: one deterministic layer, labels, annotations). The push
and KServe's own reading are tests/integration/test_kernel_cache.py's (docker-registry, skopeo, umoci)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from prebake.engine.vllm.cache_tree import read_cache_tree
from prebake.registry.oci.kernel_cache import (
    CACHE_PATH,
    RELOCATED,
    KernelCacheError,
    build_image,
    compatibility_footprint,
    hash_strings,
    model_uri_hash,
)
from tests.support.bundles import make_bundle

BAKED_ROOT = "/tmp/bake-graphs/tree/vllm-cache"
PREFIX = "torch_compile_cache/29b76f0e21/rank_0_0/backbone"


@pytest.fixture
def tree(tmp_path) -> Path:
    """A graphs tree as a vLLM bake leaves it: one rank's piecewise graphs with their handles (absolute
    paths under the bake's root), a Triton group file, an empty Inductor lock file, vllm.json."""
    root = tmp_path / "tree"
    prefix = root / "vllm-cache" / PREFIX
    (prefix / "artifact_compile_range_1_8").mkdir(parents=True)
    (prefix / "artifact_compile_range_1_8" / "graph.so").write_bytes(b"so")
    (prefix / "cache_key_factors.json").write_text(
        json.dumps({"code_hash": "c1", "env": {"VLLM_TARGET_DEVICE": "cpu"}})
    )
    (prefix / "vllm_compile_cache.py").write_text(repr({(1, 8): f"{BAKED_ROOT}/{PREFIX}/artifact_compile_range_1_8"}))
    group = root / "vllm-cache" / "triton_cache" / "ABC"
    group.mkdir(parents=True)
    (group / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.so": "/elsewhere/ABC/k.so"}}))
    (group / "k.so").write_bytes(b"kernel")
    (root / "vllm-cache" / "inductor_cache" / "locks").mkdir(parents=True)
    (root / "vllm-cache" / "inductor_cache" / "locks" / "x.lock").write_text("")
    (root / "vllm.json").write_text(json.dumps({"site": {"cache_root": BAKED_ROOT}}))
    return root


@pytest.fixture
def manifest(tmp_path):
    bundle = make_bundle(tmp_path / "bundle", kind="graphs")
    vllm = {"dtype": "bf16", "tensor-parallel-size": "1", "max-model-len": "128", "VLLM_USE_AOT_COMPILE": "0"}
    return bundle.manifest.model_copy(update={"key": {**bundle.manifest.key, "vllm": vllm}})


def test_the_image_is_the_same_bytes_each_time_its_paths_rewritten_and_the_lock_files_left_out(
    tree, manifest, tmp_path
):
    image = build_image(read_cache_tree(tree, manifest, "/srv/vllm/"), manifest, tmp_path / "one")
    again = build_image(read_cache_tree(tree, manifest, "/srv/vllm/"), manifest, tmp_path / "two")
    annotations = json.loads(image.manifest)["annotations"]

    assert (again.digest, again.layer_ref.digest, again.config) == (image.digest, image.layer_ref.digest, image.config)
    assert (annotations[CACHE_PATH], annotations[RELOCATED]) == ("/srv/vllm", "2")
    with tarfile.open(image.layer) as tar:
        names = tar.getnames()
        handles = tar.extractfile(f"io.vllm.cache/{PREFIX}/vllm_compile_cache.py")
        group = tar.extractfile("io.vllm.cache/triton_cache/ABC/__grp__k.json")
        assert handles is not None and group is not None
        assert f"/srv/vllm/{PREFIX}/artifact_compile_range_1_8" in handles.read().decode()
        assert json.loads(group.read())["child_paths"] == {"k.so": "/srv/vllm/triton_cache/ABC/k.so"}
    assert "io.vllm.cache/inductor_cache/locks" in names and "io.vllm.cache/inductor_cache/locks/x.lock" not in names
    assert image.labels["cache.vllm.image/format"] == "inductor,unpacked"  # an artifact folder: unpacked
    assert image.factors["option.dtype"] == "bfloat16" and image.factors["env.VLLM_USE_AOT_COMPILE"] == "false"


def test_a_bundle_that_is_no_vllm_graphs_bundle_is_refused(tree, manifest):
    with pytest.raises(KernelCacheError, match="not a vLLM graphs bundle"):
        read_cache_tree(tree, manifest.model_copy(update={"kind": "autotune"}))


def test_kserves_footprint_inputs_are_normalized_its_way():
    # identity.ModelURIHash drops user info, query and fragment; HashStrings hashes Go's JSON of a list.
    assert model_uri_hash("hf://user:pw@acme/tiny-llama?revision=main#x") == hash_strings(["hf://acme/tiny-llama"])
    assert hash_strings(["a<b"]) != hash_strings(["a\\u003cb"])  # Go escapes '<' as \u003c: so does this encoding
    # A floating runtime image (no tag, or :latest) gets no compatibility footprint, as in KServe.
    assert compatibility_footprint("quay.io/acme/vllm", "hf://a/b", {}) is None
    assert compatibility_footprint("quay.io/acme/vllm:latest", "hf://a/b", {}) is None
    tagged = compatibility_footprint("quay.io/acme/vllm:v1", "hf://a/b", {"option.dtype": "bfloat16"})
    assert tagged is not None and tagged != compatibility_footprint("quay.io/acme/vllm:v1", "hf://a/b", {})
