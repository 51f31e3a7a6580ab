"""``predict`` and ``evaluate``: MADlib's ``madlib_keras_predict`` and
``madlib_keras_evaluate`` for a model a model selection trained, run in a child process of
the session (see :mod:`._job`)."""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ._database import Database
from ._job import job_directory, run_job
from ._limits import quoted
from ._params import parse_compile_params
from ._preprocess import packing, read_packed

_ID_TYPES = ("smallint", "integer", "bigint")
_BLOCK_ROWS = 50_000     # input rows whose predictions one INSERT writes


def predict(db: Database, model_table: str, test_table: str, id_col: str, independent_varname: str,
            output_table: str, pred_type: str | int | float = "prob", use_gpus: bool = False,
            mst_key: int | None = None) -> None:
    """MADlib's ``madlib_keras_predict``: one row per row of ``test_table`` and class, with
    ``id_col``, ``class_name`` (the label's name), ``class_value``, ``prob`` and ``rank``
    (1: the likeliest). ``pred_type`` chooses the rows: ``'prob'`` every class, ``'response'``
    the likeliest alone (without ``rank``), an integer k the k likeliest (MADlib's top-k),
    a number in [0, 1) the classes more likely than it. Features are divided by the
    normalizing constant the training data was packed with."""
    rows_kept(pred_type)      # a bad pred_type is refused before anything is read
    if use_gpus:
        raise ValueError("use_gpus is true; predict runs on the CPU: use_gpus => false")
    row = _model_row(db, model_table, mst_key)
    trained = _trained_on(db, model_table)
    predict_rows(db, row, test_table, id_col, independent_varname, output_table, pred_type, trained,
                 (f"model_table {quoted(model_table)}", "its summary"))


def predict_rows(db: Database, row: dict, test_table: str, id_col: str, independent_varname: str,
                 output_table: str, pred_type: str | int | float, trained: dict[str, Any],
                 classes_from: tuple[str, str]) -> None:
    """Write ``output_table``: the predictions of the model of ``row`` (``model_arch``,
    ``model_weights``) for ``test_table``, with what ``trained`` says of its training data
    (see :func:`_trained_on`). ``classes_from`` names the model and where its class values
    come from, for the error where they and the model's outputs differ in number."""
    keep = rows_kept(pred_type)
    features = _names(independent_varname, "independent_varname")
    db.require_columns(test_table, "test_table", [id_col, *features])
    id_type = db.columns(test_table, "test_table")[id_col]
    if id_type not in _ID_TYPES:
        raise ValueError(f"id_col {quoted(id_col)} is {id_type}; predict takes an id of type {', '.join(_ID_TYPES)}")
    output = db.require_absent(output_table, "output_table")
    inputs, ids = db.read(test_table, "test_table", features, id_col)
    outputs = np.asarray(_in_child(db, "predict", row, inputs / np.float32(trained["normalizing_const"]))["outputs"])
    # One output is a sigmoid's probability of class 1; more are one per class.
    probabilities = np.column_stack([1 - outputs[:, 0], outputs[:, 0]]) if outputs.shape[1] == 1 else outputs
    classes = trained["class_values"] or [str(c) for c in range(probabilities.shape[1])]
    if len(classes) != probabilities.shape[1]:
        raise ValueError(f"{classes_from[0]}: the model has {probabilities.shape[1]} outputs, {classes_from[1]} "
                         f"{len(classes)} class values")
    quoted_id = db.quoted(id_col, "id_col")
    db.query(f"CREATE TABLE {output} ({quoted_id} {id_type}, class_name TEXT, class_value TEXT, "
             f"prob DOUBLE PRECISION" + ("" if pred_type == "response" else ", rank INTEGER") + ")")
    _write_predictions(db, output, ids, id_type, probabilities, classes, trained["dependent_varname"], keep,
                       with_rank=pred_type != "response")


def rows_kept(pred_type: str | int | float) -> tuple[int, float | None]:
    """(how many of the likeliest classes, above which probability) ``pred_type`` keeps;
    None: any probability, NaN (a diverged model's) too."""
    if pred_type in ("prob", "response"):
        return (1 if pred_type == "response" else 1 << 30), None
    if isinstance(pred_type, int) and not isinstance(pred_type, bool) and pred_type >= 1:
        return pred_type, None
    if isinstance(pred_type, float) and 0.0 <= pred_type < 1.0:
        return 1 << 30, pred_type
    raise ValueError(f"pred_type={quoted(pred_type)} must be 'response', 'prob', an integer >= 1 (the k likeliest "
                     f"classes) or a number in [0, 1) (the classes more likely than it)")


def _write_predictions(db: Database, output: str, ids: np.ndarray, id_type: str, probabilities: np.ndarray,
                       classes: list[str], class_name: str | None, keep: tuple[int, float | None],
                       with_rank: bool) -> None:
    """Insert the kept (id, class, probability, rank) rows, a block of input rows at a time."""
    top, above = keep
    order = np.argsort(-probabilities, axis=1, kind="stable")      # ties: the first class first
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, probabilities.shape[1] + 1)[None, :].repeat(len(order), 0), 1)
    names = np.array(classes, dtype=object)
    arrays = [f"${i + 1}::{kind}" for i, kind in enumerate(
        [f"{id_type}[]", "pg_catalog.text[]", "pg_catalog.text[]", "pg_catalog.float8[]", "pg_catalog.int4[]"])]
    insert = (f"INSERT INTO {output} SELECT * FROM ROWS FROM ("
              + ", ".join(f"pg_catalog.unnest({a})" for a in arrays[:5 if with_rank else 4]) + ")")
    types = [f"{id_type}[]", "text[]", "text[]", "float8[]", *(["int4[]"] if with_rank else [])]
    for start in range(0, len(ids), _BLOCK_ROWS):
        block = slice(start, start + _BLOCK_ROWS)
        kept = ranks[block] <= top
        if above is not None:
            kept &= probabilities[block] > above
        rows, columns = np.nonzero(kept)
        # Each input row's classes in rank order, the rows in input order.
        by_rank = np.lexsort((ranks[block][rows, columns], rows))
        rows, columns = rows[by_rank], columns[by_rank]
        values = [ids[block][rows].tolist(), [class_name] * len(rows), names[columns].tolist(),
                  probabilities[block][rows, columns].astype(np.float64).tolist()]
        db.query(insert, values + ([ranks[block][rows, columns].tolist()] if with_rank else []), types)


def evaluate(db: Database, model_table: str, test_table: str, output_table: str, use_gpus: bool = False,
             mst_key: int | None = None, independent_varname: str | None = None,
             dependent_varname: str | None = None) -> None:
    """Write ``output_table``: one row with the model's ``loss`` and first ``metric`` over every
    row of ``test_table``, with ``metrics_type`` and ``loss_type``, as MADlib does. The test
    table is packed (``validation_preprocessor_dl``) or of rows (``independent_varname``,
    default ``independent_var``; ``dependent_varname``, default ``dependent_var``)."""
    if use_gpus:
        raise ValueError("use_gpus is true; evaluate runs on the CPU: use_gpus => false")
    row = _model_row(db, model_table, mst_key)
    trained = _trained_on(db, model_table)
    layout = packing(db, test_table, "test_table")
    if layout is not None:
        output = db.require_absent(output_table, "output_table")
        inputs, labels = read_packed(db, test_table, "test_table", layout)
    else:
        features = _names(independent_varname or "independent_var", "independent_varname")
        label = dependent_varname or "dependent_var"
        db.require_columns(test_table, "test_table", [*features, label])
        output = db.require_absent(output_table, "output_table")
        inputs, labels = db.read(test_table, "test_table", features, label, trained["class_values"])
        inputs = inputs / np.float32(trained["normalizing_const"])
    answer = _in_child(db, "evaluate", row, inputs, labels)
    params = parse_compile_params(row["compile_params"])
    db.query(f"CREATE TABLE {output} (loss DOUBLE PRECISION, metric DOUBLE PRECISION, metrics_type TEXT[], "
             f"loss_type TEXT)")
    db.query(f"INSERT INTO {output} VALUES ($1, $2, $3, $4)",
             [answer["loss"], answer["metric"], list(params.metrics[:1]), params.loss],
             ["float8", "float8", "text[]", "text"])


def _model_row(db: Database, model_table: str, mst_key: int | None) -> dict:
    """The one trained model of ``model_table``: the one with ``mst_key`` of a model
    selection's table, or the one row ``madlib_keras_fit`` wrote, whose ``compile_params``
    its summary holds."""
    table = db.require(model_table, "model_table")
    if "mst_key" not in db.columns(model_table, "model_table"):
        return _fit_model_row(db, model_table, table, mst_key)
    db.require_columns(model_table, "model_table", ["mst_key", "model_arch", "compile_params", "model_weights"])
    rows = db.query(f"SELECT mst_key, model_arch::text AS model_arch, compile_params, model_weights FROM {table}"
                    + ("" if mst_key is None else " WHERE mst_key = $1"),
                    [] if mst_key is None else [mst_key], [] if mst_key is None else ["integer"])
    if len(rows) != 1:
        raise ValueError(f"model_table {quoted(model_table)} has {len(rows)} models"
                         + (f" with mst_key {mst_key}" if mst_key is not None else "; choose one with mst_key"))
    if rows[0]["model_weights"] is None:
        raise ValueError(f"model_table {quoted(model_table)}, mst_key {rows[0]['mst_key']}: the trial trained no "
                         f"weights")
    return rows[0]


def _fit_model_row(db: Database, model_table: str, table: str, mst_key: int | None) -> dict:
    if mst_key is not None:
        raise ValueError(f"mst_key={mst_key!r}: model_table {quoted(model_table)} holds one model "
                         f"(madlib_keras_fit's), without keys; give NULL")
    db.require_columns(model_table, "model_table", ["model_arch", "model_weights"])
    summary = f"{model_table}_summary"
    db.require_columns(summary, "model_table's summary", ["compile_params"])
    rows = db.query(f"SELECT model_arch::text AS model_arch, model_weights FROM {table}")
    if len(rows) != 1 or rows[0]["model_weights"] is None:
        raise ValueError(f"model_table {quoted(model_table)} must hold one row with model_weights; it holds "
                         f"{len(rows)} rows")
    compile_params = db.query(f"SELECT compile_params FROM {db.qualified(summary, 'model_table summary')}")
    if len(compile_params) != 1:
        raise ValueError(f"{quoted(summary)} must hold one row; it holds {len(compile_params)}")
    return {**rows[0], "compile_params": compile_params[0]["compile_params"]}


def _trained_on(db: Database, model_table: str) -> dict[str, Any]:
    """What the model's summary says of its training data: ``class_values`` (None: class
    ids), ``dependent_varname`` and ``normalizing_const``; a model table without a summary
    (or an older one) was trained on class ids, unnormalized. ``madlib_keras_fit``'s summary
    holds the name as an array and the classes as ``<dependent_varname>_class_values``."""
    summary = f"{model_table}_summary"
    found: dict[str, Any] = {"class_values": None, "dependent_varname": None, "normalizing_const": 1.0}
    if not db.exists(summary, "model_table's summary"):
        return found
    rows = db.query(f"SELECT * FROM {db.qualified(summary, 'model_table summary')}")
    if len(rows) != 1:
        return found
    row = rows[0]
    if isinstance(row.get("dependent_varname"), list):
        row = {**row, "dependent_varname": (row["dependent_varname"] or [None])[0],
               "class_values": row.get(f"{(row['dependent_varname'] or [''])[0]}_class_values")}
    found.update({c: row[c] for c in found if row.get(c) is not None})
    return found


def _names(text: str, argument: str) -> list[str]:
    names = [c.strip() for c in (text or "").split(",") if c.strip()]
    if not names:
        raise ValueError(f"{argument}={quoted(text)} must name one or more columns")
    return names


def _in_child(db: Database, kind: str, row: dict, inputs: np.ndarray, labels: np.ndarray | None = None) -> dict:
    """Run the model of ``row`` on ``inputs`` (and ``labels``) in a child process."""
    arrays = {"inputs": inputs} if labels is None else {"inputs": inputs, "labels": labels}
    with job_directory(arrays, {"model": bytes(row["model_weights"])}) as job_dir:
        answer = run_job(db, job_dir, {"kind": kind, "model_arch": row["model_arch"],
                                       "compile_params": row.get("compile_params")},
                         keras_backend=db.keras_backend(), use_gpus=False)
        if kind == "predict":
            answer["outputs"] = np.load(os.path.join(job_dir, "outputs.npy"), allow_pickle=False)
        return answer
