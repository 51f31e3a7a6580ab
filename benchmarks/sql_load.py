"""Loading a PostgreSQL table: ``cb.Dataset.from_sql`` against pandas' ``read_sql``.

A throwaway PostgreSQL server (``initdb`` in a temporary directory, as in the tests) gets a
table of ``--rows`` rows: ``--features`` float features in a ``real[]`` column and an integer
label. Then, alternated, ``--repeats`` times each:

- ``from_sql``: ``cb.Dataset.from_sql(uri, table, features=["x"], label="y")``: ADBC's driver
  (binary COPY into Arrow), the arrays, the content order and the seeded split;
- ``read_sql``: ``pandas.read_sql(query, engine)`` through SQLAlchemy and psycopg 3 (what a
  pandas user writes), the DataFrame only;
- ``read_sql + from_pandas``: that DataFrame made into a Dataset, the same work as from_sql.

A first round, not counted, warms up imports and the server's cache.

It prints rows per second (medians) and the ratio from_sql / read_sql (target >= 5), checks
that both paths hold the same rows, and writes the numbers to ``--out``.

    .venv/bin/python benchmarks/sql_load.py                      # 100,000 rows, ~1 min
    .venv/bin/python benchmarks/sql_load.py --rows 20000 --repeats 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import pyarrow as pa

import cerebro as cb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _postgres import postgres_server, server_binaries  # noqa: E402


def fill(uri: str, rows: int, features: int) -> None:
    from adbc_driver_postgresql import dbapi

    rng = np.random.default_rng(0)
    x = rng.random((rows, features), dtype=np.float32)
    y = rng.integers(0, 10, rows).astype(np.int32)
    values = pa.array(x.ravel())
    column = pa.ListArray.from_arrays(pa.array(np.arange(0, rows * features + 1, features, dtype=np.int32)), values)
    with dbapi.connect(uri) as connection, connection.cursor() as cursor:
        cursor.execute("CREATE TABLE samples (x real[], y integer)")
        cursor.adbc_ingest("samples", pa.table({"x": column, "y": pa.array(y)}), mode="append")
        connection.commit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "sql_load.json"))
    args = parser.parse_args(argv)
    binaries = server_binaries()
    if binaries is None:
        print("PostgreSQL's server is not installed (apt-get install postgresql-15)", file=sys.stderr)
        return 2
    import pandas as pd
    import sqlalchemy

    with postgres_server(binaries) as uri:
        fill(uri, args.rows, args.features)
        host = uri.split("host=")[1].split("&")[0]
        user = uri.split("user=")[1].split("&")[0]
        engine = sqlalchemy.create_engine(f"postgresql+psycopg://{user}@/postgres?host={host}")
        results: dict[str, list[float]] = {"from_sql": [], "read_sql": [], "read_sql + from_pandas": []}
        for repeat in range(-1, args.repeats):        # -1: a warm-up (imports, the server's cache), not counted
            order = list(results) if repeat % 2 == 0 else list(reversed(results))
            for name in order:
                started = time.perf_counter()
                if name == "from_sql":
                    via_sql = cb.Dataset.from_sql(uri, "samples", features=["x"], label="y")
                else:
                    frame = pd.read_sql("SELECT x, y FROM samples", engine)
                    if name != "read_sql":
                        via_pandas = cb.Dataset.from_pandas(frame, features=["x"], label="y")
                if repeat >= 0:
                    results[name].append(time.perf_counter() - started)
        engine.dispose()
    same_rows = sorted(map(bytes, np.column_stack([via_sql.label, via_sql.features.view(np.int32)]))) == \
        sorted(map(bytes, np.column_stack([via_pandas.label, via_pandas.features.view(np.int32)])))
    medians = {name: statistics.median(times) for name, times in results.items()}
    rates = {name: args.rows / seconds for name, seconds in medians.items()}
    ratio = medians["read_sql"] / medians["from_sql"]
    print(f"{args.rows:,} rows x {args.features} features (real[]) + a label, median of {args.repeats}:")
    print(f"| {'load':<24} | {'seconds':>8} | {'rows/s':>10} |")
    print(f"|{'-' * 26}|{'-' * 10}|{'-' * 12}|")
    for name in results:
        print(f"| {name:<24} | {medians[name]:>8.3f} | {rates[name]:>10,.0f} |")
    print(f"from_sql / read_sql rows/s: {ratio:.1f}x (target >= 5); the same rows both ways: {same_rows}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([sys.executable, *sys.argv]), "rows": args.rows, "features": args.features,
                   "seconds": results, "median_seconds": medians, "rows_per_second": rates,
                   "ratio_vs_read_sql": ratio, "same_rows": same_rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0 if same_rows else 1


if __name__ == "__main__":
    sys.exit(main())
