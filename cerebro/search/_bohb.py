"""BOHB: asynchronous successive halving whose new trials a TPE density model proposes."""
from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .._checks import Constraint, Integer, Optional, Real
from ..engine._interface import Decision, TrialRequest
from ..engine._seeds import proposal_rng, trial_index, trial_name
from ._base import Searcher
from ._configs import leaves
from ._optuna_params import optuna_params
from ._rungs import Rungs
from ._space import choice, sample_config
from ._tpe import _optuna_distribution, _suggest


class Proposal(enum.Enum):
    """How a trial's config was proposed."""

    STARTUP = "startup"            # one of the first n_startup_trials: drawn at random
    TOO_FEW = "too few points"     # no rung had enough results for the model yet: drawn at random
    RANDOM = "random"              # the random_fraction drawn at random whatever the model
    MODEL = "model"                # TPE, fitted on the results at one rung (or max_epochs)


class BOHB(Searcher):
    """BOHB (Falkner et al., "BOHB: Robust and Efficient Hyperparameter Optimization at
    Scale", ICML 2018), asynchronous as Syne Tune and Ray Tune run it: the trials of
    asynchronous successive halving (rungs at ``grace_period * reduction_factor**k`` epochs
    below ``max_epochs``, judged as :class:`ASHA` judges them, keeping the top
    ``floor(n / reduction_factor)`` of the ``n`` trials at a rung, at least one, as successive
    halving does), whose configurations a density model proposes.

    The trials drawn at random and those the model proposed are judged at each rung among
    their own kind: two successive halvings sharing the workers. So the random draws are an
    ASHA of their own, which proposals that look good early cannot crowd out where early
    epochs mislead (learning curves that cross); BENCHMARKS.md measures it (mean regret on
    LCBench task 167184 8.7 with one rung for both, 3.9 with two).

    The model is Optuna's multivariate TPE (Bergstra et al., NeurIPS 2011), a density model of
    the kind BOHB fits, on the configurations at the highest rung (or ``max_epochs``) that at
    least ``min_points_in_model`` trials reached (default: the number of hyperparameters + 1),
    with their metric there, and on those stopped before it, ranked below them (as Optuna ranks
    pruned trials): without them every configuration the model saw at a high rung would be a
    good one. The first ``n_startup_trials``, those proposed while no rung has enough results,
    and a fraction ``random_fraction`` of the others are drawn at random. At most
    ``max_concurrent`` trials are live at once.

    Reproducible by construction: trial ``i`` sees the results at epoch ``L`` of the trials
    ``0 .. i - 1 - (max_concurrent - 1) * L // grace_period`` (while one trial trains ``L``
    epochs, the others live beside it can start at most that many), and is proposed once each
    of them has reached epoch ``L`` or ended, so that what it sees is final; its random draws
    come from the run seed and ``i``. So timing and the number of workers never change which
    configurations are tried or which trials go on; ``max_concurrent`` does. With
    ``max_concurrent=1`` each trial sees every trial before it, as sequential BOHB does.

    Example:
        >>> import cerebro as cb
        >>> from cerebro.demo import build, load_data     # an MLP or a small CNN on the 8x8 digits
        >>> space = {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.loguniform(1e-4, 1e-2), "batch_size": 32}
        >>> search = cb.BOHB(build, space, num_trials=8, max_epochs=4, grace_period=1, reduction_factor=2,
        ...                  max_concurrent=4, n_startup_trials=4, metric="val_accuracy", mode="max")
        >>> result = search.fit(load_data(), workers=2, seed=0)
        >>> result.best.metrics["val_accuracy"] > 0.5
        True
    """

    cannot_extend: ClassVar[str] = (
        "its rungs are placed by max_epochs, so with another budget other trials would have been promoted, and "
        "its model proposed other configurations from their results")
    cannot_multi_objective: ClassVar[str] = "it promotes the trials that rank best at each rung on one metric"
    _parameters: ClassVar[dict[str, Constraint]] = {
        "num_trials": Integer(low=1), "max_epochs": Integer(low=1), "grace_period": Integer(low=1),
        "reduction_factor": Real(low=2), "max_concurrent": Integer(low=1), "n_startup_trials": Integer(low=0),
        "min_points_in_model": Optional(Integer(low=1)), "random_fraction": Real(low=0, high=1)}

    def __init__(self, build: Callable, space: Mapping[str, Any], *, num_trials: int = 50,
                 max_epochs: int = 27, grace_period: int = 1, reduction_factor: float = 3,
                 max_concurrent: int = 8, n_startup_trials: int = 10, min_points_in_model: int | None = None,
                 random_fraction: float = 1 / 3, metric: str = "val_loss", mode: str = "min",
                 patience: int | None = None, min_delta: float = 0.0,
                 warm_start: Any = None, warm_start_epoch: str = "best") -> None:
        """Store the arguments as given; they are checked once every constructor has run."""
        super().__init__(build, space, metric=metric, mode=mode, patience=patience, min_delta=min_delta,
                         warm_start=warm_start, warm_start_epoch=warm_start_epoch)
        self.num_trials = num_trials
        self.max_epochs = max_epochs
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.max_concurrent = max_concurrent
        self.n_startup_trials = n_startup_trials
        self.min_points_in_model = min_points_in_model
        self.random_fraction = random_fraction

    def _check(self) -> None:
        """The first rung cannot lie beyond ``max_epochs``, and Optuna must be able to sample the space."""
        if self.grace_period > self.max_epochs:
            raise ValueError(f"grace_period={self.grace_period!r} must be at most max_epochs={self.max_epochs!r}")
        for path, primitive in leaves(self.space):
            if not (isinstance(primitive, choice) and primitive.branches):   # a branch: its index
                try:
                    _optuna_distribution(".".join(path), primitive)
                except ValueError as error:      # TPESearch's check, in its words: name this searcher
                    raise ValueError(str(error).replace("TPESearch", type(self).__name__, 1)) from None

    def start(self, seed: int) -> None:
        """Empty rungs for a run whose seed is ``seed``; no trial proposed yet."""
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._seed = seed
        # The top floor(n / reduction_factor) go on (at least one), as in successive halving:
        # measured (BENCHMARKS.md) it reaches lower regret than ASHA's ceil at every share of the budget.
        self._rungs = {drawn: Rungs(self.grace_period, self.reduction_factor, self.max_epochs, self.mode, strict=True)
                       for drawn in (True, False)}         # drawn at random -> its rungs
        self._epochs = self._rungs[True].epochs
        levels = [*self._epochs, self.max_epochs]
        self._levels: dict[int, dict[int, float]] = {level: {} for level in levels}   # -> trial -> its metric there
        # Trial i sees a level's results of trials 0 .. i - lag: while one trial trains `level`
        # epochs, each of the others live beside it starts at most level // grace_period trials,
        # so waiting for them seldom holds up a worker (and one trial at a time waits for none).
        self._lags = {level: (self.max_concurrent - 1) * level // self.grace_period + 1 for level in levels}
        self._settled = dict.fromkeys(levels, 0)     # per level: trials 0 .. settled - 1 reached it or ended
        self._ended: set[int] = set()
        self._configs: list[dict[str, Any]] = []
        self._proposals: list[dict[str, Any]] = []     # per trial: how it was proposed, as state() shows it
        self._studies: dict[int, Any] = {}      # level -> Optuna's in-memory study of the results there
        self._told = dict.fromkeys(levels, 0)   # per level: trials 0 .. told - 1 are in its study

    def suggest(self) -> list[TrialRequest]:
        """Propose the next trial while fewer than ``max_concurrent`` are live and the results
        it sees are all in (:meth:`_ready`), until ``num_trials`` were proposed."""
        requests = []
        while len(self._configs) < self.num_trials and self._live() < self.max_concurrent \
                and self._ready(len(self._configs)):
            index = len(self._configs)
            self._configs.append(self._propose(index))
            self._rungs_of(index).started(index)
            requests.append(TrialRequest(self._configs[-1], self.max_epochs))
        return requests

    def _ready(self, index: int) -> bool:
        """Whether, at every level, each trial whose result there trial ``index`` sees (trials
        ``0 .. index - lag``) has reached it or ended: then what it sees is final, whatever the timing."""
        for level, lag in self._lags.items():
            settled = self._settled[level]
            while settled <= index - lag and (settled in self._ended or settled in self._levels[level]):
                settled += 1
            self._settled[level] = settled
            if settled <= index - lag:
                return False
        return True

    def _propose(self, index: int) -> dict[str, Any]:
        """Trial ``index``'s config, from the results it sees and a generator of its own;
        records how it was proposed."""
        import optuna
        rng = proposal_rng(self._seed, index)
        coin, sampler_seed = rng.random(), int(rng.integers(2**31))
        level = self._level(index)
        if index < self.n_startup_trials or level is None or coin < self.random_fraction:
            how = Proposal.STARTUP if index < self.n_startup_trials else \
                Proposal.TOO_FEW if level is None else Proposal.RANDOM
            self._proposals.append({"by": how.value})
            return sample_config(self.space, rng)
        study = self._study(level, index, sampler_seed)
        told = [t.state.name for t in study.get_trials(deepcopy=False)]
        self._proposals.append({"by": Proposal.MODEL.value, "epoch": level, "points": told.count("COMPLETE"),
                                "stopped": told.count("PRUNED")})
        trial = study.ask()
        config = {key: _suggest(trial, value, key) for key, value in self.space.items()}
        study.tell(trial, state=optuna.trial.TrialState.FAIL)      # asked, not observed: TPE leaves it out
        return config

    def _observed(self, level: int, index: int) -> dict[int, float]:
        """The finite results at epoch ``level`` that trial ``index`` sees: trial -> metric."""
        last = index - self._lags[level]
        return {i: value for i, value in sorted(self._levels[level].items()) if i <= last and math.isfinite(value)}

    def _level(self, index: int) -> int | None:
        """The highest rung (or ``max_epochs``) at which trial ``index`` sees at least
        ``min_points_in_model`` results; None while none has."""
        needed = self.min_points_in_model or len(leaves(self.space)) + 1
        return next((level for level in sorted(self._levels, reverse=True)
                     if len(self._observed(level, index)) >= needed), None)

    def _study(self, level: int, index: int, seed: int) -> Any:
        """The study of the results at epoch ``level`` with every trial that trial ``index``
        sees there told (in index order, each once), and a multivariate TPE sampler seeded
        with ``seed``: nothing but they and the seed decide what it proposes.

        A trial that ended before ``level`` is told as pruned, with its results at the rungs it
        reached, so TPE ranks it below every trial that reached the level (as Optuna ranks its
        pruned trials): the trials at a high rung are all good ones, and without the others
        TPE's density of the bad configurations would lie on the good region."""
        import optuna
        from optuna.trial import TrialState, create_trial
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)   # multivariate, group
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=0, multivariate=True, group=True,
                                                 constant_liar=False)
        if level not in self._studies:
            self._studies[level] = optuna.create_study(direction="minimize" if self.mode == "min" else "maximize",
                                                       sampler=sampler)
        study = self._studies[level]
        study.sampler = sampler
        for i in range(self._told[level], index - self._lags[level] + 1):
            params, distributions = optuna_params(self.space, self._configs[i])
            if i in self._levels[level]:
                if math.isfinite(self._levels[level][i]):
                    study.add_trial(create_trial(params=params, distributions=distributions,
                                                 value=self._levels[level][i]))
                continue
            curve = {epoch: values[i] for epoch, values in self._levels.items()
                     if epoch < level and i in values and math.isfinite(values[i])}
            if curve:           # a trial that failed before its first rung tells nothing
                study.add_trial(create_trial(state=TrialState.PRUNED, params=params, distributions=distributions,
                                             intermediate_values=curve))
        self._told[level] = max(self._told[level], index - self._lags[level] + 1)
        return study

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """Keep the epoch's metric where the model may be fitted on it (a rung or ``max_epochs``);
        at a rung, go on, stop or wait as ASHA does."""
        index, value = trial_index(trial_id), metrics[self.metric]
        if epoch in self._levels:
            self._levels[epoch][index] = float(value)
        return self._rungs_of(index).report(index, epoch, value)

    def decide(self) -> dict[str, Decision]:
        """Decisions for waiting trials whose older peers have all reached the rung or ended."""
        both = {**self._rungs[True].decide(), **self._rungs[False].decide()}
        return dict(sorted(both.items(), key=lambda item: trial_index(item[0])))

    def continues_after(self, trial_id: str, epoch: int) -> bool:
        """Between rungs a trial goes on whatever its metrics."""
        return epoch not in self._epochs

    def trial_ended(self, trial_id: str, status: str) -> None:
        """A trial that ended no longer holds up younger ones at its next rung, nor the next proposals."""
        index = trial_index(trial_id)
        self._rungs_of(index).ended(index)
        self._ended.add(index)

    def stop_reason(self, trial_id: str) -> str | None:
        """The rung a stopped trial was stopped at, its rank and how many went on."""
        index = trial_index(trial_id)
        reason = self._rungs_of(index).reason(index)
        kind = "trials drawn at random" if self._drawn(index) else "trials the model proposed"
        return None if reason is None else f"{reason}, among the {kind}"

    def state(self) -> dict[str, Any]:
        """How each trial was proposed (by the model: fitted at which epoch, on how many
        results), and the waiting trials and every rung's values of each kind."""
        return {"created": len(self._configs),
                "proposals": {trial_name(i): p for i, p in enumerate(self._proposals)},
                "drawn": self._rungs[True].state(), "proposed": self._rungs[False].state()}

    def _drawn(self, index: int) -> bool:
        """Whether trial ``index`` was drawn at random (not proposed by the model)."""
        return self._proposals[index]["by"] != Proposal.MODEL.value

    def _rungs_of(self, index: int) -> Rungs:
        """The rungs trial ``index`` is judged at: its own kind's."""
        return self._rungs[self._drawn(index)]

    def _live(self) -> int:
        """Trials started and not ended, of both kinds."""
        return len(self._rungs[True].live) + len(self._rungs[False].live)
