"""A baked vLLM cache root served from another path, HOME, venv or CUDA: fixed where prebake can, named otherwise.

No hardware and no vLLM: the trees are laid out as Triton and vLLM write them (triton
runtime/cache.py group files, vLLM's vllm_compile_cache.py handles), and the sites are the
records a bake writes into vllm.json.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from prebake.engine.vllm.portability import (
    Site,
    interpreter,
    moved,
    pins,
    prepare_root,
    relocate,
    resolve_site,
)

BAKED_ROOT = "/home/baker/.cache/prebake/tmp/build-1/graphs/vllm-cache"


def _site(**changes) -> Site:
    base = Site(
        home="/home/baker",
        config_root="/home/baker/.config/vllm",
        xla_cache_path="/home/baker/.cache/vllm/xla_cache",
        cache_root=BAKED_ROOT,
        prefix="/opt/bake-venv",
        packages={
            "vllm": "/opt/bake-venv/lib/python3.12/site-packages/vllm",
            "torch": "/opt/bake-venv/lib/python3.12/site-packages/torch",
            "triton": "/opt/bake-venv/lib/python3.12/site-packages/triton",
            "deep_gemm": "/opt/bake-venv/lib/python3.12/site-packages/deep_gemm",
        },
        cuda_home="/usr/local/cuda-12.8",
        nvcc="Cuda compilation tools, release 12.8, V12.8.93",
    )
    return replace(base, **changes)


def _triton_kernel(root: Path, baked_root: str) -> Path:
    """A Triton cache entry as FileCacheManager.put_group leaves it, written under `baked_root`."""
    folder = root / "torch_compile_cache" / "3fbdd5227b" / "rank_0_0" / "backbone" / "triton_cache" / "KEYB32"
    folder.mkdir(parents=True)
    children = {}
    for name in ("triton_poi_fused_0.cubin", "triton_poi_fused_0.json", "triton_poi_fused_0.ptx"):
        (folder / name).write_text("x")
        children[name] = f"{baked_root}/{folder.relative_to(root)}/{name}"
    group = folder / "__grp__triton_poi_fused_0.json"
    group.write_text(json.dumps({"child_paths": children}))
    return group


def test_triton_group_files_name_the_served_copy_after_a_move(tmp_path):
    root = tmp_path / "serve" / "vllm-cache"
    group = _triton_kernel(root, BAKED_ROOT)

    done = relocate(root, BAKED_ROOT)

    children = json.loads(group.read_text())["child_paths"]
    assert done.group_files == 1
    assert all(Path(p).is_file() and Path(p).parent == group.parent for p in children.values())
    assert relocate(root, BAKED_ROOT).group_files == 0  # idempotent: a second pass rewrites nothing


def test_a_group_child_that_is_not_in_the_copy_is_left_as_it_was(tmp_path):
    root = tmp_path / "vllm-cache"
    group = _triton_kernel(root, BAKED_ROOT)
    children = json.loads(group.read_text())["child_paths"]
    (group.parent / "triton_poi_fused_0.ptx").unlink()

    relocate(root, BAKED_ROOT)

    after = json.loads(group.read_text())["child_paths"]
    assert after["triton_poi_fused_0.ptx"] == children["triton_poi_fused_0.ptx"]
    assert Path(after["triton_poi_fused_0.cubin"]).parent == group.parent


def test_a_file_that_only_looks_like_a_group_file_is_not_touched(tmp_path):
    root = tmp_path / "vllm-cache"
    root.mkdir()
    odd = root / "__grp__notes.json"
    odd.write_text("[1, 2, 3]")
    assert relocate(root, BAKED_ROOT).group_files == 0 and odd.read_text() == "[1, 2, 3]"


def test_vllm_standalone_artifact_handles_are_pointed_at_the_served_root(tmp_path):
    root = tmp_path / "engines" / "vllm-cache"
    folder = root / "torch_compile_cache" / "3fbdd5227b" / "rank_0_0" / "backbone"
    folder.mkdir(parents=True)
    handles = folder / "vllm_compile_cache.py"
    artifact = f"{BAKED_ROOT}/torch_compile_cache/3fbdd5227b/rank_0_0/backbone/artifact_shape_None_subgraph_0"
    handles.write_text(f"{{(None, 0, 'inductor_standalone'): ('artifact_shape_None_subgraph_0', '{artifact}')}}\n")

    assert relocate(root, BAKED_ROOT).handle_files == 1

    text = handles.read_text()
    assert BAKED_ROOT not in text and f"'{root}/torch_compile_cache/3fbdd5227b/" in text


def test_home_derived_vllm_locations_are_pinned_to_the_bake_unless_set_by_hand():
    here = _site(home="/root", config_root="/root/.config/vllm", xla_cache_path="/root/.cache/vllm/xla_cache")

    assert pins(_site(), here, {}) == {
        "VLLM_CONFIG_ROOT": "/home/baker/.config/vllm",
        "VLLM_XLA_CACHE_PATH": "/home/baker/.cache/vllm/xla_cache",
    }
    by_hand = {"VLLM_CONFIG_ROOT": "/etc/vllm"}
    here = replace(here, config_root="/etc/vllm")
    assert "VLLM_CONFIG_ROOT" not in pins(_site(), here, by_hand)
    (named,) = [m for m in moved(_site(), here, by_hand) if m.factor == "VLLM_CONFIG_ROOT"]
    assert "/etc/vllm here, /home/baker/.config/vllm at bake" in named.describe() and "#47573" in named.effect


def test_a_vllm_installed_elsewhere_is_named_with_what_it_costs():
    packages = {k: v.replace("/opt/bake-venv", "/srv/venv") for k, v in _site().packages.items()}
    here = _site(prefix="/srv/venv", packages=packages)

    found = {m.factor: m for m in moved(_site(), here, {})}

    assert set(found) == {"vllm package", "torch package", "triton package", "deep_gemm package"}
    assert "traced with its path" in found["vllm package"].effect
    assert "Inductor's FX-graph and AOTAutograd caches still hit" in found["vllm package"].effect
    assert "#48190" in found["deep_gemm package"].effect
    assert found["vllm package"].here == "/srv/venv/lib/python3.12/site-packages/vllm"


def test_deep_gemm_names_a_moved_cuda_home_and_another_nvcc():
    here = _site(cuda_home="/usr/local/cuda", nvcc="Cuda compilation tools, release 12.9, V12.9.41")

    found = {m.factor: m for m in moved(_site(), here, {})}

    assert set(found) == {"CUDA_HOME", "nvcc"}
    assert found["nvcc"].baked.endswith("V12.8.93") and "include paths" in found["CUDA_HOME"].effect
    # without DeepGEMM in the bake, neither matters
    no_deep_gemm = _site(packages={"vllm": _site().packages["vllm"]})
    assert moved(no_deep_gemm, replace(here, packages=no_deep_gemm.packages), {}) == []


def test_nothing_moves_when_bake_and_serve_share_a_site():
    assert moved(_site(), _site(), {}) == [] and pins(_site(), _site(), {}) == {}


def test_the_site_probe_reads_package_folders_without_importing_them(tmp_path):
    env = {"HOME": str(tmp_path / "h"), "PATH": "/usr/bin:/bin"}
    site = resolve_site(env, tmp_path / "root", sys.executable)

    assert site.home == str(tmp_path / "h") and site.config_root == str(tmp_path / "h" / ".config" / "vllm")
    assert site.prefix == sys.prefix and site.packages["torch"].endswith("torch")
    assert site.packages["deep_gemm"] is None
    assert Site.from_json(json.loads(json.dumps(site.to_json()))) == site


def test_serving_a_baked_root_elsewhere_relocates_pins_and_names_before_vllm_starts(tmp_path):
    root = tmp_path / "run" / "vllm-cache"
    group = _triton_kernel(root, BAKED_ROOT)
    report = {"site": _site(packages={"torch": "/elsewhere/site-packages/torch"}).to_json()}
    env = {"HOME": str(tmp_path / "server-home"), "PATH": "/usr/bin:/bin"}

    ready = prepare_root(report, root, env, sys.executable)

    assert Path(next(iter(json.loads(group.read_text())["child_paths"].values()))).parent == group.parent
    assert ready.pins["VLLM_CONFIG_ROOT"] == "/home/baker/.config/vllm"
    assert any(n.startswith("pointed 1 Triton group file(s)") for n in ready.notes)
    assert any(n.startswith("moved since the bake: torch package: ") for n in ready.notes)


def test_a_bundle_without_a_site_record_is_still_relocated(tmp_path):
    root = tmp_path / "vllm-cache"
    _triton_kernel(root, BAKED_ROOT)
    ready = prepare_root({}, root, {}, None)
    assert ready.pins == {} and len(ready.notes) == 1


def test_the_vllm_interpreter_is_found_in_the_command():
    assert interpreter(["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]) == "/v/bin/python"
    assert interpreter(["/v/bin/python3.12", "-X", "dev"]) == "/v/bin/python3.12"
    assert interpreter(["vllm", "serve"]) is None


def test_a_per_host_value_vllm_hashes_is_named():
    baked = _site(per_host={"MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "node-a"})
    here = _site(per_host={"MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "node-b"})

    (found,) = moved(baked, here, {})

    assert found.describe().startswith("MOONCAKE_REQUESTER_LOCAL_HOSTNAME: node-b here, node-a at bake")
    assert moved(_site(), here, {}) == []  # a bake that did not record it: nothing to compare
