"""``Dataset.from_sql``: rows of a real PostgreSQL table or query, read through ADBC, in an
order fixed by their content, equal to ``from_pandas`` on the same rows; bad input refused
naming the problem."""
from __future__ import annotations

import itertools
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from _models import build
from sklearn.datasets import load_digits

import cerebro as cb

dbapi = pytest.importorskip("adbc_driver_postgresql.dbapi")


def load(uri: str, name: str, columns: str, data: dict[str, pa.Array]) -> None:
    """Create table ``name`` with ``columns`` (SQL) and append ``data``."""
    with dbapi.connect(uri) as connection, connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {name}")
        cursor.execute(f"CREATE TABLE {name} ({columns})")
        cursor.adbc_ingest(name, pa.table(data), mode="append")
        connection.commit()


@pytest.fixture(scope="module")
def digits_tables(postgres):
    """The digits as ``digits`` (pixels real[], digit integer, in the original order),
    ``shuffled`` (the same rows in another order) and ``wide`` (one real column a pixel)."""
    features, label = load_digits(return_X_y=True)
    features = (features / 16.0).astype(np.float32)[:600]
    label = label[:600].astype(np.int32)
    order = np.random.default_rng(1).permutation(len(label))
    for name, rows in (("digits", np.arange(len(label))), ("shuffled", order)):
        load(postgres, name, "id serial, pixels real[], digit integer",
             {"pixels": pa.array(list(features[rows]), type=pa.list_(pa.float32())), "digit": pa.array(label[rows])})
    wide = {f"p{i}": pa.array(features[order, i]) for i in range(64)}
    load(postgres, "wide", ", ".join(f"p{i} real" for i in range(64)) + ", digit integer",
         {**wide, "digit": pa.array(label[order])})
    return features, label


def test_one_hot_label_arrays_are_read_as_rows_of_the_label(postgres, digits_tables):
    features, label = digits_tables
    one_hot = np.eye(10, dtype=np.int16)[label]
    load(postgres, "one_hot", "pixels real[], digit smallint[]",
         {"pixels": pa.array(list(features), type=pa.list_(pa.float32())),
          "digit": pa.array(list(one_hot), type=pa.list_(pa.int16()))})
    data = cb.Dataset.from_sql(postgres, "one_hot", features=["pixels"], label="digit", validation=None)
    plain = cb.Dataset.from_numpy(*cb.data.in_content_order(features, one_hot), validation=None)
    assert data.label.shape == (600, 10) and np.array_equal(data.label, plain.label)
    assert np.array_equal(data.features, plain.features)


def test_rows_come_in_one_order_whatever_order_the_table_holds_them_in(postgres, digits_tables):
    features, label = digits_tables
    a = cb.Dataset.from_sql(postgres, "digits", features=["pixels"], label="digit", seed=3)
    b = cb.Dataset.from_sql(postgres, "public.shuffled", features=["pixels"], label="digit", seed=3)
    wide = cb.Dataset.from_sql(postgres, "wide", features=[f"p{i}" for i in range(64)], label="digit", seed=3)
    for other in (b, wide):
        assert np.array_equal(a.features, other.features) and np.array_equal(a.label, other.label)
        assert a.fingerprint() == other.fingerprint()
    assert a.features.dtype == np.float32 and a.label.dtype == np.int64
    # The same rows as the source, as a multiset: sorted alike, they are equal.
    as_read = np.column_stack([a.label, a.features])
    given = np.column_stack([label, features])
    assert np.array_equal(as_read[np.lexsort(as_read.T[::-1])], given[np.lexsort(given.T[::-1])])


def test_a_query_is_read_like_a_table(postgres, digits_tables):
    _, label = digits_tables
    small = cb.Dataset.from_sql(postgres, "SELECT pixels, digit FROM shuffled WHERE digit < 5", label="digit",
                                validation=None)
    assert small.num_train_rows == int((label < 5).sum())
    assert set(small.label.tolist()) == {0, 1, 2, 3, 4}


def test_a_large_table_is_read_over_several_connections_in_one_snapshot(postgres, digits_tables, monkeypatch):
    from cerebro.data import _sql

    features, label = digits_tables
    load(postgres, "growing", "pixels real[], digit integer",
         {"pixels": pa.array(list(features), type=pa.list_(pa.float32())), "digit": pa.array(label)})
    alone = cb.Dataset.from_sql(postgres, "growing", features=["pixels"], label="digit", seed=3)
    monkeypatch.setattr(_sql, "PAGES_PER_CONNECTION", 4)      # the table has about 23 pages
    connections = []
    calls = itertools.count(1)     # next() on it is atomic: the connections are made in threads
    committed = threading.Event()
    connect = _sql._connect

    def connect_after_a_commit(dbapi, dsn):
        number = next(calls)
        connections.append(number)
        if number == 2:        # the first extra connection: after the snapshot was taken
            with dbapi.connect(dsn) as other, other.cursor() as cursor:
                cursor.execute("INSERT INTO growing SELECT pixels, 10 FROM growing LIMIT 1")   # a new last page
                other.commit()
            committed.set()
        elif number > 2:
            committed.wait()
        return connect(dbapi, dsn)

    monkeypatch.setattr(_sql, "_connect", connect_after_a_commit)
    together = cb.Dataset.from_sql(postgres, "growing", features=["pixels"], label="digit", seed=3)
    assert len(connections) == _sql.MAX_CONNECTIONS == 4
    # The row committed during the read is not in it: every connection read the first one's snapshot.
    assert np.array_equal(together.features, alone.features) and np.array_equal(together.label, alone.label)
    after = cb.Dataset.from_sql(postgres, "growing", features=["pixels"], label="digit", validation=None)
    assert after.num_train_rows == len(label) + 1 and 10 in after.label


def test_a_large_table_is_read_over_the_connections_the_server_grants(postgres, digits_tables, monkeypatch):
    from cerebro.data import _sql

    features, label = digits_tables
    load(postgres, "crowded", "pixels real[], digit integer",
         {"pixels": pa.array(list(features), type=pa.list_(pa.float32())), "digit": pa.array(label)})
    alone = cb.Dataset.from_sql(postgres, "crowded", features=["pixels"], label="digit", seed=3)
    monkeypatch.setattr(_sql, "PAGES_PER_CONNECTION", 4)
    calls = itertools.count(1)
    connect = _sql._connect

    def one_more_only(dbapi, dsn):      # as a server at max_connections would
        if next(calls) > 2:
            raise ConnectionError("could not connect: FATAL: sorry, too many clients already")
        return connect(dbapi, dsn)

    monkeypatch.setattr(_sql, "_connect", one_more_only)
    crowded = cb.Dataset.from_sql(postgres, "crowded", features=["pixels"], label="digit", seed=3)
    assert next(calls) == 5           # the first connection, then three tried at once: one granted
    assert np.array_equal(crowded.features, alone.features) and np.array_equal(crowded.label, alone.label)


def test_n_d_integer_and_bytea_columns_keep_their_shape_and_dtype(postgres):
    with dbapi.connect(postgres) as connection, connection.cursor() as cursor:
        cursor.execute("CREATE TABLE images (pixels smallint[][], png bytea, weight double precision, y real)")
        cursor.execute("INSERT INTO images VALUES ('{{1,2,3},{4,5,6}}', '\\x89504e47', 0.5, 1.5), "
                       "('{{7,8,9},{10,11,12}}', '\\x0001', 2.0, -1)")
        connection.commit()
    images = cb.Dataset.from_sql(postgres, "images", features=["pixels"], label="y", validation=None)
    assert images.features.dtype == np.int16 and images.label.dtype == np.float32
    assert images.features[np.argsort(images.label)].tolist() == [[[7, 8, 9], [10, 11, 12]], [[1, 2, 3], [4, 5, 6]]]
    flat = cb.Dataset.from_sql(postgres, "images", features=["weight", "pixels"], label="y", validation=None)
    assert flat.features[np.argsort(flat.label)].tolist() == [[2, 7, 8, 9, 10, 11, 12], [0.5, 1, 2, 3, 4, 5, 6]]
    encoded = cb.Dataset.from_sql(postgres, "images", features=["png"], label="y", validation=None)
    assert sorted(encoded.features.tolist()) == [b"\x00\x01", b"\x89PNG"]


@pytest.mark.slow
def test_a_run_from_sql_equals_the_same_rows_from_pandas_bitwise(postgres, digits_tables, tmp_path):
    search = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-3])}, epochs=2)
    features, label = digits_tables
    from_sql = cb.Dataset.from_sql(postgres, "shuffled", features=["pixels"], label="digit", partitions=4, seed=0)
    # The source's own rows (not what from_sql made of them), in the order from_sql put them in.
    index = {(row.tobytes(), int(y)): i for i, (row, y) in enumerate(zip(features, label))}
    order = [index[row.tobytes(), int(y)] for row, y in zip(from_sql.features, from_sql.label)]
    frame = pd.DataFrame({"pixels": list(features[order].astype(np.float64)), "digit": label[order]})
    from_pandas = cb.Dataset.from_pandas(frame, features=["pixels"], label="digit", partitions=4, seed=0)
    one = search.fit(from_sql, workers=2, store=tmp_path / "sql", seed=1, verbose=0)
    two = search.fit(from_pandas, workers=2, store=tmp_path / "pandas", seed=1, verbose=0)
    pd.testing.assert_frame_equal(one.history(), two.history(), check_exact=True)
    for a, b in zip(one.trials, two.trials, strict=True):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


@pytest.fixture(scope="module")
def holes(postgres):
    """A table with a NULL row, a NULL inside an array, ragged arrays and non-numeric columns."""
    with dbapi.connect(postgres) as connection, connection.cursor() as cursor:
        cursor.execute("CREATE TABLE holes (x real[], y integer, price numeric, gap real[], ragged real[], "
                       "words text[], blob bytea)")
        cursor.execute("INSERT INTO holes VALUES ('{1.0}', 0, 1.5, '{1,2}', '{1}', '{a}', '\\x01'), "
                       "(NULL, 1, 2.5, '{1,NULL}', '{1}', '{bb}', '\\x02'), "
                       "('{2.0}', 0, 3, '{3,4}', '{1,2}', '{c}', '\\x03')")
        connection.commit()


@pytest.mark.parametrize("source, columns, error, message", [
    ("nope", {"label": "digit"}, ValueError, r"^cannot read 'nope': relation \"nope\" does not exist$"),
    ("digits", {"features": ["pixel"], "label": "label"}, ValueError,
     r"^columns \['pixel', 'label'\] are not in 'digits'; its columns are \['id', 'pixels', 'digit'\]$"),
    ("holes", {"features": ["x"], "label": "y"}, ValueError,
     r"^column 'x' of 'holes' holds 1 NULLs; every row needs a value"),
    ("holes", {"features": ["gap"], "label": "y"}, ValueError,
     r"^column 'gap' of 'holes' holds NULLs inside its arrays; every element needs a value$"),
    ("holes", {"features": ["ragged"], "label": "y"}, ValueError,
     r"^column 'ragged' of 'holes' holds arrays of different shapes"),
    ("holes", {"features": ["price"], "label": "y"}, TypeError,
     r"^column 'price' of 'holes' is of PostgreSQL type numeric; features and label must be numbers \(cast NUMERIC "
     r"to double precision\)"),
    ("holes", {"features": ["words"], "label": "y"}, TypeError,
     r"^column 'words' of 'holes' holds arrays of a type \(oid 25\) that is not a number; cast them to real\[\] or "
     r"double precision\[\]$"),
    ("holes", {"features": ["price"], "label": "blob"}, TypeError,
     r"^label column 'blob' of 'holes' is bytea; a label must be numbers"),
    ("SELECT pixels, digit FROM digits WHERE false", {"label": "digit"}, ValueError,
     r"^'SELECT pixels, digit FROM digits WHERE false' has no rows; a dataset needs at least one$"),
    ("SELECT digit, digit FROM digits", {"label": "digit"}, ValueError,
     r"^'SELECT digit, digit FROM digits' has more than one column named \['digit'\]; name each once \(AS\)$"),
    ("digits; DROP TABLE digits", {"label": "digit"}, ValueError,
     r"^table_or_query='digits; DROP TABLE digits' must be a table name"),
], ids=["no table", "no columns", "NULL", "NULL element", "ragged", "numeric", "text[]", "bytea label", "no rows",
        "a column twice", "not a name or query"])
def test_bad_sources_and_columns_are_refused_naming_them(postgres, digits_tables, holes, source, columns, error,
                                                         message):
    with pytest.raises(error, match=message):
        cb.Dataset.from_sql(postgres, source, **columns)


def test_a_bad_dsn_or_a_failed_connection_never_shows_the_password():
    with pytest.raises(ValueError, match=r"^dsn must be a PostgreSQL URI such as") as refused:
        cb.Dataset.from_sql("postgres ql://cerebro:secret@host/db", "digits", label="digit")
    assert "secret" not in str(refused.value)
    for dsn in ("postgresql://cerebro:secret@127.0.0.1:1/x", "postgresql://cerebro@127.0.0.1:1/x?password=secret"):
        with pytest.raises(ConnectionError, match=r"^could not connect to postgresql://cerebro(:\*\*\*)?@127.0.0.1:1/x"
                                                  r"(\?password=\*\*\*)?: ") as refused:
            cb.Dataset.from_sql(dsn, "digits", label="digit")
        assert "secret" not in str(refused.value)


def test_names_fold_to_lower_case_and_a_query_may_end_in_a_comment(postgres, digits_tables):
    upper = cb.Dataset.from_sql(postgres, "Public.Digits", features=["pixels"], label="digit", validation=None)
    commented = cb.Dataset.from_sql(postgres, "SELECT pixels, digit FROM digits -- every row", label="digit",
                                    validation=None)
    assert upper.num_train_rows == commented.num_train_rows == len(digits_tables[1])
