"""``cerebro run`` of one small experiment file, on the local backend and on a cluster's, for
the backends' cluster tests (Ray, Dask): the same grid must give the same bits."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pandas as pd

import cerebro as cb

EXPERIMENT = '''
import torch
from sklearn.datasets import load_digits
import cerebro as cb

X, y = load_digits(return_X_y=True)
data = cb.Dataset.from_numpy(X[:400].astype("float32") / 16, y[:400], partitions=4, validation=0.2, seed=0)


def build(config):
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=32)


search = cb.GridSearch(build, {"lr": cb.choice([0.1, 0.01])}, epochs=2)
'''


def run_on(tmp_path: Path, backend: str, cluster: Callable[[], AbstractContextManager[dict[str, str]]]
           ) -> dict[str, dict]:
    """``cerebro run`` of :data:`EXPERIMENT` with 2 workers locally, then with ``--backend
    backend`` in the environment ``cluster()`` yields; checks both give the same history, bit
    for bit, and returns the cluster run's workers as its ``run_started`` line gives them."""
    (tmp_path / "experiment.py").write_text(EXPERIMENT)
    cli = [os.path.join(os.path.dirname(sys.executable), "cerebro"), "run", "experiment.py", "--workers", "2",
           "--seed", "1", "--quiet"]
    local = subprocess.run([*cli, "--store", "local"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr
    with cluster() as env:
        ran = subprocess.run([*cli, "--backend", backend, "--store", backend], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    expected, result = cb.load(tmp_path / "local"), cb.load(tmp_path / backend)
    pd.testing.assert_frame_equal(result.history(), expected.history(), check_exact=True)
    with open(tmp_path / backend / "journal.jsonl") as f:
        return next(e for e in map(json.loads, f) if e["event"] == "run_started")["workers"]
