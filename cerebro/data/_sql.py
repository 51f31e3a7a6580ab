"""Rows of a PostgreSQL table or query, for :meth:`cerebro.Dataset.from_sql`.

They are read through ADBC's PostgreSQL driver, which fetches them with binary ``COPY``
straight into Arrow: no Python object per row or value. A table's rows come back in no
particular order, so :func:`canonical_order` orders them by their content before the seeded
split: the same rows give the same run whatever order the table holds them in.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?")
_QUERY = re.compile(r"\s*(select|with|values|table)\b", re.IGNORECASE)


def read_sql(dsn: str, table_or_query: str, features: Sequence[str] | str | None, label: str) -> pa.Table:
    """The label and feature columns (every column where ``features`` is None) of
    ``table_or_query`` as an Arrow table; raises, naming the problem, before reading a row
    if the source or a column is missing, and after if a column holds NULLs."""
    if not isinstance(dsn, str) or urlsplit(dsn).scheme not in ("postgresql", "postgres"):
        raise ValueError(f"dsn={dsn!r} must be a PostgreSQL URI such as "
                         f"'postgresql://user:password@host:5432/dbname' or 'postgresql:///dbname?host=/socket/dir'")
    if not isinstance(table_or_query, str):
        raise TypeError(f"table_or_query must be a table name or a query; got {type(table_or_query).__name__}")
    if _TABLE.fullmatch(table_or_query):
        source = "SELECT * FROM " + ".".join(_quote(part) for part in table_or_query.split("."))
    elif _QUERY.match(table_or_query):
        source = table_or_query.strip().rstrip(";")
    else:
        raise ValueError(f"table_or_query={table_or_query!r} must be a table name (table or schema.table) or a "
                         f"query starting with SELECT, WITH, VALUES or TABLE")
    try:
        from adbc_driver_postgresql import dbapi
    except ImportError:
        raise ImportError("Dataset.from_sql needs ADBC's PostgreSQL driver: pip install 'cerebro[sql]'") from None
    try:
        connection = dbapi.connect(dsn)
    except dbapi.Error as error:
        raise ConnectionError(f"could not connect to {_without_password(dsn)}: {_first_line(error)}") from None
    with connection, connection.cursor() as cursor:
        columns = _columns(cursor, dbapi, source, table_or_query)
        wanted = [c for c in columns if c != label] if features is None else \
            [features] if isinstance(features, str) else list(features)
        missing = [c for c in [*wanted, label] if c not in columns]
        if missing:
            raise ValueError(f"columns {missing} are not in {table_or_query!r}; its columns are {columns}")
        selected = ", ".join(_quote(c) for c in dict.fromkeys([*wanted, label]))
        cursor.execute(f"SELECT {selected} FROM ({source}) AS cerebro_rows")
        table = cursor.fetch_arrow_table()
    _check_columns(table, table_or_query)
    return table


def canonical_order(features: np.ndarray, label: np.ndarray) -> np.ndarray:
    """The row indices that sort rows by their bytes (label, then features): an order that
    depends on the rows alone, never on the order they came in. Equal rows are
    interchangeable, so ties need no rule."""
    rows = len(label)
    if features.dtype == object:     # bytes values (encoded images) of any length
        keys = [label[i].tobytes() + features[i] for i in range(rows)]
        return np.array(sorted(range(rows), key=keys.__getitem__), dtype=np.int64)
    content = np.concatenate([np.ascontiguousarray(label).reshape(rows, -1).view(np.uint8),
                              np.ascontiguousarray(features).reshape(rows, -1).view(np.uint8)], axis=1)
    content = np.ascontiguousarray(content)
    return np.argsort(content.view(np.dtype((np.void, content.shape[1]))).ravel(), kind="stable")


def _columns(cursor, dbapi, source: str, table_or_query: str) -> list[str]:
    """The column names of ``source``, read without reading a row."""
    try:
        cursor.execute(f"SELECT * FROM ({source}) AS cerebro_rows LIMIT 0")
        return [str(c) for c in cursor.fetch_arrow_table().column_names]
    except dbapi.Error as error:
        raise ValueError(f"cannot read {table_or_query!r}: {_first_line(error)}") from None


def _check_columns(table: pa.Table, table_or_query: str) -> None:
    """Refuse NULLs and types that are not numbers, numeric arrays or bytea."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, column in zip(table.column_names, table.columns):
        kind = column.type
        values = pc.list_flatten(column) if pa.types.is_list(kind) or pa.types.is_large_list(kind) else column
        if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
                or pa.types.is_boolean(values.type) or pa.types.is_binary(values.type)):
            # The driver hands over types Arrow lacks (numeric, money, ...) as opaque values.
            described = f"PostgreSQL type {kind.type_name}" if hasattr(kind, "type_name") else f"type {kind}"
            raise TypeError(f"column {name!r} of {table_or_query!r} is of {described}; features and label must be "
                            f"numbers (cast NUMERIC to double precision), arrays of numbers, or bytea")
        nulls = column.null_count + (values.null_count if values is not column else 0)
        if nulls:
            raise ValueError(f"column {name!r} of {table_or_query!r} holds {nulls} NULLs; every row needs a value "
                             f"(filter them out in a query, or fill them)")


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _without_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def _first_line(error: Exception) -> str:
    """PostgreSQL's own message where the driver's error carries one, else its first line."""
    text = str(error).strip()
    return text.split("ERROR:", 1)[1].strip().splitlines()[0] if "ERROR:" in text else text.splitlines()[0]
