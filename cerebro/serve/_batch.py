"""``cb.predict``: batch inference with a run's trial over workers, the reverse of MOP: the
model goes to every worker once and the rows are cut once; on local processes
(:mod:`._local`) or in Spark tasks (:mod:`._spark`). The outputs come back in the input's
row order."""
from __future__ import annotations

import os
from typing import Any

from .._extras import require
from ..backends import Backend, SparkBackend
from ..data import FeatureSpec, prediction_rows
from ..data._spark_python import explained
from ..results import Result, TrialResult, load
from ..store import _files as files
from ..worker._trainable import positive_batch_size
from ._local import predict_over_workers
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
        >>> cb.predict("runs/exp1", X_test, workers=2, top_k=3)  # doctest: +SKIP

        or, from a shell: ``cerebro predict RUN IN.parquet -o OUT``.
    """
    spark, workers = _spark_of(backend, workers)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers={workers!r} must be a positive integer")
    if batch_size is not None:       # else 0 (falsy) would quietly mean the trainable's own
        positive_batch_size(batch_size)
    if spark is not None and out is not None and os.path.exists(out):
        raise FileExistsError(f"out={str(out)!r} exists; Spark writes a directory of Parquet files there: "
                              f"remove it or choose another path")
    if spark is None and out is not None:
        files.check_output(out, "out")
    if not isinstance(run_or_result, Result):
        files.check_location("run_or_result", run_or_result)
    result = run_or_result if isinstance(run_or_result, Result) else load(run_or_result, trust=trust)
    chosen = _trial(result, trial)
    if result.provided_build is None:
        result.store.read_build()          # its signature checked (no code run) before any work
    info = result.store.read_run_info()      # read once: the features' layout and the run's workers
    spec = FeatureSpec.of_run(info["data"])
    if spark is not None:
        return _on_spark(spark, chosen, epoch, data, spec, workers, top_k, out, batch_size)
    features, ids = prediction_rows(data, spec)
    count = max(1, min(workers or info.get("workers", 1), os.cpu_count() or 1, len(features)))    # 0 rows: 1
    outputs = predict_over_workers(result, chosen, epoch, features, count, batch_size)
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
        require("cb.predict(..., backend='spark')", "pyspark")
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
    try:
        if out is not None:
            answer.write.parquet(os.fspath(out))
            return str(out)
        return answer if not order else answer.toPandas()
    except Exception as error:   # an executor's Python without Cerebro: one message naming it
        raise explained(error, spark.sparkContext) from None


def _trial(result: Result, trial: str) -> TrialResult:
    if trial == "best":
        return result.best
    found = {t.trial_id: t for t in result.trials}
    if trial not in found:
        raise ValueError(f"trial={trial!r} is not a trial of {result.run_dir!r}; its trials are {sorted(found)}")
    return found[trial]
