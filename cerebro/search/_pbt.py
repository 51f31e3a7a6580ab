"""Population based training: the worst trials copy the best ones' state and explore."""
from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar

from .._checks import All, Constraint, Integer, Items, Optional, Real
from ..engine._interface import Decision, Exploit, TrialRequest
from ..engine._seeds import search_rng, trial_index, trial_name
from ._base import Searcher
from ._configs import leaves, primitive_at
from ._ranking import ranked
from ._space import Distribution, choice, loguniform, quniform, randint, sample_config, uniform


class PBT(Searcher):
    """Population based training (Jaderberg et al., "Population Based Training of Neural
    Networks", arXiv:1711.09846, 2017).

    ``population`` trials train together, each for ``epochs``. Every ``perturbation_interval``
    epochs each waits until the whole population reached that epoch; then each trial in the
    bottom ``quantile_fraction`` (by the objective) *exploits* a trial of the top quantile,
    drawn at random: it copies its state (weights and optimizer state, bitwise) and its
    config, and *explores*: each key in ``mutations`` is resampled from the space with
    probability ``resample_probability``, else scaled by 0.8 or 1.2 (``cb.choice``: moved to
    a neighbouring value), and kept inside the space's bounds. The new learning rate, weight
    decay, ... take effect in the live optimizer's parameter groups. A trial keeps its id;
    :meth:`cerebro.Result.lineage` lists every exploit.

    In a nested space a trial stays in its branch: the keys of another branch are not
    its own and a choice among dicts is never mutated; a key inside a dict is named by its
    path, ``"optimizer.lr"``.

    Args:
        mutations: keys of the space to explore (dotted paths inside nested dicts); default:
            every ``cb.uniform`` and ``cb.loguniform`` key, at any depth.

    Example:
        >>> import cerebro as cb
        >>> from cerebro.demo import build, load_data     # an MLP or a small CNN on the 8x8 digits
        >>> space = {"architecture": "mlp", "lr": cb.loguniform(1e-4, 1e-2), "batch_size": 32}
        >>> search = cb.PBT(build, space, population=4, epochs=6, perturbation_interval=2,
        ...                 metric="val_accuracy", mode="max")
        >>> result = search.fit(load_data(), workers=2, seed=0)
        >>> result.best.metrics["val_accuracy"] > 0.5
        True
    """

    cannot_extend: ClassVar[str] = ""
    cannot_multi_objective: ClassVar[str] = "it replaces the trials that rank worst on one metric by the best ones"
    _parameters: ClassVar[dict[str, Constraint]] = {
        "population": All(Integer(low=1), Integer(low=2, description="at least 2: PBT copies between trials")),
        "epochs": Integer(low=1),
        "perturbation_interval": Integer(low=1),
        "mutations": Optional(Items(description="a list of keys of the space")),
        "quantile_fraction": Real(low=0, high=0.5, low_open=True),
        "resample_probability": Real(low=0, high=1),
    }

    def __init__(self, build: Callable, space: Mapping[str, Any], *, population: int = 8, epochs: int = 10,
                 perturbation_interval: int = 2, mutations: Collection[str] | None = None,
                 quantile_fraction: float = 0.25, resample_probability: float = 0.25,
                 metric: str = "val_loss", mode: str = "min",
                 patience: int | None = None, min_delta: float = 0.0,
                 warm_start: Any = None, warm_start_epoch: str = "best") -> None:
        """Store the arguments as given; they are checked once every constructor has run."""
        super().__init__(build, space, metric=metric, mode=mode, patience=patience, min_delta=min_delta,
                         warm_start=warm_start, warm_start_epoch=warm_start_epoch)
        self.population = population
        self.epochs = epochs
        self.perturbation_interval = perturbation_interval
        self.mutations = mutations
        self.quantile_fraction = quantile_fraction
        self.resample_probability = resample_probability

    def _check(self) -> None:
        """``mutations`` must name primitives of the space, and something must be left to explore."""
        primitives = {".".join(path): primitive for path, primitive in leaves(self.space)}
        for key in self.mutations or ():
            if key in self.space and not isinstance(self.space[key], Distribution):
                raise ValueError(f"mutations: space[{key!r}] is the constant {self.space[key]!r}; "
                                 f"only a primitive (cb.uniform, cb.choice, ...) can be mutated")
            if key not in primitives:
                raise ValueError(f"mutations: {key!r} is not a key of the space; keys: {sorted(primitives)}")
            if isinstance(chosen := primitives[key], choice) and chosen.branches:
                raise ValueError(f"mutations: {key!r} chooses among dicts (branches of the space); a trial stays "
                                 f"in its branch: name the keys inside it instead")
        if not self._mutated_keys():
            raise ValueError("PBT has nothing to explore: the space has no cb.uniform or cb.loguniform key; "
                             "name the keys to mutate with mutations=[...]")

    def _mutated_keys(self) -> list[str]:
        """The keys explored (dotted paths), in the space's order: ``mutations``, or every
        uniform and loguniform key."""
        paths = [(".".join(path), primitive) for path, primitive in leaves(self.space)]
        if self.mutations is not None:
            return [key for key, _ in paths if key in self.mutations]
        return [key for key, primitive in paths if isinstance(primitive, (uniform, loguniform))]

    def _settings(self) -> dict[str, Any]:
        """As every searcher's, with the keys explored as ``mutations``, also when it was None."""
        return {**super()._settings(), "mutations": self._mutated_keys()}

    def start(self, seed: int) -> None:
        """Draw from the run's ``seed``; the population is still to be created."""
        self._rng = search_rng(seed)
        self._configs: dict[int, dict[str, Any]] = {}
        self._live: set[int] = set()
        self._values: dict[int, float] = {}       # this generation's: trial -> value
        self._generation = 1                      # the next exploit happens after this * interval epochs
        self._exploits: list[dict[str, Any]] = []

    def suggest(self) -> list[TrialRequest]:
        """The whole population at once, each for ``epochs``; nothing after that."""
        if self._configs:
            return []
        self._configs = {index: sample_config(self.space, self._rng) for index in range(self.population)}
        self._live = set(self._configs)
        return [TrialRequest(config, self.epochs) for config in self._configs.values()]

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """Pause a trial every ``perturbation_interval`` epochs (not at its last); go on between."""
        if epoch % self.perturbation_interval or epoch >= self.epochs:
            return Decision.CONTINUE
        self._values[trial_index(trial_id)] = metrics[self.metric]
        return Decision.PAUSE

    def decide(self) -> dict[str, Decision | Exploit]:
        """Once every live trial paused: the bottom quantile exploits the top, the rest go on."""
        if not self._values or any(index not in self._values for index in self._live):
            return {}          # part of the population is still training towards this generation
        order = ranked(self._values, self.mode)
        quantile = min(math.ceil(len(order) * self.quantile_fraction), len(order) // 2)
        top, bottom = order[:quantile], set(order[len(order) - quantile:])
        decisions: dict[str, Decision | Exploit] = {}
        for index in order:
            if index not in bottom:
                decisions[trial_name(index)] = Decision.CONTINUE
                continue
            source = top[int(self._rng.integers(len(top)))]
            config = self._explore(self._configs[source])
            self._exploits.append({"trial_id": trial_name(index), "source": trial_name(source), "config": config,
                                   "epoch": self._generation * self.perturbation_interval})
            self._configs[index] = config
            decisions[trial_name(index)] = Exploit(trial_name(source), config)
        self._values = {}
        self._generation += 1
        return decisions

    def _explore(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with every mutated key resampled or perturbed, drawn from the search's rng."""
        new = copy.deepcopy(config)
        for key in self._mutated_keys():
            path = key.split(".")
            primitive = primitive_at(self.space, config, path)
            if primitive is None:
                continue           # a key of another branch than this trial's
            *parents, last = path
            holder = functools.reduce(lambda d, k: d[k], parents, new)
            if self._rng.random() < self.resample_probability:
                holder[last] = primitive.sample(self._rng)
            else:
                holder[last] = _perturb(primitive, holder[last], up=bool(self._rng.random() < 0.5))
        return new

    def trial_ended(self, trial_id: str, status: str) -> None:
        """A trial that ended no longer holds up the generation."""
        self._live.discard(trial_index(trial_id))

    def state(self) -> dict[str, Any]:
        """The generation, every trial's current config and the exploits so far."""
        return {"generation": self._generation, "configs": {trial_name(i): c for i, c in sorted(self._configs.items())},
                "exploits": list(self._exploits)}


def _perturb(primitive: Distribution, value: Any, up: bool) -> Any:
    """``value`` scaled by 1.2 (``up``) or 0.8, or moved one ``choice`` step, within the bounds."""
    if isinstance(primitive, choice):
        position = next((i for i, v in enumerate(primitive.values) if v == value), 0)
        return primitive.values[min(max(position + (1 if up else -1), 0), len(primitive.values) - 1)]
    scaled = value * (1.2 if up else 0.8)
    if isinstance(primitive, randint):
        return int(min(max(round(scaled), primitive.low), primitive.high - 1))
    if isinstance(primitive, quniform):
        steps = min(max(round(scaled / primitive.q), math.ceil(primitive.low / primitive.q)),
                    math.floor(primitive.high / primitive.q))
        return float(steps * primitive.q)
    if isinstance(primitive, (uniform, loguniform)):
        return float(min(max(scaled, primitive.low), primitive.high))
    raise TypeError(f"PBT cannot perturb a {type(primitive).__name__}: it moves cb.uniform, cb.loguniform, cb.randint, "
                    f"cb.quniform and cb.choice values")
