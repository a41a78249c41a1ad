"""The core of prebake: what a bundle is, where it is kept, and how a recipe becomes bundles.

    errors, fsutil, timebox, keys, layout   the foundation every part below uses
    buckets/   bucket sets: vllm-gaudi's rules, the traffic fit, padding reports
    bundle/    the bundle format: manifest, pack, unpack
    ports/     what the core needs from a registry (declared here, implemented in prebake.registry)
    store/     the local store, its admin view and its stats
    recipe/    recipes, kinds and the keys of a target
    fetch/     the fetch pipeline, its outcomes, trust gating, the nearest miss
    bake/      baking one kind, doit's task dicts, the fleet plan, provenance

Pure: nothing here imports torch, boto3, huggingface_hub, prebake.registry or prebake.engine, and
nothing reads a PREBAKE_* setting except where a function says so in its docstring (the store's
home and bound, the key salt, the recipe folders: each read at the call that needs it, with the
environment as a parameter). The doit tasks and the fleet plan live here as pure data builders:
they hand back task dictionaries and plans, and the composition root (prebake.engine.compose)
supplies every side effect.
"""
