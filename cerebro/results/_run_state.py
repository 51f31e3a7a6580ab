"""Where a run stands, as its journal says: running, finished, or stopped before its end and
why; and so where each of its live trials stands (running, paused by the searcher, or
parked until a resume)."""
from __future__ import annotations

import enum
import os
from typing import Any

from ..store import (
    Decided,
    DecidedPaused,
    RunExtended,
    RunFailed,
    RunFinished,
    RunInterrupted,
    RunStarted,
    StopCause,
    TrialEnded,
    TrialStatus,
)
from ..store._lock import held_locally


class RunState(enum.StrEnum):
    """Where a run stands; a ``str``, so it compares and prints as its value."""

    RUNNING = "running"            # no end journaled, and a driver runs it (or one cannot tell: a remote store)
    DIED = "died"                  # no end journaled, and no driver runs it: killed, out of memory, crashed
    FINISHED = "finished"
    STOPPED = "stopped"            # cb.stop / cerebro stop asked it to
    BUDGET = "budget"              # its time_budget passed
    INTERRUPTED = "interrupted"    # Ctrl-C, SIGTERM or a cancelled SQL call
    FAILED = "failed"              # its driver raised (Result.run_error says what)

    @property
    def resumable(self) -> bool:
        """Stopped before its end by a driver that closed it: ``cb.resume`` goes on."""
        return self in (RunState.STOPPED, RunState.BUDGET, RunState.INTERRUPTED, RunState.FAILED, RunState.DIED)


# A journal written before causes were journaled says None: interrupted, the broadest word.
# An interruption's cause (None: journaled by a version that did not say) as the run's state.
_BY_CAUSE: dict[StopCause | None, RunState] = {StopCause.STOP: RunState.STOPPED, StopCause.BUDGET: RunState.BUDGET,
                                               StopCause.INTERRUPT: RunState.INTERRUPTED}


class RunLine:
    """Folds the journal's run-level events (and the searcher's pauses) as :class:`Result`
    reads them, line by line."""

    def __init__(self) -> None:
        self.state = RunState.RUNNING
        self.error: str | None = None
        self.paused: set[str] = set()     # trials the searcher paused and has not decided on yet

    def apply(self, event: Any) -> None:
        match event:
            case RunStarted() | RunExtended():      # RunResumed is a RunStarted
                self.state, self.error = RunState.RUNNING, None
            case RunFinished():
                self.state = RunState.FINISHED
            case RunInterrupted():
                self.state = _BY_CAUSE.get(event.cause, RunState.INTERRUPTED)
            case RunFailed():
                self.state, self.error = RunState.FAILED, event.reason
            case Decided() if event.decision == "pause":
                self.paused.add(event.trial_id)
            case Decided() | TrialEnded():
                self.paused.discard(event.trial_id)
            case DecidedPaused():
                self.paused.difference_update(event.decisions)

    def settle(self, lock: str) -> None:
        """Once every line is in: a run with no end journaled whose local lock file ``lock`` no
        driver holds has died (a remote store's lease is not read: its driver is taken to be
        there; a run directory without the file, from before locks, as well)."""
        if self.state is RunState.RUNNING and "://" not in lock and os.path.isfile(lock) and not held_locally(lock):
            self.state = RunState.DIED

    def live_status(self, trial_id: str) -> TrialStatus:
        """The status of a trial that has not ended: parked where no driver will go on with it
        before a resume, else paused (by the searcher) or running."""
        if self.state.resumable:
            return TrialStatus.PARKED
        return TrialStatus.PAUSED if trial_id in self.paused else TrialStatus.RUNNING
