"""Fleet planning and no-op fleet bakes, measured in one run.

    python -m benchmarks.fleet [--repeat 5]

plan time    `plan_fleet` of llama3-8b's 24 targets x 3 kinds, keyed from the example profiles
             (examples/profiles/fleet.toml), against folder registries holding 10, 1,000 and
             10,000 entries (half of the plan's own keys present, the rest other models'
             bundles). Planning reads only the index entries of its targets, so the ratio
             10,000 / 10 should stay near 1.
no-op bake   `prebake bake --model tiny-llama` (the installed command: DoitMain over
             bake_tasks) with every key of this host already in the registry, and the
             `prebake plan --missing-only --format github-matrix` that a CI fleet runs first:
             wall time of each process, and the bake's ratio to `prebake --version` (the
             interpreter and import floor).

The Ray executor is not part of this tree yet, so no Ray fan-out figure is printed.
Ends with one JSON line holding the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from artifacts.kinds import plan
from artifacts.planning import plan_fleet
from artifacts.recipes import load_recipe, targets
from engine.fleet.profiles import load_profiles
from engine.probe import current_host
from registry.file import FileRegistry
from tests.support.fleet import fill_registry, write_entry

REPO = Path(__file__).resolve().parents[1]
PREBAKE = Path(sys.executable).parent / "prebake"
SIZES = (10, 1_000, 10_000)


def plan_seconds(root: Path, repeat: int) -> float:
    recipe = load_recipe("llama3-8b")
    profiles = load_profiles(REPO / "examples" / "profiles" / "fleet.toml")
    wanted = targets(recipe)
    times = []
    for _ in range(repeat):
        registry = FileRegistry(root)
        started = time.perf_counter()
        fleet = plan_fleet(
            recipe,
            wanted,
            here=current_host(),
            profiles=profiles,
            published=lambda k, d: registry.lookup(k, d) is not None,
        )
        times.append(time.perf_counter() - started)
        assert len(fleet.targets) == 24
    return statistics.median(times)


def seed_plan_keys(root: Path) -> int:
    """Half of the llama3-8b targets present under the profiles' keys; returns entries written."""
    recipe = load_recipe("llama3-8b")
    profiles = {p.platform_string(): p for p in load_profiles(REPO / "examples" / "profiles" / "fleet.toml")}
    written = 0
    for target in targets(recipe)[::2]:
        for key in plan(recipe, target, profiles[target.platform].host).keys.values():
            write_entry(root, key)
            written += 1
    return written


def timed(argv: list[str], env: dict[str, str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
    return statistics.median(times)


def noop_figures(tmp: Path, repeat: int) -> dict[str, float]:
    home = tmp / "home"
    root = home / "registry"
    recipe = load_recipe("tiny-llama")
    for target in targets(recipe):
        for key in plan(recipe, target, current_host()).keys.values():
            write_entry(root, key)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}, "PREBAKE_HOME": str(home)}
    env["PREBAKE_TRUSTED_KEYS"] = ""
    floor = timed([str(PREBAKE), "--version"], env, repeat)
    bake = timed([str(PREBAKE), "bake", "--model", "tiny-llama"], env, repeat)
    matrix = [str(PREBAKE), "plan", "--model", "tiny-llama", "--missing-only", "--format", "github-matrix"]
    plan_cli = timed(matrix, env, repeat)
    empty = subprocess.run(matrix, env=env, cwd=REPO, capture_output=True, text=True).stdout
    assert json.loads(empty) == {"include": []}, empty
    return {"noop_bake_s": bake, "noop_plan_matrix_s": plan_cli, "cli_floor_s": floor}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per figure; the median is reported")
    args = parser.parse_args(argv)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="prebake-fleet-") as tmp:
        for size in SIZES:
            root = Path(tmp) / f"registry-{size}"
            own = seed_plan_keys(root)
            fill_registry(root, size - own)
            plan_seconds(root, 1)  # warm: imports, key computation caches, the page cache
            figures[f"plan_s_{size}"] = plan_seconds(root, args.repeat)
            print(
                f"plan llama3-8b (24 targets x 3 kinds) against {size:>6} entries: {figures[f'plan_s_{size}'] * 1e3:7.1f} ms"
            )
        noop = noop_figures(Path(tmp), args.repeat)
    figures.update(noop)
    figures["plan_ratio_10000_to_10"] = figures["plan_s_10000"] / figures["plan_s_10"]
    figures["noop_bake_to_cli_floor"] = noop["noop_bake_s"] / noop["cli_floor_s"]
    print(f"ratio plan time 10,000 / 10 entries: {figures['plan_ratio_10000_to_10']:.2f}")
    print(
        f"no-op `prebake bake --model tiny-llama`: {noop['noop_bake_s']:.2f} s "
        f"({figures['noop_bake_to_cli_floor']:.2f}x `prebake --version`, {noop['cli_floor_s']:.2f} s)"
    )
    print(f"no-op `prebake plan --missing-only --format github-matrix`: {noop['noop_plan_matrix_s']:.2f} s")
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
