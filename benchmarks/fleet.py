"""Fleet planning and no-op fleet bakes, measured in one run.

    python -m benchmarks.fleet [--repeat 5]

plan time    `plan_fleet` of llama3-8b's 25 targets x 3 kinds, keyed from the example profiles
             (examples/profiles/fleet.toml), against folder registries of 10, 1,000 and 10,000
             entries (half the plan's own keys present): 10,000 / 10 should stay near 1.
no-op bake   `prebake bake --model tiny-llama` with every key of this host already in the
             registry, and the `prebake plan --missing-only --format github-matrix` a CI fleet
             runs first: each process's wall time, the bake's over `prebake --version`'s.
ray fan-out  a local Ray cluster (a head and one node advertising {"prebake-cpu": 24}): 24 tasks
             routed by that resource, the median of (task start - submit), and the no-op
             `prebake bake --executor ray`. Skipped with --no-ray or without Ray.

Ends with one JSON line holding the figures (docs/fleet.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prebake.artifacts.bake.fleet_plan import plan_fleet
from prebake.artifacts.recipe.kinds import target_keys
from prebake.artifacts.recipe.schema import load_recipe, targets
from prebake.engine.adapters import kinds_for
from prebake.engine.common.probe import current_host
from prebake.engine.fleet.profiles import load_profiles
from prebake.registry.backends.file import FileRegistry
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
            kinds_for=kinds_for,
        )
        times.append(time.perf_counter() - started)
        assert len(fleet.targets) == 25
    return statistics.median(times)


def seed_plan_keys(root: Path) -> int:
    """Half of the llama3-8b targets present under the profiles' keys; returns entries written."""
    recipe = load_recipe("llama3-8b")
    profiles = {p.platform_string(): p for p in load_profiles(REPO / "examples" / "profiles" / "fleet.toml")}
    written = 0
    for target in [t for t in targets(recipe) if t.platform in profiles][::2]:
        for key in target_keys(recipe, target, profiles[target.platform].host, kinds_for(recipe, target)).keys.values():
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
        for key in target_keys(recipe, target, current_host(), kinds_for(recipe, target)).keys.values():
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


def ray_figures(tmp: Path, repeat: int) -> dict[str, float]:
    from tests.support.ray_cluster import ray_cluster

    home = tmp / "home"  # filled by noop_figures: every tiny-llama key of this host is present
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")}, "PREBAKE_HOME": str(home)}
    env.update(PREBAKE_TRUSTED_KEYS="", PYTHONPATH=str(REPO))
    with ray_cluster(env) as cluster:
        cluster.add_node({"prebake-cpu": 24}, num_cpus=2)
        script = (
            "import json, statistics, time, ray\n"
            f"ray.init(address={cluster.address!r}, logging_level='ERROR')\n"
            "start = ray.remote(lambda: time.time())\n"
            "ray.get(start.options(num_cpus=0, resources={'prebake-cpu': 1}).remote())  # warm a worker\n"
            "sent = []; refs = []\n"
            "for _ in range(24):\n"
            "    sent.append(time.time()); refs.append(start.options(num_cpus=0, resources={'prebake-cpu': 1}).remote())\n"
            "print(json.dumps(statistics.median(b - a for a, b in zip(sent, ray.get(refs)))))\n"
        )
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            sys.exit(f"the Ray fan-out probe failed:\n{out.stderr[-3000:]}")
        fan_out = float(out.stdout.strip().splitlines()[-1])
        noop = [str(PREBAKE), "bake", "--model", "tiny-llama", "--executor", "ray", "--ray-address", cluster.address]
        noop_s = timed(noop, env, repeat)
    return {"ray_fanout_s_per_target": fan_out, "noop_ray_bake_s": noop_s}


def main(argv: list[str] | None = None) -> int:
    from prebake.engine.cli.common import positive_int  # 1 or more, or a clear usage error

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeat", type=positive_int, default=5, help="timed rounds per figure; the median is reported"
    )
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray cluster figures")
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
                f"plan llama3-8b (25 targets x 3 kinds) against {size:>6} entries: {figures[f'plan_s_{size}'] * 1e3:7.1f} ms"
            )
        noop = noop_figures(Path(tmp), args.repeat)
        if not args.no_ray and importlib.util.find_spec("ray") is not None:
            figures.update(ray_figures(Path(tmp), args.repeat))
    figures.update(noop)
    figures["plan_ratio_10000_to_10"] = figures["plan_s_10000"] / figures["plan_s_10"]
    figures["noop_bake_to_cli_floor"] = noop["noop_bake_s"] / noop["cli_floor_s"]
    print(f"ratio plan time 10,000 / 10 entries: {figures['plan_ratio_10000_to_10']:.2f}")
    print(
        f"no-op `prebake bake --model tiny-llama`: {noop['noop_bake_s']:.2f} s "
        f"({figures['noop_bake_to_cli_floor']:.2f}x `prebake --version`, {noop['cli_floor_s']:.2f} s)"
    )
    print(f"no-op `prebake plan --missing-only --format github-matrix`: {noop['noop_plan_matrix_s']:.2f} s")
    if "ray_fanout_s_per_target" in figures:
        print(f"Ray fan-out, submit to task start, median of 24: {figures['ray_fanout_s_per_target'] * 1e3:.1f} ms")
        print(f"no-op `prebake bake --executor ray` (submits nothing): {figures['noop_ray_bake_s']:.2f} s")
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
