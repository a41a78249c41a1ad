"""A Hugging Face checkpoint folder written from a runtime state dict, for tests that compare with transformers.

prebake only reads checkpoints (prebake.engine.bundled.runtime.weights); tests write one here so
transformers can load the very weights the runtime runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from safetensors.torch import save_file
from torch import Tensor

from prebake.artifacts.fsutil import atomic_target, write_bytes
from prebake.engine.bundled.runtime.weights import CONFIG_FILE, WEIGHTS_FILE, LlamaConfig, check_state_dict


def save_hf_folder(config: LlamaConfig, state_dict: Mapping[str, Tensor], path: str | Path) -> Path:
    """Write config.json and model.safetensors (HF names) into `path`, the weights first."""
    check_state_dict(config, state_dict)
    folder = Path(path)
    tensors = {_hf_name(k): v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    with atomic_target(folder / WEIGHTS_FILE) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})
    write_bytes(folder / CONFIG_FILE, json.dumps(config.to_hf(), indent=2, sort_keys=True).encode() + b"\n")
    return folder


def _hf_name(runtime_name: str) -> str:
    return runtime_name if runtime_name == "lm_head.weight" else "model." + runtime_name
