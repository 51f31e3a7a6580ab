"""What a SQL function's read of a table costs the session's backend in memory.

A throwaway PostgreSQL server (as in the tests) gets Cerebro's functions and, for each
``--rows``, a table of that many rows of 64 ``real`` columns; ``cerebro.predict`` reads it
(through SPI, as the calling role) with a one-layer model. A thread samples the backend's
RSS every 20 ms; the table prints the peak above the backend's RSS before the call, per byte
of the table, and writes the numbers to ``--out``.

    .venv/bin/python benchmarks/sql_memory.py              # ~2 min
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import _sql as setup  # noqa: E402
import psutil  # noqa: E402
from _postgres import plpython_installed, postgres_server, server_binaries  # noqa: E402

from cerebro.sql._keras_model import flat_weights  # noqa: E402

COLUMNS = 64


def model_table(uri: str) -> None:
    keras = setup.keras
    model = keras.Sequential([keras.Input((COLUMNS,)), keras.layers.Dense(2)])
    weights = flat_weights({f"{i:04d}": w for i, w in enumerate(model.get_weights())}).hex()
    setup.sql(uri, "DROP TABLE IF EXISTS model",
              "CREATE TABLE model (mst_key integer, model_arch json, compile_params varchar, model_weights bytea)",
              f"INSERT INTO model VALUES (1, '{model.to_json()}', $$loss='mse', optimizer='SGD'$$, "
              f"'\\x{weights}'::bytea)")


def peak_above_start(uri: str, rows: int) -> tuple[int, int, float]:
    """(table bytes, backend's peak RSS above its RSS before the call, seconds)."""
    columns = ", ".join(f"random()::real AS c{i}" for i in range(COLUMNS))
    setup.sql(uri, "DROP TABLE IF EXISTS wide, wide_out",
              f"CREATE TABLE wide AS SELECT i AS id, {columns} FROM generate_series(1, {rows}) AS i")
    size = setup.sql(uri, "SELECT pg_total_relation_size('wide')")[0][0]
    features = ",".join(f"c{i}" for i in range(COLUMNS))
    with setup.dbapi.connect(uri, autocommit=True) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = psutil.Process(cursor.fetchone()[0])
        start, peak, done = backend.memory_info().rss, [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], backend.memory_info().rss)
                time.sleep(0.02)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        began = time.perf_counter()
        cursor.execute(f"SELECT cerebro.predict('model', 'wide', 'id', '{features}', 'wide_out')")
        cursor.fetchall()
        seconds = time.perf_counter() - began
        done.set()
        sampler.join()
    return size, peak[0] - start, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 300_000])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "sql_memory.json"))
    args = parser.parse_args()
    binaries = server_binaries()
    if binaries is None or not plpython_installed(binaries):
        sys.exit("PostgreSQL 15 with PL/Python is needed: apt-get install postgresql-15 postgresql-plpython3-15")
    results = []
    with postgres_server(binaries) as uri:
        setup.prepare(uri)
        model_table(uri)
        for rows in args.rows:
            size, grown, seconds = peak_above_start(uri, rows)
            results.append({"rows": rows, "table_bytes": size, "backend_peak_growth_bytes": grown, "seconds": seconds})
    print(f"{'rows':>9} {'table MiB':>10} {'backend peak +MiB':>18} {'per table byte':>15} {'call s':>7}")
    for r in results:
        print(f"{r['rows']:>9} {r['table_bytes'] / 2**20:>10.0f} {r['backend_peak_growth_bytes'] / 2**20:>18.0f} "
              f"{r['backend_peak_growth_bytes'] / r['table_bytes']:>15.1f} {r['seconds']:>7.1f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
