"""The bundled engine's runtime: a Llama-family model on torch, served from compiled buckets.

    model, weights, loader   the model, its Hugging Face checkpoint I/O, seeded random weights
    shapes, steps            padded step shapes and the compiled prefill/decode steps over them
    autotune, aot, build     tactic timing, Dynamo precompile, and the build child of `doit bake`
    scheduler, tokenizer     continuous batching into buckets; text <-> token ids
    server, metrics          `prebake serve`'s process (uvicorn on its own thread) and its Prometheus metrics
    api/                     the OpenAI-compatible HTTP API on FastAPI: schema, routes, streaming, guards

Everything here may import torch; nothing outside the runtime does at import time. server, api/
and metrics import it only once the engine has started, so the probes answer while torch loads.
"""
