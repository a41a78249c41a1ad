"""Bucket sets: the padded shapes a server compiles once, by vllm-gaudi's rules or fitted to traffic.

    limits, sets, rules      serving limits and bucket settings; bucket sets as data; vllm-gaudi's rules
    traces, replay           request traces, and their replay through a model of the engine's batching
    traffic, threshold_fit   the traffic strategy: sets fitted to a replayed trace (exact threshold DPs)
    report                   how well a set fits some traffic: counts and the four padding figures
    artifact                 the buckets artifact: serving limits and settings to one BucketSet, and its key

Pure Python over the core's foundation (errors, fsutil): no bundle, store or bake module is imported.
"""
