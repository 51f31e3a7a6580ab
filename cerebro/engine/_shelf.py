"""Where the driver keeps the trials' states between hops: a few in memory, the rest on local
disk, so the driver's memory does not grow with the number of trials (DESIGN's "control
plane"; issue 34).

A state comes to the driver at its epoch's end (with direct hops; with ``hops="driver"``
after every train sub-epoch) and goes to the workers that need it next, to eval visits, and
to the store as a checkpoint. Between those the driver holds it: with 64 trials of a 300 MB
model that would be ~20 GB. The shelf keeps ``resident`` states in
memory and writes the others to files of its own directory (the run's data-only format,
:func:`cerebro.store.frames`), mapping them back when they are next needed.
A :class:`Shelved` state's file lives as long as something refers to it (the trial, an
earlier epoch's evals, a queued checkpoint write), then is removed.
"""
from __future__ import annotations

import functools
import mmap
import os
import queue
import threading
import warnings
import weakref
import zlib
from typing import Any

from ..store import RunStore, StateFormatError, frames, parse_view, read_state_file, remove_state_file
from ..store._scratch import remove_scratch, scratch_directory


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
        if state is not None or self._path is None:      # in memory, or never spilled
            return state
        with open(self._path, "rb") as f:     # copy-on-write: a tensor written to never reaches the file
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        crc = zlib.crc32(mapped)
        if crc != self._crc:
            raise StateFormatError(f"the driver's spilled state {self._path} changed on disk since it was "
                                   f"written (CRC-32 {crc:#010x}, written {self._crc:#010x})")
        return parse_view(memoryview(mapped))      # tensors over the mapping: nothing copied

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


class Stored:
    """A state a worker wrote to the run's store at its epoch's end (``staged/``, see
    :meth:`.._writer.StoreRecorder.staged_state`): the driver holds its name only. The checkpoint is a
    second name of the file (:meth:`RunStore.promote_checkpoint`); :meth:`get` reads it,
    checked, where a worker needs the state from the driver. The staged name is removed once
    nothing refers to it."""

    in_memory = False

    def __init__(self, store: RunStore, path: str, trial_id: str, epoch: int) -> None:
        self.store, self.path, self.trial_id, self.epoch = store, path, trial_id, epoch
        weakref.finalize(self, _remove_staged, path)

    def get(self) -> Any:
        return read_state_file(self.path, self.trial_id, self.epoch)


class StateShelf:
    """Keeps at most ``resident`` states in memory (None: all of them), spilling the rest
    to ``directory`` (default: a new directory under ``TMPDIR``, removed by :meth:`close`).

    Which to spill: the newest. MOP serves waiting trials in turn, so the state that just
    came back is needed after every other one; the ones that stay in memory are used again
    soonest (on a cyclic use, spilling the least recently put, as an LRU cache would, misses
    every time). The write runs
    on a thread of its own, off the driver's loop; the state stays in memory until it is
    written, and at most ``MAX_SPILLS_QUEUED`` wait, so a slow disk slows :meth:`put`
    rather than growing memory. A disk that fails keeps the states in memory, with a
    warning."""

    MAX_SPILLS_QUEUED = 1

    def __init__(self, resident: int | None = None, directory: str | None = None) -> None:
        if resident is not None and resident < 1:
            raise ValueError(f"resident={resident!r} must be a positive number of states, or None")
        self.resident = resident
        self._directory = directory
        self._in_memory: dict[int, weakref.ref[Shelved]] = {}
        self._count = 0
        self.spilled = 0            # states written to disk (or on their way) so far
        self._spills: queue.Queue[tuple[Shelved, str] | None] = queue.Queue(self.MAX_SPILLS_QUEUED)
        self._thread: threading.Thread | None = None
        self._failed = False

    def put(self, state: Any) -> Shelved | Stored:
        """``state`` on the shelf: in memory while fewer than ``resident`` are, else on disk;
        one already :class:`Stored` stays where it is."""
        if isinstance(state, Stored):
            return state
        shelved = Shelved(state)
        if self.resident is None or len(self._in_memory) < self.resident or self._failed:
            self._count += 1
            # A state let go of (its trial ended, a newer one came) leaves the count at once.
            self._in_memory[self._count] = weakref.ref(shelved, functools.partial(self._forget, self._count))
            return shelved
        self.spilled += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_spills, name="cerebro-state-shelf", daemon=True)
            self._thread.start()
        self._spills.put((shelved, os.path.join(self._make_directory(), f"{self.spilled}.state")))
        return shelved

    def _forget(self, key: int, _: object) -> None:
        self._in_memory.pop(key, None)

    def _make_directory(self) -> str:
        if self._directory is None:
            self._directory = scratch_directory("cerebro-states")
        return self._directory

    def _write_spills(self) -> None:
        while (item := self._spills.get()) is not None:
            shelved, path = item
            if self._failed:
                continue
            try:
                shelved._spill(path)
            except OSError as error:
                self._failed = True
                warnings.warn(f"the driver could not write a trial's state to {self._directory} ({error}); it keeps "
                              f"the states in memory from now on", RuntimeWarning, stacklevel=1)

    def close(self) -> None:
        """Stop spilling and remove the spilled states' directory (the run is over: nothing
        reads them)."""
        if self._thread is not None:
            self._spills.put(None)
            self._thread.join()
            self._thread = None
        if self._directory is not None and os.path.basename(self._directory).startswith("cerebro-states-"):
            remove_scratch(self._directory)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _remove_staged(path: str) -> None:
    try:
        remove_state_file(path)
    except OSError:
        pass       # the store went away: clear_staged at the run's end or next start removes it
