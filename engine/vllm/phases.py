"""A vLLM start by phase, read from its own log (vLLM 0.32's messages; vLLM times each phase
itself, nothing here times anything): model-load ("Model loading took ..." or, on CPU,
"Initializing model took" plus "Loading weights took"), dynamo ("Dynamo bytecode transform
time"), inductor (compiled or directly loaded graphs, summed over the compile ranges),
torch-compile ("torch.compile took ... in total"), warm-up ("Initial profiling/warmup run took"),
engine-init ("init engine (profile, create kv cache, warmup model) took"); derived:
kv-cache+profile (engine-init less warm-up) and imports+rest (time to ready less model-load and
engine-init). A phase vLLM did not log (an eager start has no Dynamo) is absent, not zero;
docs/vllm.md ("Measured here") reads them.
"""

from __future__ import annotations

import re

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_SINGLE = {
    "model-load": re.compile(rf"Model loading took .*? and {_NUMBER} seconds"),
    "torch-compile": re.compile(rf"torch\.compile took {_NUMBER} s in total"),
    "warm-up": re.compile(rf"Initial profiling/warmup run took {_NUMBER} s"),
    "engine-init": re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUMBER} s"),
}
_INIT_MODEL = re.compile(rf"Initializing model took {_NUMBER} seconds")
_LOAD_WEIGHTS = re.compile(rf"Loading weights took {_NUMBER} seconds")
_SUMMED = {
    "dynamo": re.compile(rf"Dynamo bytecode transform time: {_NUMBER} s"),
    "inductor": re.compile(
        rf"(?:Compiling a graph for compile range .*? takes {_NUMBER} s"
        rf"|Directly load the compiled graph\(s\) for compile range .*? took {_NUMBER} s)"
    ),
}
ORDER = (
    "imports+rest",
    "model-load",
    "dynamo",
    "inductor",
    "torch-compile",
    "warm-up",
    "kv-cache+profile",
    "engine-init",
)


def phases(log_text: str, ready_s: float | None = None) -> dict[str, float]:
    """Seconds of each phase vLLM logged in one start (the last value where a phase repeats)."""
    out: dict[str, float] = {}
    for name, pattern in _SINGLE.items():
        found = pattern.findall(log_text)
        if found:
            out[name] = float(found[-1])
    if "model-load" not in out:  # vLLM's CPU model runner logs the two halves of the load
        halves = [_INIT_MODEL.findall(log_text), _LOAD_WEIGHTS.findall(log_text)]
        if any(halves):
            out["model-load"] = sum(float(h[-1]) for h in halves if h)
    for name, pattern in _SUMMED.items():
        total, seen = 0.0, False
        for match in pattern.finditer(log_text):
            total += float(next(g for g in match.groups() if g is not None))
            seen = True
        if seen:
            out[name] = total
    if "engine-init" in out and "warm-up" in out:
        out["kv-cache+profile"] = max(0.0, out["engine-init"] - out["warm-up"])
    if ready_s is not None and "engine-init" in out:
        out["imports+rest"] = max(0.0, ready_s - out["engine-init"] - out.get("model-load", 0.0))
    return {name: round(out[name], 3) for name in ORDER if name in out}


def describe(by_phase: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in by_phase.items()) or "no phase logged"
