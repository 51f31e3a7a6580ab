"""Batch inference throughput: ``cb.predict`` on 1 and 2 workers against a plain torch loop
over the same rows (eval mode, no_grad, the same batch size, one thread per process).

A run of one MLP (64-``--hidden``-``--hidden``-10) trained one epoch on the digits gives the
trial; ``--rows`` random rows of 64 features are predicted ``--repeats`` times each way, the
median wall time kept. Rows per second per worker against the loop's is the ratio the issue
asks to be at least 0.9. ``cb.predict`` with 2 workers includes starting its 2 processes
(importing torch, building the model): that is what a user waits for.

    .venv/bin/python benchmarks/predict.py          # ~3 min on 2 cores
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from sklearn.datasets import load_digits

import cerebro as cb

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 1024


def build(config: dict) -> cb.TorchTrainable:
    hidden = config["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                             torch.nn.functional.cross_entropy, batch_size=BATCH)


def plain_loop(model: torch.nn.Module, rows: np.ndarray) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return np.concatenate([model(torch.from_numpy(rows[i:i + BATCH])).numpy()
                               for i in range(0, len(rows), BATCH)])


def median_seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "predict.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)             # as each worker process: one thread on each of the 2 CPUs
    features, label = load_digits(return_X_y=True)
    data = cb.Dataset.from_numpy((features / 16).astype(np.float32), label, partitions=2, seed=0)
    with tempfile.TemporaryDirectory() as scratch:
        result = cb.GridSearch(build, {"hidden": cb.choice([args.hidden])}, epochs=1).fit(
            data, workers=2, store=os.path.join(scratch, "run"), seed=0, verbose=0)
        rows = np.random.default_rng(0).random((args.rows, 64), dtype=np.float32)
        model = result.best.model()
        loop = median_seconds(lambda: plain_loop(model, rows), args.repeats)
        one = median_seconds(lambda: cb.predict(result, rows, workers=1), args.repeats)
        two = median_seconds(lambda: cb.predict(result, rows, workers=2), args.repeats)
    table = [("plain torch loop, 1 process", 1, loop), ("cb.predict, 1 worker", 1, one),
             ("cb.predict, 2 workers", 2, two)]
    print(f"{'':30} {'rows/s':>10} {'rows/s per worker':>18} {'vs loop per worker':>19}")
    for name, workers, seconds in table:
        rate = args.rows / seconds
        print(f"{name:30} {rate:10,.0f} {rate / workers:18,.0f} {loop / seconds / workers:19.2f}")
    numbers = {"rows": args.rows, "hidden": args.hidden, "batch": BATCH, "repeats": args.repeats,
               "seconds": {"loop": loop, "predict_1": one, "predict_2": two},
               "per_worker_vs_loop": {"predict_1": loop / one, "predict_2": loop / two / 2},
               "cpus": os.cpu_count(), "python": sys.version.split()[0], "torch": torch.__version__}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(numbers, f, indent=1)


if __name__ == "__main__":
    main()
