"""A run directory before its run began: what a fit writes there before run.json (its lock,
the partitions, its code), and who may clear it.

A fit that fails before run.json exists has nothing to resume, so it removes what it wrote
(:func:`undo`); one killed meanwhile leaves it behind, and the next fit given that
directory clears it (:func:`clear`), unless a live fit still holds its lock.
"""
from __future__ import annotations

import os

from . import _files as files
from ._lock import StoreInUseError, held_locally

HALF_MADE = {".lock", "data", "build.pkl", "build.pkl.sig"}


def half_made(path: str) -> list[str] | None:
    """What a fit left in ``path`` that stopped before its run began, or None."""
    left = files.listdir(path)
    if "://" not in path and any(os.path.islink(os.path.join(path, name)) for name in left):
        return None           # not what a fit writes: never followed, never removed
    return left if left and set(left) <= HALF_MADE else None


def writing_now(path: str) -> bool:
    """Whether a live fit holds the half-made local store ``path`` (it writes its partitions)."""
    return "://" not in path and held_locally(files.join(path, ".lock"))


def clear(path: str) -> bool:
    """Remove what a stopped fit left in the local store ``path``; False where it holds
    anything else (or is remote, where a lease, not a lock, says who is there)."""
    left = half_made(path)
    if left is None or "://" in path:
        return False
    if writing_now(path):
        raise StoreInUseError(f"store {path!r} is in use: a fit is writing its partitions there (no run.json "
                              f"yet); wait for its run to begin, or choose another store")
    for name in left:
        files.remove_tree(files.join(path, name))
    return True


def undo(path: str, made: bool) -> None:
    """Remove what a fit that failed before its run began wrote in ``path``: the directory if
    it made it, else its contents. A directory with run.json holds a run: it stays."""
    if files.exists(files.join(path, "run.json")):
        return
    if made:
        files.remove_tree(path)
        return
    for name in files.listdir(path):
        files.remove_tree(files.join(path, name))
