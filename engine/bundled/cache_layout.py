"""Where the bundled engine's caches live in its installed trees, and the variables that point
torch at them: the one place that decides them. Imports no torch.

    autotune tree:  autotune.json     every step shape's tactic timings and the winner
    graphs tree:    inductor/         Inductor's cache (FX graphs, AOTAutograd entries, kernels)
                    aot/              variant "dynamo-precompile" only: one precompiled function per shape
                    graphs.json       the step shapes compiled, their tactics and compile seconds

The environment is returned as a mapping: callers hand it to a child process or print it
(`prebake fetch`). The one exception is the bundled engine's serving process, which compiles
in itself: `activate` applies its environment once, before torch compiles anything.

Inductor writes into its cache folder (locks, new entries), so the serving engine never
points it at a store tree: it gets a private, writable copy (`private_graphs_tree`). Its temporary
files go to its run folder too (`private_temp`): torch's AOTInductor loader extracts every package's
library into a folder under TMPDIR and removes it only when the loader is destroyed, never when
the process is killed; a run folder is a store scratch folder, which recovery (gc) removes once its
owner died.
"""

from __future__ import annotations

import getpass
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from prebake.artifacts.errors import StoreError
from prebake.artifacts.fsutil import copy_writable
from prebake.artifacts.store import sealing
from prebake.artifacts.store.local import Installed
from prebake.engine.bundled.variants.base import GRAPHS_FILE, INDUCTOR_DIR

FALLBACK_KIND = "graphs"  # the kind the engine compiles in its serving process on a miss (EngineSpec's)
GRAPHS_ENV = "PREBAKE_GRAPHS_DIR"
AUTOTUNE_FILE = "autotune.json"
AUTOTUNE_ENV = "PREBAKE_AUTOTUNE_FILE"
__all__ = ["AUTOTUNE_ENV", "AUTOTUNE_FILE", "FALLBACK_KIND", "GRAPHS_ENV", "GRAPHS_FILE", "INDUCTOR_DIR"]


def private_graphs_tree(installed: Installed | None, run_dir: Path) -> Path:
    """A writable graphs tree for one serving process: a copy of the installed one, or an empty
    one to compile into. The store's tree is only read."""
    dest = private_graphs_path(run_dir)
    if installed is None:  # Inductor, imported early under this folder, may have made it already
        (dest / INDUCTOR_DIR).mkdir(parents=True, exist_ok=True)
        return dest
    copy_writable(installed.tree, dest)  # bundles unpack 0644/0755; Inductor writes beside them
    (dest / INDUCTOR_DIR).mkdir(exist_ok=True)
    return dest


def fetched_cache(installed: Installed, cache: Path) -> Path:
    """The Inductor cache folder `prebake fetch` exports for a graphs tree: `cache` (the store's
    writable folder beside the tree, deleted with it), seeded once from the tree's own inductor/
    (an aoti-package tree has none: an empty cache). The tree is read-only; a torch process started
    with the exports writes here, never into the verified tree."""
    inductor = cache / INDUCTOR_DIR
    if not inductor.is_dir():
        seeding = cache / f".seeding-{os.getpid()}"
        sealing.remove(seeding)
        if (installed.tree / INDUCTOR_DIR).is_dir():
            copy_writable(installed.tree / INDUCTOR_DIR, seeding)
        seeding.mkdir(parents=True, exist_ok=True)
        try:
            seeding.rename(inductor)  # whole or not there; a racing fetch seeded it first: its copy stays
        except OSError:
            sealing.remove(seeding)
    return inductor


def private_graphs_path(run_dir: Path) -> Path:
    """Where a serving process's private graphs tree goes (made by `private_graphs_tree`)."""
    return run_dir / "graphs"


def inductor_cache_dir(run_dir: Path) -> Path:
    """The Inductor cache folder a serving process in `run_dir` activates (known before the fetch, so
    Inductor's modules can be imported under it while the bundles download)."""
    return private_graphs_path(run_dir) / INDUCTOR_DIR


def temp_dir(run_dir: Path) -> Path:
    """The temporary folder (TMPDIR) of the processes of one run folder (a start's, a bake's build),
    with torch's machine folder linked into it (`_link_machine_folder`)."""
    folder = run_dir / "tmp"
    folder.mkdir(parents=True, exist_ok=True)
    _link_machine_folder(folder)
    return folder


def _link_machine_folder(folder: Path) -> None:
    """`folder`/torchinductor_<user> as a link to the machine's own (under the temporary folder this
    process has now): what torch keeps there outlives a process on purpose, and must not go with the
    run folder. Inductor's precompiled headers and prebake's vector-ISA probe sets (runtime.isa_probes)
    are found there by TMPDIR; without the link, every bake and every compiling start under its own
    TMPDIR compiled both again (about 15 s of a core each; docs/operations.md). Deleting the run
    folder removes the link, never what it points at (rmtree and sealing.remove do not follow links).
    A machine folder that cannot be made leaves no link: torch compiles into the run folder, as it would."""
    link = folder / torch_machine_folder_name()
    if link.is_symlink() or link.exists():
        return
    machine = Path(os.path.realpath(Path(tempfile.gettempdir()) / link.name))
    try:
        machine.mkdir(parents=True, exist_ok=True)
        link.symlink_to(machine, target_is_directory=True)
    except OSError:  # a read-only system temporary folder, or another process linked it first
        pass


def torch_machine_folder_name() -> str:
    """The name of torch's machine folder under the temporary folder (torch 2.13's
    `torch._inductor.runtime.cache_dir_utils.default_cache_dir`, without importing torch)."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)


def private_temp(run_dir: Path) -> Callable[[], None]:
    """Send this process's temporary files, and its children's, into `run_dir`'s temporary folder
    until the returned call puts the previous ones back (an engine's close). Only the serving
    process calls this, as its start begins, before torch is imported."""
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(temp_dir(run_dir))

    def restore() -> None:
        if before[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before[0]
        tempfile.tempdir = before[1]

    return restore


def engine_environment(graphs_tree: Path) -> dict[str, str]:
    """Variables the serving process compiles under: Inductor's cache inside its private graphs tree."""
    return {GRAPHS_ENV: str(graphs_tree), "TORCHINDUCTOR_CACHE_DIR": str(graphs_tree / INDUCTOR_DIR)}


def activate(env: Mapping[str, str]) -> None:
    """Apply `env` to this process. Only the serving process calls this, once, before any compile:
    Inductor caches paths derived from its cache folder after the first use."""
    if "torch._inductor.codecache" in sys.modules and os.environ.get("TORCHINDUCTOR_CACHE_DIR") != env.get(
        "TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    ):
        raise StoreError(
            "Inductor is already loaded in this process with another cache folder, so the installed graphs "
            "would be ignored; start the engine in a fresh process (prebake serve)"
        )
    os.environ.update(env)
