"""Charts the benchmarks draw for the docs (matplotlib, PNG), from the figures they measured.

    python -m benchmarks.charts startup RESULTS.json docs/images/startup.png
    python -m benchmarks.charts startup-vllm FIGURES.json docs/images/startup_vllm.png
    python -m benchmarks.charts soak SOAK.json docs/images/soak.png
    python -m benchmarks.charts scale RESULTS.json docs/images/scale.png

benchmarks/startup.py calls `startup` with --chart (RESULTS.json is what its --json writes);
benchmarks/startup_vllm.py calls `startup_vllm` with --chart (FIGURES.json is its last line);
benchmarks/soak.py calls `soak` with --chart (SOAK.json is its last line).
benchmarks/scale.py calls `scale` with --chart (RESULTS.json is what its --json writes).
Nothing here measures: a chart is only as current as the run it was drawn from, and says its date.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

# start-up steps in the order they run; compile-heavy ones stand out in warm colours
STEPS = ("probe", "keys", "lookup", "verify", "fetch", "build", "install", "load", "warm-up", "compile", "write-back")
COLOURS = {
    "build": "#e69f00",
    "compile": "#d55e00",
    "warm-up": "#0072b2",
    "load": "#56b4e9",
    "fetch": "#009e73",
    "write-back": "#cc79a7",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def startup(summary: dict, out: Path, *, title: str = "tiny-llama start-up by step") -> Path:
    """Stacked bars, seconds per start-up step: the warm starts (eager, prebaked per variant) on one
    panel, the cold starts on another, each on its own linear scale so no segment is distorted."""
    warm: list[tuple[str, dict[str, float]]] = []
    cold: list[tuple[str, dict[str, float]]] = []
    if "eager" in summary:
        warm.append(("eager", summary["eager"]["steps_mean_s"]))
    for variant, modes in summary.items():
        if variant != "eager":
            warm += [(f"prebaked ({variant})", modes["prebaked"]["steps_mean_s"])] if "prebaked" in modes else []
            cold += [(f"cold ({variant})", modes["cold"]["steps_mean_s"])] if "cold" in modes else []
    panels = [(rows, name) for rows, name in ((warm, "warm starts"), (cold, "cold starts (compiling)")) if rows]
    plt = _pyplot()
    heights = [0.5 * len(rows) + 0.9 for rows, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, sum(heights) + 0.8), gridspec_kw={"height_ratios": heights})
    axes = list(axes) if len(panels) > 1 else [axes]
    for ax, (rows, name) in zip(axes, panels):
        _stacked(ax, rows)
        ax.set_title(name, fontsize=9, loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[s]) for s in STEPS if s in COLOURS]
    fig.legend(
        handles,
        [s for s in STEPS if s in COLOURS],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.95),
        ncol=6,
        fontsize=7,
        frameon=False,
    )
    axes[-1].set_xlabel("seconds, per start-up step (other steps grey; the total is the steps' sum)")
    fig.suptitle(f"{title} ({dt.date.today().isoformat()})")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return _save(fig, out, layout=False)


def _stacked(ax, rows: list[tuple[str, dict[str, float]]]) -> None:
    for y, (_, steps) in enumerate(rows):
        left = 0.0
        for step in STEPS:
            seconds = steps.get(step, 0.0)
            if seconds > 0:
                ax.barh(y, seconds, left=left, color=COLOURS.get(step, "#999999"), edgecolor="white", linewidth=0.5)
                left += seconds
        ax.text(left, y, f" {left:.1f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.margins(x=0.12)


def startup_vllm(figures: dict, out: Path) -> Path:
    """Bars: seconds to ready of vLLM cold, restarted on its own cache, and started prebaked."""
    ready = figures["ready_mean_s"]
    order = [m for m in ("cold", "local-cold", "local-warm", "prebaked", "relocated") if m in ready]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    colours = {"cold": "#d55e00", "local-cold": "#e69f00", "local-warm": "#56b4e9", "prebaked": "#0072b2"}
    ax.bar(order, [ready[m] for m in order], color=[colours.get(m, "#999999") for m in order])
    for i, m in enumerate(order):
        ax.text(i, ready[m], f"{ready[m]:.0f} s", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds to ready")
    ax.set_title(f"vLLM (CPU) start-up: cold, its own warm cache, prebaked ({dt.date.today().isoformat()})")
    return _save(fig, out)


def soak(figures: dict, out: Path) -> Path:
    """RSS, open fds and threads of the serving process tree per minute, the warm-up shaded."""
    samples = figures["samples"]
    minutes = [s["minute"] for s in samples]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    series = (("rss_bytes", "RSS (MiB)", 1 << 20), ("fds", "open fds", 1), ("threads", "threads", 1))
    for ax, (name, label, scale) in zip(axes, series):
        ax.plot(minutes, [s[name] / scale for s in samples], marker=".", color="#0072b2")
        ax.axvspan(0, figures["warm_up_minutes"], color="#dddddd", zorder=0)
        ax.set_xlabel("minutes serving")
        ax.set_title(f"{label}: +{figures['growth_after_warm_up'][name] * 100:.1f}% after warm-up", fontsize=9)
        ax.set_ylim(bottom=0)
    fig.suptitle(
        f"soak {dt.date.today()}: {sum(figures['requests'].values())} requests, {figures['errors']} errors, "
        f"{figures['differing']} differing; {figures['side_runs']['gc']} gc runs beside it",
        fontsize=9,
    )
    return _save(fig, out)


def scale(rows: dict, out: Path) -> Path:
    """Three panels over the models (tiny to 8B): the bake's seconds and peak RSS, the seconds to
    ready of each start mode, and decode tokens/s prebaked and eager (benchmarks/scale.py's rows)."""
    models = list(rows)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    x = range(len(models))
    bake = [rows[m]["bake"] for m in models]
    axes[0].bar(x, [b["seconds"] for b in bake], color="#e69f00")
    for i, b in enumerate(bake):
        axes[0].text(i, b["seconds"], f"{b['peak_rss_bytes'] / 2**30:.1f} GiB", ha="center", va="bottom", fontsize=8)
    axes[0].set_title("bake: seconds (label: peak RSS)", fontsize=9)
    colours = {"eager": "#56b4e9", "prebaked": "#0072b2", "cold": "#d55e00"}
    for j, mode in enumerate(("eager", "prebaked", "cold")):
        ready = [rows[m]["starts"].get(mode, {}).get("ready_s", 0.0) for m in models]
        axes[1].bar([i + (j - 1) * 0.27 for i in x], ready, width=0.27, color=colours[mode], label=mode)
    axes[1].set_yscale("log")
    axes[1].set_title("seconds to ready (log scale)", fontsize=9)
    axes[1].legend(fontsize=7, frameon=False)
    for j, mode in enumerate(("eager", "prebaked")):
        speed = [rows[m]["starts"].get(mode, {}).get("decode_tokens_per_s") or 0.0 for m in models]
        axes[2].bar([i + (j - 0.5) * 0.4 for i in x], speed, width=0.4, color=colours[mode], label=mode)
    axes[2].set_yscale("log")
    axes[2].set_title("decode tokens/s, one sequence (log scale)", fontsize=9)
    axes[2].legend(fontsize=7, frameon=False)
    for ax in axes:
        ax.set_xticks(list(x), models, fontsize=8)
    fig.suptitle(f"prebake from tiny-llama to llama3-8b, bf16, 2 CPU cores ({dt.date.today().isoformat()})")
    return _save(fig, out)


def _save(fig, out: Path, *, layout: bool = True) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    if layout:
        fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) != 3 or argv[0] not in ("startup", "startup-vllm", "soak", "scale"):
        print(__doc__, file=sys.stderr)
        return 2
    data = json.loads(Path(argv[1]).read_text())
    if argv[0] == "startup":
        startup(data.get("summary", data), Path(argv[2]))
    elif argv[0] == "soak":
        soak(data, Path(argv[2]))
    elif argv[0] == "scale":
        scale(data, Path(argv[2]))
    else:
        startup_vllm(data, Path(argv[2]))
    print(f"wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
