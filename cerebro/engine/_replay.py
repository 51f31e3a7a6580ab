"""Replay: the journal read back into the searcher, as the driver told it.

Every decision of a run is a function of the seed and of the results in the journal, so the
searcher is rebuilt by calling it again exactly as the driver did (suggest, report, decide,
trial_ended, in journal order) and checking that it answers as the journal says. What it
recovers, each trial where the journal leaves it, is what :func:`._resume.take_up` hands the
new driver.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from .._checks import quoted
from ..store import (
    EVENTS,
    DamagedLine,
    Decided,
    DecidedPaused,
    EpochEnd,
    Exploited,
    Ledger,
    RunExtended,
    TrialAdded,
    TrialCreated,
    TrialEnded,
    TrialFacts,
    TrialRetried,
    TrialStopAsked,
    parse_event,
)
from ._epoch_rules import diverged, plateau
from ._extend import as_extended
from ._interface import Decision, Exploit, SearchPolicy, TrialRequest, describe
from ._settings import RunSettings


class ResumeError(RuntimeError):
    """The run directory cannot be resumed as it is (its searcher answers differently, or a
    trial's state is lost)."""


@dataclass
class RecoveredTrial(TrialFacts):
    """A trial as the journal leaves it (:class:`TrialFacts`), with the searcher's answers."""

    decision: Decision | None = None          # report's answer at ``epoch``
    decision_journaled: bool = False
    pending: Decision | Exploit | None = None   # decided by decide(), not carried out yet
    improved_at: tuple[int, float] | None = None   # early stopping (see _epoch_rules.plateau)
    stop_reason: str | None = None


@dataclass
class Recovered:
    """What :func:`replay` recovered: every trial, and the requests not yet started."""

    trials: dict[str, RecoveredTrial]
    unstarted: list[TrialRequest]             # suggested, but the driver died before creating them
    last_time: float


def replay(policy: SearchPolicy, events: list[dict[str, Any]], settings: RunSettings) -> Recovered:
    """Call ``policy`` as the driver did for ``events``; the trials as the journal leaves them
    (read by the :class:`Ledger` every reader of a run uses, with their best epochs and
    early stopping by ``settings``)."""
    ledger = Ledger(settings.metric, settings.mode, make=RecoveredTrial)
    suggested: list[TrialRequest] = []
    added: list[TrialRequest] = []            # what the users added (cb.add_trial), to be created next
    last_time = 0.0
    journaled = as_extended(typed_events(events))
    for event in journaled:
        if isinstance(event, RunExtended):
            policy.extend(event.epochs)       # type: ignore[attr-defined]  # extension() checked it has it
    undone = retried_ends(journaled)
    for index, event in enumerate(journaled):
        if index in undone:
            continue          # the searcher is not told of an end that a retry undid
        last_time = max(last_time, getattr(event, "time", None) or getattr(event, "end", None) or 0.0)
        if isinstance(event, TrialCreated):
            _check_created(event, policy, added, suggested)
        trial = ledger.apply(event)       # None: an event of no trial, or of one never created (ignored)
        match event:
            case TrialAdded():
                added.append(policy.added(event.config))     # type: ignore[attr-defined]  # it had it then
            case EpochEnd() if trial is not None:
                trial.pending, trial.decision, trial.decision_journaled = None, None, False
                if not diverged(trial.metrics):
                    trial.decision = policy.report(trial.trial_id, trial.epoch, trial.metrics)
                    trial.improved_at, trial.decision, trial.stop_reason = plateau(
                        trial.improved_at, trial.epoch, trial.max_epochs, trial.metrics, trial.decision, settings)
            case Decided() if trial is not None:
                if trial.decision is None or trial.decision.value != event.decision:
                    raise ResumeError(f"the searcher answers {trial.decision} for {trial.trial_id} after epoch "
                                      f"{trial.epoch}; the journal says {event.decision}")
                trial.decision_journaled = True
            case DecidedPaused():
                decided = policy.decide()
                if {t: describe(d) for t, d in decided.items()} != event.decisions:
                    raise ResumeError(f"the searcher decides {decided}; the journal says {event.decisions}")
                for trial_id, decision in decided.items():
                    ledger.trials[trial_id].pending = decision
            case Exploited() if trial is not None:
                trial.pending = Decision.CONTINUE
            case TrialEnded() if trial is not None:
                trial.pending = None
                policy.trial_ended(trial.trial_id, event.status)
    return Recovered(ledger.trials, added + suggested, last_time)


def _check_created(event: TrialCreated, policy: SearchPolicy, added: list[TrialRequest],
                   suggested: list[TrialRequest]) -> None:
    """Check that the trial ``event`` created is the next one a user added, or the searcher
    suggests (asked again once its last suggestions are used up)."""
    if not added and not suggested:
        suggested.extend(policy.suggest())
    if not added and not suggested:
        raise ResumeError(f"the searcher suggests no trial where the journal created {event.trial_id}")
    request = (added or suggested).pop(0)
    if request.config != event.config or request.max_epochs != event.max_epochs:
        raise ResumeError(f"the searcher suggests {request} where the journal created {event.trial_id} "
                          f"with {event.config} for {event.max_epochs} epochs")


def retried_ends(events: list[Any]) -> frozenset[int]:
    """The positions of the ``trial_ended`` events that a later ``trial_retried`` undid."""
    ends: dict[str, int] = {}
    undone = set()
    for index, event in enumerate(events):
        if isinstance(event, TrialEnded):
            ends[event.trial_id] = index
        elif isinstance(event, TrialRetried) and event.trial_id in ends:
            undone.add(ends.pop(event.trial_id))
    return frozenset(undone)


def typed_events(events: list[dict[str, Any]]) -> list[Any]:
    return [event for event in map(parse_event, events) if event is not None]


# The events replay needs: without one, the searcher cannot be called as the driver did. A
# lost line of any other kind loses a row of the schedule or of the workers' story, never a
# decision (a lost ``decision`` line is report's answer, which replay recomputes).
NEEDED = frozenset(cls.name for cls in (TrialCreated, EpochEnd, DecidedPaused, Exploited, TrialEnded, TrialRetried,
                                        RunExtended, TrialStopAsked, TrialAdded))


def replayable(events: list[dict[str, Any]], damaged: list[DamagedLine]) -> tuple[list[dict[str, Any]],
                                                                                   DamagedLine | None]:
    """The events resume replays, and the damaged line from which the journal is cut, if any.

    A damaged line in the middle that replay can do without is skipped, with a warning; the
    first one it needs (or whose kind cannot be read) cuts the journal there, since the
    events after it cannot be replayed without it: they are redone. A damaged tail (a crash
    mid-write) is cut silently.
    """
    needed = next((line for line in damaged if line.events_before < len(events)
                   and (line.seems not in EVENTS or line.seems in NEEDED)), None)
    tail = next((line for line in damaged if line.events_before == len(events)), None)
    cut = needed or tail
    for line in damaged:
        if line is not cut and (cut is None or line.number < cut.number):
            warnings.warn(f"{line}: it held {quoted(line.seems)}, an event resume does without", stacklevel=3)
    if needed is not None:
        held = repr(needed.seems) if needed.seems in EVENTS else "an event of unknown kind"
        warnings.warn(f"{needed.path} line {needed.number} is damaged (it fails its CRC-32) and held {held}, "
                      f"an event resume needs: the run goes on from line {needed.number - 1}, and the work of "
                      f"the {len(events) - needed.events_before} events after it is redone", stacklevel=3)
    return events[:cut.events_before] if cut is not None else events, cut
