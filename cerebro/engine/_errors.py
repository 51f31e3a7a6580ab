"""The errors that stop a run."""
from __future__ import annotations


class TooManyFailuresError(RuntimeError):
    """More trials failed than ``max_failures`` allows; the run stopped."""


class WorkerLostError(RuntimeError):
    """A worker process ended or stopped answering; the run cannot go on without it."""
