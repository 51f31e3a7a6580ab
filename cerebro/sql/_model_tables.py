"""The tables a model selection starts from, with MADlib's layout: the model architecture
table (``load_model_arch``, MADlib's ``load_keras_model``) and the model selection table
(``load_model_selection_table``, ``generate_model_configs``), each with a ``_summary``
table that names the architecture table.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..search import Hyperband, choice
from ..search._space import sample_config
from ._database import Database
from ._grid import ConfigGrid
from ._keras_model import ModelSpec, check_model_arch, keras3_json
from ._limits import (
    MAX_ARCH_CHARS,
    MAX_GRID_CONFIGS,
    MAX_PARAMS_CHARS,
    Pulse,
    check_count,
    check_length,
    listed,
    quoted,
)
from ._params import parse_compile_params, parse_fit_params, same_params

SEARCH_TYPES = ("grid", "random")


def load_model_arch(db: Database, model_arch_table: str, model_arch: str, model_weights: bytes | None = None,
                    name: str | None = None, description: str | None = None, model_id: int | None = None) -> int:
    """Add a Keras architecture (``model.to_json()``) to ``model_arch_table``, creating the
    table if needed; returns its ``model_id``. At most :data:`._limits.MAX_ARCH_CHARS`
    characters: it is parsed and walked in the backend."""
    check_length(model_arch, "model_arch", MAX_ARCH_CHARS, "MAX_ARCH_CHARS")
    try:
        json.loads(model_arch)
    except (TypeError, ValueError, RecursionError) as error:
        raise ValueError(f"model_arch is not JSON ({error}); give keras.Model.to_json()") from None
    model_arch = keras3_json(model_arch)        # Keras 2's, as MADlib's users have them, is converted
    check_model_arch(model_arch)
    table = db.qualified(model_arch_table, "model_arch_table")
    if not db.exists(model_arch_table, "model_arch_table"):
        db.query(f"CREATE TABLE {table} (model_id SERIAL PRIMARY KEY, model_arch JSON NOT NULL, "
                 f"model_weights BYTEA, name TEXT, description TEXT)")
    if model_id is None:
        row = db.query(f"INSERT INTO {table} (model_arch, model_weights, name, description) "
                       f"VALUES ($1, $2, $3, $4) RETURNING model_id",
                       [model_arch, model_weights, name, description], ["json", "bytea", "text", "text"])
    else:
        row = db.query(f"INSERT INTO {table} (model_id, model_arch, model_weights, name, description) "
                       f"VALUES ($1, $2, $3, $4, $5) RETURNING model_id",
                       [model_id, model_arch, model_weights, name, description],
                       ["integer", "json", "bytea", "text", "text"])
        # The next automatic model_id must not collide with this one.
        db.query(f"SELECT setval(pg_get_serial_sequence($1, 'model_id'), (SELECT max(model_id) FROM {table}))",
                 [table], ["text"])
    return row[0]["model_id"]


def delete_model_arch(db: Database, model_arch_table: str, model_id: int) -> None:
    """MADlib's ``delete_keras_model``: remove ``model_id`` from ``model_arch_table``, and the
    table once it holds no model."""
    table = db.require(model_arch_table, "model_arch_table")
    if not db.query(f"DELETE FROM {table} WHERE model_id = $1 RETURNING model_id", [model_id], ["integer"]):
        raise ValueError(f"model_arch_table {quoted(model_arch_table)} has no model_id {model_id!r}")
    if not db.query(f"SELECT 1 FROM {table} LIMIT 1"):
        db.query(f"DROP TABLE {table}")


def load_model_selection_table(db: Database, model_arch_table: str, model_selection_table: str,
                               model_id_list: Sequence[int], compile_params_list: Sequence[str],
                               fit_params_list: Sequence[str], object_table: str | None = None) -> None:
    """Write every combination of the model ids (in increasing order), compile and fit
    parameters (in the order given) as rows of ``model_selection_table``, keyed ``mst_key``
    1, 2, ... As in MADlib, each distinct combination once: a repeated id, or a string
    that differs from an earlier one only in spaces or the order of its arguments, adds no
    model (the first spelling is kept). More than :data:`._limits.MAX_GRID_CONFIGS` rows
    are refused before any is made."""
    require_model_ids(db, model_arch_table, model_id_list)
    compile_params = _distinct(compile_params_list, parse_compile_params, "compile_params_list",
                               db.check_for_interrupts)
    fit_params = _distinct(fit_params_list, parse_fit_params, "fit_params_list", db.check_for_interrupts)
    if not compile_params or not fit_params:
        raise ValueError("compile_params_list and fit_params_list must each hold at least one string")
    models = sorted(set(model_id_list))
    check_count(f"{len(models):,} model ids, {len(compile_params):,} distinct compile_params and "
                f"{len(fit_params):,} distinct fit_params make", len(models) * len(compile_params) * len(fit_params),
                "configurations", MAX_GRID_CONFIGS, "MAX_GRID_CONFIGS", ": give fewer model ids or strings")
    rows = [(m, c, f) for m in models for c in compile_params for f in fit_params]
    write_selection(db, model_arch_table, model_selection_table, rows, object_table)


def _distinct(texts: Sequence[str] | None, parse: Callable[[str], Any], argument: str, pulse: Pulse) -> list[str]:
    """``texts`` checked by ``parse``, each meaning once, in their order. Each distinct
    string makes at least one row, so more than :data:`._limits.MAX_GRID_CONFIGS` of them
    are refused before any is parsed."""
    spellings = list(dict.fromkeys(texts or []))
    check_count(f"{argument} holds", len(spellings), "distinct strings", MAX_GRID_CONFIGS, "MAX_GRID_CONFIGS",
                ": each makes at least one configuration")
    kept: dict[tuple, str] = {}
    for text in spellings:
        pulse()
        kept.setdefault(same_params(text, parse), text)
    return list(kept.values())


def generate_model_configs(db: Database, model_arch_table: str, model_selection_table: str,
                           model_id_list: Sequence[int], compile_params_grid: str, fit_params_grid: str,
                           search_type: str = "grid", num_configs: int | None = None,
                           random_state: int | None = None, object_table: str | None = None) -> None:
    """Write a model selection table from parameter grids (see :mod:`._grid`): every
    combination (``search_type => 'grid'``) or ``num_configs`` draws seeded by
    ``random_state`` (``'random'``); to a table that exists, they are appended. Either
    makes at most :data:`._limits.MAX_GRID_CONFIGS` rows: a grid is counted, and refused
    above it, before any row is made."""
    if search_type not in SEARCH_TYPES:
        raise ValueError(f"search_type={quoted(search_type)} must be 'grid' or 'random'")
    if search_type == "random":
        if isinstance(num_configs, bool) or not isinstance(num_configs, int) or num_configs < 1:
            raise ValueError(f"num_configs={num_configs!r} must be a positive integer for search_type 'random'")
        check_count(f"num_configs={num_configs} makes", num_configs, "configurations", MAX_GRID_CONFIGS,
                    "MAX_GRID_CONFIGS")
    require_model_ids(db, model_arch_table, model_id_list)
    pulse = db.check_for_interrupts
    grid = ConfigGrid(model_id_list, compile_params_grid, fit_params_grid, enumerated=search_type == "grid",
                      pulse=pulse)
    rows = grid.grid(pulse) if search_type == "grid" else _draws(grid, int(num_configs or 0), random_state, pulse)
    if db.exists(model_selection_table, "model_selection_table"):
        append_selection(db, model_arch_table, model_selection_table, rows, object_table)
    else:
        write_selection(db, model_arch_table, model_selection_table, rows, object_table)


def _draws(grid: ConfigGrid, num_configs: int, random_state: int | None, pulse: Pulse) -> list[tuple[int, str, str]]:
    """``num_configs`` rows drawn from ``grid``, seeded by ``random_state``."""
    rng = np.random.default_rng(random_state)
    rows = []
    for _ in range(num_configs):
        pulse()
        rows.append(grid.render(sample_config(grid.space, rng)))
    return rows


def append_selection(db: Database, model_arch_table: str, model_selection_table: str,
                     rows: Sequence[tuple[int, str, str]], object_table: str | None) -> None:
    """``rows`` added to an existing model selection table of the same architecture table,
    keyed on from its largest ``mst_key`` (MADlib's ``generate_model_configs`` appends)."""
    if object_table is not None:
        raise ValueError(f"object_table={quoted(object_table)}: custom Keras objects are not supported; give NULL")
    named, held = read_model_selection(db, model_selection_table)
    if named != model_arch_table:
        raise ValueError(f"model_selection_table {quoted(model_selection_table)} is of model_arch_table "
                         f"{quoted(named)}, not {quoted(model_arch_table)}; append to it only configurations of its "
                         f"own architectures")
    # A table of more could not be trained (read_model_selection refuses it), nor appended to.
    check_count(f"model_selection_table {quoted(model_selection_table)} holds {len(held):,} rows; with "
                f"{len(rows):,} more it would hold", len(held) + len(rows), "configurations", MAX_GRID_CONFIGS,
                "MAX_GRID_CONFIGS")
    table = db.qualified(model_selection_table, "model_selection_table")
    first = db.query(f"SELECT coalesce(max(mst_key), 0) + 1 AS first FROM {table}")[0]["first"]
    db.query(f"INSERT INTO {table} (mst_key, model_id, compile_params, fit_params) "
             f"SELECT * FROM unnest($1, $2, $3, $4)",
             [list(range(first, first + len(rows))), [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]],
             ["integer[]", "integer[]", "text[]", "text[]"])
    db.query("SELECT setval(pg_get_serial_sequence($1, 'mst_key'), $2)", [table, first + len(rows) - 1],
             ["text", "integer"])


def hyperband_schedule(db: Database, schedule_table: str, r: int, eta: int = 3, skip_last: int = 0) -> None:
    """MADlib's ``hyperband_schedule``: the brackets ``automl`` runs for ``R=r, eta=eta``,
    one row per bracket ``s`` and rung ``i``: ``n_i`` configurations trained to ``r_i``
    iterations (Cerebro's :class:`cerebro.Hyperband`, the same rule as MADlib)."""
    if skip_last != 0:
        raise ValueError(f"skip_last={skip_last!r} is not supported; Cerebro's Hyperband runs every bracket")
    table = db.require_absent(schedule_table, "schedule_table")
    brackets = Hyperband(lambda config: None, {"config": choice([0])}, max_epochs=r, eta=eta).brackets()
    rows = [(b.s, i, n, epochs) for b in brackets for i, (n, epochs) in enumerate(zip(b.keep, b.rung_epochs))]
    db.query(f"CREATE TABLE {table} (s INTEGER, i INTEGER, n_i INTEGER, r_i INTEGER)")
    db.query(f"INSERT INTO {table} SELECT * FROM unnest($1, $2, $3, $4)", [list(column) for column in zip(*rows)],
             ["integer[]", "integer[]", "integer[]", "integer[]"])


def require_no_selection(db: Database, model_selection_table: str) -> tuple[str, str]:
    """The quoted names of a model selection table and its summary, neither existing yet."""
    return (db.require_absent(model_selection_table, "model_selection_table"),
            db.require_absent(f"{model_selection_table}_summary", "model_selection_table's summary"))


def write_selection(db: Database, model_arch_table: str, model_selection_table: str,
                    rows: Sequence[tuple[int, str, str]], object_table: str | None) -> None:
    """``rows`` as the model selection table, keyed ``mst_key`` 1, 2, ... in their order (a
    row may repeat: AutoML may try a configuration twice, each a model of its own)."""
    if object_table is not None:
        raise ValueError(f"object_table={quoted(object_table)}: custom Keras objects are not supported; give NULL")
    table, summary = require_no_selection(db, model_selection_table)
    db.query(f"CREATE TABLE {table} (mst_key SERIAL PRIMARY KEY, model_id INTEGER NOT NULL, "
             f"compile_params VARCHAR NOT NULL, fit_params VARCHAR NOT NULL)")
    db.query(f"INSERT INTO {table} SELECT * FROM unnest($1, $2, $3, $4)",
             [list(range(1, len(rows) + 1)), [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]],
             ["integer[]", "integer[]", "text[]", "text[]"])
    db.query("SELECT setval(pg_get_serial_sequence($1, 'mst_key'), $2)", [table, len(rows)], ["text", "integer"])
    db.query(f"CREATE TABLE {summary} (model_arch_table VARCHAR, object_table VARCHAR)")
    db.query(f"INSERT INTO {summary} VALUES ($1, $2)", [model_arch_table, object_table], ["text", "text"])


def require_model_ids(db: Database, model_arch_table: str,
                      model_id_list: Sequence[int]) -> dict[int, tuple[str, bytes | None]]:
    """The architectures of ``model_id_list`` with the weights they start from (NULL: the
    initializers'); an error names the ids the table lacks. Each id makes a configuration or
    more, so more than :data:`._limits.MAX_GRID_CONFIGS` are refused."""
    if not model_id_list or any(m is None for m in model_id_list):
        raise ValueError(f"model_id_list={quoted(model_id_list)} must hold one or more model ids, none NULL")
    check_count("model_id_list holds", len(model_id_list), "model ids", MAX_GRID_CONFIGS, "MAX_GRID_CONFIGS")
    table = db.require(model_arch_table, "model_arch_table")
    db.require_columns(model_arch_table, "model_arch_table", ["model_id", "model_arch", "model_weights"])
    # Measured in the server: an architecture written into the table by hand is refused as
    # load_model_arch would, before the backend reads it.
    too_long = db.query(f"SELECT model_id, length(model_arch::text) AS chars FROM {table} WHERE model_id = ANY($1) "
                        f"AND length(model_arch::text) > $2 ORDER BY model_id LIMIT 1",
                        [list(model_id_list), MAX_ARCH_CHARS], ["integer[]", "integer"])
    if too_long:
        row = too_long[0]
        raise ValueError(f"model_arch_table {quoted(model_arch_table)}, model_id {row['model_id']}: model_arch holds "
                         f"{row['chars']:,} characters; at most {MAX_ARCH_CHARS:,} are allowed (MAX_ARCH_CHARS)")
    found = {row["model_id"]: (row["model_arch"], None if row["model_weights"] is None else bytes(row["model_weights"]))
             for row in db.query(f"SELECT model_id, model_arch::text AS model_arch, model_weights FROM {table} "
                                 f"WHERE model_id = ANY($1)", [list(model_id_list)], ["integer[]"])}
    missing = [m for m in model_id_list if m not in found]
    if missing:
        raise ValueError(f"model_arch_table {quoted(model_arch_table)} has no model_id [{listed(missing)}]")
    return found


def read_model_selection(db: Database, model_selection_table: str) -> tuple[str, dict[int, ModelSpec]]:
    """The architecture table and the rows of ``model_selection_table`` by ``mst_key``;
    duplicate keys, unknown model ids and malformed parameter strings are refused, naming the
    row, and so is a table of more than :data:`._limits.MAX_GRID_CONFIGS` rows, before any is
    read."""
    table = db.require(model_selection_table, "model_selection_table")
    db.require_columns(model_selection_table, "model_selection_table",
                       ["mst_key", "model_id", "compile_params", "fit_params"])
    summary = f"{model_selection_table}_summary"
    if not db.exists(summary, "model_selection_table's summary"):
        raise ValueError(f"{quoted(summary)} does not exist: it names the model architecture table; make the model "
                         f"selection table with load_model_selection_table or generate_model_configs")
    named = db.query(f"SELECT model_arch_table FROM {db.qualified(summary, 'summary')}")
    if len(named) != 1 or named[0]["model_arch_table"] is None:
        raise ValueError(f"{quoted(summary)} must hold one row naming the model architecture table")
    model_arch_table = named[0]["model_arch_table"]
    rows = _selection_rows(db, model_selection_table, table)
    architectures = require_model_ids(db, model_arch_table, list(dict.fromkeys(row["model_id"] for row in rows)))
    models = {}
    for row in rows:
        db.check_for_interrupts()
        try:
            parse_compile_params(row["compile_params"])
            parse_fit_params(row["fit_params"])
        except ValueError as error:
            raise ValueError(f"model_selection_table {quoted(model_selection_table)}, mst_key {row['mst_key']}: "
                             f"{error}") from None
        model_arch, weights = architectures[row["model_id"]]
        models[row["mst_key"]] = ModelSpec(row["model_id"], model_arch, row["compile_params"], row["fit_params"],
                                           weights)
    return model_arch_table, models


def _selection_rows(db: Database, model_selection_table: str, table: str) -> list[dict[str, Any]]:
    """The rows of a model selection table, counted first: each is a model one call trains,
    and each is parsed in the backend."""
    count = db.query(f"SELECT count(*) AS count FROM {table}")[0]["count"]
    check_count(f"model_selection_table {quoted(model_selection_table)} holds", count, "rows", MAX_GRID_CONFIGS,
                "MAX_GRID_CONFIGS", ": one call trains at most that many configurations")
    # Measured in the server: a row of a 1 GB string is refused before the backend reads it.
    too_long = db.query(f"SELECT mst_key, length(compile_params) AS compile_params, length(fit_params) AS fit_params "
                        f"FROM {table} WHERE length(compile_params) > $1 OR length(fit_params) > $1 ORDER BY mst_key "
                        f"LIMIT 1", [MAX_PARAMS_CHARS], ["integer"])
    if too_long:
        row = too_long[0]
        column = "compile_params" if row["compile_params"] > MAX_PARAMS_CHARS else "fit_params"
        raise ValueError(f"model_selection_table {quoted(model_selection_table)}, mst_key {row['mst_key']}: {column} "
                         f"holds {row[column]:,} characters; at most {MAX_PARAMS_CHARS:,} are allowed "
                         f"(MAX_PARAMS_CHARS)")
    duplicates = [row["mst_key"] for row in db.query(
        f"SELECT mst_key FROM {table} GROUP BY mst_key HAVING count(*) > 1 ORDER BY mst_key")]
    if duplicates:
        raise ValueError(f"model_selection_table {quoted(model_selection_table)} has duplicate mst_key "
                         f"[{listed(duplicates)}]; each row needs its own key")
    rows = db.query(f"SELECT mst_key, model_id, compile_params, fit_params FROM {table} ORDER BY mst_key")
    if not rows:
        raise ValueError(f"model_selection_table {quoted(model_selection_table)} has no rows")
    for column in ("mst_key", "model_id", "compile_params", "fit_params"):
        if any(row[column] is None for row in rows):
            raise ValueError(f"model_selection_table {quoted(model_selection_table)} has a NULL {column}")
    return rows
