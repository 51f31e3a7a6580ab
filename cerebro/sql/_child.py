"""``python -m cerebro.sql._child JOB_DIR PARENT_PID``: what a SQL function's session hands
to a child process (see :mod:`._job`): training a model selection, or predicting with a
trained model. It reads ``job.json`` and ``.npy`` arrays (never pickles) from ``JOB_DIR``,
writes its files and ``answer.json`` there, and ends with the session's backend.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from ..backends import LocalBackend
from ..data import ArrayDataset, Dataset
from ..engine import resume
from ..results import Result
from ..search import Hyperband, Searcher, TPESearch, choice
from ._grid import ConfigGrid
from ._job import POLL_SECONDS, STOP_SECONDS
from ._keras_model import GridBuild, ModelSpec, SelectionBuild, keras_architecture, keras_model, load_flat_weights
from ._output import RunDescription, hyperband_rounds, output_rows
from ._selection import SelectionSearch

_PREDICT_BATCH = 1024


def main(job_dir: str, parent: int) -> int:
    _end_with(parent)
    with open(os.path.join(job_dir, "job.json")) as f:
        job = json.load(f)
    try:
        answer: dict[str, Any] = {"result": JOBS[job["kind"]](job_dir, job)}
    except Exception as error:      # handed to the session, which raises it as the SQL error
        answer = {"error": {"type": type(error).__name__, "message": str(error)}}
    written = os.path.join(job_dir, "answer.json.part")
    with open(written, "w") as f:
        json.dump(answer, f)
    os.replace(written, os.path.join(job_dir, "answer.json"))     # whole or absent
    return 0 if "result" in answer else 1


def _end_with(parent: int) -> None:
    """When the session's backend ends, however it ends (a terminate, a shutdown, a crash),
    stop as a cancel does: SIGTERM to this process (the driver stops its workers and leaves
    the run resumable), then SIGKILL to its whole process group, workers too, if that takes
    longer than :data:`._job.STOP_SECONDS`. A thread watches for it, since a process is told
    of its parent's end by nothing else it could rely on."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_SECONDS)
        os.killpg(0, signal.SIGKILL)     # this process leads its group: the session started it so
    threading.Thread(target=watch, name="cerebro-parent-watch", daemon=True).start()


def _weights(job_dir: str, name: str, present: bool) -> bytes | None:
    return _read_weights(job_dir, name) if present else None


def _read_weights(job_dir: str, name: str) -> bytes:
    with open(os.path.join(job_dir, f"{name}.weights"), "rb") as f:
        return f.read()


def _data(job_dir: str, run: RunDescription) -> ArrayDataset:
    """The rows the session read, as ``Dataset.from_sql`` would have made them."""
    def array(name: str) -> np.ndarray:
        return np.load(os.path.join(job_dir, f"{name}.npy"), allow_pickle=False)
    validation = None
    if os.path.exists(os.path.join(job_dir, "validation_features.npy")):
        validation = Dataset.from_numpy(array("validation_features"), array("validation_label"), validation=None,
                                        seed=run.seed)
    return ArrayDataset.from_numpy(array("train_features"), array("train_label"), validation=validation,
                                   partitions=run.workers, seed=run.seed)


def train(job_dir: str, job: dict[str, Any]) -> dict[str, Any]:
    """Fit the job's search, or resume its interrupted run; the output tables' rows."""
    run = RunDescription(**job["run"])
    backend = LocalBackend(workers=run.workers)
    if "KERAS_BACKEND" in os.environ:    # the session's: its fork server imports while this reads and builds
        backend.expect_keras(os.environ["KERAS_BACKEND"])
    if job["use_gpus"]:
        import torch
        if not torch.cuda.is_available():
            raise ValueError("use_gpus is true, but the server sees no GPU; call with use_gpus => false")
    data = _data(job_dir, run)
    one_hot = data.label.ndim > 1
    metric = "val_loss" if data.has_validation else "train_loss"
    if "models" in job:
        models = {int(key): ModelSpec(m, arch, c, f, _weights(job_dir, f"model-{key}", has))
                  for key, (m, arch, c, f, has) in job["models"].items()}
        build: Any = SelectionBuild(models, one_hot)
        space: dict[str, Any] = {"mst_key": choice(sorted(models))}

        def searcher(space: dict[str, Any]) -> Searcher:
            return SelectionSearch(build, space, epochs=run.num_iterations, metric=metric, mode="min")
    else:
        architectures = {int(m): (arch, _weights(job_dir, f"arch-{m}", has))
                         for m, (arch, has) in job["architectures"].items()}
        build = GridBuild(architectures, ConfigGrid(*job["grid"]), one_hot)
        space = dict(build.grid.space)
        searcher = _automl_searcher(build, run, job["params"], metric)
    result, resumed = _fit_or_resume(searcher, space, job["digest"], data, run, backend)
    by_trial = {t.trial_id: build.spec(t.config) for t in result.trials}
    rounds = None
    if run.method == "hyperband":
        brackets = Hyperband(build, space, max_epochs=run.num_iterations, eta=job["params"].get("eta", 3)).brackets()
        rounds = hyperband_rounds([(b.s, b.rung_epochs, b.keep[0]) for b in brackets], result)
    rows = output_rows(result, by_trial, run, job_dir, rounds)
    rows["selection"] = [[s.model_id, s.compile_params, s.fit_params] for s in by_trial.values()]
    return {**rows, "resumed": resumed}


def _automl_searcher(build: GridBuild, run: RunDescription, params: dict[str, Any], metric: str) -> Any:
    if run.method == "hyperband":
        return lambda space: Hyperband(build, space, max_epochs=run.num_iterations, eta=params.get("eta", 3),
                                       metric=metric)
    return lambda space: TPESearch(build, space, num_trials=params.get("num_configs", 20),
                                   epochs=run.num_iterations, metric=metric)


def _fit_or_resume(searcher: Any, space: dict[str, Any], digest: str, data: Dataset,
                   run: RunDescription, backend: LocalBackend) -> tuple[Result, bool]:
    """The finished, resumed or new run in ``run.store``. The space carries the call's digest
    as a constant: a run directory is resumed only by the call that made it. Where the store
    is named by that digest, a directory left by a call interrupted before its run began is
    removed and the run started clean."""
    settings = os.path.join(run.store, "run.json")
    if os.path.exists(settings):
        with open(settings) as f:
            made_by = str(json.load(f).get("searcher", {}).get("space", {}).get("call"))
        if digest not in made_by:
            raise ValueError(f"the run directory {run.store!r} holds another run; SET cerebro.store to a new "
                             f"directory or remove it")
        # The store is the DBA's, named by the call's digest: the run this child's call made.
        return resume(run.store, backend=backend, verbose=0, trust=True), True
    if os.path.basename(run.store) == digest[:12]:
        shutil.rmtree(run.store, ignore_errors=True)
    result = searcher({**space, "call": digest}).fit(data, backend=backend, store=run.store, seed=run.seed,
                                                    verbose=0, tensorboard=False)
    return result, False


def predict(job_dir: str, job: dict[str, Any]) -> dict[str, Any]:
    """The model's outputs for the rows in ``inputs.npy``, written to ``outputs.npy``."""
    model = keras_architecture(job["model_arch"])
    load_flat_weights(model, _read_weights(job_dir, "model"))
    inputs = np.load(os.path.join(job_dir, "inputs.npy"), allow_pickle=False)
    outputs = np.concatenate([np.asarray(model.predict_on_batch(inputs[i:i + _PREDICT_BATCH]))
                              for i in range(0, len(inputs), _PREDICT_BATCH)]).reshape(len(inputs), -1)
    np.save(os.path.join(job_dir, "outputs.npy"), outputs, allow_pickle=False)
    return {"rows": len(outputs)}


def evaluate(job_dir: str, job: dict[str, Any]) -> dict[str, Any]:
    """The model's loss and first metric over the rows in ``inputs.npy`` and ``labels.npy``."""
    labels = np.load(os.path.join(job_dir, "labels.npy"), allow_pickle=False)
    model = keras_model(job["model_arch"], job["compile_params"], one_hot=labels.ndim > 1)
    load_flat_weights(model, _read_weights(job_dir, "model"))
    inputs = np.load(os.path.join(job_dir, "inputs.npy"), allow_pickle=False)
    logs = model.evaluate(inputs, labels, batch_size=_PREDICT_BATCH, verbose=0, return_dict=True)
    metrics = [float(value) for name, value in logs.items() if name != "loss"]
    return {"loss": float(logs["loss"]), "metric": metrics[0] if metrics else None}


JOBS = {"fit": train, "predict": predict, "evaluate": evaluate}

if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
