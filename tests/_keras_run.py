"""A driver of Keras runs in a process of its own (the Keras backend is fixed per process):
``KERAS_BACKEND=jax python tests/_keras_run.py STORE WORKERS...`` prints, per worker count,
a JSON line with the backend, the trials' statuses, a digest of their weights and histories."""
from __future__ import annotations

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
from _keras_models import build  # noqa: E402
from _models import digits  # noqa: E402

import cerebro as cb  # noqa: E402


def main(store: str, worker_counts: list[int]) -> None:
    search = cb.GridSearch(build, {"architecture": cb.choice(["mlp", "cnn"])}, epochs=2)
    for workers in worker_counts:
        result = search.fit(digits(partitions=4, rows=400), workers=workers, store=f"{store}/{workers}", seed=7,
                            verbose=0)
        weights = hashlib.sha256(b"".join(tensor.numpy().tobytes() for trial in result.trials
                                          for tensor in trial.state_dict().values())).hexdigest()
        print(json.dumps({"backend": keras.backend.backend(), "workers": workers,
                          "statuses": [trial.status.value for trial in result.trials],
                          "errors": [trial.error for trial in result.trials if trial.error],
                          "weights": weights, "history": result.history().to_json()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(w) for w in sys.argv[2:]])
