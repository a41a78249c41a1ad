"""Baking on a fleet: builder profiles, the installed `prebake bake` (doit's API), executors (local, Ray)."""
