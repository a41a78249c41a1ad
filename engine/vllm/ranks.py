"""vLLM's tensor-parallel ranks: the cores each rank's OpenMP threads take on CPU, what each rank's
log says it compiled or loaded, and whether a baked cache root holds every rank's compile cache:

    torch_compile_cache/<hash10>/rank_<r>_<dp>/                   one folder per rank (vLLM's backend)
    torch_compile_cache/torch_aot_compile/<hash>/rank_<r>_<dp>/   one AOT artifact per rank
    inductor_cache/fxgraph/<k[1:3]>/<k>/, aotautograd/<k>/         shared by the ranks (CPU, AOT off):
                                                                  vllm.json's "ranks" names each rank's keys

A log line is a rank's by vLLM's worker prefix "(Worker_TP<r> pid=...)" or torch's "[rank<r>]:"
(torch/_logging/_internal.py prefixes every line once torch.distributed is up). Reads trees and
logs; `thread_binding` only returns variables.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.errors import RecipeError
from prebake.artifacts.recipe.schema import Target, parse_platform
from prebake.engine.vllm.process import INDUCTOR_DIR, CompileReport, compile_report

BIND = "VLLM_CPU_OMP_THREADS_BIND"  # vllm/utils/ompmultiprocessing.py: one core list per rank, "|" between
_PROCESS = re.compile(r"^\((?P<name>[A-Za-z][\w-]*) pid=(?P<pid>\d+)\)")
_TORCH_RANK = re.compile(r"^\[rank(?P<rank>\d+)\]:")
_TP = re.compile(r"_TP(\d+)")
_RANK_DIR = re.compile(r"^rank_(\d+)_(\d+)$")
_KEY = {
    "fxgraph": re.compile(r"fx graph cache (?:hit|miss) for key (\S+)"),
    "aotautograd": re.compile(r"AOTAutograd cache (?:hit|miss) for key (\S+)"),
}


@dataclass(frozen=True)
class RankGap:
    """One rank whose compile cache a cache root lacks, and what is missing."""

    rank: int
    missing: str  # the folder or cache entry, relative to the cache root

    def describe(self) -> str:
        return f"rank {self.rank}'s compile cache is not in the bundle ({self.missing})"


def thread_binding(target: Target, env: Mapping[str, str], cpus: Sequence[int] | None = None) -> dict[str, str]:
    """VLLM_CPU_OMP_THREADS_BIND for a CPU target at tp > 1: this process's allowed cores split
    evenly, rank by rank ("0|1" on two cores). vLLM's "auto" binds one NUMA node per rank and
    refuses a host with fewer nodes than ranks; a value already set is the operator's and is kept."""
    if parse_platform(target.platform)[0] != "cpu" or target.tp == 1 or BIND in env:
        return {}
    allowed = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if len(allowed) < target.tp:
        raise RecipeError(
            f"{target.name} runs {target.tp} vLLM ranks, one core each at least, but this process may use "
            f"{len(allowed)} core(s) ({allowed}); serve a smaller tp, or set {BIND} yourself (e.g. '0|0')"
        )
    per = len(allowed) // target.tp
    return {BIND: "|".join(_span(allowed[r * per : (r + 1) * per]) for r in range(target.tp))}


def _span(cores: Sequence[int]) -> str:
    """Consecutive cores as a range ("0-3"), others as a list ("0,2,5"): vLLM's parse_id_list reads both."""
    if len(cores) > 1 and cores[-1] - cores[0] == len(cores) - 1:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def rank_lines(log_text: str) -> dict[int, list[str]]:
    """The log's lines by the rank that printed them, lines of no rank (API server, engine core)
    left out. A worker names its rank ("Worker_TP1") only once its group is up, so its earlier
    lines ("Worker", "VllmWorker-1") are given the rank its pid later names; at tp=1 no worker
    names a TP rank and every worker line is rank 0's."""
    lines = log_text.splitlines()
    named = {
        m.group("pid"): int(tp.group(1))
        for m in map(_PROCESS.match, lines)
        if m and (tp := _TP.search(m.group("name")))
    }
    out: dict[int, list[str]] = {}
    for line in lines:
        rank = _rank(line, named)
        if rank is not None:
            out.setdefault(rank, []).append(line)
    return out


def _rank(line: str, named: Mapping[str, int]) -> int | None:
    torch_rank = _TORCH_RANK.match(line)
    if torch_rank:
        return int(torch_rank.group("rank"))
    process = _PROCESS.match(line)
    if process is None:
        return None
    if process.group("pid") in named:
        return named[process.group("pid")]
    return 0 if not named and process.group("name").startswith(("Worker", "VllmWorker")) else None


def rank_reports(log_text: str) -> dict[int, CompileReport]:
    """What each rank's own lines say about its compile cache (process.compile_report per rank)."""
    return {rank: compile_report("\n".join(lines)) for rank, lines in sorted(rank_lines(log_text).items())}


def rank_keys(log_text: str) -> dict[str, dict[str, list[str]]]:
    """The Inductor FX-graph and AOTAutograd cache keys each rank looked up, hit or missed: what
    vllm.json records as "ranks", rank (a string, as JSON keys are) -> cache -> keys."""
    out: dict[str, dict[str, list[str]]] = {}
    for rank, lines in sorted(rank_lines(log_text).items()):
        text = "\n".join(lines)
        keys = {cache: sorted(set(pattern.findall(text))) for cache, pattern in _KEY.items()}
        if any(keys.values()):
            out[str(rank)] = keys
    return out


def gaps(cache_root: Path, tp: int, recorded: Mapping[str, Mapping[str, Sequence[str]]] | None) -> tuple[RankGap, ...]:
    """Every rank below `tp` whose compile cache `cache_root` lacks: a rank_<r>_<dp> folder absent
    beside another rank's, or (CPU) a cache key the bake recorded for it absent from inductor_cache/.
    `recorded` is vllm.json's "ranks" (None or empty: a bundle baked before it was recorded, or whose
    ranks keep their own folders)."""
    found = list(_folder_gaps(cache_root, tp))
    if recorded and tp > 1:  # no rank recorded a key: no shared inductor_cache/ to check
        found += _key_gaps(cache_root, tp, recorded)
    return tuple(sorted(set(found), key=lambda g: (g.rank, g.missing)))


def _folder_gaps(cache_root: Path, tp: int) -> list[RankGap]:
    compile_cache = cache_root / "torch_compile_cache"
    folders = [p for p in _subdirs(compile_cache) if p.name != "torch_aot_compile"]
    folders += _subdirs(compile_cache / "torch_aot_compile")
    found = []
    for folder in folders:
        ranks = {int(m.group(1)): int(m.group(2)) for p in _subdirs(folder) if (m := _RANK_DIR.match(p.name))}
        if not ranks:
            continue
        dp = min(ranks.values())
        for rank in range(tp):
            if rank not in ranks:
                found.append(RankGap(rank, f"{folder.relative_to(cache_root).as_posix()}/rank_{rank}_{dp}/"))
    return found


def _key_gaps(cache_root: Path, tp: int, recorded: Mapping[str, Mapping[str, Sequence[str]]]) -> list[RankGap]:
    inductor = cache_root / INDUCTOR_DIR
    found = []
    for rank in range(tp):
        keys = recorded.get(str(rank))
        if not keys:
            found.append(RankGap(rank, f"the bake recorded no {INDUCTOR_DIR}/ key for rank {rank}"))
            continue
        for key in keys.get("fxgraph", ()):
            if not (inductor / "fxgraph" / key[1:3] / key).exists():
                found.append(RankGap(rank, f"{INDUCTOR_DIR}/fxgraph/{key[1:3]}/{key}"))
        for key in keys.get("aotautograd", ()):
            if not (inductor / "aotautograd" / key).exists():
                found.append(RankGap(rank, f"{INDUCTOR_DIR}/aotautograd/{key}"))
    return found


def bake_problem(
    log_text: str, cache_root: Path, tp: int, recorded: Mapping[str, Mapping[str, Sequence[str]]]
) -> str | None:
    """Why a bake at `tp` ranks left a cache root that not every rank can start from, or None: a rank
    whose log shows no compile and no cache load, or a rank's cache missing from the root."""
    if tp == 1:
        return None
    reports = rank_reports(log_text)
    silent = [r for r in range(tp) if r not in reports or not (reports[r].compiled or reports[r].loaded)]
    if silent:
        return (
            f"the log of rank(s) {silent} shows no compile and no cache load (vLLM's worker lines "
            f"'(Worker_TP<r> pid=...)' and torch's '[rank<r>]:' lines); keep TORCH_LOGS as prebake sets it"
        )
    found = gaps(cache_root, tp, recorded)
    return describe_gaps(found) if found else None


def _subdirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def describe_gaps(found: Sequence[RankGap]) -> str:
    """One clause per rank that misses something, naming its first missing folder or entry."""
    first = {g.rank: g for g in reversed(found)}
    return "; ".join(first[rank].describe() for rank in sorted(first))
