"""The bake itself: a target's kinds built, published and installed (recipes and kinds are in
prebake.artifacts.recipe, fetching in prebake.artifacts.fetch).

bake_kind    baking one kind of one target: build its tree, pack, publish, install
tasks        doit task dictionaries for `doit bake`
fleet_plan   the fleet plan: every target of a matrix, per kind present, missing or unbuildable
provenance   the bake's in-toto Statement (SLSA provenance v1) and its reader
"""
