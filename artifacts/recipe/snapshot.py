"""A recipe's [snapshot] table: whether its bake also dumps a warm serving process (docs/snapshots.md)."""

from __future__ import annotations

from prebake.artifacts.frozen import Frozen


class SnapshotSpec(Frozen):
    """[snapshot]: bake a process snapshot of the warm engine, restored before serving."""

    bake: bool = False
