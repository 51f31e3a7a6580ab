"""``fit_multiple_model`` and ``automl``: MADlib's model selection calls, run by the Cerebro
driver inside the PostgreSQL session that calls them.

The driver reads the source (and validation) table once, as Arrow through ADBC, and writes
its partitions into the run directory; each worker process loads its partitions from there
and keeps them for the whole run. Trials are the rows of the model selection table
(``fit_multiple_model``: a :class:`cerebro.GridSearch` over ``mst_key``) or are drawn from
parameter grids (``automl``: :class:`cerebro.Hyperband` or :class:`cerebro.TPESearch`), so
hops, seeds, failures and resume behave exactly as in Python: the same seed gives the same
weights as the same search run from Python. A call whose run was interrupted resumes it
when called again with the same arguments.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..backends import LocalBackend
from ..data import Dataset
from ..engine import resume
from ..report import Result, load
from ..search import GridSearch, Hyperband, Searcher, TPESearch, choice
from ._database import Database
from ._grid import ConfigGrid
from ._keras_model import GridBuild, ModelSpec, SelectionBuild
from ._model_tables import read_model_selection, require_model_ids, require_no_selection, write_selection
from ._output import RunDescription, write_outputs
from ._params import keyword_arguments


def fit_multiple_model(db: Database, source_table: str, model_output_table: str, model_selection_table: str,
                       num_iterations: int, use_gpus: bool = False, validation_table: str | None = None,
                       metrics_compute_frequency: int | None = None, warm_start: bool = False,
                       name: str | None = None, description: str | None = None,
                       independent_varname: str = "independent_var",
                       dependent_varname: str = "dependent_var") -> None:
    """Train every row of ``model_selection_table`` for ``num_iterations`` epochs with MOP
    and write ``model_output_table``, ``_info`` and ``_summary``."""
    _check_iterations(num_iterations, metrics_compute_frequency)
    model_arch_table, models = read_model_selection(db, model_selection_table)
    if warm_start:
        models = _warm_weights(db, model_output_table, models)
    else:
        _require_no_output(db, model_output_table)
    settings = _settings(db, model_output_table)
    data, one_hot = _load_data(db, source_table, validation_table, independent_varname, dependent_varname,
                               settings["seed"], settings["workers"])
    build = SelectionBuild(models, one_hot)
    space = {"mst_key": choice(sorted(models))}
    run = RunDescription(source_table, validation_table, independent_varname, dependent_varname, model_arch_table,
                         model_selection_table, num_iterations, metrics_compute_frequency or num_iterations,
                         bool(warm_start), name, description, method="grid", **settings)

    def searcher(space_with_run: dict[str, Any]) -> Searcher:
        return GridSearch(build, space_with_run, epochs=num_iterations, metric=_metric(data), mode="min")
    warm = hashlib.sha256(b"".join(spec.weights or b"" for spec in models.values())).hexdigest()
    result = _run(db, searcher, space, repr((build, space, warm)), data, run, use_gpus)
    run = replace(run, store=result.store.path)
    by_trial = {t.trial_id: models[t.config["mst_key"]] for t in result.trials}
    write_outputs(db, model_output_table, result, by_trial, run)


def automl(db: Database, source_table: str, model_output_table: str, model_arch_table: str,
           model_selection_table: str, model_id_list: list[int], compile_params_grid: str, fit_params_grid: str,
           automl_method: str = "hyperband", automl_params: str | None = None, random_state: int | None = None,
           object_table: str | None = None, use_gpus: bool = False, validation_table: str | None = None,
           metrics_compute_frequency: int | None = None, name: str | None = None, description: str | None = None,
           independent_varname: str = "independent_var", dependent_varname: str = "dependent_var") -> None:
    """MADlib's ``madlib_keras_automl``: Hyperband (``automl_params => 'R=6, eta=3'``) or TPE
    (``'num_configs=20, num_iterations=5'``) over the grids' space. The configurations tried
    are written to ``model_selection_table``, keyed in the order the trials were created."""
    architectures = require_model_ids(db, model_arch_table, model_id_list)
    grid = ConfigGrid(model_id_list, compile_params_grid, fit_params_grid)
    require_no_selection(db, model_selection_table)
    _require_no_output(db, model_output_table)
    params = keyword_arguments(automl_params, "automl_params", "R=6, eta=3", bare_names=True) \
        if automl_params else {}
    settings = _settings(db, model_output_table)
    if random_state is not None:
        settings["seed"] = random_state
    data, one_hot = _load_data(db, source_table, validation_table, independent_varname, dependent_varname,
                               settings["seed"], settings["workers"])
    build = GridBuild(architectures, grid, one_hot)
    if automl_method == "hyperband":
        _only(params, ("R", "eta", "skip_last"), automl_method)
        if params.get("skip_last", 0) != 0:
            raise ValueError(f"automl_params {automl_params!r}: skip_last={params['skip_last']!r} is not supported; "
                             f"Cerebro's Hyperband runs every bracket")
        iterations = params.get("R", 6)

        def searcher(space: dict[str, Any]) -> Searcher:
            return Hyperband(build, space, max_epochs=iterations, eta=params.get("eta", 3), metric=_metric(data))
    elif automl_method == "tpe":
        _only(params, ("num_configs", "num_iterations", "algorithm"), automl_method)
        if params.get("algorithm", "tpe") != "tpe":
            raise ValueError(f"automl_params {automl_params!r}: algorithm={params['algorithm']!r} must be tpe")
        iterations = params.get("num_iterations", 5)

        def searcher(space: dict[str, Any]) -> Searcher:
            return TPESearch(build, space, num_trials=params.get("num_configs", 20), epochs=iterations,
                             metric=_metric(data))
    else:
        raise ValueError(f"automl_method={automl_method!r} must be 'hyperband' or 'tpe'")
    _check_iterations(iterations, metrics_compute_frequency, "R" if automl_method == "hyperband" else "num_iterations")
    run = RunDescription(source_table, validation_table, independent_varname, dependent_varname, model_arch_table,
                         model_selection_table, iterations, metrics_compute_frequency or iterations, False, name,
                         description, method=automl_method, **settings)
    space = dict(grid.space)
    result = _run(db, searcher, space, repr((build, space)), data, run, use_gpus)
    run = replace(run, store=result.store.path)
    by_trial = {trial.trial_id: build.spec(trial.config) for trial in result.trials}
    write_selection(db, model_arch_table, model_selection_table,
                     [(s.model_id, s.compile_params, s.fit_params) for s in by_trial.values()], object_table)
    write_outputs(db, model_output_table, result, by_trial, run)


def _run(db: Database, searcher: Any, space: dict[str, Any], identity: str, data: Dataset, run: RunDescription,
         use_gpus: bool) -> Result:
    """Fit, or resume the interrupted run of the same call. The space carries a digest of
    the call (trials, data, seed) as a constant, so a run directory is resumed only by the
    call that made it."""
    digest = _digest(identity, data, run)
    store = run.store if db.setting("store") else os.path.join(run.store, digest[:12])
    backend = LocalBackend(workers=run.workers)
    with _gpus(use_gpus):
        if os.path.exists(os.path.join(store, "run.json")):
            made_by = {t.config.get("call") for t in load(store).trials}
            if made_by != {digest}:
                raise ValueError(f"the run directory {store!r} holds another run; SET cerebro.store to a new "
                                 f"directory or remove it")
            db.notice(f"continuing the run in {store} (a finished one is read back as it is)")
            return resume(store, backend=backend, verbose=0)
        return searcher({**space, "call": digest}).fit(data, backend=backend, store=store, seed=run.seed, verbose=0,
                                                      tensorboard=False)


def _digest(call: str, data: Dataset, run: RunDescription) -> str:
    hasher = hashlib.sha256(f"{call}|{run.num_iterations}|{run.seed}|{run.method}".encode())
    for array in (data.features, data.label, *data.validation_arrays()):
        hasher.update(np.ascontiguousarray(array).tobytes())
    return hasher.hexdigest()


def _settings(db: Database, output_table: str) -> dict[str, Any]:
    """The run's settings from the session (see :mod:`._database`)."""
    return {"store": db.store(output_table), "seed": db.integer_setting("seed", 0, 0),
            "workers": db.integer_setting("workers", os.cpu_count() or 1, 1), "started": time.time()}


def _load_data(db: Database, source_table: str, validation_table: str | None, independent_varname: str,
               dependent_varname: str, seed: int, partitions: int) -> tuple[Dataset, bool]:
    """The source (and validation) rows, checked by name first; and whether labels are
    one-hot rows rather than class ids."""
    features = [c.strip() for c in (independent_varname or "").split(",") if c.strip()]
    if not features:
        raise ValueError(f"independent_varname={independent_varname!r} must name one or more columns")
    for table, argument in ((source_table, "source_table"), (validation_table, "validation_table")):
        if table is not None:
            db.require_columns(table, argument, [*features, dependent_varname])
    dsn = db.dsn()
    validation = None if validation_table is None else Dataset.from_sql(
        dsn, validation_table, features=features, label=dependent_varname, validation=None, seed=seed)
    data = Dataset.from_sql(dsn, source_table, features=features, label=dependent_varname, validation=validation,
                            partitions=partitions, seed=seed)
    return data, data.label.ndim > 1


def _metric(data: Dataset) -> str:
    return "val_loss" if data.has_validation else "train_loss"


def _check_iterations(num_iterations: Any, frequency: Any, name: str = "num_iterations") -> None:
    if isinstance(num_iterations, bool) or not isinstance(num_iterations, int) or num_iterations < 1:
        raise ValueError(f"{name}={num_iterations!r} must be a positive integer")
    if frequency is not None and not 1 <= frequency <= num_iterations:
        raise ValueError(f"metrics_compute_frequency={frequency!r} must be between 1 and num_iterations "
                         f"({num_iterations})")


def _only(params: Mapping[str, Any], allowed: tuple[str, ...], method: str) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"automl_params has {', '.join(unknown)}; {method} understands {', '.join(allowed)}")


def _require_no_output(db: Database, output_table: str) -> None:
    for suffix in ("", "_info", "_summary"):
        db.require_absent(f"{output_table}{suffix}", "model_output_table")


def _warm_weights(db: Database, output_table: str, models: Mapping[int, ModelSpec]) -> dict[int, ModelSpec]:
    """``warm_start``: each row starts from the weights ``output_table`` holds for its key."""
    table = db.require(output_table, "model_output_table (warm_start)")
    weights = {row["mst_key"]: row["model_weights"] for row in db.query(
        f"SELECT mst_key, model_weights FROM {table}")}
    missing = [key for key in models if weights.get(key) is None]
    if missing:
        raise ValueError(f"warm_start: model_output_table {output_table!r} has no weights for mst_key {missing}")
    return {key: replace(spec, weights=bytes(weights[key])) for key, spec in models.items()}


@contextlib.contextmanager
def _gpus(use_gpus: bool) -> Iterator[None]:
    """Workers see the server's GPUs only with ``use_gpus``; it needs one."""
    if use_gpus:
        import torch
        if not torch.cuda.is_available():
            raise ValueError("use_gpus is true, but the server sees no GPU; call with use_gpus => false")
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
