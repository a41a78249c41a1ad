"""Whether vLLM can serve fp8 on this host's CPU: refused on a CPU without FP8 matmul units.

vLLM's `--quantization fp8` multiplies FP8 weights by `torch._scaled_mm`. On an x86 CPU without AMX
(the host probe's ISA level "amx") torch emulates it, slower than bf16 (about 20x for a decode-shaped
linear on this project's AMD EPYC, docs/fp8.md); AMX does not make it native either (330x on this
project's Xeon with amx_tile, amx_bf16 and amx_int8), so on an AMX host the matmul is timed here
(engine/common/fp8_units). A vLLM that baked or served emulated fp8 would be a slow copy of the bf16
target: the bundled engine warns and serves it anyway (a correctness target); the vLLM adapter
refuses, at bake and at start (both run on the host they name), naming what to do instead. GPUs are
the host probe's (fp8 needs sm_89), Gaudi is vllm-gaudi's.
"""

from __future__ import annotations

from collections.abc import Callable

from prebake.artifacts.errors import HostCannotBuildError
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.recipe.schema import parse_platform
from prebake.engine.common.fp8_units import EMULATED_ABOVE, fp8_matmul_slowdown

FP8_UNITS = "amx"  # the host probe's ISA level without which torch emulates FP8 matmuls (needed, not enough)


def refuse_emulated_fp8(plan: TargetKeys, slowdown: Callable[[], float] = fp8_matmul_slowdown) -> None:
    """Raise HostCannotBuildError for an fp8 CPU target whose host has no FP8 matmul units: no AMX in
    the plan's probed ISA, or AMX and FP8 measured (`slowdown`, on this host) more than
    EMULATED_ABOVE times slower than bf16."""
    target = plan.target
    if target.dtype != "fp8" or parse_platform(target.platform)[0] != "cpu":
        return
    isa = str(plan.key("graphs").factors().get("platform.isa", ""))
    if FP8_UNITS not in isa.split(","):
        found = f"this CPU has no AMX (ISA {isa or 'unknown'}), so torch would emulate every FP8 matmul"
    elif (factor := slowdown()) > EMULATED_ABOVE:
        found = (
            f"this CPU has AMX (ISA {isa}) but runs torch's FP8 matmul {factor:.0f}x slower than bf16 "
            f"(measured: emulated, no FP8 units)"
        )
    else:
        return
    raise HostCannotBuildError(
        f"{target.name}: vLLM serves fp8 on a CPU only where torch runs FP8 matmuls natively; {found}, "
        f"slower than bf16. Serve {plan.recipe.model.name} at bf16 (precision=bf16); bake and serve fp8 on a "
        f"GPU of sm_89 or newer (or a CPU with FP8 matmul units); or serve it with the bundled engine "
        f"(engine = 'prebake'), which runs fp8 here as a correctness target"
    )
