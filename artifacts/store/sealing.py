"""Installed trees are read-only to the engines that read them, as containerd's layers are.

`seal` takes every write bit off a tree once it is installed, so a process pointed at it (an
Inductor cache folder, say) cannot add or change a file of a verified, content-addressed tree; an
engine that needs to write gets a private copy (fsutil.copy_writable) or the tree's writable cache
(StorePaths.cache). The store opens a tree again only to delete it: `open_top` before the rename
that takes it out of trees/ (moving a folder to another parent rewrites its `..`), `remove` for a
tree or folder on its way out. Trees installed by earlier releases stay as they were unpacked.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def seal(tree: Path) -> None:
    """Every file and folder of `tree` read-only (links as they are), the deepest first."""
    for folder, _, files in os.walk(tree, topdown=False):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.lstat(path).st_mode & ~_WRITE)
        os.chmod(folder, os.stat(folder).st_mode & ~_WRITE)


def open_top(tree: Path) -> None:
    """Let the owner rename `tree` to another folder (its own folder writable again)."""
    if tree.is_dir() and not tree.is_symlink():
        os.chmod(tree, os.stat(tree).st_mode | stat.S_IWUSR)


def remove(path: Path) -> None:
    """Delete `path` whole, a sealed tree too: its folders writable again first (removing a file
    needs its folder's write bit, not its own). Errors are ignored, as rmtree's are here."""
    if path.is_dir() and not path.is_symlink():
        try:
            for folder, _, _ in os.walk(path):  # top-down: a folder is opened before it is listed
                os.chmod(folder, os.stat(folder).st_mode | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRUSR)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)
