"""Narrow waist 1: what the driver asks a searcher, and what a searcher answers.

The driver calls :meth:`SearchPolicy.suggest` at the start and after every epoch end or
trial end, and starts the trials it returns (ids ``t0000``, ``t0001``, ... in that order).
At each epoch end it calls :meth:`SearchPolicy.report` with the epoch's metrics; the answer
says whether the trial trains another epoch, stops, or waits (``PAUSE``) for a decision
that needs other trials' results. The driver then calls :meth:`SearchPolicy.decide` for
the waiting trials the searcher can now decide: go on, stop, or :class:`Exploit` (copy
another waiting trial's state and change the config, for PBT). A trial that reaches its
``max_epochs`` is completed; one the searcher stops earlier is stopped. The run ends when
no trial is live and ``suggest`` returns nothing.

Reports arrive in the order trials finish their epochs, which depends on timing. To keep
invariant 2 a searcher's decisions must not depend on that order: grid and random search
decide each trial on its own metrics; the adaptive searchers pause a trial until every
result its decision depends on has arrived, and order those results by trial id.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Decision(enum.Enum):
    """A searcher's answer for a trial at an epoch end."""

    CONTINUE = "continue"
    STOP = "stop"
    PAUSE = "pause"        # only as an answer to report: decided later, through decide()


@dataclass(frozen=True)
class Exploit:
    """Continue from ``source``'s state (weights and optimizer state) with ``config``.

    ``source`` is a trial paused at the same epoch; its state is copied bitwise, and the
    optimizer's hyperparameters are taken from ``build(config)`` (Jaderberg et al., 2017).
    """

    source: str
    config: dict[str, Any]


@dataclass(frozen=True)
class TrialRequest:
    """A trial to start: its configuration and how many epochs it may train at most."""

    config: dict[str, Any]
    max_epochs: int


class SearchPolicy(Protocol):
    """What the driver asks a searcher (see the module docstring for when)."""

    def start(self, seed: int) -> None:
        """Reset for a new run whose seed is ``seed``."""

    def suggest(self) -> list[TrialRequest]:
        """Trials to start now (possibly none)."""

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """``trial_id`` finished ``epoch`` (1-based) with ``metrics``: continue, stop or pause?"""

    def decide(self) -> Mapping[str, Decision | Exploit]:
        """Decisions for paused trials that can now be decided (CONTINUE, STOP or Exploit)."""

    def continues_after(self, trial_id: str, epoch: int) -> bool:
        """Whether ``report`` answers CONTINUE after ``epoch`` whatever the metrics. Optional
        (a policy without it is taken to need them); where True, ``trial_id``'s next epoch
        starts as soon as this one's training ends, while its eval visits still run."""

    def trial_ended(self, trial_id: str, status: str) -> None:
        """``trial_id`` ended as ``status`` (completed, stopped, failed or diverged)."""

    def stop_reason(self, trial_id: str) -> str | None:
        """Why the searcher stopped ``trial_id``, for the history and the report."""

    def state(self) -> dict[str, Any]:
        """The searcher's state as JSON-safe data, written to the journal at each decision."""


def describe(decision: Decision | Exploit) -> str | dict:
    """A decision as journal data."""
    if isinstance(decision, Exploit):
        return {"exploit": decision.source, "config": decision.config}
    return decision.value
