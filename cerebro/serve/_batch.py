"""``cb.predict``: batch inference with a run's trial over workers, the reverse of MOP: the
rows are split once into one contiguous share per worker and stay there, the model (build,
config and weights) goes to every worker once, and each worker predicts its share in batches.
The outputs come back in the input's row order."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

from ..backends import Backend, SparkBackend
from ..data import FeatureSpec, prediction_rows
from ..report import Result, TrialResult, load
from ..worker import predict_rows
from ..worker._serve import write_share
from ._outputs import output_frame, top_k_classes
from ._spark import spark_predict


def predict(run_or_result: str | os.PathLike | Result, data: Any, *, trial: str = "best",
            epoch: int | str = "best", workers: int | None = None, backend: str | Backend = "local",
            top_k: int | None = None, out: str | os.PathLike | None = None,
            batch_size: int | None = None, trust: bool = False) -> Any:
    """Apply a trial of a run to ``data`` (a numpy array, a pandas DataFrame with the
    training's feature columns, a Parquet path or a :class:`cerebro.Dataset`; on Spark also a
    Spark DataFrame) over ``workers`` processes (default: as many as the run had, at most the
    CPUs) or, with ``backend="spark"`` (the active SparkSession) or a
    :class:`cerebro.SparkBackend`, in Spark tasks (:mod:`cerebro.serve._spark`).

    Returns a DataFrame, one row per input row in order: the input's ``id`` column where it
    has one, then the model's outputs (``output_0``, ``output_1``, ...), or with ``top_k``
    the k likeliest classes (``class_1, prob_1, ...``; a row of outputs that is not
    probabilities already, non-negative summing to 1, is taken as logits and softmaxed). With
    ``out``, writes that table as Parquet there and returns the path (on Spark: a directory of
    Parquet files, which ``pandas.read_parquet`` reads in order). A Spark DataFrame gives a
    Spark DataFrame: the same columns, its rows in its order, computed when an action runs.
    ``trial`` is ``"best"`` (by its best epoch) or a trial id; ``epoch`` as
    :meth:`TrialResult.state_dict`. The model is rebuilt with the run's ``build``: code, so a
    run directory that a run of yours did not write is refused unless ``trust=True`` (see
    :mod:`cerebro.store._trust`).

    Example (a fragment: it needs a finished run):
        >>> cb.predict("runs/exp1", X_test, workers=2, top_k=3)      # or: cerebro predict RUN IN.parquet -o OUT
    """
    spark, workers = _spark_of(backend, workers)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers={workers!r} must be a positive integer")
    if spark is not None and out is not None and os.path.exists(out):
        raise FileExistsError(f"out={str(out)!r} exists; Spark writes a directory of Parquet files there: "
                              f"remove it or choose another path")
    result = run_or_result if isinstance(run_or_result, Result) else load(run_or_result, trust=trust)
    chosen = _trial(result, trial)
    if result.provided_build is None:
        result.store.read_build()          # its signature checked (no code run) before any work
    spec = FeatureSpec.of_run(result.store.read_run_info()["data"])
    if spark is not None:
        return _on_spark(spark, chosen, epoch, data, spec, workers, top_k, out, batch_size)
    features, ids = prediction_rows(data, spec)
    count = min(workers or result.store.read_run_info().get("workers", 1), os.cpu_count() or 1, len(features))
    outputs = _over_workers(result, chosen, epoch, features, count, batch_size)
    table = top_k_classes(outputs, top_k) if top_k is not None else output_frame(outputs)
    if ids is not None:
        table.insert(0, "id", ids)
    if out is None:
        return table
    table.to_parquet(out, index=False)
    return str(out)


def _spark_of(backend: str | Backend, workers: int | None) -> tuple[Any, int | None]:
    """(the SparkSession to predict in, or None for local processes; the workers)."""
    if isinstance(backend, SparkBackend):
        if workers is not None and workers != backend.workers:
            raise ValueError(f"workers={workers!r} differs from the backend's workers={backend.workers}; "
                             f"give the number of workers to the backend only")
        return backend.spark, backend.workers
    if backend == "local":
        return None, workers
    if backend == "spark":
        from pyspark.sql import SparkSession
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ValueError("backend='spark' needs an active SparkSession: create one with "
                             "SparkSession.builder...getOrCreate(), or pass backend=cb.SparkBackend(spark)")
        return spark, workers
    raise ValueError(f"backend={backend!r} must be 'local', 'spark' or a cb.SparkBackend")


def _on_spark(spark: Any, trial: TrialResult, epoch: int | str, data: Any, spec: FeatureSpec,
              workers: int | None, top_k: int | None, out: str | os.PathLike | None, batch_size: int | None) -> Any:
    answer, order = spark_predict(spark, trial, epoch, data, spec, workers=workers, top_k=top_k,
                                  batch_size=batch_size)
    if order:
        answer = answer.orderBy(*order).drop(*order)
    if out is not None:
        answer.write.parquet(os.fspath(out))
        return str(out)
    return answer if not order else answer.toPandas()


def _trial(result: Result, trial: str) -> TrialResult:
    if trial == "best":
        return result.best
    found = {t.trial_id: t for t in result.trials}
    if trial not in found:
        raise ValueError(f"trial={trial!r} is not a trial of {result.run_dir!r}; its trials are {sorted(found)}")
    return found[trial]


def _over_workers(result: Result, trial: TrialResult, epoch: int | str, features: np.ndarray, count: int,
                  batch_size: int | None) -> np.ndarray:
    """The outputs for ``features``: in this process for one worker, else one contiguous share
    per worker process (:mod:`cerebro.worker._serve`), each of which builds the model once."""
    if count <= 1:
        return predict_rows(trial.trainable(epoch), features, batch_size)
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="cerebro-predict-") as job_dir:
        with open(os.path.join(job_dir, "build.pkl"), "wb") as f:
            f.write(result.store.read_build())
        save_file({k: v.contiguous() for k, v in trial.state_dict(epoch).items()},
                  os.path.join(job_dir, "weights.safetensors"))
        with open(os.path.join(job_dir, "job.json"), "w") as f:
            json.dump({"config": trial.config, "batch_size": batch_size,
                       "threads": max(1, (os.cpu_count() or 1) // count)}, f)
        # The batch size alone is needed here: the build, without reading the weights again.
        size = batch_size or result.build(trial.config).batch_size
        for index, share in enumerate(_shares(features, count, size)):
            write_share(job_dir, index, share)
        workers = [subprocess.Popen([sys.executable, "-m", "cerebro.worker._serve", job_dir, str(index)],
                                    stderr=subprocess.PIPE, text=True) for index in range(count)]
        failed = [(index, worker.communicate()[1]) for index, worker in enumerate(workers)]
        failed = [(index, err) for (index, err), worker in zip(failed, workers) if worker.returncode != 0]
        if failed:
            index, err = failed[0]
            last = err.strip().splitlines()[-1] if err.strip() else f"exit status {workers[index].returncode}"
            raise RuntimeError(f"prediction worker {index} failed: {last}\n{err}")
        return np.concatenate([np.load(os.path.join(job_dir, f"outputs-{i}.npy"), allow_pickle=False)
                               for i in range(count)])


def _shares(features: np.ndarray, count: int, batch_size: int) -> list[np.ndarray]:
    """``count`` contiguous shares of the rows, cut at multiples of ``batch_size``: each
    worker's batches are the ones a single process makes, so the outputs are its bits."""
    batches = -(-len(features) // batch_size)
    cuts = [min(len(features), batch_size * int(b)) for b in np.linspace(0, batches, count + 1)[1:-1].round()]
    return np.split(features, cuts)
