"""Whether vLLM can serve fp8 on this host's CPU: refused on a CPU without FP8 matmul units.

vLLM's `--quantization fp8` multiplies FP8 weights by `torch._scaled_mm`; on an x86 CPU, oneDNN has
an FP8 kernel only with AMX (`amx_tile`, Sapphire Rapids and later: the host probe's ISA level
"amx"). Without it torch emulates the matmul in fp32, slower than bf16 (about 20x for a
decode-shaped linear on this project's AMD EPYC, docs/fp8.md), so a vLLM that baked or served fp8
there would be a slow copy of the bf16 target. The bundled engine warns and serves it anyway (a
correctness target); the vLLM adapter refuses, at bake and at start, naming what to do instead.
GPUs are the host probe's (fp8 needs sm_89), Gaudi is vllm-gaudi's.
"""

from __future__ import annotations

from prebake.artifacts.errors import HostCannotBuildError
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.recipe.schema import parse_platform

FP8_UNITS = "amx"  # the host probe's ISA level of the units oneDNN's FP8 kernel runs on (amx_tile)


def refuse_emulated_fp8(plan: TargetKeys) -> None:
    """Raise HostCannotBuildError for an fp8 CPU target whose host (the plan's probed ISA) has no AMX."""
    target = plan.target
    if target.dtype != "fp8" or parse_platform(target.platform)[0] != "cpu":
        return
    isa = str(plan.key("graphs").factors().get("platform.isa", ""))
    if FP8_UNITS in isa.split(","):
        return
    raise HostCannotBuildError(
        f"{target.name}: vLLM serves fp8 on a CPU only with FP8 matmul units (x86 AMX, the /proc/cpuinfo flag "
        f"amx_tile: Sapphire Rapids or later); this CPU has none (ISA {isa or 'unknown'}), so torch would emulate "
        f"every FP8 matmul in fp32, slower than bf16. Serve {plan.recipe.model.name} at bf16 (precision=bf16); "
        f"bake and serve fp8 on a CPU with AMX or a GPU of sm_89 or newer; or serve it with the bundled engine "
        f"(engine = 'prebake'), which runs fp8 here as a correctness target"
    )
