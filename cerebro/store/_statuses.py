"""The statuses a trial takes and the kinds of work a sub-epoch does: ``str`` enums, so
they compare and serialize as their values in the journal and in run views."""
from __future__ import annotations

import enum


class TrialStatus(enum.StrEnum):
    """Where a trial stands; a ``str``, so it compares and serializes as its value."""

    RUNNING = "running"
    PAUSED = "paused"          # waits for the searcher's decision, which needs other trials
    PARKED = "parked"          # its run stopped first (cb.stop, time_budget, Ctrl-C, a failure); resume goes on
    COMPLETED = "completed"    # trained its max_epochs
    STOPPED = "stopped"        # the searcher stopped it early
    FAILED = "failed"          # its build or a sub-epoch raised, or it took its workers down
    DIVERGED = "diverged"      # a loss became NaN or infinite
    TIMEOUT = "timeout"        # a sub-epoch ran past trial_timeout

    @property
    def is_finished(self) -> bool:
        return self not in (TrialStatus.RUNNING, TrialStatus.PAUSED, TrialStatus.PARKED)

    @property
    def is_failure(self) -> bool:
        """Counts against ``max_failures``."""
        return self in (TrialStatus.FAILED, TrialStatus.DIVERGED, TrialStatus.TIMEOUT)


class TaskKind(enum.StrEnum):
    """What a sub-epoch does: train the trial on a partition, or evaluate it there."""

    TRAIN = "train"
    EVAL = "eval"
