"""Real vLLM at tensor-parallel size 2 (vllm-cpu 0.32.0, two ranks, one core each): baked, served.

Opt-in: marked `vllm` and skipped where vllm is not importable (`make vllm-check` builds .venv-vllm).
Two vLLM starts, each with two rank processes that need both cores: the bake
(`doit bake model=tiny-llama-vllm tp=2`, every rank compiles) and a prebaked
`prebake serve --tp 2`, whose log must show, rank by rank, the Inductor FX-graph and AOTAutograd
cache hits for exactly the keys that rank compiled at the bake, and no compile. Its kernel-cache
image is built from the same bundle (no registry needed) and must hold every rank's entries.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

from prebake.artifacts.store.local import Store
from prebake.engine.vllm import ranks
from prebake.engine.vllm.cache_tree import read_cache_tree
from prebake.engine.vllm.process import CACHE_DIR, REPORT_FILE, Spawn, start, stop, wait_ready
from prebake.registry.oci.kernel_cache import RANKS, build_image
from tests.integration.test_vllm import MODEL, generate
from tests.support.baking import BIN, Home
from tests.support.oci_server import oci_available, oci_server
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not importable; run make vllm-check"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two vLLM ranks need two cores, one each"),
]
KV_CACHE = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # GiB per rank: vLLM on CPU reserves most of the RAM otherwise


@pytest.fixture(scope="module")
def baked(tmp_path_factory) -> Home:
    home = Home(tmp_path_factory.mktemp("vllm-tp2"))
    proc = home.doit("run", "bake", f"model={MODEL}", "precision=bf16", "tp=2", extra_env=KV_CACHE)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return home


def fetched(home: Home) -> dict:
    """`prebake fetch --engine vllm --tp 2 --json` of `home`: the environment vLLM gets and the bundles."""
    done = home.prebake("fetch", "--engine", "vllm", "--model", MODEL, "--precision", "bf16", "--tp", "2", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def graphs_tree(home: Home) -> Path:
    return Path(fetched(home)["bundles"]["graphs"]["tree"])


def test_the_tp2_bake_records_every_rank_and_its_bundle_holds_each_ranks_cache(baked):
    tree = graphs_tree(baked)
    report = json.loads((tree / REPORT_FILE).read_text())
    recorded = report["ranks"]
    print(f"\nbaked at tp=2 in {report['ready_s']:.1f} s; ranks' keys: {json.dumps(recorded)}", file=sys.stderr)

    assert sorted(recorded) == ["0", "1"] and all(recorded[r]["fxgraph"] and recorded[r]["aotautograd"] for r in "01")
    assert recorded["0"] != recorded["1"]  # each rank's graph is its own (rank-specific constants), both kept
    assert report["variables"][ranks.BIND].count("|") == 1  # one core list per rank, handed to vLLM
    assert fetched(baked)["env"][ranks.BIND] == report["variables"][ranks.BIND]  # and again at serve
    assert ranks.gaps(tree / CACHE_DIR, 2, recorded) == ()


def test_a_prebaked_tp2_start_compiles_nothing_on_either_rank(baked, tmp_path):
    bake_s = json.loads((graphs_tree(baked) / REPORT_FILE).read_text())["ready_s"]
    recorded = json.loads((graphs_tree(baked) / REPORT_FILE).read_text())["ranks"]
    port, load = free_port(), os.getloadavg()[0]
    argv = (str(BIN / "prebake"), "serve", "--engine", "vllm", "--model", MODEL, "--precision", "bf16", "--tp", "2")
    argv += ("--registry", str(baked.root / "home" / "registry"), "--port", str(port))
    argv += ("--cache-root", str(tmp_path / "cache"))
    running = start(Spawn(argv, {**baked.env, **KV_CACHE}, None, tmp_path / "vllm.log"))
    try:
        seconds = wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=900)
        tokens = generate(port)
    finally:
        stop(running)
    log = running.log.read_text(errors="replace")
    by_rank = ranks.rank_reports(log)
    for rank, report in by_rank.items():
        print(f"\nrank {rank}: {report.describe()}", *report.loaded, sep="\n  ", file=sys.stderr)
    print(
        f"\nprebaked tp=2 start ready in {seconds:.1f} s, the bake's vLLM start {bake_s:.1f} s "
        f"(prebaked/bake = {seconds / bake_s:.2f}); load average {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end",
        file=sys.stderr,
    )

    assert sorted(by_rank) == [0, 1], log[-3000:]
    for rank in (0, 1):
        loaded = " ".join(by_rank[rank].loaded)
        assert by_rank[rank].warm, f"rank {rank}: {by_rank[rank].describe()}"
        assert "fx graph cache hit" in loaded and "AOTAutograd cache hit" in loaded, loaded
    assert ranks.rank_keys(log) == recorded  # every rank looked up exactly what it compiled at the bake
    assert "miss:" not in log and len(tokens) == 12 and len(set(tokens)) > 1


def test_the_kernel_cache_image_of_the_tp2_bundle_carries_both_ranks(baked, tmp_path):
    graphs = fetched(baked)["bundles"]["graphs"]
    installed = Store(baked.root / "home").lookup("graphs", graphs["key"])
    assert installed is not None
    recorded = json.loads((installed.tree / REPORT_FILE).read_text())["ranks"]
    if oci_available():  # `prebake kernel-cache --tp 2` itself, pushed to a registry on loopback
        with oci_server(tmp_path / "server") as server:
            to = f"{server.address('team/vllm-cache')}:tp2"
            argv = ("kernel-cache", "--model", MODEL, "--precision", "bf16", "--tp", "2", "--to", to, "--json")
            pushed = baked.prebake(*argv, extra_env=server.env())
        assert pushed.returncode == 0, pushed.stderr
        report = json.loads(pushed.stdout)
        assert report["ranks"] == [0, 1] and report["labels"][RANKS] == "0,1", report
    image = build_image(
        read_cache_tree(installed.tree, installed.manifest), installed.manifest, tmp_path / "scratch", ranks=(0, 1)
    )
    with tarfile.open(image.layer) as layer:
        names = set(layer.getnames())

    assert image.labels[RANKS] == "0,1"
    for rank in "01":
        for key in recorded[rank]["fxgraph"]:
            assert f"io.vllm.cache/inductor_cache/fxgraph/{key[1:3]}/{key}" in names, (rank, key)
        for key in recorded[rank]["aotautograd"]:
            assert f"io.vllm.cache/inductor_cache/aotautograd/{key}" in names, (rank, key)
