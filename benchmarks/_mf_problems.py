"""Offline multi-fidelity problems for ``search_vs_peers.py``: fidelity = epochs, every value
computed, nothing trained or downloaded.

Two families:

* **MF-Hartmann** (3-D and 6-D): the Hartmann functions with the fidelity-dependent bias and
  noise of Kandasamy et al., "Multi-fidelity Bayesian optimisation with continuous
  approximations" (ICML 2017), in the parametrisation of mf-prior-bench's MFH3 / MFH6: after
  epoch ``e`` of ``E``, with ``s = log(e) / log(E)``, the bump weights are ``alpha - bias * (1 - s)``
  and a noise ``|N(0, 1)| * noise * (1 - s)`` is added; epoch ``E`` is the true, noiseless
  Hartmann function. Both terms only raise the value, so the global minimum is the published
  one, at the last epoch. The noise is a function of (config, epoch), the same on every call.
* **LCBench** (one problem per OpenML task): YAHPO Gym's surrogate of LCBench (Zimmer et al.,
  "Auto-PyTorch Tabular", TPAMI 2021; Pfisterer et al., "YAHPO Gym", AutoML 2022), an ONNX model
  vendored under ``benchmarks/data/lcbench/`` with its licence, run with onnxruntime. The value
  is the validation error in % (100 - val_accuracy) of an MLP after each of 52 epochs; curves
  cross, so early epochs mislead. Deterministic; its optimum is estimated (``estimate_lcbench_optimum``).

A problem minimises ``metric``. ``observe(config, epoch)`` is what a searcher sees,
``truth(config, epoch)`` the same without noise; the regret of a (config, epoch) a searcher
would hand back is ``truth - optimum``.

    >>> problem = mf_hartmann(3)
    >>> round(problem.optimum, 5), problem.max_epochs
    (-3.86278, 27)
    >>> config = {"x0": 0.114614, "x1": 0.555649, "x2": 0.852547}
    >>> round(problem.truth(config, 27) - problem.optimum, 6) == 0.0
    True
    >>> problem.observe(config, 1) == problem.observe(config, 1) > problem.truth(config, 1)
    True
"""
from __future__ import annotations

import functools
import json
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "lcbench")


@dataclass(frozen=True)
class Param:
    """One hyperparameter, in the terms every library shares: a float in [low, high] (on a
    log scale where ``log``) or, with ``integer``, an integer in [low, high] inclusive."""

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False


@dataclass(frozen=True)
class Problem:
    """A minimisation problem whose fidelity is the epoch (1 .. ``max_epochs``)."""

    name: str
    family: str
    params: tuple[Param, ...]
    max_epochs: int
    metric: str
    optimum: float
    observe: Callable[[dict[str, Any], int], float]
    truth: Callable[[dict[str, Any], int], float]

    def space(self) -> dict[str, Any]:
        """The problem's space in ``cerebro``'s primitives."""
        import cerebro as cb
        return {p.name: cb.randint(int(p.low), int(p.high) + 1) if p.integer
                else (cb.loguniform if p.log else cb.uniform)(p.low, p.high) for p in self.params}

    def objective(self, config: dict[str, Any], epoch: int) -> dict[str, float]:
        """``cb.simulate``'s objective: the observed metric after ``epoch``."""
        return {self.metric: self.observe(config, epoch)}

    def regret(self, config: dict[str, Any], epoch: int) -> float:
        """How far the model of ``config`` after ``epoch`` is from the best one there is."""
        return self.truth(config, epoch) - self.optimum


# --- MF-Hartmann ------------------------------------------------------------------------------
# The Hartmann constants as published (Dixon and Szegő 1978; Surjanovic and Bingham's library).
_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_HARTMANN = {
    3: (np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]]),
        1e-4 * np.array([[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]]),
        (0.114614, 0.555649, 0.852547)),
    6: (np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8],
                  [17, 8, 0.05, 10, 0.1, 14]]),
        1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                         [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]]),
        (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)),
}
# mf-prior-bench's default (bias, noise) for MFH3 and MFH6 (its presets "good" .. "terrible"
# go from (2.5, 2.0) to (4.0, 5.0), where the first epochs no longer rank configs at all).
BIAS, NOISE = 0.5, 0.1


def _hartmann(x: np.ndarray, dims: int, weights: np.ndarray) -> float:
    a, p, _ = _HARTMANN[dims]
    return float(-(weights * np.exp(-np.sum(a * (x - p) ** 2, axis=1))).sum())


def _noise_draw(x: np.ndarray, epoch: int) -> float:
    """|N(0, 1)| as a function of the config's exact bits and the epoch: the same observation
    every time a (config, epoch) is asked for, whatever the process or hash seed."""
    words = [w for value in x for w in struct.unpack("<II", struct.pack("<d", float(value)))]
    return abs(float(np.random.default_rng([1337, epoch, *words]).normal()))


def mf_hartmann(dims: int, max_epochs: int = 27, bias: float = BIAS, noise: float = NOISE) -> Problem:
    """MF-Hartmann in ``dims`` (3 or 6) dimensions over [0, 1]^dims, fidelity = epochs."""
    if dims not in _HARTMANN:
        raise ValueError(f"dims={dims!r}: MF-Hartmann is defined in 3 or 6 dimensions")
    names = [f"x{i}" for i in range(dims)]

    def point(config: dict[str, Any]) -> np.ndarray:
        return np.array([config[n] for n in names], dtype=float)

    def fidelity(epoch: int) -> float:        # 0 at the first epoch, 1 at the last
        return math.log(epoch) / math.log(max_epochs)

    def truth(config: dict[str, Any], epoch: int) -> float:
        return _hartmann(point(config), dims, _ALPHA - bias * (1 - fidelity(epoch)))

    def observe(config: dict[str, Any], epoch: int) -> float:
        return truth(config, epoch) + _noise_draw(point(config), epoch) * noise * (1 - fidelity(epoch))

    optimum = _hartmann(np.array(_HARTMANN[dims][2]), dims, _ALPHA)
    return Problem(f"mfh{dims}", "MF-Hartmann", tuple(Param(n, 0.0, 1.0) for n in names), max_epochs,
                   "val_loss", optimum, observe, truth)


# --- LCBench (YAHPO Gym's ONNX surrogate) -----------------------------------------------------
_LCBENCH_PARAMS = (Param("batch_size", 16, 512, log=True), Param("learning_rate", 1e-4, 1e-1, log=True),
                   Param("momentum", 0.1, 0.99), Param("weight_decay", 1e-5, 1e-1),
                   Param("num_layers", 1, 5, integer=True), Param("max_units", 64, 1024, log=True),
                   Param("max_dropout", 0.0, 1.0))
# The surrogate's inputs, in its order (YAHPO Gym's lcbench "cont_names"), and which of its six
# outputs is val_accuracy (its "y_names": time, val_accuracy, val_cross_entropy, ...).
_INPUTS = ("epoch", "batch_size", "learning_rate", "momentum", "weight_decay", "num_layers", "max_units",
           "max_dropout")
_VAL_ACCURACY = 1
LCBENCH_EPOCHS = 52
# Integers on a log scale, as YAHPO's own parameter set has them: drawn as floats, rounded.
_ROUNDED = ("batch_size", "num_layers", "max_units")


@functools.cache
def _session() -> Any:
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1     # one core per benchmark process
    return onnxruntime.InferenceSession(os.path.join(DATA, "model.onnx"), options,
                                        providers=["CPUExecutionProvider"])


@functools.cache
def _task_codes() -> dict[str, int]:
    with open(os.path.join(DATA, "encoding.json")) as f:
        return json.load(f)["OpenML_task_id"]


def lcbench_errors(task: str, configs: np.ndarray, epochs: np.ndarray) -> np.ndarray:
    """The surrogate's validation error (%) of each row of ``configs`` (columns in
    ``_LCBENCH_PARAMS``' order) after the matching entry of ``epochs``."""
    rounded = [i for i, p in enumerate(_LCBENCH_PARAMS) if p.name in _ROUNDED]
    x = np.array(configs, dtype=float, ndmin=2)
    x[:, rounded] = np.round(x[:, rounded])
    by_name = dict(zip([p.name for p in _LCBENCH_PARAMS], x.T))
    by_name["epoch"] = np.asarray(epochs, dtype=float)
    inputs = np.stack([np.broadcast_to(by_name[n], len(x)) for n in _INPUTS], 1).astype(np.float32)
    codes = np.full((len(x), 1), _task_codes()[task], dtype=np.int32)
    out = _session().run(None, {"x_cat": codes, "x_cont": inputs})[0]
    return 100.0 - out[:, _VAL_ACCURACY].astype(float)


def _row(config: dict[str, Any]) -> np.ndarray:
    return np.array([[config[p.name] for p in _LCBENCH_PARAMS]], dtype=float)


def estimate_lcbench_optimum(task: str, samples: int = 20_000, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    """The surrogate's lowest error over configs and epochs, estimated: for each seed,
    ``samples`` random configs and the box's 128 corners (where the surrogate extrapolates,
    and where its lowest errors lie on some tasks) at every epoch, then a Nelder-Mead descent
    (scipy) from the best 8 (config, epoch) pairs. ``LCBENCH_OPTIMA`` holds what it gave."""
    from scipy.optimize import minimize
    best: dict[str, Any] = {"error": math.inf}
    epochs = np.arange(1, LCBENCH_EPOCHS + 1)
    for seed in seeds:
        corners = (np.arange(2 ** len(_LCBENCH_PARAMS))[:, None] >> np.arange(len(_LCBENCH_PARAMS))) & 1
        unit = np.concatenate([corners, np.random.default_rng(seed).uniform(size=(samples, len(_LCBENCH_PARAMS)))])
        errors = lcbench_errors(task, np.repeat(_configs(unit), len(epochs), 0), np.tile(epochs, len(unit)))
        for flat in np.argsort(errors)[:8]:
            epoch = int(epochs[flat % len(epochs)])

            def error(u: np.ndarray, epoch: int = epoch) -> float:
                return float(lcbench_errors(task, _configs(np.clip(u, 0.0, 1.0)[None]), np.array([epoch]))[0])
            found = minimize(error, unit[flat // len(epochs)], method="Nelder-Mead", options={"maxfev": 400})
            if found.fun < best["error"]:
                config = _configs(np.clip(found.x, 0.0, 1.0)[None])[0]
                best = {"error": float(found.fun), "epoch": epoch,
                        "config": {p.name: float(v) for p, v in zip(_LCBENCH_PARAMS, config)}}
    return best


def _configs(unit: np.ndarray) -> np.ndarray:
    """Points of the unit cube as configs (columns in ``_LCBENCH_PARAMS``' order)."""
    return np.stack([_from_unit(p, unit[:, i]) for i, p in enumerate(_LCBENCH_PARAMS)], 1)


def _from_unit(p: Param, u: Any) -> Any:
    if p.log:
        return np.exp(np.log(p.low) + u * (np.log(p.high) - np.log(p.low)))
    if p.integer:
        return np.floor(p.low + u * (p.high - p.low + 1 - 1e-9))
    return p.low + u * (p.high - p.low)


def lcbench(task: str) -> Problem:
    """LCBench's OpenML task ``task`` (a string id, e.g. "167190") through YAHPO's surrogate."""
    if task not in _task_codes():
        raise ValueError(f"task={task!r} is not one of the surrogate's OpenML tasks: {sorted(_task_codes())}")

    def error(config: dict[str, Any], epoch: int) -> float:
        return float(lcbench_errors(task, _row(config), np.array([epoch]))[0])

    return Problem(f"lcbench-{task}", "LCBench", _LCBENCH_PARAMS, LCBENCH_EPOCHS, "val_error",
                   LCBENCH_OPTIMA[task]["error"], error, error)


# Two of the 34 tasks where low-fidelity ranks mislead (Spearman's rho of the error after epoch 3
# and the best error of 500 random configs: 0.63 and 0.69; 0.8-0.9 on most tasks) and where the
# surrogate's optimum estimate is stable across seeds (on 189354, say, it is not: 4.6 or 7.9).
LCBENCH_TASKS = ("167190", "167184")
OPTIMA_FILE = os.path.join(DATA, "optima.json")


def _load_optima() -> dict[str, dict[str, Any]]:
    with open(OPTIMA_FILE) as f:
        return json.load(f)["tasks"]


LCBENCH_OPTIMA = _load_optima()


def problems(quick: bool = False) -> list[Problem]:
    """The benchmark's problems: MF-Hartmann 3-D and 6-D, and LCBench on ``LCBENCH_TASKS``
    (MF-Hartmann 3-D and the first task with ``quick``)."""
    if quick:
        return [mf_hartmann(3), lcbench(LCBENCH_TASKS[0])]
    return [mf_hartmann(3), mf_hartmann(6), *(lcbench(t) for t in LCBENCH_TASKS)]


if __name__ == "__main__":       # rewrite optima.json (a few minutes a task)
    found = {task: estimate_lcbench_optimum(task) for task in LCBENCH_TASKS}
    with open(OPTIMA_FILE, "w") as f:
        json.dump({"how": estimate_lcbench_optimum.__doc__.split("``LCBENCH_OPTIMA``")[0].strip(),
                   "tasks": found}, f, indent=1)
    print(json.dumps(found, indent=1))
