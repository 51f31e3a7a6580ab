"""The tables a model selection writes, with MADlib's layout: ``<out>`` (one row per
configuration: its key, architecture, parameters and trained weights), ``<out>_info``
(per-iteration training and validation metrics as arrays, with their times) and
``<out>_summary`` (what was run, where its run directory is)."""
from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._version import __version__
from ..results import Result
from ._database import Database
from ._keras_model import ModelSpec, flat_weights
from ._params import parse_compile_params, parse_fit_params


@dataclass(frozen=True)
class RunDescription:
    """The arguments of the SQL call and the run's settings, for ``<out>_summary``."""

    source_table: str
    validation_table: str | None
    independent_varname: str | None
    dependent_varname: str | None
    model_arch_table: str
    model_selection_table: str | None      # None: madlib_keras_fit's one model
    num_iterations: int
    metrics_compute_frequency: int
    warm_start: bool
    name: str | None
    description: str | None
    store: str
    seed: int
    workers: int
    method: str
    started: float
    class_values: Sequence[str | None] | None = None  # a text label's classes by id (NULL: num_classes' padding)
    dependent_vartype: str | None = None
    automl_params: str | None = None
    normalizing_const: float = 1.0      # what predict divides features by (training_preprocessor_dl's)
    use_gpus: bool = False
    random_state: int | None = None     # automl's, as given (seed holds the seed the run used)


def metrics_iterations(num_iterations: int, frequency: int) -> list[int]:
    """The iterations whose metrics ``<out>_info`` keeps: every ``frequency``-th and the last."""
    return sorted({*range(frequency, num_iterations + 1, frequency), num_iterations})


def hyperband_rounds(brackets: Sequence[tuple[int, Sequence[int], int]], result: Result) -> dict[str, list[int]]:
    """MADlib's ``s`` and ``i`` of each trial of a Hyperband run: its bracket, and the last
    round of it the trial reached. ``brackets`` are (s, each round's epochs, trials of the
    first round), largest first, filled in trial order (as :class:`cerebro.Hyperband` does)."""
    owners = [(s, rounds) for s, rounds, first in brackets for _ in range(first)]
    found = {}
    for position, trial in enumerate(sorted(result.trials, key=lambda t: t.trial_id)):
        s, rounds = owners[position]
        found[trial.trial_id] = [s, max(0, sum(1 for epochs in rounds if epochs <= trial.epochs) - 1)]
    return found


# The values of an <out>_info row, as output_rows hands them over (model_type is written by SQL).
INFO_FIELDS = ("mst_key", "model_id", "compile_params", "fit_params", "model_size", "metrics_elapsed_time",
               "metrics_type", "loss_type", "training_metrics_final", "training_loss_final", "training_metrics",
               "training_loss", "validation_metrics_final", "validation_loss_final", "validation_metrics",
               "validation_loss", "metrics_iters", "status", "reason", "iterations", "trial_id")


def output_rows(result: Result, by_trial: Mapping[str, ModelSpec], run: RunDescription,
                weights_dir: str, rounds: Mapping[str, list[int]] | None = None) -> dict[str, Any]:
    """The rows of ``<out>`` and ``<out>_info`` for ``result``'s trials, as plain data (each
    trial's weights in a file of ``weights_dir``), and the best trial's key: what the child
    process that trained (see :mod:`._job`) hands back to the session for
    :func:`write_outputs`. ``by_trial`` gives each trial's model selection row."""
    kept = metrics_iterations(run.num_iterations, run.metrics_compute_frequency)
    history = result.history()
    ends = result.schedule().groupby(["trial_id", "epoch"])["end"].max().to_dict()
    # A model selection table's trial carries its key; an AutoML trial's key is its place.
    keys = {t.trial_id: t.config.get("mst_key", position + 1) for position, t in enumerate(result.trials)}
    models, info = [], []
    for trial in result.trials:
        spec, key = by_trial[trial.trial_id], keys[trial.trial_id]
        weights = flat_weights(trial.state_dict("last")) if trial.epochs else None     # MADlib's: the last
        if weights is not None:
            with open(os.path.join(weights_dir, f"{key}.weights"), "wb") as f:
                f.write(weights)
        models.append([key, spec.model_id, spec.model_arch, spec.compile_params, spec.fit_params, weights is not None])
        # An iteration of a row with fit_params epochs=k is k epochs.
        per_iteration = parse_fit_params(spec.fit_params).epochs
        rows = history[history["trial_id"] == trial.trial_id] if len(history) else history
        # A trial stopped early (Hyperband, a failure) keeps its last epoch: the _final values.
        rows = rows[rows["epoch"].isin([i * per_iteration for i in kept]) | (rows["epoch"] == trial.epochs)] \
            if len(rows) else rows
        # The iteration each kept epoch ends (or, for a failure within one, falls in).
        iterations = [-(-int(e) // per_iteration) for e in rows["epoch"]] if len(rows) else []
        metric = _first_metric(spec)
        training, validation = _column(rows, f"train_{metric}"), _column(rows, f"val_{metric}")
        training_loss, validation_loss = _column(rows, "train_loss"), _column(rows, "val_loss")
        info.append([key, spec.model_id, spec.compile_params, spec.fit_params,
                     len(weights) / 1024 if weights else None,
                     [ends.get((trial.trial_id, int(e))) for e in rows["epoch"]] if len(rows) else [],
                     [metric] if metric else [], _loss_name(spec),
                     _last(training), _last(training_loss), training, training_loss,
                     _last(validation), _last(validation_loss), validation, validation_loss, iterations,
                     trial.status.value, trial.reason or trial.error, trial.epochs // per_iteration, trial.trial_id,
                     *(rounds[trial.trial_id] if rounds else [])])
    return {"models": models, "info": info, "best": _best_key(result, keys), "store": result.store.path,
            "ended": time.time(), "rounds": rounds is not None}


def write_outputs(db: Database, output_table: str, rows: Mapping[str, Any], run: RunDescription,
                  weights_dir: str) -> None:
    """Replace ``output_table`` and its ``_info`` and ``_summary`` tables with ``rows`` (see
    :func:`output_rows`)."""
    names = {suffix: db.qualified(f"{output_table}{suffix}", "model_output_table")
             for suffix in ("", "_info", "_summary")}
    for suffix, table in names.items():
        if db.exists(f"{output_table}{suffix}", "model_output_table"):      # warm_start replaces them
            db.query(f"DROP TABLE {table}")
    db.query(f"CREATE TABLE {names['']} (mst_key INTEGER PRIMARY KEY, model_id INTEGER, model_arch JSON, "
             f"compile_params VARCHAR, fit_params VARCHAR, model_weights BYTEA)")
    db.query(f"CREATE TABLE {names['_info']} (mst_key INTEGER PRIMARY KEY, model_id INTEGER, compile_params VARCHAR, "
             f"fit_params VARCHAR, model_type VARCHAR, model_size DOUBLE PRECISION, "
             f"metrics_elapsed_time DOUBLE PRECISION[], metrics_type VARCHAR[], loss_type VARCHAR, "
             f"training_metrics_final DOUBLE PRECISION, training_loss_final DOUBLE PRECISION, "
             f"training_metrics DOUBLE PRECISION[], training_loss DOUBLE PRECISION[], "
             f"validation_metrics_final DOUBLE PRECISION, validation_loss_final DOUBLE PRECISION, "
             f"validation_metrics DOUBLE PRECISION[], validation_loss DOUBLE PRECISION[], metrics_iters INTEGER[], "
             f"status VARCHAR, reason VARCHAR, iterations INTEGER, trial_id VARCHAR"
             + (", s INTEGER, i INTEGER)" if rows.get("rounds") else ")"))
    for key, model_id, model_arch, compile_params, fit_params, trained in rows["models"]:
        weights = None
        if trained:
            with open(os.path.join(weights_dir, f"{key}.weights"), "rb") as f:
                weights = f.read()
        db.query(f"INSERT INTO {names['']} VALUES ($1, $2, $3, $4, $5, $6)",
                 [key, model_id, model_arch, compile_params, fit_params, weights],
                 ["integer", "integer", "json", "text", "text", "bytea"])
    types = ["integer", "integer", "text", "text", "float8", "float8[]", "text[]", "text", "float8", "float8",
             "float8[]", "float8[]", "float8", "float8", "float8[]", "float8[]", "integer[]", "text", "text", "integer",
             "text",
             *(["integer", "integer"] if rows.get("rounds") else [])]
    # $1..$4, then MADlib's model_type, then the rest.
    places = ", ".join(["$1", "$2", "$3", "$4", "'keras'", *(f"${n}" for n in range(5, len(types) + 1))])
    for values in rows["info"]:
        db.query(f"INSERT INTO {names['_info']} VALUES ({places})", values, types)
    _write_summary(db, names["_summary"], output_table, rows, run)


def _write_summary(db: Database, table: str, output_table: str, rows: Mapping[str, Any],
                   run: RunDescription) -> None:
    """``<out>_summary``: MADlib's columns (``object_table`` is always NULL: no custom
    objects; ``random_state`` as given, the seed used is ``seed``), then Cerebro's."""
    columns = (
        ("source_table", "text", run.source_table), ("validation_table", "text", run.validation_table),
        ("model", "text", output_table), ("model_info", "text", f"{output_table}_info"),
        ("dependent_varname", "text", run.dependent_varname), ("independent_varname", "text", run.independent_varname),
        ("model_arch_table", "text", run.model_arch_table),
        ("model_selection_table", "text", run.model_selection_table),
        ("automl_method", "text", run.method), ("automl_params", "text", run.automl_params),
        ("random_state", "integer", run.random_state), ("object_table", "text", None),
        ("use_gpus", "boolean", run.use_gpus), ("num_iterations", "integer", run.num_iterations),
        ("metrics_compute_frequency", "integer", run.metrics_compute_frequency),
        ("warm_start", "boolean", run.warm_start), ("name", "text", run.name), ("description", "text", run.description),
        ("start_training_time", "timestamptz", run.started), ("end_training_time", "timestamptz", rows["ended"]),
        ("metrics_iters", "integer[]", metrics_iterations(run.num_iterations, run.metrics_compute_frequency)),
        ("best_mst_key", "integer", rows["best"]), ("store", "text", rows["store"]), ("seed", "integer", run.seed),
        ("workers", "integer", run.workers), ("cerebro_version", "text", __version__),
        ("dependent_vartype", "text", run.dependent_vartype), ("class_values", "text[]", run.class_values),
        ("madlib_version", "text", f"cerebro {__version__}"), ("normalizing_const", "real", run.normalizing_const))
    _table_of_one_row(db, table, [name for name, _, _ in columns], [kind for _, kind, _ in columns],
                      [value for _, _, value in columns])


def _table_of_one_row(db: Database, table: str, names: Sequence[str], types: Sequence[str],
                      values: Sequence[Any]) -> None:
    """Create ``table`` with these columns (SQL names, quoted where they need it) and insert
    the one row; a ``timestamptz`` value is given as seconds since the epoch."""
    db.query(f"CREATE TABLE {table} (" + ", ".join(
        f"{name} {kind.replace('float8', 'DOUBLE PRECISION')}" for name, kind in zip(names, types)) + ")")
    places = ", ".join(f"to_timestamp(${i + 1})" if kind == "timestamptz" else f"${i + 1}"
                       for i, kind in enumerate(types))
    db.query(f"INSERT INTO {table} VALUES ({places})", list(values),
             ["float8" if kind == "timestamptz" else kind for kind in types])


def _best_key(result: Result, keys: Mapping[str, int]) -> int | None:
    try:
        return keys[result.best.trial_id]
    except ValueError:    # no trial finished with a finite metric
        return None


def _first_metric(spec: ModelSpec) -> str | None:
    """MADlib reports one metric: the first of ``compile_params``'s."""
    metrics = parse_compile_params(spec.compile_params).metrics
    return metrics[0] if metrics else None


def _loss_name(spec: ModelSpec) -> str:
    return parse_compile_params(spec.compile_params).loss


def _column(rows: Any, name: str) -> list[float | None] | None:
    """A history column as SQL numbers: NaN (an epoch without that metric) is NULL, and so
    is a column the run has not (validation metrics without a validation table), as in MADlib."""
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
            for v in rows[name]] if name in rows else None


def _last(values: Sequence[float | None] | None) -> float | None:
    return values[-1] if values else None


# madlib_keras_fit's <model>_summary, MADlib's columns in MADlib's order, then Cerebro's run.
_FIT_SUMMARY = (
    ("source_table", "text"), ("model", "text"), ("dependent_varname", "text[]"), ("independent_varname", "text[]"),
    ("model_arch_table", "text"), ("model_id", "integer"), ("compile_params", "text"), ("fit_params", "text"),
    ("num_iterations", "integer"), ("validation_table", "text"), ("object_table", "text"),
    ("metrics_compute_frequency", "integer"), ("name", "text"), ("description", "text"), ("model_type", "text"),
    ("model_size", "float8"), ("start_training_time", "timestamptz"), ("end_training_time", "timestamptz"),
    ("metrics_elapsed_time", "float8[]"), ("madlib_version", "text"), ("num_classes", "integer[]"),
    ("dependent_vartype", "text[]"), ("normalizing_const", "real"), ("metrics_type", "text[]"),
    ("loss_type", "text"), ("training_metrics_final", "float8"), ("training_loss_final", "float8"),
    ("training_metrics", "float8[]"), ("training_loss", "float8[]"), ("validation_metrics_final", "float8"),
    ("validation_loss_final", "float8"), ("validation_metrics", "float8[]"), ("validation_loss", "float8[]"),
    ("metrics_iters", "integer[]"), ("class_values", "text[]"), ("warm_start", "boolean"), ("store", "text"),
    ("seed", "integer"), ("workers", "integer"), ("cerebro_version", "text"))


def write_model_output(db: Database, model: str, rows: Mapping[str, Any], run: RunDescription,
                       weights_dir: str) -> None:
    """``madlib_keras_fit``'s tables: ``model`` (its one row: ``model_weights``, ``model_arch``)
    and ``model_summary`` (:data:`_FIT_SUMMARY`; the class values column is named
    ``<dependent_varname>_class_values``, as MADlib names it). A model that failed to train
    is an error naming why, and writes nothing."""
    (key, model_id, model_arch, compile_params, fit_params, trained), = rows["models"]
    info = dict(zip(INFO_FIELDS, rows["info"][0]))
    if info["status"] != "completed" or not trained:
        raise ValueError(f"the model did not train: {info['status']} after {info['iterations']} iterations: "
                         f"{info['reason']}; its run directory is {rows['store']}")
    with open(os.path.join(weights_dir, f"{key}.weights"), "rb") as f:
        weights = f.read()
    tables = {suffix: db.qualified(f"{model}{suffix}", "model") for suffix in ("", "_summary")}
    for suffix, table in tables.items():
        if db.exists(f"{model}{suffix}", "model"):      # warm_start replaces them
            db.query(f"DROP TABLE {table}")
    db.query(f"CREATE TABLE {tables['']} (model_weights BYTEA, model_arch JSON)")
    db.query(f"INSERT INTO {tables['']} VALUES ($1, $2)", [weights, model_arch], ["bytea", "json"])
    label = run.dependent_varname or "dependent_var"
    try:
        class_column = db.quoted(f"{label}_class_values", "dependent_varname")
    except ValueError:      # a label whose name no column name can carry
        class_column = "class_values"
    names = [class_column if name == "class_values" else name for name, _ in _FIT_SUMMARY]
    values = [run.source_table, model, [label], [run.independent_varname], run.model_arch_table, model_id,
              compile_params, fit_params, run.num_iterations, run.validation_table, None,
              run.metrics_compute_frequency, run.name, run.description, "madlib_keras", info["model_size"],
              run.started, rows["ended"], info["metrics_elapsed_time"], f"cerebro {__version__}",
              None if run.class_values is None else [len(run.class_values)],
              [run.dependent_vartype], run.normalizing_const,
              *(info[name] for name, _ in _FIT_SUMMARY[23:33]),
              metrics_iterations(run.num_iterations, run.metrics_compute_frequency), run.class_values,
              run.warm_start, rows["store"], run.seed, run.workers, __version__]
    _table_of_one_row(db, tables["_summary"], names, [kind for _, kind in _FIT_SUMMARY], values)
