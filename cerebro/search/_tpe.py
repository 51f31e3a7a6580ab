"""TPE: Optuna's Tree-structured Parzen Estimator, fed by MOP trials."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .._checks import Constraint, Integer, Optional, Real
from ..engine._interface import Decision, TrialRequest
from ..engine._seeds import search_rng, trial_index, trial_name
from ._base import Searcher
from ._configs import leaves
from ._rungs import Rungs
from ._space import Distribution, choice, loguniform, plain_value, quniform, randint, uniform


def _optuna_distribution(key: str, primitive: Distribution) -> Any:
    """Optuna's distribution for ``space[key]``; a ValueError for a primitive or a choice
    value Optuna cannot store. ``randint``'s exclusive ``high`` becomes Optuna's inclusive
    one, ``quniform``'s bounds the outermost multiples of ``q`` inside them."""
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


def _suggest(trial: Any, node: Any, name: str) -> Any:
    """``node``'s value in Optuna's ``trial``, asked for as ``name``: a choice among dicts asks
    for a branch's index, then for that branch's keys as ``name[index].key``, so each
    branch's parameters are its own and TPE learns them from the trials that took it."""
    if isinstance(node, Mapping):
        return {key: _suggest(trial, value, f"{name}.{key}") for key, value in node.items()}
    if isinstance(node, choice) and node.branches:
        index = trial.suggest_categorical(name, list(range(len(node.values))))
        return _suggest(trial, node.values[index], f"{name}[{index}]")
    if not isinstance(node, Distribution):
        return plain_value(node, name)
    distribution = _optuna_distribution(name, node)
    if hasattr(distribution, "choices"):
        value = trial.suggest_categorical(name, distribution.choices)
    elif distribution.__class__.__name__ == "IntDistribution":
        value = trial.suggest_int(name, distribution.low, distribution.high)
    else:
        value = trial.suggest_float(name, distribution.low, distribution.high, log=distribution.log,
                                    step=distribution.step)
    if isinstance(node, quniform):    # Optuna's float steps carry rounding noise
        return float(round(value / node.q) * node.q)
    return plain_value(value, name)


class TPESearch(Searcher):
    """Bayesian optimisation with the Tree-structured Parzen Estimator (Bergstra et al.,
    "Algorithms for Hyper-Parameter Optimization", NeurIPS 2011), Optuna's ``TPESampler``
    through its ask/tell interface, seeded from the run seed.

    ``num_trials`` trials train ``epochs`` each, ``max_concurrent`` at once (MOP needs
    several per worker to keep them busy); each is told its last epoch's ``metric``. The
    first ``n_startup_trials`` are random.

    With ``grace_period`` set, trials are also pruned by ASHA's rule (see :class:`ASHA`):
    at rungs ``grace_period * reduction_factor**k`` a trial goes on only if it ranks in the
    top ``1/reduction_factor`` of the trials that reached the rung; TPE is told a pruned
    trial as ``PRUNED`` with its per-epoch values, as Optuna's own pruners do.

    With several metrics (``metric=["val_accuracy", "params"]``, ``mode=["max", "min"]``),
    Optuna's multi-objective TPE (Ozaki et al., "Multiobjective Tree-Structured Parzen
    Estimator", JAIR 2022) searches for their Pareto front (``result.pareto()``): each trial
    is told its last epoch's value of every metric. Pruning ranks trials on one metric, so it
    is refused there (``grace_period`` stays None), as Optuna's pruners refuse
    multi-objective studies; ``patience`` watches the first metric.

    Reproducible by construction: trial ``i`` is drawn after exactly the results of trials
    ``0 .. i - max_concurrent`` were told, in id order, so timing and the number of workers
    never change which configurations are tried; ``max_concurrent`` does.

    Example:
        >>> import cerebro as cb
        >>> from cerebro.demo import build, load_data     # an MLP or a small CNN on the 8x8 digits
        >>> space = {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.loguniform(1e-4, 1e-2),
        ...          "batch_size": cb.choice([32, 64])}
        >>> search = cb.TPESearch(build, space, num_trials=8, epochs=3, max_concurrent=4, n_startup_trials=4,
        ...                       metric="val_accuracy", mode="max")
        >>> result = search.fit(load_data(), workers=2, seed=0)
        >>> result.best.metrics["val_accuracy"] > 0.5
        True
    """

    cannot_extend: ClassVar[str] = (
        "each trial it suggested was drawn from the metrics the trials before it ended with, which a longer "
        "budget changes")
    cannot_multi_objective: ClassVar[str] = ""      # Optuna's TPE samples for several objectives
    _parameters: ClassVar[dict[str, Constraint]] = {
        "num_trials": Integer(low=1), "epochs": Integer(low=1), "max_concurrent": Integer(low=1),
        "n_startup_trials": Integer(low=0), "grace_period": Optional(Integer(low=1)), "reduction_factor": Real(low=2)}

    def __init__(self, build: Callable, space: Mapping[str, Any], *, num_trials: int = 20, epochs: int = 10,
                 max_concurrent: int = 8, n_startup_trials: int = 10, grace_period: int | None = None,
                 reduction_factor: float = 3, metric: str | list[str] = "val_loss", mode: str | list[str] = "min",
                 patience: int | None = None, min_delta: float = 0.0,
                 warm_start: Any = None, warm_start_epoch: str = "best") -> None:
        """Store the arguments as given; they are checked once every constructor has run."""
        super().__init__(build, space, metric=metric, mode=mode, patience=patience, min_delta=min_delta,
                         warm_start=warm_start, warm_start_epoch=warm_start_epoch)
        self.num_trials = num_trials
        self.epochs = epochs
        self.max_concurrent = max_concurrent
        self.n_startup_trials = n_startup_trials
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor

    def _check(self) -> None:
        """The first rung cannot lie beyond ``epochs``, no pruning on several metrics, and Optuna
        must be able to sample the space."""
        if self.grace_period is not None and self.grace_period > self.epochs:
            raise ValueError(f"grace_period={self.grace_period!r} must be at most epochs={self.epochs!r}")
        if self.grace_period is not None and len(self.objectives()) > 1:
            raise ValueError(f"grace_period={self.grace_period!r} prunes trials by their rank on one metric, and "
                             f"metric={self.metric!r} has {len(self.objectives())}: Optuna's pruners refuse "
                             f"multi-objective studies too; leave grace_period=None to search for the Pareto front")
        for path, primitive in leaves(self.space):
            if not (isinstance(primitive, choice) and primitive.branches):   # a branch: its index
                _optuna_distribution(".".join(path), primitive)

    def start(self, seed: int) -> None:
        """A fresh Optuna study whose TPE sampler is seeded from the run's ``seed``; nothing
        asked or told yet; rungs for pruning when ``grace_period`` is set."""
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=int(search_rng(seed).integers(2**31)),
                                             n_startup_trials=self.n_startup_trials)
        self._study = optuna.create_study(directions=["minimize" if o.mode == "min" else "maximize"
                                                      for o in self.objectives()], sampler=sampler)
        self._asked = self._told = 0
        self._open: dict[int, Any] = {}               # trial -> its Optuna trial, until told
        # trial -> epoch -> the value of each objective, until told
        self._curves: dict[int, dict[int, tuple[float, ...]]] = {}
        self._ended: dict[int, str] = {}              # ended trials not told yet -> their status
        # No rungs below `epochs` when grace_period is None: no pruning.
        self._rungs = Rungs(self.grace_period or self.epochs, self.reduction_factor, self.epochs,
                            self.objectives()[0].mode)

    def suggest(self) -> list[TrialRequest]:
        """Tell ended trials in id order and ask new ones, each after exactly the results of
        the trials ``max_concurrent`` or more before it were told."""
        requests = []
        while self._asked < self.num_trials or self._told in self._ended:
            if self._asked < self.num_trials and self._told >= self._asked - self.max_concurrent + 1:
                requests.append(TrialRequest(self._ask(), self.epochs))
            elif self._told in self._ended:
                self._tell(self._told, self._ended.pop(self._told))
                self._told += 1
            else:
                break           # trial `asked` must see exactly one more result, not there yet
        return requests

    def _tell(self, index: int, status: str) -> None:
        """Tell Optuna how trial ``index`` ended: a completed one its last epoch's value of each
        objective (one: with its per-epoch values, as a pruned one), a stopped one ``PRUNED``,
        any other (or a non-finite value) ``FAIL``."""
        from optuna.trial import TrialState
        trial, curve = self._open.pop(index), self._curves.pop(index, {})
        single = len(self._study.directions) == 1
        for epoch, values in sorted(curve.items()):
            if single and math.isfinite(values[0]):     # Optuna keeps intermediate values of one objective only
                trial.report(values[0], epoch)
        final = curve[max(curve)] if curve else (math.nan,)
        if status == "completed" and all(math.isfinite(value) for value in final):
            self._study.tell(trial, final[0] if single else list(final))
        elif status == "stopped":
            self._study.tell(trial, state=TrialState.PRUNED)
        else:
            self._study.tell(trial, state=TrialState.FAIL)

    def _ask(self) -> dict[str, Any]:
        """Ask Optuna for the next trial's parameters, define-by-run, and return its config,
        constants included, as plain values (``quniform`` values snapped to their multiple of ``q``)."""
        trial = self._study.ask()
        self._open[self._asked] = trial
        self._rungs.started(self._asked)
        self._asked += 1
        return {key: _suggest(trial, value, key) for key, value in self.space.items()}

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """Record the epoch's value for Optuna; at a rung, go on, stop or wait as ASHA does."""
        index = trial_index(trial_id)
        # The other objectives' may be missing (an objective function that did not give one):
        # such a trial is told as failed, not the run.
        first, *others = self.objectives()
        values = (metrics[first.metric], *(metrics.get(o.metric, math.nan) for o in others))
        self._curves.setdefault(index, {})[epoch] = values
        return self._rungs.report(index, epoch, values[0])

    def decide(self) -> dict[str, Decision]:
        """Decisions for trials waiting at a rung whose older peers have all reached it or ended."""
        return self._rungs.decide()

    def continues_after(self, trial_id: str, epoch: int) -> bool:
        """Between rungs a trial goes on whatever its metrics."""
        return epoch not in self._rungs.epochs

    def trial_ended(self, trial_id: str, status: str) -> None:
        """Hold the ended trial's ``status`` until its turn to be told, in id order."""
        index = trial_index(trial_id)
        self._rungs.ended(index)
        self._ended[index] = status

    def stop_reason(self, trial_id: str) -> str | None:
        """The rung a pruned trial was stopped at, its rank and how many went on."""
        return self._rungs.reason(trial_index(trial_id))

    def state(self) -> dict[str, Any]:
        """How many trials were asked, every told trial's state and value (``values``, one per
        objective, with several), and the rungs."""
        # Not study.trials, which deep-copies every trial: 70 ms an ask at 1,000 trials.
        told = [t for t in self._study.get_trials(deepcopy=False) if t.state.is_finished()]
        key = "value" if len(self._study.directions) == 1 else "values"
        return {"asked": self._asked,
                "told": [{"trial_id": trial_name(t.number), "state": t.state.name,
                          key: t.value if key == "value" else t.values} for t in told],
                **self._rungs.state()}
