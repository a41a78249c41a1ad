"""A checkpoint folder's tensors by Hugging Face name, read on demand, and the checks every scale passes.

A scale that is missing, of the wrong shape, zero, negative or NaN is refused naming the tensor: it
would serve garbage or infinities, and it is the checkpoint's fault, never the server's.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from prebake.artifacts.errors import CheckpointError
from prebake.artifacts.recipe.quantization import QuantizationError
from prebake.engine.bundled.runtime.fp8_linear import FP8


class CheckpointTensors:
    """Every tensor of a folder's safetensors files by name; each read when asked for (mmap)."""

    def __init__(self, files: Sequence[Path]) -> None:
        self._stack = ExitStack()
        self._where: dict[str, object] = {}
        self.folder = files[0].parent
        for file in files:
            try:
                handle = self._stack.enter_context(safe_open(file, framework="pt"))
            except (SafetensorError, OSError) as exc:
                self._stack.close()
                raise CheckpointError(
                    f"{file} is not a readable, whole safetensors file ({exc}): download it again"
                ) from None
            self._where.update(dict.fromkeys(handle.keys(), handle))

    def __enter__(self) -> CheckpointTensors:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def names(self) -> set[str]:
        return set(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> Tensor:
        if name not in self._where:
            raise QuantizationError(f"{self.folder}: tensor {name} is missing; the checkpoint is incomplete")
        return self._where[name].get_tensor(name)  # type: ignore[attr-defined]

    def fp8_weight(self, name: str, shape: tuple[int, int] | None = None) -> Tensor:
        weight = self.get(name)
        if weight.dtype != FP8:
            raise QuantizationError(
                f"{self.folder}: {name} is {weight.dtype}, not float8_e4m3fn (F8_E4M3) as its quantization "
                f"config says; the checkpoint and its config.json disagree"
            )
        if shape is not None and tuple(weight.shape) != shape:
            raise QuantizationError(f"{self.folder}: {name} is {tuple(weight.shape)}, the config needs {shape}")
        return weight

    def scale(self, name: str, shapes: Sequence[tuple[int, ...]]) -> Tensor:
        """The scale `name` as fp32, refused unless present, of one of `shapes`, finite and positive."""
        if name not in self._where:
            raise QuantizationError(
                f"{self.folder}: scale {name} is missing; an FP8 weight cannot be read without it "
                f"(re-export the checkpoint with its scales)"
            )
        return checked_scale(self.get(name), name, shapes, str(self.folder))


def checked_scale(scale: Tensor, name: str, shapes: Sequence[tuple[int, ...]], where: str) -> Tensor:
    if tuple(scale.shape) not in [tuple(s) for s in shapes]:
        wanted = " or ".join(str(tuple(s)) for s in shapes)
        raise QuantizationError(f"{where}: scale {name} has shape {tuple(scale.shape)}, not {wanted}")
    values = scale.float()
    if torch.isnan(values).any():
        raise QuantizationError(f"{where}: scale {name} holds NaN; the checkpoint is corrupt, export it again")
    if (values <= 0).any() or torch.isinf(values).any():
        raise QuantizationError(
            f"{where}: scale {name} holds zero, negative or infinite values (min {values.min().item():g}); "
            f"an FP8 scale must be finite and positive, export the checkpoint again"
        )
    return values
