"""A worker's outbox: the states it trained, kept for the workers that train them next.

With direct hops (:mod:`._peers`) a trial's state stays with the worker that trained it until
the next worker fetches it, and until the driver says it is needed no more (an epoch's evals
may read it while the trial trains on). With many trials per worker these add up: past
``budget`` bytes in memory, the oldest are written to a private directory on local disk
(``TMPDIR``, mode 0700), off the hop's path, and served from there, memory-mapped and checked
by CRC-32. Only where that disk fails does a state go back to the driver (:class:`HandedBack`).

Example:
    >>> import torch
    >>> from cerebro.store import pack_tensors, parse_view
    >>> outbox = Outbox(budget=100)               # every state but the newest goes to disk
    >>> for version in (1, 2):
    ...     outbox.put("t0000", version, pack_tensors({"w": torch.full((64,), float(version))}))
    ()
    ()
    >>> outbox.spilled, parse_view(memoryview(bytearray(outbox.get("t0000", 1))))["w"].tensor()[0].item()
    (1, 1.0)
    >>> outbox.close()
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass

from ..store import frames, parse_view
from ..store._scratch import remove_scratch, scratch_directory
from ._protocol import HandedBack

IDLE_SECONDS = 60.0       # how long a peer waits for a state that is being copied


@dataclass(frozen=True)
class _OnDisk:
    path: str
    size: int
    crc: int


class Outbox:
    """The states a worker trained, each kept until the driver says it is needed no more
    (:meth:`forget`): up to ``budget`` bytes in memory, the oldest of the rest on local disk.

    A state is reserved before the worker answers its sub-epoch and filled (copied) right
    after, so the copy is off the hop's path; a peer that asks in between waits for it."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.spilled = 0                  # states written to disk so far
        self._filled = threading.Condition()    # the worker loop puts, the server's threads get
        # (trial, version) -> the state as one message; None while reserved; _OnDisk once spilled
        self._entries: OrderedDict[tuple[str, int], bytes | _OnDisk | None] = OrderedDict()
        self._bytes = 0                   # of the states in memory
        self._directory: str | None = None
        self._names = itertools.count()
        self._handed_back: list[HandedBack] = []

    def reserve(self, trial_id: str, version: int) -> tuple[HandedBack, ...]:
        """Room for ``trial_id``'s ``version``; returns the states given back to the driver
        since the last call (where the disk failed)."""
        with self._filled:
            self._entries[trial_id, version] = None
            handed_back, self._handed_back = tuple(self._handed_back), []
        return handed_back

    def fill(self, trial_id: str, version: int, parts: list[memoryview | bytes]) -> None:
        """Keep the reserved state, as one message (``parts``: its frames); a copy, as the
        trainer goes on changing its tensors in place. Then the oldest states past the budget
        go to disk."""
        blob = b"".join(parts)
        with self._filled:
            if (trial_id, version) in self._entries:    # else forgotten meanwhile
                self._entries[trial_id, version] = blob
                self._bytes += len(blob)
            self._filled.notify_all()
        self._spill()

    def put(self, trial_id: str, version: int, state: object) -> tuple[HandedBack, ...]:
        """:meth:`reserve` and :meth:`fill` at once: keep ``state`` (packed)."""
        handed_back = self.reserve(trial_id, version)
        self.fill(trial_id, version, frames(state))
        return handed_back

    def get(self, trial_id: str, version: int, timeout: float = IDLE_SECONDS) -> bytes | mmap.mmap | None:
        """``trial_id``'s state ``version`` as one message, if held (waiting while reserved);
        None also where its file on disk changed since it was written."""
        def settled() -> bool:
            return self._entries.get((trial_id, version), b"") is not None
        with self._filled:
            self._filled.wait_for(settled, timeout)
            entry = self._entries.get((trial_id, version))
        return _read(entry) if isinstance(entry, _OnDisk) else entry

    def forget(self, trial_id: str, version: int) -> None:
        with self._filled:
            entry = self._entries.pop((trial_id, version), None)
            if isinstance(entry, bytes):
                self._bytes -= len(entry)
            self._filled.notify_all()
        if isinstance(entry, _OnDisk):
            with contextlib.suppress(FileNotFoundError):
                os.remove(entry.path)

    def close(self) -> None:
        """Remove the states on disk (the worker ends)."""
        if self._directory is not None:
            remove_scratch(self._directory)

    def _spill(self) -> None:
        """The oldest states in memory to disk while past the budget (the newest stays)."""
        while True:
            with self._filled:
                if self._bytes <= self.budget:
                    return
                in_memory = [(k, v) for k, v in self._entries.items() if isinstance(v, bytes)]
                if len(in_memory) <= 1:
                    return
                key, blob = in_memory[0]
            spilled = self._write(key, blob)
            with self._filled:
                if self._entries.get(key) is blob:      # not forgotten meanwhile
                    self._bytes -= len(blob)
                    if spilled is None:
                        del self._entries[key]
                        self._handed_back.append(HandedBack(*key, parse_view(memoryview(bytearray(blob)))))
                    else:
                        self._entries[key] = spilled
                        self.spilled += 1
                elif spilled is not None:
                    os.remove(spilled.path)

    def _write(self, key: tuple[str, int], blob: bytes) -> _OnDisk | None:
        try:
            if self._directory is None:
                self._directory = scratch_directory("cerebro-outbox")    # mode 0700
            path = os.path.join(self._directory, f"{next(self._names)}.state")
            with open(path, "xb") as f:
                f.write(blob)
            return _OnDisk(path, len(blob), zlib.crc32(blob))
        except OSError as error:      # a full or failing disk: the driver keeps it instead
            logging.getLogger("cerebro").warning("could not write %s's state %d to local disk (%s): it goes "
                                                 "back to the driver", key[0], key[1], error)
            return None


def _read(entry: _OnDisk) -> mmap.mmap | None:
    """A spilled state, mapped; None where its file changed since it was written."""
    try:
        with open(entry.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    if len(mapped) != entry.size or zlib.crc32(mapped) != entry.crc:
        logging.getLogger("cerebro").warning("the outbox's state %s changed on disk since it was written: "
                                             "not sent", entry.path)
        mapped.close()
        return None
    return mapped
