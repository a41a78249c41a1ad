"""The dynamo-precompile graphs variant: one precompiled Dynamo function per step shape.

    graphs tree: aot/<shape name>.pt2fn   one torch.compiler.load_compiled_function file per step shape
                 inductor/, graphs.json   the Inductor cache those files call; shapes, tactics, seconds

It saves what Dynamo and Inductor produce together (torch.compile(...).aot_compile, as vLLM
does): guards, bytecode and graph, so a start deserialises instead of tracing. Weights are not
embedded (the model is external data, bound when loaded); the KV cache is an argument written in
place. A torch without precompile (`supported()` says why) bakes the Inductor cache alone; a
function that does not load here is no start failure: the variant falls to the same tree's
Inductor cache (prebake.engine.bundled.variants.dynamo_precompile). docs/graphs-variants.md.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from prebake.engine.bundled.runtime.model import KVCache, Llama
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
from prebake.engine.common.logs import Countdown

AOT_DIR = "aot"
SUFFIX = ".pt2fn"
_MODEL_REF = "model"  # the external-data name the serving model is bound under


class AotSteps(CompiledSteps):
    """CompiledSteps whose prefill/decode dispatch to one precompiled function per step shape."""

    def __init__(self, model: Llama, cache: KVCache, functions: dict[StepShape, Callable]):
        super().__init__(model, cache, compile=False)
        self.functions = dict(functions)
        self._prefill = self._prefill_shape  # type: ignore[assignment]  # same call shape, untyped args
        self._decode = self._decode_shape  # type: ignore[assignment]

    def _prefill_shape(self, ids, lengths, slots, cache, attn_impl):
        b, t = ids.shape
        return self._function(StepShape("prefill", b, t, t))(ids, lengths, slots, cache, attn_impl)

    def _decode_shape(self, ids, positions, slots, cache, ctx_len, attn_impl):
        return self._function(StepShape("decode", ids.shape[0], 1, ctx_len))(
            ids, positions, slots, cache, ctx_len, attn_impl
        )

    def _function(self, shape: StepShape) -> Callable:
        try:
            return self.functions[shape]
        except KeyError:
            raise KeyError(
                f"no precompiled graph for step shape {shape.name}; the graphs bundle holds "
                f"{sorted(s.name for s in self.functions)}; rebake graphs for this bucket set"
            ) from None


def supported() -> str | None:
    """None when this torch can precompile and load Dynamo functions; else why not."""
    compiled = torch.compile(lambda x: x)
    if not hasattr(compiled, "aot_compile"):
        return f"torch {torch.__version__} has no torch.compile(...).aot_compile"
    if not hasattr(torch.compiler, "load_compiled_function"):
        return f"torch {torch.__version__} has no torch.compiler.load_compiled_function"
    return None


def compile_shapes(
    model: Llama, cache: KVCache, tactics: dict[StepShape, Tactic], out: Path, *, mode: str = "default", log=print
) -> tuple[AotSteps, dict[StepShape, float]]:
    """Precompile every shape with its tactic, save each under out/aot/; the steps and seconds per shape."""
    folder = out / AOT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    # No guards are saved (as vLLM strips them, TorchCompileGuardsStripWrapper): AotSteps picks each
    # function by its exact step shape, the bundle's key pins the model, dtype and target, and the
    # output code asserts its inputs' sizes and strides. Dynamo's guards would re-check the model's
    # every parameter on every call, and building them is most of a function's load (`bind`).
    # torch.compile takes a mode or options, not both: a mode is passed as the options it stands for.
    inductor = torch._inductor.list_mode_options(mode) if mode != "default" else {}
    functions, seconds = {}, {}
    countdown = Countdown(len(tactics))
    for shape, tactic in tactics.items():
        started = time.perf_counter()
        method = model.prefill if shape.phase == "prefill" else model.decode
        args = example_args(shape, cache, tactic)
        # a fresh options dict per call: torch.compile pops guard_filter_fn out of the one it is given
        options = {**inductor, "guard_filter_fn": _no_guards, "cpp.dynamic_threads": True}
        compiled = torch.compile(method, dynamic=False, fullgraph=True, options=options).aot_compile((args, {}))  # type: ignore[attr-defined]  # experimental, unstubbed
        compiled.save_compiled_function(str(folder / f"{shape.name}{SUFFIX}"), external_data={_MODEL_REF: model})
        functions[shape] = compiled
        seconds[shape] = time.perf_counter() - started
        log("  " + countdown.line(f"precompile {shape.name} [{tactic.label()}] {seconds[shape]:.2f} s"))
    return AotSteps(model, cache, functions), seconds


def _no_guards(entries: list) -> list[bool]:
    return torch.compiler.skip_all_guards_unsafe(entries)


@dataclass
class LoadParts:
    """Seconds of loading precompiled functions, by part (summed over the shapes loaded)."""

    deserialise: float = 0.0  # unpickling the saved state: guards' state, bytecode, the graph's entry
    kernels: float = 0.0  # the compiled graph's output code: its module run, its kernels' libraries loaded
    bind: float = 0.0  # the function bound to the serving model: its guards built, its bytecode wrapped
    split: bool = True  # False when this torch's internals differ and only the total is known (in bind)

    def total(self) -> float:
        return self.deserialise + self.kernels + self.bind

    def as_dict(self) -> dict[str, float]:
        return {"deserialise": self.deserialise, "kernels": self.kernels, "bind": self.bind}


def load_shapes(
    model: Llama, cache: KVCache, shapes: list[StepShape], tree: Path, parts: LoadParts | None = None
) -> AotSteps:
    """The precompiled functions of `shapes` from a graphs tree, bound to `model`; `parts` gets the seconds."""
    parts = parts if parts is not None else LoadParts()
    functions = {}
    for shape in shapes:
        path = tree / AOT_DIR / f"{shape.name}{SUFFIX}"
        if not path.is_file():
            raise FileNotFoundError(
                f"the graphs bundle at {tree} has no precompiled {shape.name} ({path}); "
                f"it was baked for another bucket set: rebake graphs"
            )
        functions[shape] = _load_in_parts(path.read_bytes(), {_MODEL_REF: model}, parts)
    return AotSteps(model, cache, functions)


def _load_in_parts(data: bytes, external: dict, parts: LoadParts) -> Callable:
    """torch.compiler.load_compiled_function, timed by part.

    torch 2.13's AOTCompiledFunction.deserialize does three things in a row: unpickle the state,
    deserialise the compiled graph (which runs Inductor's output code and loads its kernels), and
    construct the function (whose __post_init__ builds the guards). They are done here one at a
    time, with torch's own classes, to time them; a torch whose internals differ is loaded with
    the public call and only its total is known."""
    started = time.perf_counter()
    try:
        import dataclasses

        from torch._dynamo.aot_compile import AOTCompiledFunction, AOTCompileUnpickler, CompileArtifacts
        from torch._dynamo.package import SerializedCode
    except ImportError:
        parts.split = False
        function = torch.compiler.load_compiled_function(io.BytesIO(data), external_data=external)
        parts.bind += time.perf_counter() - started
        return function
    state = AOTCompileUnpickler(external, io.BytesIO(data)).load()
    state["runtime_env"] = dataclasses.replace(
        state["runtime_env"], bytecode=SerializedCode.to_code_object(state["runtime_env"].bytecode)
    )
    state["original_code"] = SerializedCode.to_code_object(state["original_code"])
    deserializer, compiled_state = state["compiled_fn"]
    loaded = time.perf_counter()
    parts.deserialise += loaded - started
    with torch._inductor.config.patch(enable_autograd_for_aot=True):
        state["compiled_fn"] = deserializer(compiled_state)
    bound = time.perf_counter()
    parts.kernels += bound - loaded
    function = AOTCompiledFunction(CompileArtifacts(**state))
    parts.bind += time.perf_counter() - bound
    return function


def example_args(shape: StepShape, cache: KVCache, tactic: Tactic) -> tuple:
    """Placeholder arguments of the model method that runs `shape` (as CompiledSteps.run_dummy builds them)."""
    b, device = shape.batch, cache.keys[0].device  # on the device the steps run on, as CompiledSteps moves them
    slots = torch.arange(b, device=device)
    ids = torch.ones((b, shape.tokens), dtype=torch.long, device=device)
    if shape.phase == "prefill":
        return ids, torch.full((b,), shape.tokens, device=device), slots, cache, tactic.attn_impl
    positions = torch.full((b,), shape.ctx_len - 1, device=device)
    return ids[:, 0], positions, slots, cache, shape.ctx_len, tactic.attn_impl
