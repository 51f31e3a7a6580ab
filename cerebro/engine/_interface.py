"""Narrow waist 1: what the driver asks a searcher, and what a searcher answers.

The driver calls :meth:`SearchPolicy.suggest` at the start and after every trial's epoch
end, and starts the trials it returns (ids ``t0000``, ``t0001``, ... in that order). At
each epoch end it calls :meth:`SearchPolicy.report` with the epoch's metrics; the answer
says whether the trial trains another epoch. A trial that reaches its ``max_epochs`` is
completed; one the searcher stops earlier is stopped. The run ends when no trial is live
and ``suggest`` returns nothing.

Reports arrive in the order trials finish their epochs, which depends on timing. Grid and
random search decide each trial on its own metrics, so their decisions are reproducible;
a searcher that compares trials must make its decisions independent of that order (for
example, decide a rung only once every trial in it has reported) to keep invariant 2.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol


class Decision(enum.Enum):
    CONTINUE = "continue"
    STOP = "stop"


@dataclass(frozen=True)
class TrialRequest:
    """A trial to start: its configuration and how many epochs it may train at most."""

    config: dict[str, Any]
    max_epochs: int


class SearchPolicy(Protocol):
    def start(self, seed: int) -> None:
        """Reset for a new run whose seed is ``seed``."""

    def suggest(self) -> list[TrialRequest]:
        """Trials to start now (possibly none)."""

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """``trial_id`` finished ``epoch`` (1-based) with ``metrics``: continue or stop?"""

    def trial_ended(self, trial_id: str, status: str) -> None:
        """``trial_id`` ended as ``status`` (completed, stopped, failed or diverged)."""
