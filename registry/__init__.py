"""Where bundles live: one small protocol and one small module per backend."""
