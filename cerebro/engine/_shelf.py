"""Where the driver keeps the trials' states between hops: a few in memory, the rest on local
disk, so the driver's memory does not grow with the number of trials (DESIGN's "control
plane"; issue 34).

A state comes from the worker that trained it and goes to the worker that trains it next,
to an eval visit, and to the store as a checkpoint. Between those the driver holds it: with
64 trials of a 300 MB model that would be ~20 GB. The shelf keeps the ``resident`` states
put last in memory and writes older ones to a file of its own directory (the run's data-only
format, :func:`cerebro.store.write_message`), reading them back when they are next needed.
A :class:`Shelved` state's file lives as long as something refers to it (the trial, an
earlier epoch's evals, a queued checkpoint write), then is removed.
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile
import threading
import weakref
import zlib
from collections import OrderedDict
from typing import Any

from ..store import StateFormatError, frames, parse


class Shelved:
    """One packed state on the shelf; :meth:`get` gives it back, from memory or its file
    (checked against the CRC-32 of what was written: invariant 9).

    Safe to read from the store writer's thread while the driver's thread spills it: the
    file is complete before the state in memory is let go."""

    def __init__(self, state: Any) -> None:
        self._state = state
        self._path: str | None = None
        self._crc = 0

    def get(self) -> Any:
        state = self._state
        if state is not None:
            return state
        crc = 0
        with open(self._path, "rb") as f:
            def read_into(view: memoryview) -> int:
                nonlocal crc
                count = f.readinto(view)
                crc = zlib.crc32(view[:count], crc)
                return count
            state = parse(read_into)
            if f.read(1) or crc != self._crc:
                raise StateFormatError(f"the driver's spilled state {self._path} changed on disk since it was "
                                       f"written (CRC-32 {crc:#010x}, written {self._crc:#010x})")
        return state

    @property
    def in_memory(self) -> bool:
        return self._state is not None

    def _spill(self, path: str) -> None:
        crc = 0
        with open(path, "wb") as f:
            for frame in frames(self._state):
                f.write(frame)
                crc = zlib.crc32(frame, crc)
        self._path, self._crc = path, crc
        weakref.finalize(self, _remove, path)
        self._state = None


class StateShelf:
    """Keeps at most ``resident`` states in memory (None: all of them), spilling the oldest
    to ``directory`` (default: a new directory under ``TMPDIR``, removed by :meth:`close`)."""

    def __init__(self, resident: int | None = None, directory: str | None = None) -> None:
        if resident is not None and resident < 1:
            raise ValueError(f"resident={resident!r} must be a positive number of states, or None")
        self.resident = resident
        self._directory = directory
        self._in_memory: OrderedDict[int, weakref.ref[Shelved]] = OrderedDict()
        self._count = 0
        self._lock = threading.Lock()
        self.spilled = 0            # states written to disk so far

    def put(self, state: Any) -> Shelved:
        """``state`` on the shelf; the oldest state still in memory goes to disk if there
        are more than ``resident``."""
        shelved = Shelved(state)
        with self._lock:
            self._count += 1
            # A state let go of (its trial ended, a newer one came) leaves the count at once.
            self._in_memory[self._count] = weakref.ref(shelved, functools.partial(self._forget, self._count))
            while self.resident is not None and len(self._in_memory) > self.resident:
                _, oldest = self._in_memory.popitem(last=False)
                held = oldest()
                if held is not None and held.in_memory:
                    held._spill(os.path.join(self._make_directory(), f"{self._count}-{id(held)}.state"))
                    self.spilled += 1
        return shelved

    def _forget(self, key: int, _: object) -> None:
        self._in_memory.pop(key, None)

    def _make_directory(self) -> str:
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="cerebro-states-")
        return self._directory

    def close(self) -> None:
        """Remove the spilled states' directory (the run is over: nothing reads them)."""
        if self._directory is not None and os.path.basename(self._directory).startswith("cerebro-states-"):
            shutil.rmtree(self._directory, ignore_errors=True)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
