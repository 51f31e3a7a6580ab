"""The database a SQL function runs in, through PL/Python's ``plpy``: names checked and
quoted, tables described, the function's settings read.

Settings are PostgreSQL's custom parameters, e.g. ``SET cerebro.workers = 4``:

========================  ==============================================================
``cerebro.workers``       worker processes (default: the server's CPU count)
``cerebro.seed``          the run seed (default 0: rerunning gives the same models)
``cerebro.store``         the run directory (default ``~/cerebro_runs/<db>/<output table>``
                          in the server's OS user's home)
``cerebro.dsn``           how the run reads tables (default: this server's socket, as the
                          session's user)
``cerebro.keras_backend`` tensorflow, jax or torch (default: KERAS_BACKEND or tensorflow)
========================  ==============================================================
"""
from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ..worker._keras import driver_keras_backend

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?")


class Database:
    """This session's database, seen from a PL/Python function."""

    def __init__(self) -> None:
        self._plpy = importlib.import_module("plpy")    # exists only inside PostgreSQL

    def query(self, sql: str, args: Sequence[Any] = (), types: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The rows of ``sql`` with ``$1, $2, ...`` bound to ``args`` of PostgreSQL ``types``."""
        if not args:
            return list(self._plpy.execute(sql))
        return list(self._plpy.execute(self._plpy.prepare(sql, list(types)), list(args)))

    def notice(self, message: str) -> None:
        self._plpy.notice(message)

    # --- names -------------------------------------------------------------------------
    def quoted(self, name: str, argument: str) -> str:
        """``name`` (``table`` or ``schema.table``) quoted for SQL, folded to lower case as
        PostgreSQL folds unquoted names; refuses anything else."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{argument}={name!r} is not a table name; expected 'table' or 'schema.table' (letters, "
                             f"digits, _ and $)")
        return ".".join(self._plpy.quote_ident(part.lower()) for part in name.split("."))

    def exists(self, name: str, argument: str) -> bool:
        return self.query("SELECT to_regclass($1) IS NOT NULL AS found", [self.quoted(name, argument)],
                          ["text"])[0]["found"]

    def require(self, name: str, argument: str) -> str:
        """The quoted name of an existing table; else an error naming it."""
        if not self.exists(name, argument):
            raise ValueError(f"{argument} {name!r} does not exist")
        return self.quoted(name, argument)

    def require_absent(self, name: str, argument: str) -> str:
        """The quoted name of a table that does not exist yet; else an error naming it."""
        if self.exists(name, argument):
            raise ValueError(f"{argument} {name!r} already exists; drop it or choose another name")
        return self.quoted(name, argument)

    def columns(self, name: str, argument: str) -> dict[str, str]:
        """The columns of table ``name`` and their types."""
        rows = self.query("SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
                          "WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                          [self.require(name, argument)], ["text"])
        return {row["attname"]: row["type"] for row in rows}

    def require_columns(self, name: str, argument: str, wanted: Sequence[str]) -> None:
        have = self.columns(name, argument)
        missing = [column for column in wanted if column not in have]
        if missing:
            raise ValueError(f"{argument} {name!r} has no column {', '.join(map(repr, missing))}; its columns are "
                             f"{', '.join(have)}")

    # --- settings ----------------------------------------------------------------------
    def setting(self, name: str) -> str | None:
        """The custom parameter ``cerebro.<name>``, or None where it is not set."""
        value = self.query("SELECT current_setting($1, true) AS value", [f"cerebro.{name}"], ["text"])[0]["value"]
        return value or None

    def integer_setting(self, name: str, default: int, low: int) -> int:
        value = self.setting(name)
        if value is None:
            return default
        if not re.fullmatch(r"\d+", value.strip()) or int(value) < low:
            raise ValueError(f"cerebro.{name}={value!r} must be an integer >= {low}")
        return int(value)

    def dsn(self) -> str:
        """A ``postgresql://`` URI back to this database, for reading tables as Arrow."""
        given = self.setting("dsn")
        if given:
            return given
        row = self.query("SELECT current_database() AS db, session_user AS who, current_setting('port') AS port, "
                         "split_part(current_setting('unix_socket_directories'), ',', 1) AS socket")[0]
        host = row["socket"].strip() or "localhost"
        return (f"postgresql:///{quote(row['db'])}?host={quote(host)}&port={row['port']}"
                f"&user={quote(row['who'])}")

    def store(self, output_table: str) -> str:
        given = self.setting("store")
        if given:
            return given
        database = self.query("SELECT current_database() AS db")[0]["db"]
        return os.path.join(os.path.expanduser("~"), "cerebro_runs", database, output_table)

    def use_keras_backend(self) -> None:
        """Choose Keras's backend for this session before anything imports Keras."""
        backend = self.setting("keras_backend")
        if backend is not None:
            loaded = driver_keras_backend()
            if loaded not in (None, backend):
                raise ValueError(f"cerebro.keras_backend={backend!r}, but this session already runs Keras on "
                                 f"{loaded!r}; set it in a new session")
            os.environ["KERAS_BACKEND"] = backend
