"""The bundled engine's runtime: a Llama-family model on torch, served from compiled buckets.

    model, weights, loader   the model, its Hugging Face checkpoint I/O, seeded random weights
    shapes, steps            padded step shapes and the compiled prefill/decode steps over them
    autotune, aot, build     tactic timing, Dynamo precompile, and the build child of `doit bake`
    scheduler, tokenizer     continuous batching into buckets; text <-> token ids
    server, metrics          the OpenAI-compatible HTTP front end and its Prometheus metrics

Everything here may import torch; nothing outside the runtime does at import time.
"""
