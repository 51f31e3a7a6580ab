"""A live trial as the driver holds it: where it stands, its state and its holders, and
the evaluations of earlier epochs still running beside its next (see :mod:`._trials`).

Where it stands is one :class:`Phase`, moved only along :data:`TRANSITIONS` (as a task's
state in dask's ``worker_state_machine``), so no two flags can disagree::

    NEW ──> TRAINING ──> WAITING ──> PAUSED ──> TRAINING ...
              │   ▲         │           │
              │   └─────────┘           └──> PARKED (the run stops: resumed later)
              └──> ENDING (failed; ends once its earlier epoch's evals are in)

A trial that ends leaves the book; it has no phase after that.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ..store import TrialStatus
from ..worker import Sums


class Phase(enum.Enum):
    """Where a live trial stands."""

    NEW = "new"              # created or taken up; no epoch scheduled yet
    TRAINING = "training"    # its epoch's sub-epochs are scheduled or running
    WAITING = "waiting"      # its epoch is done; reported once the evals of the epoch before are in
    PAUSED = "paused"        # its epoch is reported; it waits for the searcher's decide()
    PARKED = "parked"        # the run stops: its next epoch waits for a resume
    ENDING = "ending"        # failed in its epoch: ends once the evals of the epoch before are in


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.NEW: frozenset({Phase.TRAINING, Phase.PARKED, Phase.PAUSED}),
    # TRAINING -> TRAINING: the next epoch starts while this one's evals run (overlap)
    Phase.TRAINING: frozenset({Phase.TRAINING, Phase.WAITING, Phase.PAUSED, Phase.PARKED, Phase.ENDING}),
    Phase.WAITING: frozenset({Phase.TRAINING, Phase.PAUSED, Phase.PARKED, Phase.ENDING}),
    Phase.PAUSED: frozenset({Phase.TRAINING, Phase.PARKED}),
    Phase.PARKED: frozenset({Phase.PARKED}),      # cb.stop asked while parked: it may park again
    Phase.ENDING: frozenset(),
}


@dataclass
class Evaluation:
    """An epoch whose eval visits still run while the trial trains its next epoch."""

    state: Any                    # as the epoch's training left it (a _shelf.Shelved)
    version: int
    holders: set[int]
    train_sums: dict[int, Sums]
    eval_sums: dict[int, Sums]
    learning_rate: float | None

    def held_state(self) -> Any:
        """The driver's copy of this version's state (always there for an epoch's end)."""
        return self.state


@dataclass
class Trial:
    """A live trial: its configuration, where it stands, and the state the driver holds."""

    trial_id: str
    config: dict
    max_epochs: int
    epoch: int = 0
    state: Any = None             # the driver's copy: a _shelf.Shelved packed state, as it came from a worker
    state_version: int = 0        # the version of that copy: with direct hops, the latest only at epoch ends
    version: int = 0              # train sub-epochs the latest state has seen
    holders: set[int] = field(default_factory=set)         # workers holding the latest version
    epoch_start: int = 0          # the version its current epoch started from
    phase: Phase = Phase.NEW
    retune: bool = False          # config changed (PBT): optimizer hyperparameters from build(config)
    lost_with: list[str] = field(default_factory=list)      # workers lost while running it
    train_sums: dict[int, Sums] = field(default_factory=dict)   # this epoch's, by partition
    eval_sums: dict[int, Sums] = field(default_factory=dict)
    overlap: bool = False         # this epoch's evals may run alongside the next epoch
    evaluations: dict[int, Evaluation] = field(default_factory=dict)   # earlier epochs, by number
    ending: tuple[TrialStatus, str | None] | None = None   # how it ends, in phase ENDING
    # Resume: epochs up to ``catch_up`` ran before the crash and are redone silently; then
    # the trial goes on as ``recovered`` (a ``_replay.RecoveredTrial``) says.
    catch_up: int = 0
    recovered: Any = None
    best: tuple[int, float] | None = None      # (epoch, metric) of its best epoch so far
    improved_at: tuple[int, float] | None = None   # its last improvement by more than min_delta
    stop_reason: str | None = None             # why early stopping ended it
    stop_epoch: int | None = None              # cb.stop(run_dir, trial=...): it ends going on after it
    learning_rate: float | None = None         # after its last train sub-epoch (history's train_lr)
    # What its schedule steps on (ReduceLROnPlateau's metric): then its next epoch waits for an
    # epoch's evals, and its train tasks carry ``last_metrics``, (epoch, metrics) of the last one.
    epoch_metric: str | None = None
    last_metrics: tuple[int, dict[str, float]] | None = None

    def move(self, to: Phase) -> None:
        """Go to phase ``to``; raises (a bug) where :data:`TRANSITIONS` does not allow it."""
        if to not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"{self.trial_id} cannot go from {self.phase.value} to {to.value} (a bug)")
        self.phase = to

    def hold(self, state: Any, version: int) -> None:
        """``state`` (shelved), at ``version``, is the trial's latest and the driver's copy."""
        self.state, self.state_version, self.version = state, version, version

    def metrics_before(self, epoch: int) -> dict[str, float] | None:
        """The metrics a train task of ``epoch`` carries: its epoch before's, where the driver
        has them (always, for a trial whose schedule steps on one: it waits for them)."""
        if self.last_metrics is None or self.last_metrics[0] != epoch - 1:
            return None
        return self.last_metrics[1]

    def held_state(self) -> Any:
        """The driver's copy of the latest state; None where only a worker holds it (or at version 0)."""
        return self.state if self.state_version == self.version else None

    def holdings(self) -> list[Trial | Evaluation]:
        """The states the driver holds for it, each with its version and holders: the latest,
        and that of each epoch whose evals still run."""
        return [self, *self.evaluations.values()]
