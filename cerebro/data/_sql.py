"""Rows of a PostgreSQL table or query, for :meth:`cerebro.Dataset.from_sql`.

They are read through ADBC's PostgreSQL driver, which fetches them with binary ``COPY``
straight into Arrow: no Python object per row or value. A table's rows come back in no
particular order, so :func:`canonical_order` orders them by their content before the seeded
split: the same rows give the same run whatever order the table holds them in.

Most of a read is the server writing the arrays, one backend per connection, so a large
table is read in ranges of its pages over several connections at once, all in one snapshot:
the rows are the ones a single read would see.
"""
from __future__ import annotations

import queue
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from .._extras import require

if TYPE_CHECKING:
    import pyarrow as pa

_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?")
_QUERY = re.compile(r"\s*(select|with|values|table)\b", re.IGNORECASE)
# A table gets one more connection per this many pages (8 kB each by default), up to the
# most: smaller pieces would cost more in connections than the server's parallel work saves.
PAGES_PER_CONNECTION = 1024
MAX_CONNECTIONS = 4


def read_sql(dsn: str, table_or_query: str, features: Sequence[str] | str | None,
             label: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, label) of ``table_or_query``, with the columns of ``from_pandas``: numeric
    columns or numeric array columns (concatenated in order; default every column but the
    label), or one column of N-D arrays (kept in their shape) or of ``bytea``. Missing
    columns and bad sources are refused before a row is read; NULLs and other types after."""
    source, table_name = _source(table_or_query)
    require("Dataset.from_sql", "adbc_driver_postgresql")
    from adbc_driver_postgresql import dbapi
    if not isinstance(dsn, str) or urlsplit(dsn).scheme not in ("postgresql", "postgres"):
        # Not echoed: a malformed DSN may hold a password where no mask would find it.
        raise ValueError("dsn must be a PostgreSQL URI such as 'postgresql://user:password@host:5432/dbname' or "
                         "'postgresql:///dbname?host=/socket/dir'")
    with _connect(dbapi, dsn) as connection, connection.cursor() as cursor:
        # Repeatable read: the other connections of a parallel read take this snapshot.
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        try:
            cursor.execute(f"SELECT * FROM ({source}\n) AS cerebro_rows LIMIT 0")
            schema = cursor.fetch_arrow_table().schema
        except dbapi.Error as error:
            raise ValueError(f"cannot read {table_or_query!r}: {_first_line(error)}") from None
        wanted = _feature_columns(schema.names, features, label, table_or_query)
        arrays = {c for c in [*wanted, label] if _is_list(schema.field(c).type)}
        selected = select_list(wanted, label, arrays)
        pieces = [f"SELECT * FROM {table_name} WHERE {where}" for where in _page_ranges(cursor, table_name)] \
            if table_name else [source]
        queries = [f"SELECT {selected} FROM ({piece}\n) AS cerebro_rows" for piece in pieces]  # \n: ends a -- comment
        if len(queries) == 1:
            cursor.execute(queries[0])
            table = cursor.fetch_arrow_table()
        else:
            table = _read_in_parallel(dbapi, dsn, cursor, queries)
    return table_arrays(table, wanted, label, arrays, table_or_query)


def select_list(wanted: Sequence[str], label: str, arrays: set[str], values: dict[str, str] | None = None) -> str:
    """The columns to select, array columns in PostgreSQL's binary array format: numpy
    decodes them all at once, where a driver would decode one element at a time. A column
    in ``values`` is selected as that SQL expression instead (a cast of ``numeric[]`` to
    ``float8[]``, say). Functions and types are schema-qualified, so none of the caller's
    can take their place."""
    values = values or {}

    def value(column: str) -> str:
        return values.get(column, _quote(column))
    return ", ".join(f"pg_catalog.array_send({value(c)}) AS {_quote(c)}" if c in arrays else
                     f"{value(c)} AS {_quote(c)}" for c in [*wanted, label])


def table_arrays(table: pa.Table, wanted: Sequence[str], label: str, arrays: set[str],
                 table_or_query: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, label) of the columns of ``table`` read with :func:`select_list`."""
    if table.num_rows == 0:
        raise ValueError(f"{table_or_query!r} has no rows; a dataset needs at least one")
    if label not in arrays and _is_binary(table.column(label).type):     # arrays come as bytes too
        raise TypeError(f"label column {label!r} of {table_or_query!r} is bytea; a label must be numbers or arrays "
                        f"of numbers")
    blocks = [_column_array(table.column(c), c, c in arrays, table_or_query) for c in wanted]
    if len(blocks) > 1 and any(b.dtype == object for b in blocks):
        raise TypeError(f"a bytea column must be the only feature column; features={wanted}")
    if len(blocks) > 1 or blocks[0].dtype != object and blocks[0].ndim == 1:
        blocks = [b.reshape(len(b), -1) for b in blocks]    # one row of features each, side by side
    feature_array = np.concatenate(blocks, axis=1) if len(blocks) > 1 else blocks[0]
    return feature_array, _column_array(table.column(label), label, label in arrays, table_or_query)


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


def _source(table_or_query: object) -> tuple[str, str | None]:
    """A query for ``table_or_query``, and the quoted table name if it names a table (a
    query is used as it is)."""
    if not isinstance(table_or_query, str):
        raise TypeError(f"table_or_query must be a table name or a query; got {type(table_or_query).__name__}")
    if _TABLE.fullmatch(table_or_query):    # folded to lower case, as PostgreSQL folds unquoted names
        table_name = ".".join(_quote(part.lower()) for part in table_or_query.split("."))
        return f"SELECT * FROM {table_name}", table_name
    if _QUERY.match(table_or_query):
        return table_or_query.strip().rstrip(";"), None
    raise ValueError(f"table_or_query={table_or_query!r} must be a table name (table or schema.table) or a "
                     f"query starting with SELECT, WITH, VALUES or TABLE")


def _connect(dbapi: Any, dsn: str) -> Any:
    try:
        return dbapi.connect(dsn)
    except dbapi.Error as error:
        raise ConnectionError(f"could not connect to {_without_password(dsn)}: {_first_line(error)}") from None


def _page_ranges(cursor: Any, table_name: str) -> list[str]:
    """Conditions that split a plain table (or materialized view) into ranges of its pages,
    one per connection of the read (TID range scans); ``["true"]`` for anything else."""
    cursor.execute(f"SELECT relkind, pg_catalog.pg_relation_size(oid) / "
                   f"pg_catalog.current_setting('block_size')::bigint AS pages "
                   f"FROM pg_catalog.pg_class WHERE oid = '{table_name}'::regclass")
    kind, pages = cursor.fetchone()
    connections = min(MAX_CONNECTIONS, pages // PAGES_PER_CONNECTION) if kind in ("r", "m") else 1
    if connections < 2:
        return ["true"]
    starts = [pages * i // connections for i in range(connections)]
    # The last range is open: pages added since the size was read hold no row of this snapshot.
    return [f"ctid >= '({start},0)'::tid" + (f" AND ctid < '({end},0)'::tid" if end else "")
            for start, end in zip(starts, [*starts[1:], None])]


def _read_in_parallel(dbapi: Any, dsn: str, cursor: Any, queries: list[str]) -> pa.Table:
    """The rows of ``queries``, read over ``cursor``'s connection and up to one more per
    other query, each taking the first one's snapshot. Every connection takes the next
    unread query until none is left: the first starts at once, the others as they connect,
    and those the server refuses (its ``max_connections``, say) leave theirs to the rest."""
    import pyarrow as pa

    cursor.execute("SELECT pg_catalog.pg_export_snapshot()")
    snapshot = cursor.fetchone()[0]
    unread: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
    for index, query in enumerate(queries):
        unread.put((index, query))
    tables: list[pa.Table | None] = [None] * len(queries)

    def read(reader: Any) -> None:
        while True:
            try:
                index, query = unread.get_nowait()
            except queue.Empty:
                return
            reader.execute(query)
            tables[index] = reader.fetch_arrow_table()

    def read_on_a_new_connection() -> None:
        try:
            connection = _connect(dbapi, dsn)
        except ConnectionError:
            return
        with connection, connection.cursor() as other:
            other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            other.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
            read(other)

    with ThreadPoolExecutor(len(queries)) as pool:
        running = [pool.submit(read, cursor), *(pool.submit(read_on_a_new_connection) for _ in queries[1:])]
        for future in running:
            future.result()
    return pa.concat_tables(tables)


def _feature_columns(columns: list[str], features: Sequence[str] | str | None, label: str,
                     table_or_query: str) -> list[str]:
    """The feature columns, checked against the source's ``columns``."""
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        raise ValueError(f"{table_or_query!r} has more than one column named {repeated}; name each once (AS)")
    wanted = [c for c in columns if c != label] if features is None else \
        [features] if isinstance(features, str) else list(features)
    missing = [c for c in [*wanted, label] if c not in columns]
    if missing:
        raise ValueError(f"columns {missing} are not in {table_or_query!r}; its columns are {columns}")
    if not wanted:
        raise ValueError("features=[] must name at least one column")
    if label in wanted:
        raise ValueError(f"label column {label!r} is also among features={wanted}; a model must not see its label")
    if len(set(wanted)) < len(wanted):
        raise ValueError(f"features={wanted} names a column more than once")
    return wanted


def _is_list(kind: pa.DataType) -> bool:
    import pyarrow as pa
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _is_binary(kind: pa.DataType) -> bool:
    import pyarrow as pa
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def _column_array(column: pa.ChunkedArray, name: str, is_array: bool, table_or_query: str) -> np.ndarray:
    """One column as numpy: numbers as they are, arrays (sent by ``array_send``) decoded into
    shape (rows, ...), bytea as bytes."""
    import pyarrow as pa

    if column.null_count:
        raise ValueError(f"column {name!r} of {table_or_query!r} holds {column.null_count} NULLs; every row needs "
                         f"a value (filter them out in a query, or fill them)")
    kind = column.type
    if is_array:
        return _decode_arrays(column.combine_chunks(), name, table_or_query)
    if _is_binary(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return column.to_numpy()
    # The driver hands over types Arrow lacks (numeric, money, ...) as opaque values.
    described = f"PostgreSQL type {kind.type_name}" if hasattr(kind, "type_name") else f"type {kind}"
    raise TypeError(f"column {name!r} of {table_or_query!r} is of {described}; features and label must be "
                    f"numbers (cast NUMERIC to double precision), arrays of numbers, or bytea")


# Element types of numeric arrays (PostgreSQL type OIDs), as sent: big-endian.
_ELEMENTS = {16: np.dtype("?"), 21: np.dtype(">i2"), 23: np.dtype(">i4"), 20: np.dtype(">i8"),
             700: np.dtype(">f4"), 701: np.dtype(">f8")}


def _decode_arrays(sent: pa.Array, name: str, table_or_query: str) -> np.ndarray:
    """Arrays in PostgreSQL's binary format (per row: dimensions, a NULLs flag, the element
    type, each dimension's size and lower bound, then each element's length and value), all
    of one shape and type, as one (rows, ...) array."""
    import pyarrow as pa

    wide = pa.types.is_large_binary(sent.type)
    offsets = np.frombuffer(sent.buffers()[1], dtype=np.int64 if wide else np.int32, count=len(sent) + 1,
                            offset=sent.offset * (8 if wide else 4)).astype(np.int64)
    data = np.frombuffer(sent.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    starts = offsets[:-1] - offsets[0]
    if len(data) < 12 * len(sent) or np.frombuffer(data[:4].tobytes(), dtype=">i4")[0] == 0:
        raise ValueError(f"column {name!r} of {table_or_query!r} holds empty arrays")
    if data[starts[:, None] + np.arange(4, 8)].any():
        raise ValueError(f"column {name!r} of {table_or_query!r} holds NULLs inside its arrays; every element "
                         f"needs a value")
    ndim, _, element = (int(v) for v in np.frombuffer(data[:12].tobytes(), dtype=">i4"))
    if element not in _ELEMENTS:      # before the shapes: text or numeric elements vary in size
        raise TypeError(f"column {name!r} of {table_or_query!r} holds arrays of a type (oid {element}) that is "
                        f"not a number; cast them to real[] or double precision[]")
    head = 12 + 8 * ndim
    sizes = np.diff(offsets)
    rows = data.reshape(len(sent), -1) if (sizes == sizes[0]).all() else None
    if rows is None or not (rows[:, :head] == rows[0, :head]).all():
        raise ValueError(f"column {name!r} of {table_or_query!r} holds arrays of different shapes; every row's "
                         f"array must have the same")
    shape = tuple(int(d) for d in np.frombuffer(rows[0, 12:head].tobytes(), dtype=">i4")[::2])
    dtype = _ELEMENTS[element]
    # Each element is its 4-byte length, then its value: a strided view of the values, read
    # into native byte order in one copy.
    values = np.ndarray((len(sent), int(np.prod(shape))), dtype=dtype, buffer=rows, offset=head + 4,
                        strides=(rows.strides[0], 4 + dtype.itemsize))
    return values.astype(dtype.newbyteorder("=")).reshape(len(sent), *shape)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _without_password(dsn: str) -> str:
    """``dsn`` with its password masked, in the user part or as a ``password=`` parameter."""
    parts = urlsplit(dsn)
    netloc = parts.netloc if parts.password is None else parts.netloc.replace(f":{parts.password}@", ":***@")
    query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)], safe="/*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _first_line(error: Exception) -> str:
    """PostgreSQL's own message where the driver's error carries one, else its first line."""
    text = str(error).strip()
    return text.split("ERROR:", 1)[1].strip().splitlines()[0] if "ERROR:" in text else text.splitlines()[0]
