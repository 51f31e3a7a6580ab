"""The searcher base class: WHAT to search, and ``fit`` that runs it with MOP."""
from __future__ import annotations

import inspect
import os
import re
import warnings
from abc import ABCMeta, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .. import _checks
from .._checks import Constraint, Integer, OneOf, Optional, Real
from .._objectives import MetricNames, Modes, Objective, objectives, recorded
from ..engine._interface import Decision, Exploit, TrialRequest
from ..engine._settings import Limits, RunOptions
from ._configs import check_config
from ._space import SearchSpace

if TYPE_CHECKING:
    from ..backends import Backend
    from ..data import Dataset
    from ..results import Result
    from ..worker import Trainable


_UNSET = {"patience": None, "min_delta": 0.0, "warm_start": None, "warm_start_epoch": "best"}
# Words in a metric's name that say which way is better (as Keras' mode="auto" reads them).
_SCORE = re.compile(r"acc|auc|f1|precision|recall|r2|iou|dice|ndcg", re.IGNORECASE)
_ERROR = re.compile(r"loss|error|mse|mae|rmse|perplexity", re.IGNORECASE)


class RunSource(Constraint):
    """A finished run to start from: its directory, or its ``cb.Result``."""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (str, os.PathLike)) or isinstance(getattr(value, "run_dir", None), str)

    def describe(self) -> str:
        return "a run directory or a cb.Result"


def run_dir_of(source: Any) -> str | None:
    """The run directory a ``warm_start`` names (as given: a path or a ``cb.Result``)."""
    return None if source is None else os.fspath(getattr(source, "run_dir", source))


class _CheckedOnConstruction(ABCMeta):
    """Runs a searcher's checks when its constructor returns, whichever subclass's
    ``__init__`` stored the arguments: a typo fails where it was written, not at ``fit``.
    Unpickling (resume) builds no new searcher and checks nothing."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        searcher = super().__call__(*args, **kwargs)
        searcher._validate()
        for metric, mode in searcher.objectives():      # here alone: fit validates again
            _check_direction(metric, mode)
        return searcher


class Searcher(metaclass=_CheckedOnConstruction):
    """A model selection algorithm on top of MOP, model hopper parallelism (Nakandala et al.,
    "Cerebro: A Data System for Optimized Deep Learning Model Selection", VLDB 2020).

    The constructor says WHAT to search; :meth:`fit` says HOW to run it. Arguments are
    stored as given and checked when the constructor returns (a typo fails where it is
    written), and again at ``fit``, before any worker starts.

    Writing a searcher (docs/extending.md has a worked one): subclass this and implement
    narrow waist 1 (:class:`cerebro.engine.SearchPolicy`): :meth:`suggest` (which trials to
    start now) and :meth:`start` (reset for a run with its seed); optionally :meth:`report`
    (continue, stop or pause a trial after an epoch), :meth:`decide` (for paused trials),
    :meth:`continues_after`, :meth:`trial_ended`, :meth:`stop_reason` and :meth:`state`.
    Decisions may depend on the seed and the trials' metrics only, never on the order in
    which reports arrive. A subclass also sets, as class attributes:

    - ``_parameters``: its own constructor arguments, name -> constraint (below).
    - ``cannot_extend``: why a finished run of it cannot be trained on to more epochs
      (:func:`cerebro.resume` with ``epochs=N``, :meth:`extend`), or ``""`` where it can:
      where its decisions up to any epoch never depend on the epoch budget, so that the
      extended run is the run that had ``epochs=N`` from the start. Set ``""`` only then;
      :meth:`extend` raises ``self.epochs``, which such a searcher keeps.
    - ``cannot_add``: why a user cannot add a trial to a live run of it
      (:func:`cerebro.add_trial`, ``cerebro add``, :meth:`added`), or ``""`` where they
      can: where each trial is decided on its own metrics alone, as in grid and random
      search, so an added trial changes no other's decisions. It runs ``self.epochs``.

    - ``cannot_multi_objective``: why it cannot search on several metrics at once
      (``metric=["val_accuracy", "params"]``), or ``""`` where it can: where it ranks
      trials on none, as grid and random search, or on every objective (TPE's
      multi-objective sampler). It reads them from :meth:`objectives`.

    The defaults refuse all three, with the reason, so a searcher never gets one by accident.

    Args:
        build: ``build(config)`` -> a :class:`cerebro.TorchTrainable` or :class:`cerebro.KerasTrainable`;
            runs on the workers.
        space: parameter name -> a primitive (``cb.choice``, ``cb.uniform``, ...) or a constant.
        metric: what ``result.best`` ranks by: ``val_loss`` (default), ``train_loss``, or
            ``train_<name>`` / ``val_<name>`` for a metric the trainable logs (``params`` for
            ``cb.metrics.params``). Several objectives: a list, e.g. ``["val_accuracy",
            "params"]``, searched for their Pareto front (``result.pareto()``) by the searchers
            that can (``cannot_multi_objective`` is empty). The FIRST metric is the primary
            one: each trial's best epoch and the checkpoints kept, ``patience``,
            ``result.best`` and ``ranked()`` use it alone.
        mode: ``"min"`` or ``"max"``; with several metrics a list of as many, in their order.
        patience: early stopping: a trial whose ``metric`` (the first, with several) has not
            improved by more than ``min_delta`` for ``patience`` epochs ends ``stopped`` (None:
            never). Checked where
            the searcher lets the trial go on; it depends on the trial's metrics only, so the
            same trials stop at the same epochs on any worker count and on resume.
        min_delta: the least change of ``metric`` that counts as an improvement.
        warm_start: a finished run (its directory or its ``cb.Result``): a trial whose config
            equals one of its completed or stopped trials' starts from that trial's weights
            and optimizer state at ``warm_start_epoch`` (``"best"`` or ``"last"``) instead of
            ``build``'s, and ``history()`` says so (``warm_started_from``). The runs' data must
            have the same feature layout (checked before any worker starts).

    Each class declares its own constructor arguments once, in ``_parameters``: name ->
    :class:`cerebro._checks.Constraint`. The declarations, merged along the class hierarchy
    (:meth:`_declared`), drive the checks (when the constructor returns, and again at ``fit``),
    the settings in run.json and the ``repr``. An argument is stored under its own name, as
    given. :meth:`_check` is left for rules between arguments.
    """

    _parameters: ClassVar[dict[str, Constraint]] = {
        "build": _checks.Callable(description="a function build(config) -> cb.TorchTrainable or cb.KerasTrainable"),
        "space": SearchSpace(),
        "metric": MetricNames(),
        "mode": Modes(),
        "patience": Optional(Integer(low=1)),
        "min_delta": Real(low=0.0),
        "warm_start": Optional(RunSource()),
        "warm_start_epoch": OneOf("best", "last"),
    }

    # As given: a string, or a list of them for several objectives (see objectives()); typed Any
    # so that a searcher refusing several (cannot_multi_objective) uses them as the strings they are.
    metric: Any
    mode: Any
    patience: int | None = None     # as the class has them: searchers pickled before they existed
    min_delta: float = 0.0
    warm_start: Any = None
    warm_start_epoch: str = "best"
    # Refused by default: a new searcher is extended or added to only once its author has
    # said why that keeps its decisions what they would have been (see the class docstring).
    cannot_extend: ClassVar[str] = "it does not say whether its decisions depend on the epoch budget"
    cannot_add: ClassVar[str] = "it chooses its trials itself, and its decisions depend on which it chose"
    cannot_multi_objective: ClassVar[str] = "it does not say how it ranks trials on several metrics"
    epochs: int     # each trial's budget, set by a searcher that can be extended or added to (see above)

    def __init__(self, build: Callable[[dict], Trainable], space: Mapping[str, Any], *,
                 metric: str | list[str] = "val_loss", mode: str | list[str] = "min", patience: int | None = None,
                 min_delta: float = 0.0, warm_start: Any = None, warm_start_epoch: str = "best") -> None:
        """Store the arguments as given; they are checked once every constructor has run."""
        self.build = build
        self.space = space
        self.metric = metric
        self.mode = mode
        self.patience = patience
        self.min_delta = min_delta
        self.warm_start = warm_start
        self.warm_start_epoch = warm_start_epoch

    # --- narrow waist 1 -----------------------------------------------------------------
    @abstractmethod
    def suggest(self) -> list[TrialRequest]:
        """Trials to start now; called at the start and after every trial's epoch."""

    def report(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> Decision:
        """``trial_id`` finished ``epoch`` with ``metrics``; the default lets it go on."""
        return Decision.CONTINUE

    def decide(self) -> Mapping[str, Decision | Exploit]:
        """Decisions for trials ``report`` paused; the default never pauses."""
        return {}

    def continues_after(self, trial_id: str, epoch: int) -> bool:
        """Whether ``report`` goes on after ``epoch`` whatever the metrics: true of the default
        ``report``; a subclass that overrides ``report`` must say so itself."""
        return type(self).report is Searcher.report

    def trial_ended(self, trial_id: str, status: str) -> None:
        """``trial_id`` ended as ``status``; the default ignores it."""

    def stop_reason(self, trial_id: str) -> str | None:
        """Why ``trial_id`` was stopped early, for the history and the report."""
        return None

    def state(self) -> dict[str, Any]:
        """The search's state as JSON-safe data, written to the journal at each decision."""
        return {}

    def start(self, seed: int) -> None:
        """Reset the search for a new run with the run's ``seed``; called once per ``fit``."""

    def extend(self, epochs: int) -> None:
        """Raise every trial's epoch budget to ``epochs``: what :func:`cerebro.resume` does
        with ``epochs=N``, so that the run goes on as if it had had ``epochs=N`` from the
        start. Refused, with the reason, by searchers whose decisions depend on the budget."""
        if self.cannot_extend:
            raise ValueError(f"a {type(self).__name__} run cannot be extended: {self.cannot_extend}; to train "
                             f"its best trials longer, run cb.GridSearch over their configs "
                             f"([t.config for t in result.ranked()[:k]]) with the epochs you want")
        current = self.epochs
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < current:
            raise ValueError(f"epochs={epochs!r} must be an integer of at least the run's epochs ({current}): a run "
                             f"is extended, never shortened (every epoch's metrics are in result.history())")
        self.epochs = epochs

    def added(self, config: Mapping[str, Any]) -> TrialRequest:
        """The trial a user adds to a live run (:func:`cerebro.add_trial`): ``config``, checked
        against the space, for the run's epochs. The searcher needs to know nothing else of
        it where its trials are independent of each other (grid and random search)."""
        if self.cannot_add:
            raise ValueError(f"trials cannot be added to a {type(self).__name__} run: {self.cannot_add}")
        return TrialRequest(check_config(self.space, config), self.epochs)

    # --- the declared arguments -----------------------------------------------------------
    @classmethod
    def _declared(cls) -> dict[str, Constraint]:
        """Every declared argument -> its constraint, from the ``_parameters`` of this class
        and its bases, in the order of ``__init__``'s signature (undeclared ones last)."""
        merged: dict[str, Constraint] = {}
        for klass in reversed(cls.__mro__):
            merged.update(vars(klass).get("_parameters", {}))
        order = list(inspect.signature(cls.__init__).parameters)
        return dict(sorted(merged.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)))

    def _validate(self) -> None:
        """Check every declared argument against its constraint, in the signature's order, then
        the objectives (:meth:`objectives`) and :meth:`_check`'s rules between arguments; the
        first failure raises."""
        for name, constraint in self._declared().items():
            constraint.check(name, getattr(self, name))
        self.objectives()
        self._check()

    def objectives(self) -> tuple[Objective, ...]:
        """``metric`` and ``mode`` as ``(metric, mode)`` pairs, the primary one first: one
        where ``metric`` is a string. Raises ``ValueError`` naming the rule where they do not
        pair up, or where this searcher cannot search on several (``cannot_multi_objective``).

        >>> import cerebro as cb
        >>> search = cb.RandomSearch(lambda config: None, {"lr": cb.loguniform(1e-4, 1e-1)},
        ...                          metric=["val_accuracy", "params"], mode=["max", "min"])
        >>> [tuple(objective) for objective in search.objectives()]
        [('val_accuracy', 'max'), ('params', 'min')]
        """
        found = objectives(self.metric, self.mode)
        if len(found) > 1 and self.cannot_multi_objective:
            raise ValueError(f"{type(self).__name__} cannot search on several objectives (metric={self.metric!r}): "
                             f"{self.cannot_multi_objective}; give it one metric, or search for the Pareto front "
                             f"with cb.RandomSearch, cb.GridSearch or cb.TPESearch")
        return found

    def _check(self) -> None:
        """Rules between arguments, checked after each argument passed its own constraint;
        raise ValueError naming them. The default has none."""

    def _settings(self) -> dict[str, Any]:
        """The arguments as recorded in run.json: the class, ``metric``, ``mode``, the
        space's primitives as text, then the other declared arguments (not ``build``,
        which is pickled)."""
        rest = {name: getattr(self, name) for name in self._declared()
                if name not in ("build", "space", "metric", "mode") and not self._unset(name)}
        if "warm_start" in rest:
            rest["warm_start"] = run_dir_of(rest["warm_start"])
        return {"class": type(self).__name__, "metric": recorded(self.metric), "mode": recorded(self.mode),
                "space": {key: repr(value) for key, value in self.space.items()}, **rest}

    def _unset(self, name: str) -> bool:
        """Early stopping's arguments at their defaults are left out of run.json and the
        ``repr``, as runs (and pickled searchers) from before they existed have them."""
        return name in _UNSET and getattr(self, name) == _UNSET[name]

    def __repr__(self) -> str:
        """The constructor call with every declared argument, e.g. ``ASHA(build=build, ...)``;
        a function shows as its name."""
        arguments = ", ".join(f"{name}={_shown(getattr(self, name))}" for name in self._declared()
                              if not self._unset(name))
        return f"{type(self).__name__}({arguments})"

    # --- running it ---------------------------------------------------------------------
    def fit(self, data: Dataset, *, backend: str | Backend = "local", workers: int | None = None,
            store: str | os.PathLike | None = None, seed: int | None = None,
            verbose: int = 1, trial_timeout: float | None = None, max_failures: int | None = None,
            max_trial_losses: int = 3, keep_checkpoints: int | None = None, time_budget: float | None = None,
            tensorboard: bool = True, mlflow: bool | str = False, hang_after: float | None = 300.0,
            metrics_port: int | None = None, metrics_host: str = "127.0.0.1", resume: bool = False) -> Result:
        """Train the trials of this search with MOP and return the :class:`Result`.

        Args:
            data: a :class:`cerebro.Dataset`.
            backend: ``"local"`` (worker processes on this machine) or a Backend instance.
            workers: number of local workers (default: the machine's cores).
            store: the run directory (default: ``./cerebro_runs/<searcher>-<time>``).
            seed: the run's seed; ``None`` draws one, recorded in run.json and ``result.seed``.
            verbose: 1 shows live progress on stderr, 0 is silent.
            trial_timeout: seconds one sub-epoch of a trial may take; a trial that takes
                longer ends as ``timeout`` and the others go on. Checked between batches;
                a batch still running ``heartbeat_timeout`` seconds later has its worker
                given up (the others take over its partitions). ``None``: no limit.
            max_failures: stop the run (:class:`cerebro.TooManyFailuresError`) once more
                trials than this ended failed, diverged or timeout. ``None``: never.
            max_trial_losses: a trial whose sub-epochs were running on this many lost
                workers is taken for their cause (it crashes or hangs them) and fails; the
                lost sub-epochs before that run again elsewhere, with the same results.
                The default, 3, lets two unrelated losses (a killed or preempted worker)
                hit one trial; raise it where workers die often for reasons of their own
                (spot instances), as Spark's ``spark.task.maxFailures``.
            keep_checkpoints: keep the weights of the best k finished trials only (by their best
                epoch), deleting the others' as trials end, besides what live trials and resume
                need. ``None`` (the default) keeps every finished trial's best and last epoch.
            time_budget: seconds; once they have passed, the run starts no new trial or epoch,
                lets the epochs in flight end and returns, resumable (``cb.resume`` goes on).
                Which trials finish by then depends on timing; the run says so in the log
                and run.json. ``None``: no budget. (``cb.stop(run_dir)`` does the same on demand.)
            tensorboard: write per-trial scalars and hyperparameters under
                ``store/tensorboard`` (local stores) for ``tensorboard --logdir``.
            mlflow: ``True`` logs to MLflow in ``sqlite:///store/mlflow.db``, a string to that
                tracking URI: a parent run, a nested run per trial, the best model.
            hang_after: seconds a sub-epoch may go without beginning a batch, at least (and 10x
                the longest its trial waited for one before), before it is taken to hang: its
                trial ends as ``timeout``, its worker is replaced, the others go on. Give more
                where a first batch compiles for long (``torch.compile``). ``None``: never.
            metrics_port: serve the run's Prometheus metrics at ``http://<metrics_host>:<port>/metrics``
                from the driver while it runs (for scrapers that cannot read the run
                directory; ``cerebro dashboard`` serves the same from it). ``None``: not served.
            metrics_host: the address ``metrics_port`` listens on: ``"127.0.0.1"`` (the
                default) serves this machine alone; a scraper on another machine needs
                ``"0.0.0.0"`` (every interface), which shows the run's metrics (no configs,
                no code) to anyone who can reach the port.
            resume: go on with the run of this same search in ``store`` (space, searcher settings,
                data and seed as its run.json says) as :func:`cerebro.resume` does, bitwise, or
                return it where it finished; another search there is refused, saying how it
                differs. The run keeps its limits; this call's backend, ``verbose`` and
                ``time_budget`` (from now) apply.
        """
        from .._fit import fit  # the front end: the one import upward (see pyproject's contracts)
        limits = Limits(trial_timeout, max_failures, max_trial_losses, keep_checkpoints, hang_after)
        return fit(self, data, RunOptions(backend, workers, store, seed, verbose, limits, time_budget, tensorboard,
                                          mlflow, metrics_port, metrics_host, resume))


def _shown(value: Any) -> str:
    """``value`` as a searcher's repr shows it: a function (or class) by its name, else its repr."""
    return value.__name__ if callable(value) and hasattr(value, "__name__") else repr(value)


def _check_direction(metric: str, mode: str) -> None:
    """Warn where ``mode`` ranks ``metric`` the way its name says is worse (e.g. accuracy
    with the default ``mode="min"``): ``result.best`` would be the worst trial."""
    higher = bool(_SCORE.search(metric)) and not _ERROR.search(metric)
    lower = bool(_ERROR.search(metric)) and not _SCORE.search(metric)
    if (mode == "min" and higher) or (mode == "max" and lower):
        better = "max" if higher else "min"
        warnings.warn(f"metric={metric!r} is ranked with mode={mode!r}, so result.best is the trial with the "
                      f"{'lowest' if mode == 'min' else 'highest'} {metric}; pass mode={better!r} for the "
                      f"{'highest' if better == 'max' else 'lowest'}", UserWarning, stacklevel=3)
