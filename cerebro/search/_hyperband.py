"""Hyperband: successive halving over several brackets, run side by side."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._checks import Constraint, Integer, Real
from ..engine._interface import Decision, TrialRequest
from ..engine._seeds import search_rng, trial_index, trial_name
from ._base import Searcher
from ._ranking import ranked
from ._space import sample_config


@dataclass
class _Bracket:
    """Successive halving of one bracket: ``rung_epochs[k]`` epochs keep ``keep[k]`` trials."""

    s: int
    rung_epochs: list[int]
    keep: list[int]
    members: list[set[int]] = field(default_factory=list)       # rung -> trials that train to it
    values: list[dict[int, float]] = field(default_factory=list)  # rung -> trial -> value there
    decided: list[bool] = field(default_factory=list)


class Hyperband(Searcher):
    """Hyperband (Li et al., "Hyperband: A Novel Bandit-Based Approach to Hyperparameter
    Optimization", JMLR 2018).

    With ``s_max = floor(log_eta(max_epochs))``, bracket ``s`` (from ``s_max`` down to 0)
    starts ``ceil((s_max + 1) / (s + 1) * eta**s)`` configurations with
    ``max_epochs * eta**-s`` epochs each; at every rung the top ``1/eta`` (``floor(n_i /
    eta)`` trials) continue, from their current state, with ``eta`` times the epochs,
    until ``max_epochs``. For ``max_epochs=81, eta=3`` that is the paper's table: brackets of
    81, 34, 15, 8 and 5 trials.

    All brackets run at once ("on the diagonal", as MADlib does): while one bracket waits
    for the last trial of a rung, the others keep the workers busy. A rung is decided only
    once all its trials have reported (or ended), so decisions never depend on timing.

    Example:
        >>> import cerebro as cb
        >>> from cerebro.demo import build, load_data     # an MLP or a small CNN on the 8x8 digits
        >>> space = {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.loguniform(1e-4, 1e-2), "batch_size": 32}
        >>> search = cb.Hyperband(build, space, max_epochs=9, eta=3, metric="val_accuracy", mode="max")
        >>> result = search.fit(load_data(), workers=2, seed=0)
        >>> result.best.metrics["val_accuracy"] > 0.5
        True
    """

    cannot_extend: ClassVar[str] = (
        "its brackets and rungs are sized by max_epochs, so with another budget other trials would have run")
    cannot_multi_objective: ClassVar[str] = "it keeps the trials that rank best in each bracket on one metric"
    _parameters: ClassVar[dict[str, Constraint]] = {"max_epochs": Integer(low=1), "eta": Real(low=2)}

    def __init__(self, build: Callable, space: Mapping[str, Any], *, max_epochs: int = 81, eta: float = 3,
                 metric: str = "val_loss", mode: str = "min",
                 patience: int | None = None, min_delta: float = 0.0,
                 warm_start: Any = None, warm_start_epoch: str = "best") -> None:
        """Store the arguments as given; they are checked once every constructor has run."""
        super().__init__(build, space, metric=metric, mode=mode, patience=patience, min_delta=min_delta,
                         warm_start=warm_start, warm_start_epoch=warm_start_epoch)
        self.max_epochs = max_epochs
        self.eta = eta

    def brackets(self) -> list[_Bracket]:
        """The brackets, largest first, with their rungs and how many trials each rung keeps."""
        eta = float(self.eta)        # a numpy integer eta cannot be raised to a negative power
        s_max = 0
        while eta ** (s_max + 1) <= self.max_epochs:
            s_max += 1
        brackets = []
        for s in range(s_max, -1, -1):
            n = math.ceil((s_max + 1) / (s + 1) * eta ** s - 1e-9)
            brackets.append(_Bracket(s, [max(1, round(self.max_epochs * eta ** (i - s))) for i in range(s + 1)],
                                     [math.floor(n * eta ** -i + 1e-9) for i in range(s + 1)]))
        return brackets

    def start(self, seed: int) -> None:
        """Draw from the run's ``seed``; the brackets are still to be filled."""
        self._rng = search_rng(seed)
        self._brackets = self.brackets()
        self._bracket_of: dict[int, _Bracket] = {}
        self._pending = True
        self._ended: set[int] = set()
        self._reasons: dict[int, str] = {}

    def suggest(self) -> list[TrialRequest]:
        """Every bracket's first rung at once, largest bracket first; nothing after that."""
        if not self._pending:
            return []
        self._pending = False
        requests = []
        for bracket in self._brackets:
            first = len(self._bracket_of)
            bracket.members = [set(range(first, first + bracket.keep[0]))] + [set() for _ in bracket.keep[1:]]
            bracket.values = [{} for _ in bracket.keep]
            bracket.decided = [False for _ in bracket.keep]
            for index in bracket.members[0]:
                self._bracket_of[index] = bracket
            # Every trial may train to max_epochs: a survivor goes on from its state, never from scratch.
            requests += [TrialRequest(sample_config(self.space, self._rng), self.max_epochs)
                         for _ in bracket.members[0]]
        return requests

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """Pause a trial at each rung of its bracket below ``max_epochs``; go on between them."""
        index = trial_index(trial_id)
        bracket = self._bracket_of[index]
        if epoch not in bracket.rung_epochs[:-1]:
            return Decision.CONTINUE
        bracket.values[bracket.rung_epochs.index(epoch)][index] = metrics[self.metric]
        return Decision.PAUSE

    def decide(self) -> dict[str, Decision]:
        """Decide each rung whose trials have all reported or ended: the top ones go on."""
        decisions = {}
        for bracket in self._brackets:
            for rung in range(len(bracket.rung_epochs) - 1):
                values, members = bracket.values[rung], bracket.members[rung]
                if bracket.decided[rung] or (rung > 0 and not bracket.decided[rung - 1]) or any(
                        m not in values and m not in self._ended for m in members):
                    continue            # decided already, not reached yet, or still training
                order = ranked(values, self.mode)
                keep = order[:bracket.keep[rung + 1]]
                bracket.members[rung + 1], bracket.decided[rung] = set(keep), True
                for rank, index in enumerate(order):
                    decisions[trial_name(index)] = Decision.CONTINUE if index in keep else Decision.STOP
                    if index not in keep:
                        self._reasons[index] = (
                            f"stopped at rung {rung} (epoch {bracket.rung_epochs[rung]}) of bracket {bracket.s}: "
                            f"ranked {rank + 1} of {len(order)}, only the top {bracket.keep[rung + 1]} go on")
        return decisions

    def trial_ended(self, trial_id: str, status: str) -> None:
        """A trial that ended no longer holds up its rung's decision."""
        self._ended.add(trial_index(trial_id))

    def stop_reason(self, trial_id: str) -> str | None:
        """The rung and bracket a stopped trial was stopped at, its rank and how many went on."""
        return self._reasons.get(trial_index(trial_id))

    def state(self) -> dict[str, Any]:
        """Every bracket's rungs, how many each keeps, and the values reported there."""
        return {"brackets": [{"s": b.s, "rung_epochs": b.rung_epochs, "keep": b.keep,
                              "rungs": [{trial_name(i): v for i, v in sorted(values.items())} for values in b.values]}
                             for b in self._brackets]}
