"""Partition files are checked before a worker trusts them (DESIGN invariant 9).

``meta.json`` records each partition file's size and CRC-32 as it was written. A worker that
loads a file into memory, or maps it to stream it, checks both first; before each streamed
sub-epoch it checks, cheaply, that the file's size and modification time are still those it
checked. A symbolic link is refused: a partition is a file of the run, not a pointer that
could be turned to another file. Any mismatch raises :class:`PartitionFileError`, naming the
file: a flipped byte, a truncated file (which, mapped, would kill the worker with SIGBUS) or
one rewritten mid-run must stop the run, not train on other data.
"""
from __future__ import annotations

import os
import stat
import zlib
from dataclasses import dataclass
from typing import IO, Any

_CHUNK = 8 << 20


class PartitionFileError(ValueError):
    """A partition file that is not the one the run wrote."""


class Checksummed:
    """A writable file that keeps the size and CRC-32 of what goes through it."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file, self.size, self.crc = file, 0, 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc, self.size = zlib.crc32(view, self.crc), self.size + len(view)
        return self.file.write(view)

    def __getattr__(self, name: str) -> Any:     # flush, tell, closed, ...: the file's own
        return getattr(self.file, name)


@dataclass(frozen=True)
class Snapshot:
    """A checked file's size and modification time: what the cheap check compares."""

    path: str
    size: int
    mtime_ns: int

    def check_unchanged(self) -> None:
        found = _lstat(self.path)
        if (found.st_size, found.st_mtime_ns) != (self.size, self.mtime_ns):
            raise PartitionFileError(f"partition file {self.path} changed during the run (now {found.st_size} "
                                     f"bytes, modified at {found.st_mtime_ns} ns; checked: {self.size} bytes, "
                                     f"{self.mtime_ns} ns); the run stops rather than train on other data")


def check_file(path: str, expected: tuple[int, int] | None, content: bytes | None = None) -> Snapshot:
    """Raise unless ``path`` is a regular file of ``expected`` (size, CRC-32); ``content``:
    its bytes, where the caller read them already. ``expected`` None (a run written before
    files were checked): only the symlink check."""
    before = _lstat(path)
    if expected is not None:
        size, crc = expected
        if before.st_size != size:
            raise PartitionFileError(f"partition file {path} has {before.st_size} bytes; the run wrote {size} "
                                     f"(truncated or replaced)")
        found = zlib.crc32(content) if content is not None else _crc(path)
        if found != crc:
            raise PartitionFileError(f"partition file {path} fails its CRC-32 ({found:#010x}, written {crc:#010x}): "
                                     f"it was damaged or changed since the run wrote it")
    return Snapshot(path, before.st_size, before.st_mtime_ns)


def _lstat(path: str) -> os.stat_result:
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode):
        raise PartitionFileError(f"partition file {path} is a symbolic link (to {os.readlink(path)!r}); a run "
                                 f"reads only the files it wrote")
    if not stat.S_ISREG(found.st_mode):
        raise PartitionFileError(f"partition file {path} is not a regular file")
    return found


def _crc(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc
