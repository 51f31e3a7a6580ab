"""A worker's local copy of its partitions, when the store is remote.

Reading a partition from ``hdfs://`` or ``s3://`` every epoch would move the data over the
network once per epoch and trial; the original Cerebro cached each worker's partitions on its
local disk instead. Here a worker copies each partition it holds (or takes over from a lost
worker) into its cache directory once per run and reads it from there.

A cache directory may be shared (a node's scratch space), so a worker writes there only under
a directory that no other user can swap things into: one the user (or root) owns, writable by
others only with the sticky bit (as ``/tmp``); another is refused, naming it
(:func:`check_cache_dir`). The copies go into a private (0700) directory of the worker's,
each file created anew (``O_EXCL``) without following a link (``O_NOFOLLOW``).
"""
from __future__ import annotations

import os
import shutil
import stat

from ..store import _files as files
from ..store._scratch import remove_scratch, scratch_directory
from ._partitions import SPLITS, partition_file


class LocalCache:
    """Copies of a remote ``data_dir``'s partitions under ``cache_dir`` (default: a temporary
    directory), removed by :meth:`close`; a local ``data_dir`` is read in place unless a
    ``cache_dir`` is given (e.g. a store on a network mount)."""

    def __init__(self, data_dir: str, cache_dir: str | None, worker: int) -> None:
        self.data_dir = data_dir
        self.active = "://" in data_dir or cache_dir is not None
        self.bytes_copied = 0
        self._root: str | None = None
        self._cache_dir, self._worker = cache_dir, worker

    def local_dir(self, partitions: list[int]) -> str:
        """A directory with the layout of ``data_dir`` holding at least ``partitions``."""
        if not self.active:
            return self.data_dir
        if self._root is None:
            under = None
            if self._cache_dir is not None:
                os.makedirs(self._cache_dir, exist_ok=True)
                # The path checked, never the name again: a link above it that another user
                # owns could point elsewhere by the time the copies' directory is made.
                under = check_cache_dir(self._cache_dir)
            self._root = scratch_directory("cerebro-worker", under, tag=f"{self._worker}-")
        for name in ["meta.json"] + [os.path.relpath(partition_file("", split, p), "")
                                     for split in SPLITS for p in partitions]:
            target = os.path.join(self._root, name)
            if not os.path.lexists(target):
                self.bytes_copied += _copy(files.join(self.data_dir, *name.split("/")), target)
        return self._root

    @property
    def root(self) -> str | None:
        """The directory the copies are in, once one was made."""
        return self._root

    def close(self) -> None:
        if self._root is not None:
            remove_scratch(self._root)
            self._root = None


def check_cache_dir(path: str) -> str:
    """``path``'s real path, checked: raise unless it is a directory no other user can swap
    entries in, nor swap it or a directory above it: not a link, and it and every directory
    above it owned by this user or root, writable by others only with the sticky bit."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise NotADirectoryError(f"cache_dir {path!r} is {what}; give a directory of yours (its real path)")
    real = directory = os.path.realpath(path)
    while True:
        problem = _swappable(os.lstat(directory))
        if problem is not None:
            which = "" if directory == real else f"under {directory!r}, which is "
            raise PermissionError(f"cache_dir {path!r} is {which}{problem}: they could swap what Cerebro writes "
                                  f"there; give a directory only you can write, or set its sticky bit (chmod +t), as "
                                  f"/tmp has")
        if directory == os.path.dirname(directory):
            return real
        directory = os.path.dirname(directory)


def _swappable(info: os.stat_result) -> str | None:
    """Why another user could rename or replace entries of the directory ``info`` is of, or None."""
    if info.st_uid not in (os.getuid(), 0):
        return f"owned by another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        return f"writable by other users without the sticky bit (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _copy(source: str, target: str) -> int:
    """Copy ``source`` (any store) to the local ``target`` atomically; the bytes copied. The
    temporary file is new and no link (``O_EXCL | O_NOFOLLOW``): nothing placed there first
    is written through."""
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    made = os.open(target + ".part", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with files.open_file(source) as src, os.fdopen(made, "wb") as dst:
        shutil.copyfileobj(src, dst, 8 << 20)
        size = dst.tell()
    os.replace(target + ".part", target)
    return size
