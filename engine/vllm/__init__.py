"""vLLM, and vLLM on Gaudi, started from the same bundles: one folder for the engine.

adapter       the vLLM adapters: vLLM's own compile cache as the graphs artifact (any platform, Gaudi)
process       vLLM process control: flags, variables, start, readiness, log reading
portability   whether a baked vLLM cache root is used on the host that serves it
gaudi         vllm-gaudi's bucket variables and the HPU recipe cache
start         `prebake serve|fetch --engine vllm`: vLLM started from baked graphs
"""
