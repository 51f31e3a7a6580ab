"""Carrying out what the searcher decides at a trial's epoch end: go on, stop, wait, or
(PBT) exploit another paused trial's state with a new config, and, at resume, what the
crashed driver had decided. A part of :class:`~cerebro.engine._trials.TrialBook`, apart so
each file reads as one idea.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..store import Decided, DecidedPaused, Exploited, SearchState, TrialStatus
from ._epoch_rules import USER_STOP, diverged
from ._interface import Decision, Exploit, SearchPolicy, describe
from ._recorder import Recorder
from ._search_state import SearchStateLog
from ._trial import Phase, Trial


class Decisions:
    """The trial book's decisions (a mixin of :class:`~cerebro.engine._trials.TrialBook`)."""

    live: dict[str, Trial]
    policy: SearchPolicy
    recorder: Recorder
    decide_due: bool
    created: int
    _search_state: SearchStateLog

    if TYPE_CHECKING:
        def end(self, trial: Trial, status: TrialStatus, reason: str | None, epoch: int | None = None) -> None: ...
        def start_epoch(self, trial: Trial) -> None: ...

    def apply_decisions(self) -> None:
        """Carry out what the searcher decided for paused trials."""
        if not self.decide_due:
            return
        self.decide_due = False
        decisions = self.policy.decide()
        if not decisions:
            return
        self.write_search_state()
        self.recorder.emit(DecidedPaused({t: describe(d) for t, d in decisions.items()}, self.recorder.now()))
        self.carry_out(decisions)

    def carry_out(self, decisions: Mapping[str, Decision | Exploit]) -> None:
        """Exploits first, so every source still holds the state of the epoch it paused at."""
        for trial_id, decision in sorted(decisions.items(), key=lambda item: not isinstance(item[1], Exploit)):
            trial = self.live.get(trial_id)
            if trial is None or trial.phase is not Phase.PAUSED:
                raise RuntimeError(f"{type(self.policy).__name__} decided {decision!r} for {trial_id}, "
                                   f"which is not a paused trial")
            self.decide_due = True    # what ends or goes on may unblock other decisions
            if isinstance(decision, Exploit) and trial.stop_epoch is not None and trial.stop_epoch <= trial.epoch:
                decision = Decision.CONTINUE       # the user stopped it: it ends with its own weights (go_on)
            if isinstance(decision, Exploit):
                self._exploit(trial, decision)
                decision = Decision.CONTINUE
            self.go_on(trial, decision)

    def carry_on(self, trial: Trial, resumed: Any) -> None:
        """Do what the crashed driver had decided, or was deciding, after ``trial.epoch``;
        ``resumed`` is the trial as ``_replay.replay`` recovered it."""
        bad = diverged(resumed.metrics)
        if bad:
            self.end(trial, TrialStatus.DIVERGED, f"{bad} is {resumed.metrics[bad]} after epoch {trial.epoch}")
            return
        if resumed.pending is not None or resumed.decision is Decision.PAUSE:
            trial.move(Phase.PAUSED)     # decided by carry_out, or later by decide()
            if not resumed.decision_journaled:
                self.recorder.emit(Decided(trial.trial_id, trial.epoch, Decision.PAUSE.value))
            return
        if not resumed.decision_journaled:
            self.recorder.emit(Decided(trial.trial_id, trial.epoch, resumed.decision.value))
        trial.stop_reason = resumed.stop_reason
        self.go_on(trial, resumed.decision)

    def go_on(self, trial: Trial, decision: Decision) -> None:
        """Carry out CONTINUE or STOP for a trial at the end of an epoch (a trial the user asked
        to stop ends there, unless it has completed)."""
        if decision is Decision.CONTINUE and trial.stop_epoch is not None and \
                trial.stop_epoch <= trial.epoch < trial.max_epochs:
            self.end(trial, TrialStatus.STOPPED, USER_STOP)
        elif decision is Decision.STOP and trial.epoch < trial.max_epochs:
            self.end(trial, TrialStatus.STOPPED, trial.stop_reason or self.policy.stop_reason(trial.trial_id))
        elif decision in (Decision.STOP, Decision.CONTINUE) and trial.epoch >= trial.max_epochs:
            self.end(trial, TrialStatus.COMPLETED, None)
        elif decision is Decision.CONTINUE:
            self.start_epoch(trial)
        else:
            raise RuntimeError(f"{type(self.policy).__name__} answered {decision!r} for {trial.trial_id}; "
                               f"a decision to carry out must be CONTINUE or STOP")

    def _exploit(self, trial: Trial, exploit: Exploit) -> None:
        """PBT: ``trial`` goes on from the state of ``exploit.source``, with the new config."""
        source = self.live.get(exploit.source)
        if source is None or source.phase is not Phase.PAUSED or source.epoch != trial.epoch:
            raise RuntimeError(f"{trial.trial_id} cannot exploit {exploit.source}: the source must be a trial "
                               f"paused at the same epoch ({trial.epoch})")
        self.recorder.emit(Exploited(trial.trial_id, trial.epoch, source.trial_id, trial.config,
                                     dict(exploit.config), self.recorder.now()))
        trial.config = dict(exploit.config)
        # A new version no worker holds: the state is sent again, and the trainable rebuilt.
        trial.hold(source.state, trial.version + 1)
        trial.holders, trial.retune = set(), True
        self.recorder.write_config(trial.trial_id, trial.config)
        self.recorder.write_checkpoint(trial.trial_id, trial.state, trial.epoch, True)

    def check_not_stuck(self, running: bool) -> None:
        """Every live trial paused with nothing ``running`` and no ``decide`` due (what the
        last one decided may unblock the rest): the searcher will never decide them."""
        if self.live and all(t.phase is Phase.PAUSED for t in self.live.values()) and not running \
                and not self.decide_due:
            raise RuntimeError(f"{type(self.policy).__name__} paused trials {sorted(self.live)} "
                               f"and decided none of them; the run cannot go on")

    def write_search_state(self, now: bool = False) -> None:
        """Journal the searcher's state if it is due (``now``: at the run's end) and changed."""
        if not now and not self._search_state.due(self.created):
            return
        entry = self._search_state.entry(self.policy.state())
        if entry:
            self.recorder.emit(SearchState(self.recorder.now(), **entry))
