"""Loading a recipe's model: seeded random weights for tiny recipes, or a Hugging Face folder."""

from __future__ import annotations

import torch

from prebake.artifacts.errors import BuildError
from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.model import Llama, build_model
from prebake.engine.bundled.runtime.parallel import Parallel
from prebake.engine.bundled.runtime.weights import LlamaConfig, load_hf_folder, tiny_random_weights

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise BuildError(
            f"dtype {name!r} has no CPU runtime in the bundled engine (it runs {sorted(TORCH_DTYPES)}); "
            f"fp8 builds need a CUDA sm_89+ or Gaudi runner and an engine adapter"
        )
    return TORCH_DTYPES[name]


def load_model(spec: ModelSpec, dtype: str, device: str = "cpu", parallel: Parallel | None = None) -> Llama:
    """The runtime for a recipe's [model]: its inline config with seeded weights, or a folder, on `device`;
    with `parallel`, one rank's shard of it."""
    if spec.weights == "random":
        config = LlamaConfig.from_hf(spec.config)
        state = tiny_random_weights(config, seed=spec.seed)  # made on the CPU: the same bits on any machine
    else:
        config, state = load_hf_folder(spec.weights, torch_dtype(dtype))
    return build_model(config, state, torch_dtype(dtype), device=device, parallel=parallel)
