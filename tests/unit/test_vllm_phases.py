"""A vLLM start by phase, read from vLLM 0.32's own log lines (prebake.engine.vllm.phases)."""

from __future__ import annotations

from prebake.engine.vllm.phases import describe, phases

# The lines as vLLM 0.32 prints them on CPU (prefixes as in a real log; values made up)
COLD = """\
(EngineCore pid=1) INFO 12-01 10:00:01 [gpu_model_runner.py:5150] Model loading took 0.01 GiB memory and 0.412000 seconds
(EngineCore pid=1) INFO 12-01 10:00:05 [backends.py:1167] Dynamo bytecode transform time: 3.21 s
(EngineCore pid=1) INFO 12-01 10:00:25 [backends.py:399] Compiling a graph for compile range (1, 128) takes 15.50 s
(EngineCore pid=1) INFO 12-01 10:00:30 [backends.py:399] Compiling a graph for compile range (129, 256) takes 4.50 s
(EngineCore pid=1) INFO 12-01 10:00:30 [monitor.py:20] torch.compile took 24.00 s in total
(EngineCore pid=1) INFO 12-01 10:00:31 [monitor.py:92] Initial profiling/warmup run took 25.52 s
(EngineCore pid=1) INFO 12-01 10:00:31 [core.py:396] init engine (profile, create kv cache, warmup model) took 26.20 s (compilation: 24.00 s)
"""
WARM = """\
INFO 12-01 10:00:01 [gpu_model_runner.py:5150] Model loading took 0.01 GiB memory and 0.400000 seconds
INFO 12-01 10:00:05 [backends.py:1167] Dynamo bytecode transform time: 3.00 s
INFO 12-01 10:00:05 [backends.py:296] Directly load the compiled graph(s) for compile range (1, 128) from the cache, took 0.210 s
INFO 12-01 10:00:06 [monitor.py:20] torch.compile took 3.40 s in total
INFO 12-01 10:00:06 [monitor.py:92] Initial profiling/warmup run took 4.00 s
INFO 12-01 10:00:06 [core.py:403] init engine (profile, create kv cache, warmup model) took 4.50 s
"""
EAGER = """\
(Worker pid=2) INFO 12-01 10:16:37 [base_loader.py:82] Initializing model took 0.194536 seconds
(Worker pid=2) INFO 12-01 10:16:37 [default_loader.py:501] Loading weights took 0.03 seconds
(EngineCore pid=1) INFO 12-01 10:16:39 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.30 s
"""


def test_a_cold_start_splits_into_vllms_phases_with_the_graphs_summed():
    got = phases(COLD, ready_s=40.0)
    assert got == {
        "imports+rest": 13.388,
        "model-load": 0.412,
        "dynamo": 3.21,
        "inductor": 20.0,
        "torch-compile": 24.0,
        "warm-up": 25.52,
        "kv-cache+profile": 0.68,
        "engine-init": 26.2,
    }
    assert list(got) == list(dict.fromkeys(got))  # in start-up order, each once


def test_a_warm_start_counts_its_cache_loads_as_inductor():
    got = phases(WARM, ready_s=20.0)
    assert got["inductor"] == 0.21 and got["dynamo"] == 3.0 and got["imports+rest"] == 15.1


def test_an_eager_start_has_no_compile_phase_and_nothing_is_invented():
    got = phases(EAGER, ready_s=10.0)
    assert set(got) == {"imports+rest", "model-load", "engine-init"}
    assert got["model-load"] == 0.225  # vLLM's CPU runner logs the load in two halves
    assert "dynamo" not in describe(got) and "engine-init 0.3 s" in describe(got)
    assert phases("no vLLM here") == {} and describe({}) == "no phase logged"
