"""Adapters: the same artifacts for engines other than the bundled one.

    vllm.py        vLLM's compile cache (VLLM_CACHE_ROOT) as the graphs artifact of recipes
                   with engine = "vllm": bake it by starting vLLM, serve vLLM from a copy of it
    vllm_serve.py  `prebake serve --engine vllm` and `prebake fetch --engine vllm`
    gaudi.py       vLLM on Gaudi: vllm-gaudi's bucket variables and the HPU recipe cache
                   (PT_HPU_RECIPE_CACHE_CONFIG)

Which variables an engine gets is decided in engine.startup.install, which calls these modules;
nothing here writes os.environ: every environment is handed to a child process.
"""

from artifacts.errors import PrebakeError


class EngineStartError(PrebakeError, RuntimeError):
    """An engine started by an adapter exited, or did not become ready in time."""
