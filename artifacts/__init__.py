"""Pure core of prebake: recipes, keys, bucket sets, bundle format and the local store."""
