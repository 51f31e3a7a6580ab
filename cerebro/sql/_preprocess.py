"""MADlib's ``training_preprocessor_dl`` and ``validation_preprocessor_dl``, and reading the
tables they write.

A packed table holds the rows in buffers, MADlib's layout: per buffer, the features as one
``bytea`` of float32 values (divided by ``normalizing_const``) with their shape in
``<x>_shape``, the one-hot labels as one ``bytea`` of int16 with ``<y>_shape``, and
``buffer_id``; ``<out>_summary`` names the columns and keeps the class values and the
normalizing constant. Tables MADlib itself packed read the same way, so a MADlib user's
preprocessed tables train as they are. Reading checks every buffer's length against its shape:
a table's bytes are data, never code.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._database import Database
from ._limits import MAX_CLASSES, check_count, listed, quoted

_MAX_BUFFER_VALUES = 75_000_000     # MADlib's bound on the values one buffer holds
_NATIVE = {"text", "character varying", "character", "integer", "smallint", "bigint", "boolean", "real",
           "double precision", "numeric"}


@dataclass(frozen=True)
class Packing:
    """What the summary of a packed table says about it."""

    independent_varname: str
    dependent_varname: str
    dependent_vartype: str
    class_values: list[str | None] | None    # as text; None: the labels were one-hot arrays already
    normalizing_const: float


def training_preprocessor_dl(db: Database, source_table: str, output_table: str, dependent_varname: str,
                             independent_varname: str, buffer_size: int | None = None,
                             normalizing_const: float | None = None, num_classes: Any = None,
                             distribution_rules: str | None = None) -> None:
    """Pack ``source_table``'s rows, shuffled (by ``cerebro.seed``), into buffers of
    ``output_table``; labels of any type but numeric arrays are one-hot encoded over their
    sorted distinct values (padded to ``num_classes``)."""
    _check_buffers(buffer_size, distribution_rules)
    _require_no_output(db, output_table)
    const = 1.0 if normalizing_const is None else float(normalizing_const)
    if not (math.isfinite(const) and const > 0):
        raise ValueError(f"normalizing_const={normalizing_const!r} must be a positive number")
    x, y = _one_column(independent_varname, "independent_varname"), _one_column(dependent_varname,
                                                                                   "dependent_varname")
    db.require_columns(source_table, "source_table", [x, y])
    wanted = _num_classes(num_classes)
    levels = _levels(db, source_table, y)
    if levels is not None and wanted is not None:
        if wanted < len(levels):
            raise ValueError(f"num_classes={num_classes!r} is below the {len(levels)} classes {quoted(y)} holds")
        levels = levels + [None] * (wanted - len(levels))
    features, labels = _read_rows(db, source_table, "source_table", x, y, levels)
    order = np.random.default_rng(db.integer_setting("seed", 0, 0)).permutation(len(labels))
    packing = Packing(x, y, db.columns(source_table, "source_table")[y], levels, const)
    _write(db, source_table, output_table, packing, features[order] / np.float32(const), labels[order],
           buffer_size, distribution_rules)


def validation_preprocessor_dl(db: Database, source_table: str, output_table: str, dependent_varname: str,
                               independent_varname: str, training_preprocessor_table: str,
                               buffer_size: int | None = None, distribution_rules: str | None = None) -> None:
    """Pack ``source_table``'s rows, in the order read, as ``training_preprocessor_table``
    packed its own: the same class values and normalizing constant."""
    _check_buffers(buffer_size, distribution_rules)
    _require_no_output(db, output_table)
    training = packing(db, training_preprocessor_table, "training_preprocessor_table")
    if training is None:
        raise ValueError(f"training_preprocessor_table {quoted(training_preprocessor_table)} is not a table "
                         f"training_preprocessor_dl wrote (it has no summary naming its columns)")
    x, y = _one_column(independent_varname, "independent_varname"), _one_column(dependent_varname,
                                                                                   "dependent_varname")
    db.require_columns(source_table, "source_table", [x, y])
    levels = training.class_values
    if levels is not None:
        known = set(levels)      # a list's `in` made this 10,000 x 10,000 steps
        unknown = [v for v in _levels(db, source_table, y) or [] if v not in known]
        if unknown:
            raise ValueError(f"source_table {quoted(source_table)} has classes [{listed(unknown, most=5)}] the "
                             f"training data does not")
    features, labels = _read_rows(db, source_table, "source_table", x, y, levels)
    packed = Packing(x, y, db.columns(source_table, "source_table")[y], levels, training.normalizing_const)
    _write(db, source_table, output_table, packed, features / np.float32(training.normalizing_const), labels,
           buffer_size, distribution_rules)


def packing(db: Database, table: str, argument: str) -> Packing | None:
    """The :class:`Packing` of a packed ``table`` (ours or MADlib's); None for a table of rows."""
    summary = f"{table}_summary"
    if not db.exists(table, argument) or not db.exists(summary, argument):
        return None
    columns = db.columns(summary, argument)
    if not {"independent_varname", "dependent_varname", "normalizing_const"} <= set(columns):
        return None
    row = db.query(f"SELECT * FROM {db.qualified(summary, argument)}")[0]
    x, y = (_first(row["independent_varname"]), _first(row["dependent_varname"]))
    have = db.columns(table, argument)
    if have.get(f"{x}_shape") != "integer[]" or have.get(x) != "bytea" or have.get(y) != "bytea":
        return None
    classes = row.get(f"{y}_class_values", row.get("class_values"))
    classes = None if classes is None else [None if v is None else _text(v) for v in classes]
    const = 1.0 if row["normalizing_const"] is None else float(row["normalizing_const"])
    if not (math.isfinite(const) and const > 0):
        raise ValueError(f"{argument} {quoted(table)}: its summary's normalizing_const {const} must be a positive "
                         f"number")
    return Packing(x, y, _first(row.get("dependent_vartype")) or "", classes, const)


def read_packed(db: Database, table: str, argument: str, layout: Packing) -> tuple[np.ndarray, np.ndarray]:
    """(features, one-hot labels) of the packed ``table``, buffer by buffer in ``buffer_id``
    order; a buffer whose bytes do not fill its shape is refused."""
    quote = db.quote_ident
    x, y = layout.independent_varname, layout.dependent_varname
    rows = db.query(f"SELECT {quote(x)} AS x, {quote(x + '_shape')} AS x_shape, {quote(y)} AS y, "
                    f"{quote(y + '_shape')} AS y_shape FROM {db.require(table, argument)} ORDER BY buffer_id")
    if not rows:
        raise ValueError(f"{argument} {quoted(table)} has no rows; a dataset needs at least one")
    features = [_buffer(row["x"], row["x_shape"], "<f4", table, x) for row in rows]
    labels = [_buffer(row["y"], row["y_shape"], "<i2", table, y) for row in rows]
    if len({f.shape[1:] for f in features}) > 1 or len({lab.shape[1:] for lab in labels}) > 1 or \
            any(len(f) != len(lab) for f, lab in zip(features, labels)):
        raise ValueError(f"{argument} {quoted(table)}: its buffers' shapes do not agree")
    return np.concatenate(features), np.concatenate(labels).astype(np.int16)


def _buffer(data: Any, shape: Any, dtype: str, table: str, column: str) -> np.ndarray:
    if data is None or not shape or any(not isinstance(n, int) or n < 1 for n in shape):
        raise ValueError(f"packed table {quoted(table)}: column {quoted(column)} has a buffer without data or with "
                         f"shape {quoted(shape)}")
    values = np.frombuffer(bytes(data), dtype=dtype)
    if values.size != math.prod(shape):
        raise ValueError(f"packed table {quoted(table)}: a buffer of {quoted(column)} holds {values.size} values, its "
                         f"shape {quoted(shape)} says {math.prod(shape)}")
    return values.reshape(shape)


def _read_rows(db: Database, table: str, argument: str, x: str, y: str,
               levels: list[str | None] | None) -> tuple[np.ndarray, np.ndarray]:
    """Features as float32 and labels one-hot (int16): by their place in ``levels``, or the
    label arrays as they are."""
    features, labels = db.read(table, argument, [x], y, levels)
    if features.dtype == object:
        raise TypeError(f"{argument} {quoted(table)}: independent_varname {quoted(x)} must be an array of numbers; it "
                        f"is bytea")
    if levels is None:
        if labels.ndim != 2:
            raise TypeError(f"dependent_varname {quoted(y)} is an array of {labels.shape[1:]} values; a one-hot label "
                            f"array has one dimension")
        return features.astype(np.float32), labels.astype(np.int16)
    # Row by row, not np.eye(classes)[labels]: that would first make classes x classes values.
    one_hot = np.zeros((len(labels), len(levels)), dtype=np.int16)
    one_hot[np.arange(len(labels)), labels.astype(np.intp)] = 1
    return features.astype(np.float32), one_hot


def _levels(db: Database, table: str, y: str) -> list[str | None] | None:
    """The distinct values of a label column to encode, as text, in their type's order; None
    for a numeric array column (one-hot already, as MADlib takes it). More than
    :data:`._limits.MAX_CLASSES` are refused: each packed row holds one value per class."""
    kind = db.columns(table, "source_table")[y]
    if kind.endswith("[]"):
        return None
    column = db.quote_ident(y)
    rows = db.query(f"SELECT value::pg_catalog.text AS text FROM (SELECT DISTINCT {column} AS value FROM "
                    f"{db.require(table, 'source_table')}) AS levels ORDER BY value LIMIT $1", [MAX_CLASSES + 1],
                    ["integer"])
    if len(rows) > MAX_CLASSES:
        raise ValueError(f"dependent_varname {quoted(y)} of {quoted(table)} holds more than {MAX_CLASSES:,} distinct "
                         f"values; at most {MAX_CLASSES:,} classes are one-hot encoded (MAX_CLASSES)")
    values = [row["text"] for row in rows]
    if None in values:
        raise ValueError(f"dependent_varname {quoted(y)} of {quoted(table)} holds NULLs; every row needs a class")
    return values


def _write(db: Database, source_table: str, output_table: str, layout: Packing, features: np.ndarray,
           labels: np.ndarray, buffer_size: int | None, distribution_rules: str | None) -> None:
    out, summary = db.qualified(output_table, "output_table"), db.qualified(f"{output_table}_summary", "output_table")
    size = _buffer_size(buffer_size, len(labels), math.prod(features.shape[1:]))
    quote, x, y = db.quote_ident, layout.independent_varname, layout.dependent_varname
    db.query(f"CREATE TABLE {out} ({quote(x)} bytea, {quote(y)} bytea, {quote(x + '_shape')} integer[], "
             f"{quote(y + '_shape')} integer[], buffer_id integer)")
    insert = f"INSERT INTO {out} VALUES ($1, $2, $3, $4, $5)"
    for buffer_id, start in enumerate(range(0, len(labels), size)):
        xs, ys = features[start:start + size], labels[start:start + size]
        db.query(insert, [xs.astype("<f4").tobytes(), ys.astype("<i2").tobytes(), list(xs.shape), list(ys.shape),
                          buffer_id], ["bytea", "bytea", "integer[]", "integer[]", "integer"])
    classes = f"{quote(y + '_class_values')} {_array_type(layout.dependent_vartype)}, " \
        if layout.class_values is not None else ""
    db.query(f"CREATE TABLE {summary} (source_table text, output_table text, dependent_varname text[], "
             f"independent_varname text[], dependent_vartype text[], {classes}buffer_size integer, "
             f"normalizing_const real, num_classes integer[], distribution_rules text, "
             f"__internal_gpu_config__ text)")
    values = [source_table, output_table, [y], [x], [layout.dependent_vartype],
              *([layout.class_values] if classes else []),
              size, layout.normalizing_const, [labels.shape[1]], "all_segments", "all_segments"]
    types = ["text", "text", "text[]", "text[]", "text[]", *(["text[]"] if classes else []), "integer", "real",
             "integer[]", "text", "text"]
    casts = ", ".join(f"${i + 1}" + (f"::{_array_type(layout.dependent_vartype)}" if classes and i == 5 else "")
                      for i in range(len(values)))
    db.query(f"INSERT INTO {summary} SELECT {casts}", values, types)


def _require_no_output(db: Database, output_table: str) -> None:
    for name in (output_table, f"{output_table}_summary"):
        db.require_absent(name, "output_table")


def _check_buffers(buffer_size: int | None, distribution_rules: str | None) -> None:
    if buffer_size is not None and (isinstance(buffer_size, bool) or not isinstance(buffer_size, int)
                                    or buffer_size < 1):
        raise ValueError(f"buffer_size={buffer_size!r} must be a positive integer")
    if distribution_rules not in (None, "all_segments"):
        raise ValueError(f"distribution_rules={quoted(distribution_rules)}: PostgreSQL has one segment; give NULL or "
                         f"'all_segments'")


def _buffer_size(given: int | None, rows: int, width: int) -> int:
    """Rows a buffer holds: ``given``, or MADlib's default (as many as fit in 75 million
    values), evened out over the buffers."""
    size = given or max(1, min(rows, math.ceil(_MAX_BUFFER_VALUES / max(width, 1))))
    buffers = math.ceil(rows / size)
    return math.ceil(rows / buffers)


def _array_type(vartype: str) -> str:
    """The SQL array type of a label's class values: the label's own type where it is one of
    PostgreSQL's (as MADlib keeps them), else text."""
    return f"{vartype}[]" if vartype.split("(")[0] in _NATIVE else "pg_catalog.text[]"


def _text(value: Any) -> str:
    """A class value as PostgreSQL writes it as text (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _num_classes(num_classes: Any) -> int | None:
    """MADlib 2 takes ``num_classes`` as ``INTEGER[]`` (one per label), 1.x as ``INTEGER``."""
    if num_classes is None:
        return None
    values = num_classes if isinstance(num_classes, list) else [num_classes]
    if len(values) != 1 or isinstance(values[0], bool) or not isinstance(values[0], int) or values[0] < 1:
        raise ValueError(f"num_classes={quoted(num_classes)} must be one positive integer (one label column)")
    check_count(f"num_classes={values[0]} asks for", values[0], "classes", MAX_CLASSES, "MAX_CLASSES",
                ": each packed row holds one value per class")
    return values[0]


def _one_column(text: str | None, argument: str) -> str:
    names = [c.strip() for c in (text or "").split(",") if c.strip()]
    if len(names) != 1:
        raise ValueError(f"{argument}={quoted(text)} must name one column (several inputs or outputs are not "
                         f"supported)")
    return names[0]


def _first(value: Any) -> Any:
    """A summary's name column: ``text[]`` in MADlib 2, ``text`` in MADlib 1."""
    return value[0] if isinstance(value, list) else value


def train_test_split(db: Database, source_table: str, output_table: str, train_proportion: float,
                     test_proportion: float | None = None, grouping_cols: str | None = None,
                     target_cols: str | None = None, with_replacement: bool = False,
                     separate_output_tables: bool = False) -> None:
    """MADlib's ``train_test_split``: ``round(n * train_proportion)`` rows drawn with the
    session's ``random()`` (so ``setseed`` repeats a split) into ``<out>_train`` and the next
    ``round(n * test_proportion)`` into ``<out>_test`` (or both into ``<out>`` with a
    ``split`` column: 1 train, 0 test); with ``grouping_cols``, in each group apart."""
    test = 1 - train_proportion if test_proportion is None else test_proportion
    if not (0 < train_proportion < 1 and 0 < test <= 1 - train_proportion + 1e-9):
        raise ValueError(f"train_proportion={train_proportion!r} and test_proportion={test_proportion!r} must be in "
                         f"(0, 1) and add up to at most 1")
    if with_replacement:
        raise ValueError("with_replacement is true; train_test_split samples without replacement: give false")
    have = db.columns(source_table, "source_table")
    groups = [c.strip() for c in (grouping_cols or "").split(",") if c.strip()]
    targets = [c.strip() for c in target_cols.split(",") if c.strip()] if target_cols else list(have)
    db.require_columns(source_table, "source_table", [*groups, *targets])
    quote = db.quote_ident
    partition = f"PARTITION BY {', '.join(map(quote, groups))} " if groups else ""
    columns = ", ".join(map(quote, dict.fromkeys([*groups, *targets])))
    drawn = (f"SELECT {columns}, pg_catalog.row_number() OVER ({partition}ORDER BY pg_catalog.random()) AS drawn_, "
             f"pg_catalog.count(*) OVER ({partition.strip()}) AS rows_ FROM {db.require(source_table, 'source_table')}")
    cut = "pg_catalog.round(rows_ * $1::pg_catalog.float8)"
    split = {"train": f"drawn_ <= {cut}", "test": f"drawn_ > {cut} AND drawn_ <= {cut.replace('$1', '$2')} + {cut}"}
    # One draw for both parts: a temporary table of the rows in drawn order.
    temporary = f"pg_temp.cerebro_split_{os.urandom(6).hex()}"
    db.query(f"CREATE TEMPORARY TABLE {temporary} AS {drawn}")
    try:
        parts = {part: db.require_absent(f"{output_table}_{part}", "output_table") for part in split} \
            if separate_output_tables else {}
        for part, table in parts.items():
            db.query(f"CREATE TABLE {table} AS SELECT {columns} FROM {temporary} WHERE {split[part]}",
                     [train_proportion, test], ["float8", "float8"])
        if not separate_output_tables:
            table = db.require_absent(output_table, "output_table")
            db.query(f"CREATE TABLE {table} AS SELECT {columns}, ({split['train']})::pg_catalog.int4 AS split "
                     f"FROM {temporary} WHERE {split['train']} OR ({split['test']})", [train_proportion, test],
                     ["float8", "float8"])
    finally:
        db.query(f"DROP TABLE {temporary}")
