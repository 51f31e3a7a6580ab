"""The peers ``search_vs_peers.py`` measures Cerebro against, each driven offline on a
``_mf_problems.Problem`` until a budget of trial-epochs is spent, one evaluation at a time
(one worker): Optuna 5, SMAC 2.4 and Syne Tune 0.16, as their own loops would run them.

A run is a list of ``Step``: the trial-epochs one evaluation cost, the value the method saw
and the regret of that (config, epoch). Where a method evaluates a config at a larger budget
than before (SMAC's Hyperband), it is charged only the epochs beyond the ones already trained,
as if the user's training function resumed from a checkpoint: the cheapest reading for the peer.

Each library is imported inside its runner, so this module imports without them; ``missing``
says which are absent. ``NOT_INSTALLABLE`` holds the peers that pip cannot install beside
Cerebro's pins, with pip's reason and how to install them anyway.

    >>> import _mf_problems as mf
    >>> steps = run_peer("optuna_random", mf.mf_hartmann(3), budget=60, seed=0)
    >>> sum(s.cost for s in steps)
    60
"""
from __future__ import annotations

import datetime
import importlib.util
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from _mf_problems import Param, Problem


@dataclass(frozen=True)
class Step:
    """One evaluation a method paid for."""

    cost: int          # trial-epochs charged
    value: float       # the metric the method saw
    regret: float      # problem.regret(config, epoch) of the model evaluated


class Budget:
    """Trial-epochs left, and the steps spent so far."""

    def __init__(self, total: int) -> None:
        self.left, self.steps = total, []

    def spend(self, problem: Problem, config: dict[str, Any], epoch: int, cost: int = 1) -> float:
        """Evaluate ``config`` after ``epoch`` for ``cost`` trial-epochs (cut to what is left)."""
        value = problem.observe(config, epoch)
        self.steps.append(Step(min(cost, self.left), value, problem.regret(config, epoch)))
        self.left -= min(cost, self.left)
        return value


# --- Trials in flight: the loop Optuna's and Syne Tune's runs share ---------------------------------
class Peer:
    """A peer as an in-flight loop drives it: ``start`` a trial (its config), ``report``
    each epoch's value (True: stop it there), ``end`` a trial that trained its last epoch."""

    def start(self) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError

    def report(self, trial: Any, epoch: int, value: float) -> bool:
        raise NotImplementedError

    def end(self, trial: Any, value: float) -> None:
        raise NotImplementedError


def in_flight(peer: Peer, problem: Problem, budget: int, slots: int) -> list[Step]:
    """Run ``peer`` with ``slots`` trials in flight, as on that many workers whose epochs take
    equal time: each round every slot trains its trial one epoch, in slot order, and a slot
    whose trial ended starts a new one (which sees what has ended so far). One slot is the
    peer's own sequential loop."""
    spent = Budget(budget)
    running: list[list | None] = [None] * slots          # per slot: [trial, config, epochs done]
    while spent.left > 0:
        for slot in range(slots):
            if spent.left == 0:
                break
            if running[slot] is None:
                running[slot] = [*peer.start(), 0]
            trial, config, done = running[slot]
            running[slot][2] = epoch = done + 1
            value = spent.spend(problem, config, epoch)
            if peer.report(trial, epoch, value):
                running[slot] = None
            elif epoch == problem.max_epochs:
                peer.end(trial, value)
                running[slot] = None
    return spent.steps


# --- Optuna 5: TPE (multivariate) with Hyperband or successive-halving pruning; random search ----
class _Optuna(Peer):
    def __init__(self, problem: Problem, seed: int, sampler: str, pruner: str) -> None:
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        samplers = {"tpe": lambda: optuna.samplers.TPESampler(seed=seed, multivariate=True),
                    "random": lambda: optuna.samplers.RandomSampler(seed=seed)}
        pruners = {"hyperband": lambda: optuna.pruners.HyperbandPruner(1, problem.max_epochs, reduction_factor=3),
                   "sha": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3),
                   "none": optuna.pruners.NopPruner}
        self.study = optuna.create_study(sampler=samplers[sampler](), pruner=pruners[pruner](), direction="minimize")
        self.problem, self.pruned = problem, optuna.trial.TrialState.PRUNED

    def start(self) -> tuple[Any, dict[str, Any]]:
        trial = self.study.ask()
        return trial, {p.name: _suggest(trial, p) for p in self.problem.params}

    def report(self, trial: Any, epoch: int, value: float) -> bool:
        trial.report(value, epoch)
        if trial.should_prune():
            self.study.tell(trial, state=self.pruned)
            return True
        return False

    def end(self, trial: Any, value: float) -> None:
        self.study.tell(trial, value)


def _suggest(trial: Any, p: Param) -> float:
    if p.integer:
        return trial.suggest_int(p.name, int(p.low), int(p.high))
    return trial.suggest_float(p.name, p.low, p.high, log=p.log)


# --- SMAC 2.4: Hyperband with random configs (HyperbandFacade) or a random forest (MultiFidelity) ---
def _smac_imports() -> Any:
    # scikit-learn 1.9 dropped sklearn.tree._tree.DTYPE (float32), which smac 2.4.0's random
    # forest imports at module level (and `import smac` imports the forest): put it back.
    import sklearn.tree._tree as tree
    if not hasattr(tree, "DTYPE"):
        tree.DTYPE = np.float32
    import smac
    return smac


def _smac(problem: Problem, budget: int, seed: int, facade: str) -> list[Step]:
    smac = _smac_imports()
    from ConfigSpace import ConfigurationSpace, Float, Integer
    from smac.runhistory.dataclasses import TrialValue
    space = ConfigurationSpace(seed=seed)
    space.add([Integer(p.name, (int(p.low), int(p.high))) if p.integer else Float(p.name, (p.low, p.high), log=p.log)
               for p in problem.params])
    kind = {"hyperband": smac.HyperbandFacade, "mf": smac.MultiFidelityFacade}[facade]
    with tempfile.TemporaryDirectory() as scratch:
        scenario = smac.Scenario(space, output_directory=scratch, deterministic=True, n_trials=10**7, min_budget=1,
                                 max_budget=problem.max_epochs, seed=seed)
        optimizer = kind(scenario, lambda config, seed=0, budget=1: 0.0, overwrite=True, logging_level=logging.ERROR,
                         intensifier=kind.get_intensifier(scenario, eta=3))
        trained: dict[tuple, int] = {}       # config -> epochs it has been trained (its checkpoint)
        spent = Budget(budget)
        while spent.left > 0:
            info = optimizer.ask()
            config, epoch = dict(info.config), int(round(info.budget))
            key = tuple(sorted(config.items()))
            cost = max(epoch - trained.get(key, 0), 1)
            trained[key] = max(epoch, trained.get(key, 0))
            optimizer.tell(info, TrialValue(cost=spent.spend(problem, config, epoch, cost)), save=False)
    return spent.steps


# --- DEHB 0.1.2: differential evolution over Hyperband's brackets, through ask/tell ----------------
def _dehb(problem: Problem, budget: int, seed: int) -> list[Step]:
    from ConfigSpace import ConfigurationSpace, Float, Integer
    from dehb import DEHB
    space = ConfigurationSpace(seed=seed)
    space.add([Integer(p.name, (int(p.low), int(p.high))) if p.integer else Float(p.name, (p.low, p.high), log=p.log)
               for p in problem.params])
    with tempfile.TemporaryDirectory() as scratch:
        optimizer = DEHB(cs=space, min_fidelity=1, max_fidelity=problem.max_epochs, eta=3, seed=seed, n_workers=1,
                         output_path=scratch, log_level="ERROR")
        trained: dict[tuple, int] = {}       # config -> epochs it has been trained (its checkpoint)
        spent = Budget(budget)
        while spent.left > 0:
            job = optimizer.ask()
            config, epoch = dict(job["config"]), int(round(job["fidelity"]))
            key = tuple(sorted(config.items()))
            cost = max(epoch - trained.get(key, 0), 1)
            trained[key] = max(epoch, trained.get(key, 0))
            optimizer.tell(job, {"fitness": spent.spend(problem, config, epoch, cost), "cost": cost})
    return spent.steps


# --- Syne Tune 0.16: ASHA, and BOHB (ASHA with a KDE searcher), as its Tuner drives them ---
class _SyneTune(Peer):
    def __init__(self, problem: Problem, seed: int, kind: str) -> None:
        import syne_tune.config_space as sp
        from syne_tune.optimizer.baselines import ASHA, BOHB
        from syne_tune.optimizer.scheduler import SchedulerDecision
        space = {p.name: sp.randint(int(p.low), int(p.high)) if p.integer
                 else (sp.loguniform if p.log else sp.uniform)(p.low, p.high) for p in problem.params}
        np.random.seed(seed)        # its scheduler draws a trial's bracket from numpy's global generator
        self.scheduler = {"asha": ASHA, "bohb": BOHB}[kind](
            space, metric=problem.metric, time_attr="epoch", max_t=problem.max_epochs, do_minimize=True,
            random_seed=seed, grace_period=1, reduction_factor=3)
        self.metric, self.max_t, self.stop, self.made = problem.metric, problem.max_epochs, SchedulerDecision.STOP, 0

    def start(self) -> tuple[Any, dict[str, Any]]:
        from syne_tune.backend.trial_status import Trial
        trial = Trial(self.made, self.scheduler.suggest().config, datetime.datetime.now())
        self.scheduler.on_trial_add(trial)
        self.made += 1
        return trial, trial.config

    def report(self, trial: Any, epoch: int, value: float) -> bool:
        if self.scheduler.on_trial_result(trial, {self.metric: value, "epoch": epoch}) == self.stop:
            self.scheduler.on_trial_remove(trial)      # also at max_t: the Tuner removes the trial
            return True
        return False

    def end(self, trial: Any, value: float) -> None:
        self.scheduler.on_trial_complete(trial, {self.metric: value, "epoch": self.max_t})


def _looped(make: Callable[[Problem, int], Peer], slots: int) -> Callable[[Problem, int, int], list[Step]]:
    return lambda problem, budget, seed: in_flight(make(problem, seed), problem, budget, slots)


# name -> (the package it needs, its runner). "@4w": four trials in flight, as the peer runs on
# four workers (Optuna's studies shared by 4 processes, Syne Tune's n_workers=4); SMAC's
# intensifiers run one configuration at a time here.
PEERS: dict[str, tuple[str, Callable[[Problem, int, int], list[Step]]]] = {
    f"{name}{suffix}": (package, _looped(make, slots))
    for name, package, make in [
        ("optuna_tpe_hyperband", "optuna", lambda pr, s: _Optuna(pr, s, "tpe", "hyperband")),
        ("optuna_tpe_sha", "optuna", lambda pr, s: _Optuna(pr, s, "tpe", "sha")),
        ("optuna_random", "optuna", lambda pr, s: _Optuna(pr, s, "random", "none")),
        ("syne_tune_asha", "syne_tune", lambda pr, s: _SyneTune(pr, s, "asha")),
        ("syne_tune_bohb", "syne_tune", lambda pr, s: _SyneTune(pr, s, "bohb"))]
    for suffix, slots in (("", 1), ("@4w", 4))}
PEERS.update({
    "smac_hyperband": ("smac", lambda pr, b, s: _smac(pr, b, s, "hyperband")),
    "smac_multifidelity": ("smac", lambda pr, b, s: _smac(pr, b, s, "mf")),
    "dehb": ("dehb", _dehb),
})

# Peers that pip cannot install beside Cerebro's pins, why (pip's words; BENCHMARKS.md) and how
# they run anyway: DEHB's metadata asks for numpy<2, yet it runs on numpy 2.
NOT_INSTALLABLE = {
    "dehb": "dehb 0.1.2 depends on numpy<2.0 and >=1.18.2; jax 0.10.2 (Cerebro's [keras] and [test] extras) "
            "depends on numpy>=2.0: ResolutionImpossible; it runs on numpy 2 installed with "
            "pip install --no-deps dehb==0.1.2 loguru==0.7.3",
}


def missing(name: str) -> str | None:
    """Why peer ``name`` cannot run here, or None."""
    package = PEERS[name][0]
    if importlib.util.find_spec(package):
        return None
    return NOT_INSTALLABLE.get(name, f"{package} is not installed (pip install '.[peers]')")


def run_peer(name: str, problem: Problem, budget: int, seed: int) -> list[Step]:
    """Peer ``name`` on ``problem`` for ``budget`` trial-epochs with ``seed``."""
    return PEERS[name][1](problem, budget, seed)
