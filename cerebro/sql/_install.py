"""``cerebro sql install``: the schema of PL/Python functions that puts Cerebro in a database.

Each function's body puts this installation's package directories on PL/Python's path (the
server runs the system's Python of the same version, which can import them) and calls
:func:`cerebro.sql._functions.call`. The server's OS user must be able to read those
directories; :func:`install` checks it by calling ``version()`` in the server.
"""
from __future__ import annotations

import os
import re
import site
import sys
from dataclasses import asdict, dataclass

from .._extras import require
from ._database import Installation

_SCHEMA = re.compile(r"[a-z_][a-z0-9_]*")
_TABLE_ARGS = ("source_table varchar", "model_output_table varchar")
_RUN_ARGS = ("use_gpus boolean DEFAULT false", "validation_table varchar DEFAULT NULL",
             "metrics_compute_frequency integer DEFAULT NULL")
# NULL: the names a packed table's summary gives, else independent_var and dependent_var.
_COLUMNS = ("independent_varname varchar DEFAULT NULL", "dependent_varname varchar DEFAULT NULL")
_PREDICT_ARGS = ("model_table varchar", "test_table varchar", "id_col varchar", "independent_varname varchar",
                 "output_table varchar")
_PREDICT_TAIL = ("use_gpus boolean DEFAULT false", "mst_key integer DEFAULT NULL")
_BYOM_ARGS = ("model_arch_table varchar", "model_id integer", "test_table varchar", "id_col varchar",
              "independent_varname varchar", "output_table varchar")
_BYOM_TAIL = ("use_gpus boolean DEFAULT NULL", "class_values text[] DEFAULT NULL",
              "normalizing_const double precision DEFAULT NULL", "dependent_count integer DEFAULT 1")
_ARCH_ARGS = ("model_arch_table varchar", "model_arch json", "model_weights bytea DEFAULT NULL",
              "name varchar DEFAULT NULL", "description varchar DEFAULT NULL", "model_id integer DEFAULT NULL")


@dataclass(frozen=True)
class SqlFunction:
    """One function of the schema: its SQL name and arguments, and the entry it calls."""

    name: str
    arguments: tuple[str, ...]
    returns: str
    entry: str


FUNCTIONS = (
    SqlFunction("version", (), "text", "version"),
    SqlFunction("load_model_arch", _ARCH_ARGS, "integer", "load_model_arch"),
    # MADlib's names, with MADlib's argument names.
    SqlFunction("load_keras_model", ("keras_model_arch_table varchar", *_ARCH_ARGS[1:]), "integer",
                "load_keras_model"),
    SqlFunction("delete_keras_model", ("keras_model_arch_table varchar", "model_id integer"), "void",
                "delete_keras_model"),
    SqlFunction("load_model_selection_table", (
        "model_arch_table varchar", "model_selection_table varchar", "model_id_list integer[]",
        "compile_params_list varchar[]", "fit_params_list varchar[]", "object_table varchar DEFAULT NULL"),
        "void", "load_model_selection_table"),
    SqlFunction("generate_model_configs", (
        "model_arch_table varchar", "model_selection_table varchar", "model_id_list integer[]",
        "compile_params_grid varchar", "fit_params_grid varchar", "search_type varchar DEFAULT 'grid'",
        "num_configs integer DEFAULT NULL", "random_state integer DEFAULT NULL", "object_table varchar DEFAULT NULL"),
        "void", "generate_model_configs"),
    SqlFunction("hyperband_schedule", ("schedule_table varchar", "r integer", "eta integer DEFAULT 3",
                                       "skip_last integer DEFAULT 0"), "void", "hyperband_schedule"),
    SqlFunction("fit_multiple_model", (
        *_TABLE_ARGS, "model_selection_table varchar", "num_iterations integer", *_RUN_ARGS,
        "warm_start boolean DEFAULT false", "name varchar DEFAULT NULL", "description varchar DEFAULT NULL",
        "use_caching boolean DEFAULT false", *_COLUMNS), "void", "fit_multiple_model"),
    SqlFunction("fit", (
        "source_table varchar", "model varchar", "model_arch_table varchar", "model_id integer",
        "compile_params varchar", "fit_params varchar", "num_iterations integer", *_RUN_ARGS,
        "warm_start boolean DEFAULT false", "name varchar DEFAULT NULL", "description varchar DEFAULT NULL",
        "object_table varchar DEFAULT NULL", *_COLUMNS), "void", "fit"),
    SqlFunction("automl", (
        *_TABLE_ARGS, "model_arch_table varchar", "model_selection_table varchar", "model_id_list integer[]",
        "compile_params_grid varchar", "fit_params_grid varchar", "automl_method varchar DEFAULT 'hyperband'",
        "automl_params varchar DEFAULT NULL", "random_state integer DEFAULT NULL",
        "object_table varchar DEFAULT NULL", *_RUN_ARGS, "name varchar DEFAULT NULL",
        "description varchar DEFAULT NULL", *_COLUMNS), "void", "automl"),
    # As MADlib: pred_type 'prob' or 'response', the k likeliest classes, or a probability.
    SqlFunction("predict", (*_PREDICT_ARGS, "pred_type varchar DEFAULT 'prob'", *_PREDICT_TAIL), "void", "predict"),
    SqlFunction("predict", (*_PREDICT_ARGS, "pred_type integer", *_PREDICT_TAIL), "void", "predict"),
    SqlFunction("predict", (*_PREDICT_ARGS, "pred_type double precision", *_PREDICT_TAIL), "void", "predict"),
    *(SqlFunction("predict_byom", (*_BYOM_ARGS, f"pred_type {kind}", *_BYOM_TAIL), "void", "predict_byom")
      for kind in ("varchar DEFAULT 'prob'", "integer", "double precision")),
    SqlFunction("training_preprocessor_dl", (
        "source_table varchar", "output_table varchar", "dependent_varname varchar", "independent_varname varchar",
        "buffer_size integer DEFAULT NULL", "normalizing_const real DEFAULT 1.0",
        "num_classes integer[] DEFAULT NULL", "distribution_rules text DEFAULT 'all_segments'"), "void",
        "training_preprocessor_dl"),
    SqlFunction("validation_preprocessor_dl", (
        "source_table varchar", "output_table varchar", "dependent_varname varchar", "independent_varname varchar",
        "training_preprocessor_table varchar", "buffer_size integer DEFAULT NULL",
        "distribution_rules text DEFAULT 'all_segments'"), "void", "validation_preprocessor_dl"),
    SqlFunction("train_test_split", (
        "source_table varchar", "output_table varchar", "train_proportion double precision",
        "test_proportion double precision DEFAULT NULL", "grouping_cols varchar DEFAULT NULL",
        "target_cols varchar DEFAULT NULL", "with_replacement boolean DEFAULT false",
        "separate_output_tables boolean DEFAULT false"), "void", "train_test_split"),
    SqlFunction("evaluate", (
        "model_table varchar", "test_table varchar", "output_table varchar", "use_gpus boolean DEFAULT false",
        "mst_key integer DEFAULT NULL", *_COLUMNS), "void", "evaluate"),
)
# MADlib's names of the same functions, so a MADlib notebook runs with madlib. -> cerebro.
MADLIB_NAMES = {"fit": "madlib_keras_fit", "fit_multiple_model": "madlib_keras_fit_multiple_model",
                "automl": "madlib_keras_automl", "predict": "madlib_keras_predict", "evaluate": "madlib_keras_evaluate",
                "predict_byom": "madlib_keras_predict_byom"}
FUNCTIONS += tuple(SqlFunction(MADLIB_NAMES[f.name], f.arguments, f.returns, f.entry)
                   for f in FUNCTIONS if f.name in MADLIB_NAMES)


def package_paths() -> tuple[list[str], list[str]]:
    """(site directories, other directories) this interpreter imports Cerebro and its
    dependencies from; an editable install adds the project's directory."""
    sites = [p for p in [*site.getsitepackages(), site.getusersitepackages()] if os.path.isdir(p)]
    project = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(project)
    in_site = any(project.startswith(os.path.abspath(s) + os.sep) for s in sites)
    return sites, [] if in_site else [root]


def function_sql(schema: str, function: SqlFunction, sites: list[str], extra: list[str],
                 installation: Installation) -> str:
    """``CREATE OR REPLACE FUNCTION`` for ``function`` in ``schema``; ``installation`` is
    written into its body, where no session setting reaches it."""
    names = [argument.split()[0] for argument in function.arguments]
    call = ", ".join([repr(function.entry), repr(asdict(installation)), *(f"{n}={n}" for n in names)])
    body = "\n".join([
        "import site, sys",
        "if 'cerebro.sql._functions' not in sys.modules:",
        "    before = list(sys.path)",
        f"    for directory in {sites!r}:",
        "        site.addsitedir(directory)",
        f"    sys.path[:] = {extra!r} + [p for p in sys.path if p not in before] + before",
        "from cerebro.sql._functions import call",
        f"return call({call})",
    ])
    return (f"CREATE OR REPLACE FUNCTION {schema}.{function.name}({', '.join(function.arguments)}) "
            f"RETURNS {function.returns} AS $cerebro$\n{body}\n$cerebro$ LANGUAGE plpython3u")


def check_installation(store_root: str | None, max_workers: int | None) -> Installation:
    """The DBA's choices, refused unless ``store_root`` is an absolute path and
    ``max_workers`` a positive integer."""
    if store_root is not None and not (isinstance(store_root, str) and os.path.isabs(store_root)
                                       and "$" not in store_root and "\n" not in store_root):
        raise ValueError(f"store_root={store_root!r} must be an absolute directory path (without $ or newlines) "
                         f"the server's OS user may write")
    if max_workers is not None and (isinstance(max_workers, bool) or not isinstance(max_workers, int)
                                    or max_workers < 1):
        raise ValueError(f"max_workers={max_workers!r} must be a positive integer")
    return Installation(store_root, max_workers)


def install(dsn: str, schema: str = "cerebro", *, store_root: str | None = None,
            max_workers: int | None = None) -> str:
    """Create ``schema`` with Cerebro's SQL functions in the database at ``dsn`` (a
    ``postgresql://`` URI of a superuser: ``plpython3u`` is an untrusted language), and
    return what ``version()`` answers from the server. Run directories go under
    ``store_root`` (default ``~/cerebro_runs`` of the server's OS user), one directory per
    database, role and output table; one call starts at most ``max_workers`` workers
    (default: the server's CPU count). No role but the installer may run the functions
    until it is granted: ``GRANT USAGE ON SCHEMA cerebro TO analyst; GRANT EXECUTE ON ALL
    FUNCTIONS IN SCHEMA cerebro TO analyst``.

    Example (a fragment: it needs a running server):
        >>> cb.sql.install("postgresql:///mydb?host=/var/run/postgresql", store_root="/srv/cerebro")  # doctest: +SKIP
        'cerebro 0.1.0 on Python 3.11.2 (/usr/bin/python3)'
    """
    if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema):
        raise ValueError(f"schema={schema!r} must be a lower-case SQL name (letters, digits and _)")
    installation = check_installation(store_root, max_workers)
    require("cerebro sql install", "adbc_driver_postgresql")
    from adbc_driver_postgresql import dbapi
    sites, extra = package_paths()
    statements = ["CREATE EXTENSION IF NOT EXISTS plpython3u", f"CREATE SCHEMA IF NOT EXISTS {schema}",
                  *(function_sql(schema, f, sites, extra, installation) for f in FUNCTIONS),
                  # PostgreSQL grants EXECUTE on new functions to PUBLIC: the DBA grants it instead.
                  f"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC"]
    with dbapi.connect(dsn) as connection, connection.cursor() as cursor:
        try:
            for statement in statements:
                cursor.execute(statement)
            connection.commit()
        except dbapi.Error as error:
            raise RuntimeError(f"installing the schema {schema!r} failed: {str(error).splitlines()[0]} (the extension "
                               f"plpython3u comes with Debian's postgresql-plpython3-15)") from None
        try:
            cursor.execute(f"SELECT {schema}.version()")
            answer = cursor.fetchone()[0]
        except dbapi.Error as error:
            raise RuntimeError(f"the schema {schema!r} is installed, but the server cannot run Cerebro: "
                               f"{str(error).splitlines()[0]}. Its OS user must be able to read "
                               f"{', '.join(sites + extra)}") from None
    found = re.search(r"Python (\d+\.\d+)", answer)
    server_python = found.group(1) if found is not None else f"an unknown version ({answer!r})"
    if server_python != f"{sys.version_info.major}.{sys.version_info.minor}":
        raise RuntimeError(f"the server's PL/Python runs Python {server_python}, but these packages are for "
                           f"{sys.version_info.major}.{sys.version_info.minor}: install Cerebro with Python "
                           f"{server_python}")
    return answer
