"""TPE: Optuna's Tree-structured Parzen Estimator, fed by MOP trials."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..engine import Decision, TrialRequest, search_rng, trial_index, trial_name
from ._base import Searcher, check_epochs
from ._space import Distribution, choice, loguniform, plain_value, quniform, randint, uniform


def _optuna_distribution(key: str, primitive: Distribution) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    if isinstance(primitive, uniform):
        return FloatDistribution(primitive.low, primitive.high)
    if isinstance(primitive, loguniform):
        return FloatDistribution(primitive.low, primitive.high, log=True)
    if isinstance(primitive, randint):
        return IntDistribution(primitive.low, primitive.high - 1)
    if isinstance(primitive, quniform):
        return FloatDistribution(math.ceil(primitive.low / primitive.q) * primitive.q,
                                 math.floor(primitive.high / primitive.q) * primitive.q, step=primitive.q)
    if isinstance(primitive, choice):
        for value in primitive.values:
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise ValueError(f"TPESearch cannot sample space[{key!r}]={primitive!r}: its value {value!r} is "
                                 f"not a number, string, bool or None (choose a name and map it inside build)")
        return CategoricalDistribution(list(primitive.values))
    raise ValueError(f"TPESearch cannot sample space[{key!r}]={primitive!r}; use cb.choice, cb.uniform, "
                     f"cb.loguniform, cb.randint or cb.quniform")


class TPESearch(Searcher):
    """Bayesian optimisation with the Tree-structured Parzen Estimator (Bergstra et al.,
    "Algorithms for Hyper-Parameter Optimization", NeurIPS 2011), Optuna's ``TPESampler``
    through its ask/tell interface, seeded from the run seed.

    ``num_trials`` trials train ``epochs`` each, ``max_concurrent`` at once (MOP needs
    several per worker to keep them busy); each is told its last epoch's ``metric``. The
    first ``n_startup_trials`` are random.

    Reproducible by construction: trial ``i`` is drawn after exactly the results of trials
    ``0 .. i - max_concurrent`` were told, in id order, so timing and the number of workers
    never change which configurations are tried; ``max_concurrent`` does.

    Example:
        >>> space = {"lr": cb.loguniform(1e-4, 1e-1), "hidden": cb.choice([64, 256])}
        >>> result = cb.TPESearch(build, space, num_trials=32, epochs=5).fit(data, seed=0)
    """

    def __init__(self, build: Callable, space: Mapping[str, Any], *, num_trials: int = 20, epochs: int = 10,
                 max_concurrent: int = 8, n_startup_trials: int = 10, metric: str = "val_loss",
                 mode: str = "min") -> None:
        super().__init__(build, space, metric=metric, mode=mode)
        self.num_trials = num_trials
        self.epochs = epochs
        self.max_concurrent = max_concurrent
        self.n_startup_trials = n_startup_trials

    def _check(self) -> None:
        check_epochs("num_trials", self.num_trials)
        check_epochs("epochs", self.epochs)
        check_epochs("max_concurrent", self.max_concurrent)
        if isinstance(self.n_startup_trials, bool) or not isinstance(self.n_startup_trials, int) \
                or self.n_startup_trials < 0:
            raise ValueError(f"n_startup_trials={self.n_startup_trials!r} must be an integer >= 0")
        self._distributions()

    def _distributions(self) -> dict[str, Any]:
        return {key: _optuna_distribution(key, value) for key, value in self.space.items()
                if isinstance(value, Distribution)}

    def _settings(self) -> dict[str, Any]:
        return {"num_trials": self.num_trials, "epochs": self.epochs, "max_concurrent": self.max_concurrent,
                "n_startup_trials": self.n_startup_trials}

    def start(self, seed: int) -> None:
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=int(search_rng(seed).integers(2**31)),
                                             n_startup_trials=self.n_startup_trials)
        self._study = optuna.create_study(direction="minimize" if self.mode == "min" else "maximize",
                                          sampler=sampler)
        self._asked = self._told = 0
        self._last: dict[int, float] = {}             # trial -> its latest value
        self._results: dict[int, float | None] = {}   # ended trials not told yet: value, or None if it failed

    def suggest(self) -> list[TrialRequest]:
        from optuna.trial import TrialState
        requests = []
        while self._asked < self.num_trials or self._told in self._results:
            if self._asked < self.num_trials and self._told >= self._asked - self.max_concurrent + 1:
                requests.append(TrialRequest(self._ask(), self.epochs))
            elif self._told in self._results:
                value = self._results.pop(self._told)
                if value is None:
                    self._study.tell(self._told, state=TrialState.FAIL)
                else:
                    self._study.tell(self._told, value)
                self._told += 1
            else:
                break           # trial `asked` must see exactly one more result, not there yet
        return requests

    def _ask(self) -> dict[str, Any]:
        trial = self._study.ask(self._distributions())
        self._asked += 1
        config = {}
        for key, value in self.space.items():
            if not isinstance(value, Distribution):
                config[key] = plain_value(value, key)
            elif isinstance(value, quniform):    # Optuna's float steps carry rounding noise
                config[key] = float(round(trial.params[key] / value.q) * value.q)
            else:
                config[key] = plain_value(trial.params[key], key)
        return config

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        self._last[trial_index(trial_id)] = metrics[self.metric]
        return Decision.CONTINUE

    def trial_ended(self, trial_id: str, status: str) -> None:
        index = trial_index(trial_id)
        value = self._last.pop(index, None)
        self._results[index] = value if status == "completed" and value is not None and math.isfinite(value) else None

    def state(self) -> dict[str, Any]:
        told = [t for t in self._study.trials if t.state.is_finished()]
        return {"asked": self._asked,
                "told": [{"trial_id": trial_name(t.number), "state": t.state.name, "value": t.value} for t in told]}
