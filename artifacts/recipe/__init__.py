"""What to bake: recipes and the kinds of artifact, and the keys of one target's kinds. It reads
recipe files; the kinds' builders run only when the bake calls them.

schema   one TOML file per model: what to bake (the matrix, serving limits, options)
kinds    artifact kinds, one declaration each, and the keys of one target's kinds (KindTable, TargetKeys)
"""
