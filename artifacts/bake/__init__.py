"""The bake itself: recipes to targets, targets to keys, keys to built, published, fetched bundles.

recipes      one TOML file per model: what to bake (the matrix, serving limits, options)
kinds        artifact kinds, one declaration each, and the keys of one target's kinds (KindTable, TargetKeys)
bake_kind    baking one kind of one target: build its tree, pack, publish, install
fetch        the one fetch pipeline every consumer runs: lookup -> verify -> install, or a Miss
tasks        doit task dictionaries for `doit bake`
fleet_plan   the fleet plan: every target of a matrix, per kind present, missing or unbuildable
"""
