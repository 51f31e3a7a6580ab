"""``fit_multiple_model`` and ``automl``: MADlib's model selection calls. The session reads
and checks everything as the calling role; a child process (see :mod:`._job`) trains.

The session reads the source (and validation) table once, through SPI, and hands the rows to
the child, which runs the Cerebro driver and its workers. Trials are the rows of the model
selection table (``fit_multiple_model``: a :class:`cerebro.GridSearch` over ``mst_key``) or
are drawn from parameter grids (``automl``: :class:`cerebro.Hyperband` or
:class:`cerebro.TPESearch`), so hops, seeds, failures and resume behave exactly as in
Python: the same seed gives the same weights as the same search run from Python. A call
whose run was interrupted (cancelled, terminated, the server stopped) resumes it when
called again with the same arguments; one interrupted before its run had started starts
clean.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from ..data import in_content_order
from ..search import Hyperband, choice
from ._database import Database
from ._grid import ConfigGrid
from ._job import job_directory, run_job
from ._keras_model import GridBuild, ModelSpec, SelectionBuild
from ._limits import MAX_GRID_CONFIGS, check_count, listed, quoted
from ._model_tables import read_model_selection, require_model_ids, require_no_selection, write_selection
from ._output import RunDescription, write_outputs
from ._params import keyword_arguments
from ._preprocess import packing, read_packed

AUTOML_METHODS = ("hyperband", "tpe", "hyperopt")     # hyperopt: MADlib's name for TPE


def fit_multiple_model(db: Database, source_table: str, model_output_table: str, model_selection_table: str,
                       num_iterations: int, use_gpus: bool = False, validation_table: str | None = None,
                       metrics_compute_frequency: int | None = None, warm_start: bool = False,
                       name: str | None = None, description: str | None = None, use_caching: bool = False,
                       independent_varname: str | None = None, dependent_varname: str | None = None) -> None:
    """Train every row of ``model_selection_table`` for ``num_iterations`` epochs with MOP
    and write ``model_output_table``, ``_info`` and ``_summary``. ``use_caching`` is
    accepted and needs nothing: each worker holds its partition for the whole run. The
    source is a table of rows or one ``training_preprocessor_dl`` packed (see
    :func:`_read_data`)."""
    check_iterations(num_iterations, metrics_compute_frequency)
    db.lock_output(model_output_table, "model_output_table")
    model_arch_table, models = read_model_selection(db, model_selection_table)
    if warm_start:
        models = _warm_weights(db, model_output_table, models)
    else:
        _require_no_output(db, model_output_table)
    run = RunDescription(source_table, validation_table, independent_varname, dependent_varname, model_arch_table,
                         model_selection_table, num_iterations, metrics_compute_frequency or num_iterations,
                         bool(warm_start), name, description, method="grid", use_gpus=bool(use_gpus),
                         **run_settings(db, model_output_table))
    build = SelectionBuild(models, one_hot=False)
    weights = {f"model-{key}": spec.weights for key, spec in models.items() if spec.weights is not None}
    job = {"models": {str(key): _spec_fields(spec) for key, spec in models.items()}}
    warm = hashlib.sha256(b"".join(spec.weights or b"" for spec in models.values())).hexdigest()
    train_in_child(db, job, repr((build.models, warm)), weights, run, use_gpus, model_output_table)


def automl(db: Database, source_table: str, model_output_table: str, model_arch_table: str,
           model_selection_table: str, model_id_list: list[int], compile_params_grid: str, fit_params_grid: str,
           automl_method: str = "hyperband", automl_params: str | None = None, random_state: int | None = None,
           object_table: str | None = None, use_gpus: bool = False, validation_table: str | None = None,
           metrics_compute_frequency: int | None = None, name: str | None = None, description: str | None = None,
           independent_varname: str | None = None, dependent_varname: str | None = None) -> None:
    """MADlib's ``madlib_keras_automl``: Hyperband (``automl_params => 'R=6, eta=3'``) or TPE
    (``'tpe'`` or MADlib's ``'hyperopt'``: ``'num_configs=20, num_iterations=5'``) over the
    grids' space. The configurations tried are written to ``model_selection_table``, keyed in
    the order the trials were created."""
    if object_table is not None:
        raise ValueError(f"object_table={quoted(object_table)}: custom Keras objects are not supported; give NULL")
    db.lock_output(model_output_table, "model_output_table")
    architectures = require_model_ids(db, model_arch_table, model_id_list)
    grid = ConfigGrid(model_id_list, compile_params_grid, fit_params_grid, pulse=db.check_for_interrupts)
    _one_epoch_per_iteration(grid, fit_params_grid)
    require_no_selection(db, model_selection_table)
    _require_no_output(db, model_output_table)
    method = "tpe" if automl_method == "hyperopt" else automl_method
    params = keyword_arguments(automl_params, "automl_params", "R=6, eta=3", bare_names=True) \
        if automl_params else {}
    iterations = _automl_iterations(method, params, automl_params, automl_method)
    check_iterations(iterations, metrics_compute_frequency, "R" if method == "hyperband" else "num_iterations")
    _check_trials(method, params, iterations)
    settings = run_settings(db, model_output_table)
    if random_state is not None:
        settings["seed"] = random_state
    run = RunDescription(source_table, validation_table, independent_varname, dependent_varname, model_arch_table,
                         model_selection_table, iterations, metrics_compute_frequency or iterations, False, name,
                         description, method=method, automl_params=automl_params, use_gpus=bool(use_gpus),
                         random_state=random_state, **settings)
    weights = {f"arch-{m}": w for m, (_, w) in architectures.items() if w is not None}
    job = {"architectures": {str(m): [arch, w is not None] for m, (arch, w) in architectures.items()},
           "grid": [list(model_id_list), compile_params_grid, fit_params_grid], "params": params}
    build = GridBuild(architectures, grid, one_hot=False)
    tried = train_in_child(db, job, repr((build.grid, sorted(architectures.items()))), weights, run, use_gpus,
                   model_output_table)
    write_selection(db, model_arch_table, model_selection_table, [tuple(row) for row in tried["selection"]], None)


def _one_epoch_per_iteration(grid: ConfigGrid, fit_params_grid: str) -> None:
    """AutoML counts a configuration's budget (Hyperband's R, TPE's num_iterations) in
    iterations of one epoch each; a grid's other ``epochs`` would make its rungs mean
    something else."""
    epochs = grid.space.get("fit.epochs")
    if epochs is not None and (not isinstance(epochs, choice) or set(epochs.values) != {1}):
        raise ValueError(f"fit_params_grid {quoted(fit_params_grid)}: 'epochs' must be [1] for automl, whose budgets "
                         f"(R, num_iterations) count iterations of one epoch; give 'epochs': [1] or leave it out")


def _automl_iterations(method: str, params: Mapping[str, Any], automl_params: str | None, given: str) -> int:
    """The most epochs a trial trains, after checking ``automl_params`` for ``method``."""
    if method == "hyperband":
        _only(params, ("R", "eta", "skip_last"), method)
        if params.get("skip_last", 0) != 0:
            raise ValueError(f"automl_params {quoted(automl_params)}: skip_last={quoted(params['skip_last'])} is not "
                             f"supported; Cerebro's Hyperband runs every bracket")
        return params.get("R", 6)
    if method == "tpe":
        _only(params, ("num_configs", "num_iterations", "algorithm"), given)
        if params.get("algorithm", "tpe") != "tpe":
            raise ValueError(f"automl_params {quoted(automl_params)}: algorithm={quoted(params['algorithm'])} must be "
                             f"tpe")
        return params.get("num_iterations", 5)
    raise ValueError(f"automl_method={quoted(given)} must be one of {', '.join(map(repr, AUTOML_METHODS))}")


def _check_trials(method: str, params: Mapping[str, Any], iterations: int) -> None:
    """Refuse an automl run of more than :data:`._limits.MAX_GRID_CONFIGS` trials before
    anything is read: TPE's ``num_configs``, or the trials Hyperband's brackets start
    (counted from R and eta: R=9, eta=3 starts 17; R=10**9, eta=2 1.1 billion)."""
    if method == "tpe":
        trials = params.get("num_configs", 20)
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise ValueError(f"automl_params: num_configs={quoted(trials)} must be a positive integer")
        check_count(f"automl_params num_configs={trials} makes", trials, "configurations", MAX_GRID_CONFIGS,
                    "MAX_GRID_CONFIGS")
        return
    eta = params.get("eta", 3)
    brackets = Hyperband(lambda config: None, {"config": choice([0])}, max_epochs=iterations, eta=eta).brackets()
    check_count(f"automl_params R={iterations}, eta={quoted(eta)} makes", sum(b.keep[0] for b in brackets),
                "configurations", MAX_GRID_CONFIGS, "MAX_GRID_CONFIGS", ": give a smaller R or a larger eta")


def train_in_child(db: Database, job: dict[str, Any], identity: str, weights: Mapping[str, bytes],
                   run: RunDescription, use_gpus: bool, output_table: str,
                   write: Callable[..., None] = write_outputs) -> dict[str, Any]:
    """Read the data as the caller, have a child process train (or resume the interrupted
    run of the same call), ``write`` the output tables; returns the child's answer. The store
    is named by a digest of the call (trials, data, seed), so a run directory is resumed
    only by the call that made it."""
    arrays, run = _read_data(db, run)
    digest = _digest(identity, arrays, run)
    run = replace(run, store=run.store if db.setting("store") else os.path.join(run.store, digest[:12]))
    store = run.store
    os.makedirs(os.path.dirname(os.path.abspath(store)), exist_ok=True)
    with job_directory(arrays, weights, under=os.path.dirname(os.path.abspath(store))) as job_dir:
        answer = run_job(db, job_dir, {**job, "kind": "fit", "digest": digest, "use_gpus": bool(use_gpus),
                                       "run": asdict(run)},
                         keras_backend=db.keras_backend(), use_gpus=bool(use_gpus))
        if answer["resumed"]:
            db.notice(f"continued the run in {store} (a finished one is read back as it is)")
        write(db, output_table, answer, run, job_dir)
        return answer


def _read_data(db: Database, run: RunDescription) -> tuple[dict[str, np.ndarray], RunDescription]:
    """The source (and validation) rows as the calling role reads them, in the order
    ``Dataset.from_sql`` puts them, and ``run`` with what the data says (column names, class
    values, the normalizing constant). A source ``training_preprocessor_dl`` packed is read
    from its buffers, with the names its summary gives; its validation table must be packed
    alike (``validation_preprocessor_dl``)."""
    layout = packing(db, run.source_table, "source_table")
    if layout is None:
        label = run.dependent_varname or "dependent_var"
        run = replace(run, independent_varname=run.independent_varname or "independent_var", dependent_varname=label)
        arrays, class_values = _read_rows(db, run, label)
        return arrays, replace(run, class_values=class_values, dependent_vartype=db.columns(
            run.source_table, "source_table")[label])
    for given, packed, argument in ((run.independent_varname, layout.independent_varname, "independent_varname"),
                                    (run.dependent_varname, layout.dependent_varname, "dependent_varname")):
        if given not in (None, packed):
            raise ValueError(f"{argument}={quoted(given)}: source_table {quoted(run.source_table)} is packed, with "
                             f"{quoted(packed)}; give NULL or {quoted(packed)}")
    arrays = {}
    for table, argument, prefix in ((run.source_table, "source_table", "train"),
                                    (run.validation_table, "validation_table", "validation")):
        if table is None:
            continue
        found = layout if prefix == "train" else packing(db, table, argument)
        if found is None or found.class_values != layout.class_values:
            raise ValueError(f"validation_table {quoted(table)} must be packed by validation_preprocessor_dl with "
                             f"training_preprocessor_table => {quoted(run.source_table)}, as the source table is")
        arrays[f"{prefix}_features"], arrays[f"{prefix}_label"] = in_content_order(
            *read_packed(db, table, argument, found))
    return arrays, replace(run, independent_varname=layout.independent_varname,
                           dependent_varname=layout.dependent_varname, class_values=layout.class_values,
                           dependent_vartype=layout.dependent_vartype, normalizing_const=layout.normalizing_const)


def _read_rows(db: Database, run: RunDescription, label: str) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """The rows of a source (and validation) table of rows, checked by name first; and the
    class values of a text ``label``."""
    features = [c.strip() for c in (run.independent_varname or "").split(",") if c.strip()]
    if not features:
        raise ValueError(f"independent_varname={quoted(run.independent_varname)} must name one or more columns")
    for table, argument in ((run.source_table, "source_table"), (run.validation_table, "validation_table")):
        if table is not None:
            db.require_columns(table, argument, [*features, label])
    arrays = {}
    tables = [(t, a, p) for t, a, p in ((run.source_table, "source_table", "train"),
                                        (run.validation_table, "validation_table", "validation")) if t is not None]
    classes = [db.class_values(t, a, label) for t, a, _ in tables]
    # Text classes (MADlib's 'Iris-setosa', ...): a class's id is its place among them all.
    class_values = None if classes[0] is None else sorted({c for found in classes for c in found or []})
    for table, argument, prefix in tables:
        x, y = in_content_order(*db.read(table, argument, features, label, class_values))
        if x.dtype == object:
            raise TypeError(f"{argument} {quoted(table)}: the SQL functions take numeric features (numbers or arrays "
                            f"of numbers); {quoted(features)} holds bytea")
        arrays[f"{prefix}_features"], arrays[f"{prefix}_label"] = x, y
    return arrays, class_values


def _digest(call: str, arrays: Mapping[str, np.ndarray], run: RunDescription) -> str:
    hasher = hashlib.sha256(f"{call}|{run.num_iterations}|{run.seed}|{run.method}".encode())
    for name in sorted(arrays):
        hasher.update(name.encode() + np.ascontiguousarray(arrays[name]).tobytes())
    return hasher.hexdigest()


def _spec_fields(spec: ModelSpec) -> list[Any]:
    return [spec.model_id, spec.model_arch, spec.compile_params, spec.fit_params, spec.weights is not None]


def run_settings(db: Database, output_table: str) -> dict[str, Any]:
    """The run's settings from the session (see :mod:`._database`)."""
    return {"store": db.store(output_table), "seed": db.integer_setting("seed", 0, 0), "workers": db.workers(),
            "started": time.time()}


def check_iterations(num_iterations: Any, frequency: Any, name: str = "num_iterations") -> None:
    if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or num_iterations < 1:
        raise ValueError(f"{name}={quoted(num_iterations)} must be a positive integer")
    if frequency is not None and not 1 <= frequency <= num_iterations:
        raise ValueError(f"metrics_compute_frequency={quoted(frequency)} must be between 1 and num_iterations "
                         f"({num_iterations})")


def _only(params: Mapping[str, Any], allowed: tuple[str, ...], method: str) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"automl_params has {listed(unknown, quote=False)}; {method} understands {', '.join(allowed)}")


def _require_no_output(db: Database, output_table: str) -> None:
    for suffix in ("", "_info", "_summary"):
        db.require_absent(f"{output_table}{suffix}", "model_output_table")


def _warm_weights(db: Database, output_table: str, models: Mapping[int, ModelSpec]) -> dict[int, ModelSpec]:
    """``warm_start``: each row starts from the weights ``output_table`` holds for its key; a
    key it does not hold (a row added since) starts as a cold start would, as in MADlib."""
    table = db.require(output_table, "model_output_table (warm_start)")
    weights = {row["mst_key"]: row["model_weights"] for row in db.query(
        f"SELECT mst_key, model_weights FROM {table}")}
    return {key: spec if weights.get(key) is None else replace(spec, weights=bytes(weights[key]))
            for key, spec in models.items()}
