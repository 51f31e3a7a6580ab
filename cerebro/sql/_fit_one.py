"""``fit``: MADlib's ``madlib_keras_fit``, one model trained on a table.

It is a model selection of one row (the same child process, data reading, resume and
seeds as :func:`._fit_multiple.fit_multiple_model`), written in MADlib's single-model
layout: ``<model>`` holds ``model_weights`` and ``model_arch``, ``<model>_summary`` what was
run with its metrics (see :func:`._output.write_model_output`). Where MADlib averages the
segments' models after each iteration, the one model here trains with plain sequential SGD
over every partition in turn, and ``fit_params``'s ``epochs=k`` makes each iteration ``k``
passes over all the data, so ``num_iterations`` and ``metrics_compute_frequency`` count
iterations as in MADlib.
"""
from __future__ import annotations

import hashlib

from ._database import Database
from ._fit_multiple import check_iterations, run_settings, train_in_child
from ._keras_model import ModelSpec, SelectionBuild
from ._limits import quoted
from ._model_tables import require_model_ids
from ._output import RunDescription, write_model_output
from ._params import parse_compile_params, parse_fit_params


def fit(db: Database, source_table: str, model: str, model_arch_table: str, model_id: int, compile_params: str,
        fit_params: str | None, num_iterations: int, use_gpus: bool = False, validation_table: str | None = None,
        metrics_compute_frequency: int | None = None, warm_start: bool = False, name: str | None = None,
        description: str | None = None, object_table: str | None = None, independent_varname: str | None = None,
        dependent_varname: str | None = None) -> None:
    """Train the architecture ``model_id`` of ``model_arch_table`` for ``num_iterations``
    iterations and write ``model`` and ``model_summary``. ``warm_start`` starts from the
    weights ``model`` holds (and replaces it); without it, ``model`` must not exist."""
    if object_table is not None:
        raise ValueError(f"object_table={quoted(object_table)}: custom Keras objects are not supported; give NULL")
    check_iterations(num_iterations, metrics_compute_frequency)
    parse_compile_params(compile_params)
    fit_params = fit_params or ""
    parse_fit_params(fit_params)
    db.lock_output(model, "model")
    architecture, weights = require_model_ids(db, model_arch_table, [model_id])[model_id]
    if warm_start:
        weights = _model_weights(db, model)
    else:
        for suffix in ("", "_summary"):
            db.require_absent(f"{model}{suffix}", "model")
    spec = ModelSpec(model_id, architecture, compile_params, fit_params, weights)
    run = RunDescription(source_table, validation_table, independent_varname, dependent_varname, model_arch_table,
                         None, num_iterations, metrics_compute_frequency or num_iterations, bool(warm_start), name,
                         description, method="fit", use_gpus=bool(use_gpus), **run_settings(db, model))
    job = {"models": {"1": [model_id, architecture, compile_params, fit_params, weights is not None]}}
    identity = repr((SelectionBuild({1: spec}, one_hot=False).models, hashlib.sha256(weights or b"").hexdigest()))
    train_in_child(db, job, identity, {"model-1": weights} if weights is not None else {}, run, use_gpus, model,
                   write=write_model_output)


def _model_weights(db: Database, model: str) -> bytes | None:
    """``warm_start``: the weights of the one model ``model`` holds (NULL: a cold start)."""
    table = db.require(model, "model (warm_start)")
    db.require_columns(model, "model (warm_start)", ["model_weights"])
    rows = db.query(f"SELECT model_weights FROM {table}")
    if len(rows) != 1:
        raise ValueError(f"model {quoted(model)} holds {len(rows)} rows; warm_start continues a table madlib_keras_fit "
                         f"wrote, which holds one")
    return None if rows[0]["model_weights"] is None else bytes(rows[0]["model_weights"])
