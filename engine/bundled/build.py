"""The build child: `python -m prebake.engine.bundled.build REQUEST.json` builds autotune or graphs with torch.

Run by prebake.engine.bundled.adapter in a fresh process whose environment (TORCHINDUCTOR_CACHE_DIR for
graphs) was set by the parent, so nothing here touches os.environ.

    graphs tree:  what the recipe's graphs variant compiles (prebake.engine.bundled.variants: each
                  variant's module draws its tree)
                  graphs.json   the variant, its fallback, the step shapes compiled, their tactics and
                                compile seconds
"""

from __future__ import annotations

import json
import platform
import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from prebake.artifacts.buckets.artifact import BucketSet
from prebake.artifacts.errors import BuildError, CheckpointError, ExitCode, PrebakeError, RecipeError
from prebake.artifacts.recipe.kinds import BUCKETS_FILE
from prebake.artifacts.recipe.schema import Recipe, Target
from prebake.engine.bundled.cache_layout import AUTOTUNE_FILE, GRAPHS_FILE
from prebake.engine.bundled.runtime import isa_probes
from prebake.engine.bundled.runtime.autotune import load_winners, measure
from prebake.engine.bundled.runtime.fp8_linear import is_fp8
from prebake.engine.bundled.runtime.fp8_speed import warn_if_emulated
from prebake.engine.bundled.runtime.loader import load_model, placeholder_model, reduced_model, torch_dtype
from prebake.engine.bundled.runtime.model import KVCache, Llama
from prebake.engine.bundled.runtime.parallel import Parallel, one_rank_of
from prebake.engine.bundled.runtime.shapes import StepShape, step_shapes
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
from prebake.engine.bundled.runtime.weights import LlamaConfig
from prebake.engine.bundled.variants import fallback_of, variant_of
from prebake.engine.bundled.variants.base import CompileJob, TreeFacts
from prebake.engine.common import logs
from prebake.engine.common.fp8_units import fp8_emulated


def build_autotune(
    recipe: Recipe, dtype: str, buckets_tree: Path, out: Path, target_platform: str = "cpu", tp: int = 1
) -> None:
    """Time every tactic on every shape: the whole model, or [autotune] layers of it (real compute);
    a tp=N target's tactics on one rank's shard."""
    shapes = _shapes(recipe, buckets_tree)
    layers = _autotune_layers(recipe, dtype, target_platform)
    with _as_one_rank(tp) as parallel:
        steps = CompiledSteps(*model_and_cache(recipe, dtype, target_platform, parallel, layers=layers), compile=False)
        document = measure(steps, shapes, recipe.autotune)
    document["measured_on"] = {"machine": platform.machine(), "processor": platform.processor()}
    document["model"] = {"layers": layers or steps.model.config.num_hidden_layers, "peak_rss_bytes": peak_rss()}
    (out / AUTOTUNE_FILE).write_text(json.dumps(document, indent=1, sort_keys=True))


def _autotune_layers(recipe: Recipe, dtype: str, target_platform: str) -> int | None:
    """[autotune] layers, or one layer at fp8 on a CPU that emulates FP8 (measured: fp8_units): there
    each step is the emulated matmuls' (20-330x bf16's) and the tactics differ only in attention, the
    same in every layer, so a second layer adds minutes of emulated matmuls and no information."""
    if dtype == "fp8" and device_of(target_platform) == "cpu" and fp8_emulated():
        print("  autotune at fp8 on a CPU that emulates FP8 matmuls: one decoder layer timed")
        return 1
    return recipe.autotune.layers


def build_graphs(
    recipe: Recipe,
    dtype: str,
    buckets_tree: Path,
    autotune_tree: Path,
    out: Path,
    target_platform: str = "cpu",
    tp: int = 1,
) -> None:
    """The graphs tree of one target, on placeholder weights when the variant's compile never runs the
    model; a tp=N target's is compiled once, as rank 0 of a fake group of N (runtime/parallel.one_rank_of):
    one package, its collectives inside, that every rank loads."""
    if why := variant_of(recipe).refuses(Target(recipe.model.name, target_platform, tp, dtype)):
        raise BuildError(f"{recipe.model.name} tp {tp}: {why}")
    shapes = _shapes(recipe, buckets_tree)
    tactics = load_winners(autotune_tree / AUTOTUNE_FILE)
    placeholders = _on_placeholders(recipe)
    facts = {"weights": "placeholders" if placeholders else "loaded"}
    if dtype == "fp8" and device_of(target_platform) == "cpu":
        warn_if_emulated(LlamaConfig.from_hf(recipe.model.config))
    with _as_one_rank(tp) as parallel:
        model, cache = model_and_cache(recipe, dtype, target_platform, parallel, placeholders=placeholders)
        compile_graphs(model, cache, recipe, {s: tactics[s] for s in shapes}, out, facts=facts)


def _on_placeholders(recipe: Recipe) -> bool:
    """Whether the recipe's graphs compile on placeholder weights (the variant never runs the model)."""
    return variant_of(recipe).compiles_without_weights(recipe.compile.fallback)


@contextmanager
def _as_one_rank(tp: int) -> Iterator[Parallel | None]:
    if tp == 1:
        yield None
        return
    with one_rank_of(tp) as parallel:
        yield parallel


def peak_rss() -> int:
    """This process's peak resident memory, in bytes: Linux's VmHWM, the high-water mark of this
    process's own memory since its exec. Not ru_maxrss: across fork/vfork and exec Linux carries the
    parent's peak into it, so a build child started by a large process (a test worker that had
    loaded a model) reported its parent's gigabytes as its own. ru_maxrss (KiB) where /proc is absent."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def compile_graphs(
    model: Llama,
    cache: KVCache,
    recipe: Recipe,
    tactics: dict[StepShape, Tactic],
    out: Path,
    log: Callable[[str], None] = print,
    facts: dict[str, str] | None = None,
    *,
    workers: int | None = None,
) -> CompiledSteps:
    """Compile every shape of `tactics` into the graphs tree `out`, in the recipe's variant; the warm steps.

    The graphs builder and the serving engine's compile-in-place both call this, so a bundle
    written back by an engine is the bundle `doit bake` would have built. Inductor writes its
    cache into TORCHINDUCTOR_CACHE_DIR, which the caller set to out/inductor (its vector-ISA probes
    copied from the machine's set first: runtime.isa_probes). An aoti-package on
    the CPU compiles its shapes in worker processes (`workers`: how many; None: as many as the
    cores and the memory allow, runtime.aoti_workers); the other variants compile in this process.
    """
    import torch

    started = time.perf_counter()
    if cache.keys[0].device.type == "cpu":  # before the first kernel, and before any worker starts
        log(f"  {isa_probes.settle().line()}")
    graphs = variant_of(recipe)
    # worker processes build the model from the recipe, whole and unsharded: a tp > 1 compile stays here
    pool = None if model.parallel is not None else _workers(model, cache, recipe, len(tactics), workers)
    job = CompileJob(
        model,
        cache,
        recipe.compile.mode,
        tactics,
        out,
        log,
        fallback=fallback_of(recipe),
        workers=pool,
        parallel=model.parallel,
    )
    compiled = graphs.compile(job)
    carried = TreeFacts.of(graphs.name, recipe.compile.fallback, compiled.facts)
    document = {
        **carried.to_json(),
        "torch": torch.__version__,
        "total_compile_s": round(time.perf_counter() - started, 3),
        "builder": {**(facts or {}), "peak_rss_bytes": peak_rss()},
        "shapes": [
            {"shape": asdict(s), "tactic": asdict(t), "compile_s": round(compiled.seconds[s], 3)}
            for s, t in tactics.items()
        ],
    }
    (out / GRAPHS_FILE).write_text(json.dumps(document, indent=1, sort_keys=True))
    return compiled.steps


def _workers(model: Llama, cache: KVCache, recipe: Recipe, shapes: int, asked: int | None):
    """The worker processes an aoti-package compile may use here; None on a GPU (one at a time)."""
    from prebake.engine.bundled.runtime.aoti_workers import ModelSource, plan_workers
    from prebake.engine.bundled.runtime.loader import dtype_name

    if cache.keys[0].device.type != "cpu" or asked == 1:
        return None
    dtype = "fp8" if is_fp8(model) else dtype_name(cache.keys[0].dtype)
    # the workers' model is their own: on placeholders whenever the variant allows, even where this
    # process compiles in place on the loaded weights (a start's compile-in-place)
    source = ModelSource(
        recipe.model, dtype, recipe.serving.max_num_seqs, recipe.serving.max_model_len, _on_placeholders(recipe)
    )
    tensors = [*model.parameters(), *model.buffers(), *cache.keys, *cache.values]
    return plan_workers(source, sum(t.numel() * t.element_size() for t in tensors), shapes, asked=asked)


def _shapes(recipe: Recipe, buckets_tree: Path):
    buckets = BucketSet.from_json(json.loads((buckets_tree / BUCKETS_FILE).read_text()))
    return step_shapes(buckets, recipe.serving.max_model_len)


def model_and_cache(
    recipe: Recipe,
    dtype: str,
    target_platform: str = "cpu",
    parallel: Parallel | None = None,
    *,
    placeholders: bool = False,
    layers: int | None = None,
    log: Callable[[str], None] = print,
) -> tuple[Llama, KVCache]:
    """The recipe's model (one rank's shard with `parallel`) and a KV cache of its serving limits on
    the target platform's device (a CUDA target: the GPU): the builder and the engine size and place
    them alike. `placeholders`: the weights' storage reserved, never touched; `layers`: a copy cut to
    that many layers."""
    device = device_of(target_platform)
    if placeholders:
        model = placeholder_model(recipe.model, dtype, device=device, parallel=parallel)
    elif layers is not None:
        model = reduced_model(recipe.model, dtype, layers, device=device, parallel=parallel)
    else:
        model = load_model(recipe.model, dtype, device=device, parallel=parallel, log=log)
    cache = KVCache.allocate(
        model.config, recipe.serving.max_num_seqs, recipe.serving.max_model_len, dtype=torch_dtype(dtype), device=device
    )
    return model, cache


def device_of(target_platform: str) -> str:
    """The torch device a target platform runs on ("cuda:sm_90" -> "cuda")."""
    return "cuda" if target_platform.split(":", 1)[0] == "cuda" else "cpu"


def main(argv: list[str]) -> int:
    logs.configure()  # the parent's PREBAKE_LOG_LEVEL; a dependency's deprecations to its debug log
    spec = json.loads(Path(argv[0]).read_text())
    recipe = Recipe.model_validate(spec["recipe"])
    dtype, out, inputs = spec["target"]["dtype"], Path(spec["out"]), {k: Path(v) for k, v in spec["inputs"].items()}
    where = spec["target"].get("platform", "cpu")
    tp = int(spec["target"].get("tp", 1))
    try:
        if spec["kind"] == "autotune":
            build_autotune(recipe, dtype, inputs["buckets"], out, where, tp)
        elif spec["kind"] == "graphs":
            build_graphs(recipe, dtype, inputs["buckets"], inputs["autotune"], out, where, tp)
        else:
            print(f"prebake.engine.bundled.build: unknown kind {spec['kind']!r}", file=sys.stderr)
            return 2
    except (CheckpointError, RecipeError) as exc:  # the user's files: the parent raises it as it is
        if "refusal" not in spec:  # a request written by hand (a benchmark): the error as it came
            raise
        told = {"type": type(exc).__name__, "message": _told(exc)}
        Path(spec["refusal"]).write_text(json.dumps(told))
        return ExitCode.INVALID
    except PrebakeError as exc:  # any other input prebake refused: the message says the fix, no traceback
        print(f"prebake: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _told(exc: BaseException) -> str:
    return "\n".join([str(exc), *getattr(exc, "__notes__", ())])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
