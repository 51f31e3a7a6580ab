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


class InterruptedRun(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run in ``run_dir``; it stays resumable, and its message
    says how to finish it. A ``KeyboardInterrupt``, so code that catches those still does."""

    def __init__(self, run_dir: str) -> None:
        super().__init__(f"the run in {run_dir} was interrupted; `cerebro resume {run_dir}` finishes it")
        self.run_dir = run_dir
