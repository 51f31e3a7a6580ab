"""Partitions written by a cluster's workers: ``Dataset.from_ray`` and ``Dataset.from_dask``
against ``Dataset.from_pandas`` (the rows in the driver's memory), same rows.

For N rows of 64 float32 features and an integer label, times making the dataset (for Ray
and Dask: a pass over every block on the workers, checking and counting) and writing its
partitions into a run's data folder (Ray and Dask: keying every row, the engine's shuffle
by (split, partition), each group written by the worker it lands on), each ``--repeats``
times, and reports the medians and rows per second. Ray runs in-process (``ray.init`` of 2
CPUs), Dask as a ``LocalCluster`` of 2 worker processes; their start is not timed. Checks
that Ray and Dask wrote the same partition files (their fingerprints).

Usage::

    .venv/bin/python benchmarks/cluster_data.py [--rows 200000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from _report import provenance, write_json

import cerebro as cb

PARTITIONS = 4


def frame(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    table = pd.DataFrame(rng.normal(size=(rows, 64)).astype(np.float32), columns=[f"x{i}" for i in range(64)])
    table["y"] = rng.integers(0, 10, rows)
    return table


def timed(make: Callable[[], cb.Dataset], scratch: str) -> dict[str, Any]:
    started = time.perf_counter()
    data = make()
    made = time.perf_counter() - started
    started = time.perf_counter()
    data.write(tempfile.mkdtemp(dir=scratch), PARTITIONS)
    return {"make_s": made, "write_s": time.perf_counter() - started, "fingerprint": data.fingerprint()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/cluster_data.json")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import distributed
    import ray
    import ray.data
    from dask import dataframe as dd

    table, features = frame(args.rows), [f"x{i}" for i in range(64)]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None)
    client = distributed.Client(cluster)
    makers = {
        "from_pandas": lambda: cb.Dataset.from_pandas(table, features=features, label="y", seed=0),
        "from_ray": lambda: cb.Dataset.from_ray(ray.data.from_pandas(np.array_split(table, 8)), features=features,
                                                label="y", seed=0),
        "from_dask": lambda: cb.Dataset.from_dask(dd.from_pandas(table, npartitions=8), features=features,
                                                  label="y", seed=0),
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in makers}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            names = list(makers)[repeat % 3:] + list(makers)[:repeat % 3]      # rotate who goes first
            for name in names:
                runs[name].append(timed(makers[name], scratch))
    client.close()
    cluster.close()
    ray.shutdown()
    same = len({r["fingerprint"] for name in ("from_ray", "from_dask") for r in runs[name]}) == 1
    median = {name: {key: statistics.median(r[key] for r in rs) for key in ("make_s", "write_s")}
              for name, rs in runs.items()}
    for numbers in median.values():
        numbers["rows_per_s"] = args.rows / (numbers["make_s"] + numbers["write_s"])
    report = {**provenance(),
              "rows": args.rows, "features": 64, "partitions": PARTITIONS, "runs": runs, "median": median,
              "ray_and_dask_wrote_the_same_partitions": same}
    print(f"{args.rows} rows x 64 float32, {PARTITIONS} partitions; medians of {args.repeats}")
    print(f"{'':14}{'make, s':>10}{'write, s':>10}{'rows/s':>12}")
    for name, numbers in median.items():
        print(f"{name:14}{numbers['make_s']:10.2f}{numbers['write_s']:10.2f}{numbers['rows_per_s']:12.0f}")
    print(f"Ray and Dask wrote the same partition files: {same}")
    write_json(report, args.out)


if __name__ == "__main__":
    main()
