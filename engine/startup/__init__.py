"""Consumer-side start-up: from a recipe name to an engine pointed at verified, installed bundles.

pipeline   lookup -> verify -> fetch -> install for every kind of one target, time-boxed
install    the one place that decides cache environment variables and private writable trees
bundled    the bundled engine's start-up (load, warm up from the bundle, compile on a miss)
vllm       `prebake serve|fetch --engine vllm`: vLLM started from the baked cache root
"""
