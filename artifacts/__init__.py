"""The core of prebake: what a bundle is, where it is kept, and how a recipe becomes bundles.

    errors, fsutil, timebox, keys, layout   the foundation every part below uses
    buckets/, bundle/, ports/, store/       bucket sets; the bundle format; what the core needs from a
                                            registry (implemented in prebake.registry); the local store
    recipe/, fetch/, bake/                  recipes, kinds and keys; the fetch pipeline and trust gate;
                                            baking one kind, doit's task dicts, the fleet plan, provenance

Pure: nothing here imports torch, boto3, huggingface_hub, prebake.registry or prebake.engine, and
a PREBAKE_* setting is read only where a function says so, with the environment as a parameter.
The doit tasks and the fleet plan are pure data builders; the composition root
(prebake.engine.compose) supplies every side effect.
"""
