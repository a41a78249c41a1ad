"""The bundled engine's runtime: a Llama-family model on torch, served from compiled buckets.

    model, weights, loader   the model, its Hugging Face checkpoint I/O, seeded random weights
    shapes, steps            padded step shapes and the compiled prefill/decode steps over them
    autotune, precompile     tactic timing; Dynamo's precompile of one function per step shape
    scheduler, tokenizer     continuous batching into buckets; text <-> token ids
    metrics                  the engine's Prometheus metrics

Everything here may import torch; nothing outside the bundled engine does at import time. The
build child, `prebake serve`'s process and the HTTP API sit above it, and import it only once the
engine has started, so the probes answer while torch loads.
"""
