"""Backend overhead: the same model selection on local worker processes, Spark, Ray and Dask.

For one workload (8 equal trials of an MLP on generated data, 2 workers, 4 partitions),
runs each backend in turn, the order rotated every repeat, and reports per backend:

- start-up: the cluster or session itself (SparkSession on ``local[2]``, an in-process
  ``ray.init``, a Dask ``LocalCluster`` of two processes), started once; and each fit's time
  outside its schedule (workers starting, partitions written and loaded);
- utilization after start-up: the workers' busy time over workers x the schedule's span
  (target: within 0.03 of local on every backend);
- time per epoch (span / epochs) and the ratio to local;
- hop time: the median of a sub-epoch's time outside its compute (fetching and loading the
  state, packing and answering).

Every backend must give the same history, bit for bit (checked).

Usage::

    .venv/bin/python benchmarks/backend_overhead.py [--repeats 3] [--backends local spark ray dask]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _report import provenance, write_json  # noqa: E402

import cerebro as cb  # noqa: E402

WORKERS, PARTITIONS, EPOCHS, TRIALS = 2, 4, 5, 8
KEYS = (("utilization", "utilization after start-up"), ("epoch_s", "time per epoch, s"),
        ("hop_ms", "hop (sub-epoch - compute), ms"), ("outside_schedule_s", "start-up per fit, s"),
        ("wall_s", "fit wall, s"))


def build(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                             torch.nn.functional.cross_entropy, batch_size=64,
                             metrics={"accuracy": cb.metrics.accuracy})


def data() -> cb.Dataset:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(16384, 64)).astype(np.float32)
    return cb.Dataset.from_numpy(features, (features[:, :10].argmax(1)), validation=0.2,
                                 partitions=PARTITIONS, seed=0)


def one_fit(backend: cb.Backend, store: str) -> dict[str, Any]:
    search = cb.GridSearch(build, {"trial": cb.choice(list(range(TRIALS)))}, epochs=EPOCHS, metric="val_accuracy",
                           mode="max")
    started = time.perf_counter()
    result = search.fit(data(), backend=backend, store=store, seed=0, verbose=0)
    wall = time.perf_counter() - started
    schedule = result.schedule()
    span = float(schedule.end.max() - schedule.start.min())
    busy = float((schedule.end - schedule.start).sum())
    return {"wall_s": wall, "epoch_s": span / EPOCHS, "outside_schedule_s": wall - span,
            "utilization": busy / (WORKERS * span),
            "hop_ms": 1000 * float((schedule.end - schedule.start - schedule.compute).median()),
            "history": result.history().to_json()}


def clusters(names: list[str]) -> tuple[dict[str, Callable[[], cb.Backend]], dict[str, float], list[Callable]]:
    """Each backend's maker, the seconds its cluster or session took to start, and what stops them."""
    makers: dict[str, Callable[[], cb.Backend]] = {"local": lambda: cb.LocalBackend(WORKERS, threads_per_worker=1)}
    started_s, stops = {"local": 0.0}, []
    if "spark" in names:
        from pyspark.sql import SparkSession
        began = time.perf_counter()
        spark = (SparkSession.builder.master(f"local[{WORKERS}]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        started_s["spark"], makers["spark"] = time.perf_counter() - began, lambda: cb.SparkBackend(spark, WORKERS)
        stops.append(spark.stop)
    if "ray" in names:
        import ray
        began = time.perf_counter()
        ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
        started_s["ray"], makers["ray"] = time.perf_counter() - began, lambda: cb.RayBackend(WORKERS)
        stops.append(ray.shutdown)
    if "dask" in names:
        import distributed
        began = time.perf_counter()
        cluster = distributed.LocalCluster(n_workers=WORKERS, threads_per_worker=1, host="127.0.0.1",
                                           dashboard_address=None)
        client = distributed.Client(cluster)
        started_s["dask"], makers["dask"] = time.perf_counter() - began, lambda: cb.DaskBackend(client, WORKERS)
        stops += [client.close, cluster.close]
    return {n: makers[n] for n in names}, started_s, stops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["local", "spark", "ray", "dask"],
                        choices=["local", "spark", "ray", "dask"])
    parser.add_argument("--out", default="benchmarks/results/backend_overhead.json")
    args = parser.parse_args()
    names = ["local", *(n for n in args.backends if n != "local")]
    makers, started_s, stops = clusters(names)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:   # rotate who goes first
                runs[name].append(one_fit(makers[name](), os.path.join(scratch, f"{name}{repeat}")))
    for stop in stops:
        stop()
    identical = len({r.pop("history") for rs in runs.values() for r in rs}) == 1
    median = {name: {key: statistics.median(r[key] for r in rs) for key, _ in KEYS} for name, rs in runs.items()}
    gap = {name: median["local"]["utilization"] - m["utilization"] for name, m in median.items()}
    report = {
        **provenance(), "torch": torch.__version__,
        "workload": {"workers": WORKERS, "partitions": PARTITIONS, "epochs": EPOCHS, "trials": TRIALS,
                     "rows": 16384, "model": "MLP 64-256-10, Adam, batch 64"},
        "cluster_start_s": started_s, "runs": runs, "median": median,
        "utilization_below_local": gap, "target": 0.03, "met": all(g <= 0.03 for g in gap.values()),
        "identical_histories": identical,
    }
    print(f"{'':34}" + "".join(f"{name:>10}" for name in names))
    for key, label in KEYS:
        print(f"{label:34}" + "".join(f"{median[name][key]:10.3f}" for name in names))
    print(f"{'cluster or session start, s':34}" + "".join(f"{started_s[name]:10.1f}" for name in names))
    print(f"{'utilization below local':34}" + "".join(f"{gap[name]:10.3f}" for name in names))
    print(f"target: within 0.03 of local on every backend: {'met' if report['met'] else 'NOT met'}; "
          f"identical histories on every backend: {identical}")
    write_json(report, args.out)


if __name__ == "__main__":
    main()
