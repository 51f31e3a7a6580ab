"""The errors that stop a run."""
from __future__ import annotations


class TooManyFailuresError(RuntimeError):
    """More trials failed than ``max_failures`` allows; the run stopped."""


class WorkerLostError(RuntimeError):
    """A worker process ended or stopped answering; the run cannot go on without it."""


class StoreWriteError(OSError):
    """The run directory could not be written (full, read-only, gone); the run stopped.

    Everything journaled before is kept: once the store is writable again, ``cb.resume``
    finishes the run with the results it would have had.
    """
