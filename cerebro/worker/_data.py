"""What a worker holds of the data: its partitions, in memory or streamed, from the store or
from its local cache of a remote store."""
from __future__ import annotations

import ctypes
import os

from ..data import (
    ROW_GROUP_BYTES,
    SPLITS,
    WINDOW_ROW_GROUPS,
    LocalCache,
    PartitionLayout,
    PartitionSource,
    open_partition,
    read_layout,
)

# "auto" holds partitions in memory when they take less than this share of the free memory.
AUTO_MEMORY_SHARE = 0.5


class WorkerData:
    """A worker's partitions: partition -> split -> :class:`~cerebro.data.PartitionSource`."""

    def __init__(self, data_dir: str, in_memory: bool | str, cache_dir: str | None, worker: int) -> None:
        self.layout: PartitionLayout = read_layout(data_dir)
        self.in_memory = in_memory
        self.cache = LocalCache(data_dir, cache_dir, worker)
        self.sources: dict[int, dict[str, PartitionSource]] = {}
        self.note = ""

    def load(self, partitions: list[int]) -> None:
        """Open ``partitions`` (copied to the local cache first where the store is remote)."""
        local = self.cache.local_dir(partitions)
        in_memory, self.note = self._decide(partitions)
        if not in_memory:
            _return_freed_memory()
        for partition in partitions:
            self.sources[partition] = {split: open_partition(self.layout, local, split, partition, in_memory)
                                       for split in SPLITS}

    def release(self, partitions: list[int]) -> None:
        for partition in partitions:
            self.sources.pop(partition, None)

    def rows(self) -> dict[int, tuple[int, int]]:
        """partition -> (training rows, validation rows)."""
        return {p: (s["train"].rows, s["val"].rows) for p, s in self.sources.items()}

    def close(self) -> None:
        self.cache.close()

    def _decide(self, partitions: list[int]) -> tuple[bool, str]:
        """Whether to hold ``partitions`` in memory, and a line saying why, for the journal."""
        size = sum(self.layout.partition_bytes(p) for p in (*self.sources, *partitions))
        cached = f"; copied {_gb(self.cache.bytes_copied)} from the store to {self.cache.root}" \
            if self.cache.active else ""
        if self.in_memory != "auto":
            return bool(self.in_memory), f"{'in memory' if self.in_memory else 'streamed'} (in_memory=" \
                                         f"{self.in_memory}): partitions of {_gb(size)}{cached}"
        if not self.layout.streamable:
            return True, f"in memory: partitions of {_gb(size)}, written before they could be streamed{cached}"
        free = available_memory()
        fits = size < AUTO_MEMORY_SHARE * free
        return fits, (f"{'in memory' if fits else 'streamed'} (in_memory='auto'): partitions of {_gb(size)}, "
                      f"{'less' if fits else 'more'} than half of the {_gb(free)} free{cached}")


def _return_freed_memory() -> None:
    """glibc keeps freed blocks of up to 32 MB in its heaps once it has freed one that size
    (its mmap threshold adapts), and a worker streaming files Arrow decodes frees a window's
    arrays every few batches: fix the threshold at half a window, so windows are unmapped
    when freed while batches, smaller, reuse heap memory (mapping fresh pages for each batch
    costs page faults)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, ROW_GROUP_BYTES * WINDOW_ROW_GROUPS // 2)   # M_MMAP_THRESHOLD
        # Fixing it also fixes the trim threshold at 128 KiB, so the heap would shrink and
        # grow around every batch: keep four windows' worth at its top, the batches and
        # transform outputs of a few steps (at one window, 9,000 page faults a sub-epoch of
        # 90 MB streamed; at four, 900; in memory, 600).
        libc.mallopt(-1, 4 * ROW_GROUP_BYTES * WINDOW_ROW_GROUPS)    # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass       # not glibc: its allocator has its own policy


def available_memory() -> int:
    """Bytes of memory this machine has free for new allocations (Linux's MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e7 else f"{size / 1e6:.2f} MB"
