"""Everything that runs: the host probe, the composition root, the engines, the fleet executors, the CLI.

    common/      the probe, the environment table, logging, the EngineAdapter interface
    bundled/     prebake's own engine (adapter, cache layout, build child, start-up, serve, runtime, API)
    vllm/        vLLM and vLLM on Gaudi (adapter, process control, portability, start-up)
    adapters.py, compose.py   the engine adapters, one line each; the composition root
    fleet/, cli/              baking on a fleet (profiles, local and Ray executors); the `prebake` command

tests/repo/test_layering.py states the order: common, then each engine, then the composition root,
then fleet, then the CLI; engines never import each other or anything above them.
"""
