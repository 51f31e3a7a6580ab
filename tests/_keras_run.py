"""A driver of Keras runs in a process of its own (the Keras backend is fixed per process).

``KERAS_BACKEND=jax python tests/_keras_run.py STORE WORKERS...`` fits the grid once per worker
count and prints, per count, a JSON line with the backend, the trials' statuses, a digest of
their weights and histories. ``--epochs N`` and ``--rows N`` set the epochs (default 2) and the
digits used (default 400); ``--resume`` resumes the run in STORE instead (after its driver was
killed)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
from _keras_models import build  # noqa: E402
from _models import digits  # noqa: E402

import cerebro as cb  # noqa: E402


def search(epochs: int) -> cb.GridSearch:
    return cb.GridSearch(build, {"architecture": cb.choice(["mlp", "cnn"])}, epochs=epochs)


def summary(result: cb.Result, workers: int) -> str:
    weights = hashlib.sha256(b"".join(tensor.numpy().tobytes() for trial in result.trials
                                      for tensor in trial.state_dict().values())).hexdigest()
    return json.dumps({"backend": keras.backend.backend(), "workers": workers,
                       "statuses": [trial.status.value for trial in result.trials],
                       "errors": [trial.error for trial in result.trials if trial.error],
                       "weights": weights, "history": result.history().to_json()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("workers", type=int, nargs="*")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    if args.resume:
        cb.resume(args.store, backend=cb.LocalBackend(2, threads_per_worker=1), verbose=0)
        return
    for workers in args.workers:
        store = os.path.join(args.store, str(workers))
        result = search(args.epochs).fit(digits(partitions=4, rows=args.rows), store=store, seed=7, verbose=0,
                                         backend=cb.LocalBackend(workers, threads_per_worker=1))
        print(summary(result, workers), flush=True)


if __name__ == "__main__":
    main()
