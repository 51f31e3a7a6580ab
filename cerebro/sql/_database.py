"""The database a SQL function runs in, through PL/Python's ``plpy``, with no more rights than
the calling role (DESIGN invariant 8).

- Rows are read through SPI in the calling session, so PostgreSQL checks the caller's
  privileges; no second connection, no DSN a caller could point at another role.
- The caller's ``search_path`` is used for one thing only: finding the tables the caller
  names (as PostgreSQL would for them). Everything else runs with ``search_path`` pinned to
  ``pg_catalog, pg_temp`` and every function schema-qualified, so no function, operator or
  type of the caller's takes the place of PostgreSQL's.
- What reaches files or processes (where run directories live, how many workers a call may
  start) is fixed by the DBA at install (:class:`Installation`, written into each function's
  body); the session settings below only choose within it:

========================  ==============================================================
``cerebro.workers``       worker processes (default: the server's CPU count, at most the
                          installation's ``max_workers``)
``cerebro.seed``          the run seed (default 0: rerunning gives the same models)
``cerebro.store``         a run directory of the superuser's choosing (superusers only;
                          others get ``<store_root>/<db>/<role>/<table>/<call digest>``)
``cerebro.keras_backend`` tensorflow, jax or torch (default: KERAS_BACKEND or tensorflow)
========================  ==============================================================
"""
from __future__ import annotations

import hashlib
import hmac
import importlib
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np

# excerpt: a value for a message; the method quoted() quotes a name for SQL.
from .._checks import quoted as excerpt
from ._limits import listed

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?")
PINNED_PATH = "pg_catalog, pg_temp"
_FETCH_ROWS = 10_000
# How often a long loop in the backend asks PostgreSQL for interrupts: far within the 3 s
# docs/sql.md promises, and each ask (a query) costs ~50 us.
_INTERRUPT_SECONDS = 0.1
KERAS_BACKENDS = ("tensorflow", "jax", "torch")


@dataclass(frozen=True)
class Installation:
    """What the DBA chose with ``cerebro sql install``: the directory run directories go
    under (None: ``~/cerebro_runs`` of the server's OS user) and the most workers one call
    may start (None: the server's CPU count)."""

    store_root: str | None = None
    max_workers: int | None = None

    def lock_key(self, name: str) -> tuple[int, int]:
        """Two int4 advisory-lock keys for ``name``, keyed with a secret only the server's OS
        user can read (made on first use in the store root): any role may take any advisory
        lock, so a key a role could compute would let it block others' calls."""
        root = self.root()
        os.makedirs(root, mode=0o700, exist_ok=True)
        path = os.path.join(root, ".lock-key")
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            with open(path, "rb") as f:
                secret = f.read()
        else:
            secret = os.urandom(32)
            with os.fdopen(descriptor, "wb") as f:
                f.write(secret)
        digest = hmac.new(secret, name.encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:4], "big", signed=True), int.from_bytes(digest[4:8], "big", signed=True)

    def worker_limit(self) -> int:
        return self.max_workers or os.cpu_count() or 1

    def root(self) -> str:
        return self.store_root or os.path.join(os.path.expanduser("~"), "cerebro_runs")


class Database:
    """This session's database, seen from a PL/Python function; :meth:`close` gives the
    caller back their ``search_path``."""

    def __init__(self, installation: Installation = Installation()) -> None:
        self._plpy = importlib.import_module("plpy")    # exists only inside PostgreSQL
        self.installation = installation
        self._callers_path = self.query("SELECT pg_catalog.current_setting('search_path') AS path")[0]["path"]
        self._qualified: dict[str, str] = {}      # name -> schema-qualified, found once per call
        self._interrupts_checked = time.monotonic()
        self._set_path(PINNED_PATH)

    def close(self) -> None:
        self._set_path(self._callers_path)

    def _set_path(self, path: str) -> None:
        self.query("SELECT pg_catalog.set_config('search_path', $1, true)", [path], ["text"])

    def query(self, sql: str, args: Sequence[Any] = (), types: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The rows of ``sql`` with ``$1, $2, ...`` bound to ``args`` of PostgreSQL ``types``."""
        if not args:
            return list(self._plpy.execute(sql))
        return list(self._plpy.execute(self._plpy.prepare(sql, list(types)), list(args)))

    def notice(self, message: str) -> None:
        self._plpy.notice(message)

    def sleep(self, seconds: float) -> None:
        """Wait in PostgreSQL's own ``pg_sleep``, which answers a cancel, a terminate or a
        shutdown at once: a cancel raises here, a terminate ends the backend."""
        self.query("SELECT pg_catalog.pg_sleep($1)", [seconds], ["float8"])

    def check_for_interrupts(self) -> None:
        """Answer a pending cancel (raising here), terminate or shutdown, as PostgreSQL's
        ``CHECK_FOR_INTERRUPTS`` would: pure Python never reaches one, so a long loop in the
        backend calls this as it goes (see :mod:`._limits`). It asks the server at most every
        :data:`_INTERRUPT_SECONDS`, so a loop may call it at every step."""
        now = time.monotonic()
        if now - self._interrupts_checked >= _INTERRUPT_SECONDS:
            self.sleep(0)      # pg_sleep checks for interrupts before it looks at the time
            self._interrupts_checked = time.monotonic()

    # --- names -------------------------------------------------------------------------
    def quoted(self, name: str, argument: str) -> str:
        """``name`` (``table`` or ``schema.table``) quoted for SQL, folded to lower case as
        PostgreSQL folds unquoted names; refuses anything else."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{argument}={excerpt(name)} is not a table name; expected 'table' or 'schema.table' "
                             f"(letters, digits, _ and $)")
        return ".".join(self._plpy.quote_ident(part.lower()) for part in name.split("."))

    def quote_ident(self, name: str) -> str:
        """``name`` as a quoted SQL identifier (a column's, say)."""
        return self._plpy.quote_ident(name)

    def qualified(self, name: str, argument: str) -> str:
        """``name`` quoted and schema-qualified as the caller means it: the schema of the
        table their ``search_path`` finds, else the one ``CREATE TABLE`` would put it in."""
        quoted = self.quoted(name, argument)
        if "." in name:
            return quoted
        if quoted not in self._qualified:
            self._qualified[quoted] = self._resolve(name, quoted, argument)
        return self._qualified[quoted]

    def _resolve(self, name: str, quoted: str, argument: str) -> str:
        self._set_path(self._callers_path)
        try:
            row = self.query(
                "SELECT (SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                "ON n.oid OPERATOR(pg_catalog.=) c.relnamespace "
                "WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)) AS found, "
                "pg_catalog.current_schema() AS here", [quoted], ["text"])[0]
        finally:
            self._set_path(PINNED_PATH)
        schema = row["found"] or row["here"]
        if schema is None:
            raise ValueError(f"{argument}={excerpt(name)}: no schema on the search_path to create it in; name it as "
                             f"'schema.table'")
        return f"{self._plpy.quote_ident(schema)}.{quoted}"

    def exists(self, name: str, argument: str) -> bool:
        return self.query("SELECT pg_catalog.to_regclass($1) IS NOT NULL AS found", [self.qualified(name, argument)],
                          ["text"])[0]["found"]

    def require(self, name: str, argument: str) -> str:
        """The qualified name of an existing table; else an error naming it."""
        if not self.exists(name, argument):
            raise ValueError(f"{argument} {excerpt(name)} does not exist")
        return self.qualified(name, argument)

    def require_absent(self, name: str, argument: str) -> str:
        """The qualified name of a table that does not exist yet; else an error naming it."""
        if self.exists(name, argument):
            raise ValueError(f"{argument} {excerpt(name)} already exists; drop it or choose another name")
        return self.qualified(name, argument)

    def columns(self, name: str, argument: str) -> dict[str, str]:
        """The columns of table ``name`` and their types."""
        rows = self.query("SELECT attname, pg_catalog.format_type(atttypid, atttypmod) AS type "
                          "FROM pg_catalog.pg_attribute WHERE attrelid = pg_catalog.to_regclass($1) AND attnum > 0 "
                          "AND NOT attisdropped ORDER BY attnum", [self.require(name, argument)], ["text"])
        return {row["attname"]: row["type"] for row in rows}

    def require_columns(self, name: str, argument: str, wanted: Sequence[str]) -> None:
        have = self.columns(name, argument)
        missing = [column for column in wanted if column not in have]
        if missing:
            raise ValueError(f"{argument} {excerpt(name)} has no column {listed(missing)}; its columns are "
                             f"{listed(list(have), quote=False, most=100)}")

    def lock_output(self, name: str, argument: str) -> None:
        """Hold the output table ``name`` for this call's transaction; a second call writing
        it at the same time is refused before it trains."""
        first, second = self.installation.lock_key(self.qualified(name, argument))
        got = self.query("SELECT pg_catalog.pg_try_advisory_xact_lock($1, $2) AS got", [first, second],
                         ["integer", "integer"])[0]["got"]
        if not got:
            raise ValueError(f"{argument} {excerpt(name)} is being written by another call right now; wait for it "
                             f"to end, or choose another name")

    # --- rows ----------------------------------------------------------------------------
    def read(self, name: str, argument: str, features: Sequence[str], label: str,
             classes: Sequence[str | None] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(features, label) of table ``name``, read through SPI as the calling role, with the
        columns ``Dataset.from_sql`` takes; a text label is read as its place in ``classes``."""
        import pyarrow as pa

        from ..data import select_list, table_arrays

        types = self.columns(name, argument)
        arrays = {c for c in [*features, label] if types[c].endswith("[]")}
        # MADlib's tables hold numeric (arbitrary precision): read as double precision.
        quote = self._plpy.quote_ident
        values = {c: f"{quote(c)}::pg_catalog.float8" + ("[]" if c in arrays else "") for c in [*features, label]
                  if types[c].startswith("numeric")}
        if classes is not None:
            values[label] = f"pg_catalog.array_position($1::pg_catalog.text[], {quote(label)}::pg_catalog.text) - 1"
            types = {**types, label: "integer"}
        query = f"SELECT {select_list(features, label, arrays, values)} FROM {self.require(name, argument)}"
        cursor = self._plpy.cursor(self._plpy.prepare(query, ["text[]"]), [list(classes)]) \
            if classes is not None else self._plpy.cursor(query)
        # Batch by batch into numpy: Python objects for one batch of rows at a time, never
        # for the table (they take ~17 times its size).
        kinds = {c: pa.binary() if c in arrays or types[c] == "bytea" else pa.float32() if types[c] == "real"
                 else None for c in [*features, label]}
        blocks: list[tuple[np.ndarray, np.ndarray]] = []
        while rows := cursor.fetch(_FETCH_ROWS):
            table = pa.table({c: pa.array([row[c] for row in rows], type=kind) for c, kind in kinds.items()})
            blocks.append(table_arrays(table, list(features), label, arrays, name))
        cursor.close()
        if not blocks:
            raise ValueError(f"{excerpt(name)} has no rows; a dataset needs at least one")
        shapes = {(x.shape[1:], y.shape[1:]) for x, y in blocks}
        if len(shapes) > 1:
            raise ValueError(f"{argument} {excerpt(name)} holds arrays of different shapes; every row's array must "
                             f"have the same")
        return np.concatenate([x for x, _ in blocks]), np.concatenate([y for _, y in blocks])

    def class_values(self, name: str, argument: str, label: str) -> list[str] | None:
        """The distinct values of a text label column, sorted (a class's id is its place);
        None for a label of numbers."""
        kind = self.columns(name, argument)[label]
        if not (kind in ("text", "name") or kind.startswith(("character", "varchar"))):
            return None
        found = [row["value"] for row in self.query(f"SELECT DISTINCT {self._plpy.quote_ident(label)}::pg_catalog.text "
                                                    f"AS value FROM {self.require(name, argument)}")]
        if None in found:
            raise ValueError(f"label column {excerpt(label)} of {excerpt(name)} holds NULLs; every row needs a class")
        return sorted(found)

    # --- settings ----------------------------------------------------------------------
    def setting(self, name: str) -> str | None:
        """The custom parameter ``cerebro.<name>``, or None where it is not set."""
        value = self.query("SELECT pg_catalog.current_setting($1, true) AS value", [f"cerebro.{name}"],
                           ["text"])[0]["value"]
        return value or None

    def integer_setting(self, name: str, default: int, low: int, high: int | None = None) -> int:
        value = self.setting(name)
        if value is None:
            return default if high is None else min(default, high)
        if not re.fullmatch(r"\d+", value.strip()) or int(value) < low:
            raise ValueError(f"cerebro.{name}={excerpt(value)} must be an integer >= {low}")
        if high is not None and int(value) > high:
            raise ValueError(f"cerebro.{name}={excerpt(value)} is above this installation's limit of {high} (the DBA "
                             f"sets it with cerebro sql install --max-workers)")
        return int(value)

    def workers(self) -> int:
        limit = self.installation.worker_limit()
        return self.integer_setting("workers", os.cpu_count() or 1, 1, limit)

    def superuser(self) -> bool:
        return self.query("SELECT pg_catalog.current_setting('is_superuser') AS value")[0]["value"] == "on"

    def store(self, output_table: str) -> str:
        """The directory the run of a call writing ``output_table`` goes under: the
        installation's root, one directory per database, role and table (a superuser may
        choose another with ``cerebro.store``)."""
        given = self.setting("store")
        if given:
            if not self.superuser():
                raise ValueError(f"cerebro.store={excerpt(given)}: only a superuser may choose the run directory; "
                                 f"unset it (RESET cerebro.store) and runs go under {self.installation.root()}")
            return given
        row = self.query("SELECT pg_catalog.current_database() AS db, current_user AS who")[0]
        table = self.qualified(output_table, "model_output_table").replace('"', "")
        return os.path.join(self.installation.root(), *(_path_part(p) for p in (row["db"], row["who"], table)))

    def keras_backend(self) -> str | None:
        backend = self.setting("keras_backend")
        if backend is not None and backend not in KERAS_BACKENDS:
            raise ValueError(f"cerebro.keras_backend={excerpt(backend)} must be one of {', '.join(KERAS_BACKENDS)}")
        return backend


def _path_part(name: str) -> str:
    """A database, role or table name as one directory name: no ``/``, never ``.`` or ``..``."""
    return "%2E" * len(name) if name in (".", "..") else quote(name, safe="")
