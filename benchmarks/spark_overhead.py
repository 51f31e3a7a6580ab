"""Spark backend overhead: the same model selection on local worker processes and on Spark.

For one workload (8 equal trials of an MLP on generated data, 2 workers, 4 partitions),
runs the local backend and ``SparkBackend`` on ``local[2]`` alternately, and reports:

- time per epoch after start-up (schedule span / epochs), and the ratio Spark / local
  (target <= 1.10);
- start-up: the SparkSession itself, and each fit's time outside its schedule (workers
  starting, partitions written and loaded).

Usage::

    .venv/bin/python benchmarks/spark_overhead.py [--repeats 3] [--out benchmarks/results/spark_overhead.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import cerebro as cb  # noqa: E402

WORKERS, PARTITIONS, EPOCHS, TRIALS = 2, 4, 5, 8


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


def one_fit(backend: cb.Backend, store: str) -> dict[str, float]:
    search = cb.GridSearch(build, {"trial": cb.choice(list(range(TRIALS)))}, epochs=EPOCHS, metric="val_accuracy",
                           mode="max")
    started = time.perf_counter()
    result = search.fit(data(), backend=backend, store=store, seed=0, verbose=0)
    wall = time.perf_counter() - started
    schedule = result.schedule()
    span = float(schedule.end.max() - schedule.start.min())
    return {"wall_s": wall, "epoch_s": span / EPOCHS, "outside_schedule_s": wall - span,
            "history": result.history().to_json()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/spark_overhead.json")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    started = time.perf_counter()
    spark = (SparkSession.builder.master(f"local[{WORKERS}]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - started
    runs: dict[str, list[dict[str, float]]] = {"local": [], "spark": []}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            order = ("local", "spark") if repeat % 2 == 0 else ("spark", "local")   # alternate who goes first
            for name in order:
                backend = (cb.LocalBackend(WORKERS, threads_per_worker=1) if name == "local"
                           else cb.SparkBackend(spark, workers=WORKERS))
                runs[name].append(one_fit(backend, os.path.join(scratch, f"{name}{repeat}")))
    spark.stop()

    identical = len({r.pop("history") for r in runs["local"] + runs["spark"]}) == 1
    median = {name: {key: statistics.median(r[key] for r in rs) for key in ("wall_s", "epoch_s", "outside_schedule_s")}
              for name, rs in runs.items()}
    ratio = median["spark"]["epoch_s"] / median["local"]["epoch_s"]
    report = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()},
        "workload": {"workers": WORKERS, "partitions": PARTITIONS, "epochs": EPOCHS, "trials": TRIALS,
                     "rows": 16384, "model": "MLP 64-256-10, Adam, batch 64"},
        "spark_session_s": session_s, "runs": runs, "median": median,
        "epoch_time_ratio_spark_over_local": ratio, "target_ratio": 1.10, "met": ratio <= 1.10,
        "identical_histories": identical,
    }
    print(f"{'':28}{'local':>10}{'spark':>10}")
    for key, label in (("epoch_s", "time per epoch, s"), ("outside_schedule_s", "start-up per fit, s"),
                       ("wall_s", "fit wall, s")):
        print(f"{label:28}{median['local'][key]:10.3f}{median['spark'][key]:10.3f}")
    print(f"epoch time ratio spark/local: {ratio:.3f} (target <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'})")
    print(f"SparkSession start: {session_s:.1f} s; identical histories on both backends: {identical}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
