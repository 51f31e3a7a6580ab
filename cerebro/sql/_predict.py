"""``predict`` and ``evaluate``: MADlib's ``madlib_keras_predict`` and
``madlib_keras_evaluate`` for a model a model selection trained, run in a child process of
the session (see :mod:`._job`)."""
from __future__ import annotations

import os

import numpy as np

from ._database import Database
from ._job import job_directory, run_job
from ._params import parse_compile_params

_ID_TYPES = ("smallint", "integer", "bigint")


def predict(db: Database, model_table: str, test_table: str, id_col: str, independent_varname: str,
            output_table: str, pred_type: str = "response", use_gpus: bool = False,
            mst_key: int | None = None) -> None:
    """Write one row per row of ``test_table`` to ``output_table``: ``id_col`` and, for
    ``pred_type => 'response'``, ``estimated_dependent_var`` (the class with the highest
    output) with ``prob`` (that output; for a model with one sigmoid output, class 1 above
    0.5 and its probability); for ``'prob'``, ``prob`` holds every output."""
    if pred_type not in ("response", "prob"):
        raise ValueError(f"pred_type={pred_type!r} must be 'response' or 'prob'")
    if use_gpus:
        raise ValueError("use_gpus is true; predict runs on the CPU: use_gpus => false")
    row = _model_row(db, model_table, mst_key)
    features = _names(independent_varname, "independent_varname")
    db.require_columns(test_table, "test_table", [id_col, *features])
    id_type = db.columns(test_table, "test_table")[id_col]
    if id_type not in _ID_TYPES:
        raise ValueError(f"id_col {id_col!r} is {id_type}; predict takes an id of type {', '.join(_ID_TYPES)}")
    output = db.require_absent(output_table, "output_table")
    inputs, ids = db.read(test_table, "test_table", features, id_col)
    outputs = np.asarray(_in_child(db, "predict", row, inputs)["outputs"])
    quoted_id = db.quoted(id_col, "id_col")
    if pred_type == "response":
        # One output is a sigmoid's probability of class 1; more are one per class.
        classes = (outputs[:, 0] > 0.5).astype(np.int64) if outputs.shape[1] == 1 else outputs.argmax(axis=1)
        chosen = outputs[:, 0] if outputs.shape[1] == 1 else outputs[np.arange(len(classes)), classes]
        names = _class_values(db, model_table)
        estimated, kind = (classes.tolist(), "integer") if names is None else ([names[c] for c in classes], "text")
        db.query(f"CREATE TABLE {output} AS SELECT * FROM unnest($1::{id_type}[], $2::{kind}[], $3::real[]) "
                 f"AS t({quoted_id}, estimated_dependent_var, prob)",
                 [ids.tolist(), estimated, chosen.tolist()], [f"{id_type}[]", f"{kind}[]", "real[]"])
    else:
        db.query(f"CREATE TABLE {output} ({quoted_id} {id_type}, prob REAL[])")
        db.query(f"INSERT INTO {output} SELECT $1[i], ARRAY(SELECT unnest($2[i:i])) "
                 f"FROM generate_subscripts($1, 1) AS i",
                 [ids.tolist(), outputs.tolist()], [f"{id_type}[]", "real[]"])


def evaluate(db: Database, model_table: str, test_table: str, output_table: str, use_gpus: bool = False,
             mst_key: int | None = None, independent_varname: str = "independent_var",
             dependent_varname: str = "dependent_var") -> None:
    """Write ``output_table``: one row with the model's ``loss`` and first ``metric`` over every
    row of ``test_table``, with ``metrics_type`` and ``loss_type``, as MADlib does."""
    if use_gpus:
        raise ValueError("use_gpus is true; evaluate runs on the CPU: use_gpus => false")
    row = _model_row(db, model_table, mst_key)
    features = _names(independent_varname, "independent_varname")
    db.require_columns(test_table, "test_table", [*features, dependent_varname])
    output = db.require_absent(output_table, "output_table")
    inputs, labels = db.read(test_table, "test_table", features, dependent_varname, _class_values(db, model_table))
    answer = _in_child(db, "evaluate", row, inputs, labels)
    params = parse_compile_params(row["compile_params"])
    db.query(f"CREATE TABLE {output} (loss DOUBLE PRECISION, metric DOUBLE PRECISION, metrics_type TEXT[], "
             f"loss_type TEXT)")
    db.query(f"INSERT INTO {output} VALUES ($1, $2, $3, $4)",
             [answer["loss"], answer["metric"], list(params.metrics[:1]), params.loss],
             ["float8", "float8", "text[]", "text"])


def _model_row(db: Database, model_table: str, mst_key: int | None) -> dict:
    """The one trained model of ``model_table`` (the one with ``mst_key``)."""
    table = db.require(model_table, "model_table")
    db.require_columns(model_table, "model_table", ["mst_key", "model_arch", "compile_params", "model_weights"])
    rows = db.query(f"SELECT mst_key, model_arch::text AS model_arch, compile_params, model_weights FROM {table}"
                    + ("" if mst_key is None else " WHERE mst_key = $1"),
                    [] if mst_key is None else [mst_key], [] if mst_key is None else ["integer"])
    if len(rows) != 1:
        raise ValueError(f"model_table {model_table!r} has {len(rows)} models"
                         + (f" with mst_key {mst_key}" if mst_key is not None else "; choose one with mst_key"))
    if rows[0]["model_weights"] is None:
        raise ValueError(f"model_table {model_table!r}, mst_key {rows[0]['mst_key']}: the trial trained no weights")
    return rows[0]


def _class_values(db: Database, model_table: str) -> list[str] | None:
    """The text classes the model was trained on (its summary's ``class_values``), if any."""
    summary = f"{model_table}_summary"
    if not db.exists(summary, "model_table's summary") or \
            "class_values" not in db.columns(summary, "model_table's summary"):
        return None
    rows = db.query(f"SELECT class_values FROM {db.qualified(summary, 'model_table summary')}")
    return rows[0]["class_values"] if len(rows) == 1 else None


def _names(text: str, argument: str) -> list[str]:
    names = [c.strip() for c in (text or "").split(",") if c.strip()]
    if not names:
        raise ValueError(f"{argument}={text!r} must name one or more columns")
    return names


def _in_child(db: Database, kind: str, row: dict, inputs: np.ndarray, labels: np.ndarray | None = None) -> dict:
    """Run the model of ``row`` on ``inputs`` (and ``labels``) in a child process."""
    arrays = {"inputs": inputs} if labels is None else {"inputs": inputs, "labels": labels}
    with job_directory(arrays, {"model": bytes(row["model_weights"])}) as job_dir:
        answer = run_job(db, job_dir, {"kind": kind, "model_arch": row["model_arch"],
                                       "compile_params": row["compile_params"]},
                         keras_backend=db.keras_backend(), use_gpus=False)
        if kind == "predict":
            answer["outputs"] = np.load(os.path.join(job_dir, "outputs.npy"), allow_pickle=False)
        return answer
