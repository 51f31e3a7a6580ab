"""A worker's local copy of its partitions, when the store is remote.

Reading a partition from ``hdfs://`` or ``s3://`` every epoch would move the data over the
network once per epoch and trial; the original Cerebro cached each worker's partitions on its
local disk instead. Here a worker copies each partition it holds (or takes over from a lost
worker) into its cache directory once per run and reads it from there.
"""
from __future__ import annotations

import os
import shutil

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
            if self._cache_dir is not None:
                os.makedirs(self._cache_dir, exist_ok=True)
            self._root = scratch_directory("cerebro-worker", self._cache_dir, tag=f"{self._worker}-")
        for name in ["meta.json"] + [os.path.relpath(partition_file("", split, p), "")
                                     for split in SPLITS for p in partitions]:
            target = os.path.join(self._root, name)
            if not os.path.exists(target):
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


def _copy(source: str, target: str) -> int:
    """Copy ``source`` (any store) to the local ``target`` atomically; the bytes copied."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with files.open_file(source) as src, open(target + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst, 8 << 20)
        size = dst.tell()
    os.replace(target + ".part", target)
    return size
