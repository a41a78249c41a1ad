"""The snapshot modes of benchmarks/startup.py: the recipe's process snapshot baked by `doit bake`
into the prebaked starts' registry, then restored by `prebake serve --snapshot require`, from an
empty store each time (`snapshot`: its bundle fetched, verified and unpacked like the others), and
from one store that holds it already (`snapshot-stored`: a node whose init step ran `prebake fetch`,
or a store on an image volume; looked up and verified, not fetched; filled by an untimed first start).

    bake(...)      doit bake of the recipe with [snapshot] bake = true: only the snapshot kind is new
    figures(...)   restore / eager time to ready, first request after a restore / a prebaked start's,
                   whether the greedy tokens equal the prebaked start's, the image's bytes
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from prebake.artifacts.store.settings import default_home

SNAPSHOT_TABLE = "\n[snapshot]\nbake = true\n"
STORED = "snapshot-stored"
MODES = ("snapshot", STORED)


def with_snapshot(toml: str) -> str:
    return toml if "[snapshot]" in toml else toml.rstrip() + "\n" + SNAPSHOT_TABLE


def criu_env() -> dict[str, str]:
    """PREBAKE_CRIU as this process has it (the starts' environments drop PREBAKE_ variables)."""
    return {"PREBAKE_CRIU": os.environ["PREBAKE_CRIU"]} if os.environ.get("PREBAKE_CRIU") else {}


def bake(bin_dir: Path, repo: Path, recipes: Path, registry: Path, model: str, precision: str, work: Path) -> float:
    """Bake the snapshot into `registry` (the other kinds are there already); its seconds. doit decides:
    a registry that holds the snapshot of the current key (a kept cache, as the peers benchmark's) bakes
    nothing, one holding only older keys' (the graphs or the image format moved since) bakes it again."""
    home = work / "snapshot-bake"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}
    env.update(PREBAKE_HOME=str(home / "home"), PREBAKE_RECIPES=str(recipes), PREBAKE_TRUSTED_KEYS="", **criu_env())
    print(f"baking {model} {precision}'s snapshot into {registry} ...", flush=True)
    started = time.perf_counter()
    (home / "home").mkdir(parents=True, exist_ok=True)
    if not (home / "home" / "models").exists():  # the weights every start maps (a GGUF dequantized once)
        (home / "home" / "models").symlink_to(default_home() / "models")
    done = subprocess.run(
        [str(bin_dir / "doit"), "run", "-f", str(repo / "dodo.py"), "--db-file", str(home / "doit.db"), "bake"]
        + [f"model={model}", f"precision={precision}", f"registry={registry}"],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not any(registry.glob("index/snapshot/*.json")):
        sys.exit(f"the snapshot bake failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    seconds = time.perf_counter() - started
    print(f"  snapshot baked in {seconds:.1f} s", flush=True)
    return seconds


def image_bytes(registry: Path) -> int | None:
    """The size of the snapshot bundle written last into `registry` (the current key's, after `bake`)."""
    for entry in sorted(registry.glob("index/snapshot/*.json"), key=lambda path: path.stat().st_mtime, reverse=True):
        manifest = json.loads(entry.read_text())
        return int(manifest["blob"]["size"])
    return None


def figures(summary: dict, variant: str, tokens: dict[str, list[list[int]]], registry: Path) -> dict:
    snapshot, eager, prebaked = summary["snapshot"], summary["eager"], summary[variant]["prebaked"]
    stored = summary[STORED]
    return {
        "snapshot_over_eager": round(snapshot["ready_s"]["mean"] / eager["ready_s"]["mean"], 3),
        "snapshot_stored_over_eager": round(stored["ready_s"]["mean"] / eager["ready_s"]["mean"], 3),
        "snapshot_stored_over_eager_p50": round(stored["ready_s"]["p50"] / eager["ready_s"]["p50"], 3),
        "snapshot_over_prebaked": round(snapshot["ready_s"]["mean"] / prebaked["ready_s"]["mean"], 3),
        "snapshot_first_request_over_prebaked": round(
            snapshot["first_request_s"]["mean"] / prebaked["first_request_s"]["mean"], 3
        ),
        "snapshot_tokens_equal_prebaked": bool(tokens["snapshot"]) and tokens["snapshot"] == tokens["prebaked"],
        "snapshot_bundle_bytes": image_bytes(registry),
    }


def render(figures: dict) -> str:
    return (
        f"snapshot restore / eager: {figures['snapshot_over_eager']:.3f}x time to ready on means "
        f"({figures['snapshot_over_prebaked']:.3f}x the prebaked start's) into an empty store, "
        f"{figures['snapshot_stored_over_eager']:.3f}x from a store that holds it "
        f"({figures['snapshot_stored_over_eager_p50']:.3f}x on medians); first request after a restore "
        f"{figures['snapshot_first_request_over_prebaked']:.2f}x a prebaked start's; greedy tokens equal the "
        f"prebaked start's: {figures['snapshot_tokens_equal_prebaked']}; snapshot bundle "
        f"{(figures['snapshot_bundle_bytes'] or 0) / 1e6:.1f} MB"
    )
