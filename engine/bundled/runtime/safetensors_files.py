"""A Hugging Face model folder's files, read at the boundary where a user's files meet prebake.

    <folder>/config.json                       a JSON object (prebake.engine.bundled.runtime.weights reads it)
    <folder>/model.safetensors                 every tensor, by HF name
    <folder>/model.safetensors.index.json      or sharded: {"weight_map": {tensor name: shard file}}

What safetensors, json and the filesystem raise about these files (a file cut short by a download,
an index from another download, a shard missing, a quantized tensor) comes out as one CheckpointError
naming the file, what was expected against what was found, and the fix: never as a library's error
that reads as a bug in prebake. Which tensors the runtime wants is weights.py's business.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from prebake.artifacts.errors import CheckpointError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")  # safetensors' names of the dtypes a load converts
_MAX_HEADER = 100 << 20  # safetensors' own bound on a header


def weight_files(folder: Path) -> list[tuple[Path, frozenset[str] | None]]:
    """The safetensors files to read, each with the tensors the index maps to it (None: one file)."""
    single, index = folder / WEIGHTS_FILE, folder / INDEX_FILE
    if single.is_file():
        return [(single, None)]
    if not index.is_file():
        raise CheckpointError(
            f"no {WEIGHTS_FILE} or {INDEX_FILE} in {folder}; prebake reads safetensors "
            f"only (convert .bin weights with transformers' save_pretrained)"
        )
    weight_map = read_json(index, 'a safetensors index: {"weight_map": {tensor name: shard file}}').get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(
            f'{index} has no "weight_map" of tensor names to shard files; download it again with its shards'
        )
    shards: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, set()).add(name)
    outside = sorted(s for s in shards if Path(s).is_absolute() or ".." in Path(s).parts)
    if outside:
        raise CheckpointError(f"{index} names shards outside the folder: {outside}; download it again with its shards")
    absent = sorted(s for s in shards if not (folder / s).is_file())
    if absent:
        raise CheckpointError(f"{index} names shards missing from {folder}: {absent}; download them again")
    return [(folder / s, frozenset(names)) for s, names in sorted(shards.items())]


def read_tensors(
    file: Path, mapped: frozenset[str] | None, dtype: torch.dtype, rename: Callable[[str], str | None]
) -> dict[str, Tensor]:
    """One safetensors file's tensors by runtime name; the file's faults (cut short, a tensor the
    index maps here absent, a dtype that is not floating point) named with the fix."""
    tensors: dict[str, Tensor] = {}
    try:
        with safe_open(file, framework="pt") as st:
            held = set(st.keys())
            if mapped is not None and (lacking := sorted(mapped - held)):
                raise CheckpointError(
                    f"{file} lacks {len(lacking)} tensors its index ({INDEX_FILE}) maps to it: "
                    f"{', '.join(lacking[:5])}{' ...' if len(lacking) > 5 else ''}; the shard and the index "
                    f"come from different downloads: download both again"
                )
            for name in sorted(held):
                runtime_name = rename(name)
                if runtime_name is None:
                    continue
                found = st.get_slice(name).get_dtype()
                if found not in _FLOAT_DTYPES:
                    raise CheckpointError(
                        f"{file}: tensor {name} is {found}, expected a floating-point dtype ({', '.join(_FLOAT_DTYPES)}); "
                        f"prebake serves unquantized weights: use the model's float release"
                    )
                tensors[runtime_name] = st.get_tensor(name).to(dtype)
    except SafetensorError as exc:
        raise CheckpointError(
            f"{file} is not a whole safetensors file ({exc}; {_sizes(file)}): download it again"
        ) from None
    except OSError as exc:
        raise CheckpointError(f"{file} cannot be read ({exc.strerror or exc}): check it is a readable file") from None
    return tensors


def _sizes(file: Path) -> str:
    """What a safetensors file's header promises against what is on disk, as far as it can be read."""
    found = file.stat().st_size
    try:
        with file.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length)) if 0 < length <= _MAX_HEADER else None
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"] if header else []
        return f"its header describes {8 + length + max(ends, default=0):,} bytes, {found:,} are on disk"
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return f"{found:,} bytes on disk, its header unreadable"


def read_json(path: Path, expected: str) -> dict:
    """A JSON object from one of the folder's files, or the error naming it."""
    try:
        value = json.loads(path.read_bytes())
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read ({exc.strerror or exc}): check it is a readable file") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CheckpointError(f"{path} is not valid JSON ({exc}): expected {expected}; download it again") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} holds a JSON {type(value).__name__}, expected {expected}; download it again")
    return value
