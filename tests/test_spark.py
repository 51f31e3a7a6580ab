"""The Spark backend: the same model selection in Spark tasks, bit for bit, on local mode and
on a real standalone cluster on 127.0.0.1; clear errors when the cluster is too small."""
from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest
import torch
from _faults import assert_replaced_alone, waiting_for_the_replacement
from _models import build, digits
from _spark import blocked_python, session, standalone_cluster
from test_resume import assert_same_results as assert_same_results_as_uninterrupted
from test_resume import crashed_run, uninterrupted

import cerebro as cb
from cerebro.data._spark_python import ExecutorPythonError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from port_flood import killing_build  # noqa: E402

pytestmark = pytest.mark.slow


def spark_task(worker: int) -> str:
    """What a worker's ``launched_by`` says when it is a fresh Spark job's task."""
    return rf"spark task {worker} of stage \d+, attempt 0"

SPACE = {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.choice([1e-2, 3e-3])}
SEED = 5


def search() -> cb.GridSearch:
    return cb.GridSearch(build, SPACE, epochs=2, metric="val_accuracy", mode="max")


@pytest.fixture(scope="module")
def local_result(tmp_path_factory) -> cb.Result:
    return search().fit(digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1), seed=SEED,
                        store=tmp_path_factory.mktemp("local") / "run", verbose=0)


def assert_same_results(a: cb.Result, b: cb.Result) -> None:
    pd.testing.assert_frame_equal(a.history(), b.history(), check_exact=True)
    for x, y in zip(a.trials, b.trials):
        assert x.config == y.config
        assert all(torch.equal(x.state_dict()[k], v) for k, v in y.state_dict().items())


def assert_ran_in_spark_tasks(result: cb.Result, workers: int) -> None:
    assert sorted(result.workers) == list(range(workers))
    for index, info in result.workers.items():
        assert re.fullmatch(rf"spark task {index} of stage \d+, attempt 0", info["launched_by"])
        assert info["pid"] != os.getpid()
    schedule = result.schedule()
    assert set(schedule.pid) == {info["pid"] for info in result.workers.values()}


def test_local_mode_gives_the_local_backends_results_bit_for_bit(tmp_path, local_result):
    spark = session("local[2]")
    try:
        result = search().fit(digits(partitions=4), backend=cb.SparkBackend(spark, workers=2), seed=SEED,
                              store=f"file://{tmp_path}/run", verbose=0)     # a file:// URL store
        assert result.run_dir == str(tmp_path / "run")
        assert_ran_in_spark_tasks(result, 2)
        assert_same_results(local_result, result)
        assert cb.SparkBackend(spark).workers == 2            # default: every task slot

        # Tasks end by themselves at shutdown, so the next fit reuses their Python processes
        # (torch imported, seconds saved) instead of Spark killing them.
        again = cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
            digits(partitions=2), backend=cb.SparkBackend(spark, workers=2), seed=SEED, store=tmp_path / "again",
            verbose=0)
        assert sorted(w["pid"] for w in again.workers.values()) == sorted(w["pid"] for w in result.workers.values())

        started = time.monotonic()
        with pytest.raises(ValueError, match=re.escape("workers=3 needs 3 task slots but the Spark cluster at "
                                                       "local[2] has 2; use workers <= 2 or add executors")):
            cb.SparkBackend(spark, workers=3, slot_wait=1)
        assert time.monotonic() - started < 10
    finally:
        spark.stop()


def test_speculating_long_tasks_is_refused_as_it_would_end_the_workers():
    from pyspark import SparkConf

    from cerebro.backends._spark import check_no_long_task_speculation
    conf = SparkConf(loadDefaults=False).set("spark.speculation.task.duration.threshold", "10min")
    check_no_long_task_speculation(conf)                                 # speculation is off
    check_no_long_task_speculation(SparkConf(loadDefaults=False).set("spark.speculation", "true"))  # no threshold
    with pytest.raises(ValueError, match=re.escape(
            "spark.speculation.task.duration.threshold=10min with spark.speculation=true copies every task that "
            "runs longer, and a Cerebro worker's task runs for the whole run: the copy would end it. Unset the "
            "threshold or set spark.speculation=false")):
        check_no_long_task_speculation(conf.set("spark.speculation", "True"))


def test_standalone_cluster_gives_the_local_backends_results_bit_for_bit(tmp_path, local_result):
    with standalone_cluster(workers=2, cores=1, log_dir=str(tmp_path)) as master:
        spark = session(master)
        try:
            backend = cb.SparkBackend(spark, workers=2, slot_wait=120)   # executors register slowly under load
            result = search().fit(digits(partitions=4), backend=backend, seed=SEED, store=tmp_path / "run", verbose=0)
            assert_ran_in_spark_tasks(result, 2)
            assert_same_results(local_result, result)
        finally:
            spark.stop()


def test_on_a_cluster_a_killed_task_leaves_the_other_three_workers_training(tmp_path):
    store, marker = str(tmp_path / "run"), str(tmp_path / "killed")
    with standalone_cluster(workers=2, cores=2, log_dir=str(tmp_path)) as master:
        spark = session(master)
        try:
            backend = cb.SparkBackend(spark, workers=4, slot_wait=120)
            # Killed once an epoch is journaled; the others train on, then wait for the replacement
            # (Spark's retry of the killed task is declined: it is a job of its own).
            build_that_kills = killing_build(waiting_for_the_replacement(build, store), store, marker,
                                             after=1)
            result = cb.GridSearch(build_that_kills, SPACE, epochs=3, metric="val_accuracy", mode="max").fit(
                digits(partitions=4), backend=backend, seed=SEED, store=store, verbose=0)
        finally:
            spark.stop()
    assert os.path.exists(marker)
    assert_replaced_alone(list(result.store.events()), result, spark_task)
    expected = cb.GridSearch(build, SPACE, epochs=3, metric="val_accuracy", mode="max").fit(
        digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1), seed=SEED,
        store=tmp_path / "undisturbed", verbose=0)
    assert_same_results(expected, result)


def test_a_trial_that_kills_its_task_three_times_fails_and_only_it(tmp_path):
    spark = session("local[2]")
    try:
        result = cb.GridSearch(build, {"crash": cb.choice([False, True, False])}, epochs=3).fit(
            digits(partitions=2), backend=cb.SparkBackend(spark, workers=2), seed=0, store=tmp_path / "run",
            verbose=0)
    finally:
        spark.stop()
    assert [t.status for t in result.trials] == ["completed", "failed", "completed"]
    error = result.trials[1].error
    assert error.startswith("lost the 3 workers that ran it: worker ")
    assert error.count("while running t0001 train epoch 1") == 3
    names = [e["event"] for e in result.store.events()]
    assert names.count("worker_lost") == 3
    assert result.finished


def test_a_run_killed_on_local_workers_resumes_on_spark_to_the_same_results(tmp_path):
    store = crashed_run(tmp_path, "mid-epoch")       # its driver SIGKILLed in the middle of a sub-epoch
    spark = session("local[2]")
    try:
        resumed = cb.resume(store, backend=cb.SparkBackend(spark, workers=2), verbose=0)
    finally:
        spark.stop()
    assert all(info["launched_by"].startswith("spark task ") for info in resumed.workers.values())
    at = next(e["time"] for e in resumed.store.events() if e["event"] == "run_resumed")
    after = resumed.schedule()[lambda s: s.start >= at]
    assert len(after) > 0 and set(after.pid) == {info["pid"] for info in resumed.workers.values()}
    assert_same_results_as_uninterrupted(resumed, uninterrupted(tmp_path, "mid-epoch"))


def test_a_trials_spark_udf_predicts_on_the_executors_as_the_trial_does(tmp_path, local_result):
    """``TrialResult.spark_udf`` in local mode and on a standalone cluster: every row's outputs
    are the trial's ``predict``, in any partitioning of the DataFrame (bits kept within 1e-6:
    an executor's torch may use other threads); so are ``cb.predict``'s in Spark tasks."""
    features = digits(partitions=4).features[:300]
    expected = local_result.best.predict(features)
    frame = pd.DataFrame({"id": range(len(features)), "features": list(features.astype("float64"))})
    for master in ("local[2]", None):
        with standalone_cluster(workers=2, cores=1, log_dir=str(tmp_path)) if master is None else \
                contextlib.nullcontext(master) as url:
            spark = session(url)
            try:
                udf = local_result.best.spark_udf(spark)
                rows = spark.createDataFrame(frame).repartition(3).withColumn("prediction", udf("features"))
                got = rows.orderBy("id").toPandas()
                batch = cb.predict(local_result, features, backend=cb.SparkBackend(spark, workers=2))
            finally:
                spark.stop()
        assert got["id"].tolist() == list(range(len(features)))
        outputs = np.stack(got["prediction"].to_numpy())
        assert outputs.shape == expected.shape and abs(outputs - expected).max() <= 1e-6
        assert batch.shape == expected.shape and abs(batch.to_numpy() - expected).max() <= 1e-6


def test_cb_predict_on_spark_gives_the_local_answer_in_the_inputs_row_order(tmp_path, local_result):
    """``cb.predict(..., backend="spark")`` on local[2]: numpy rows, a Parquet directory whose
    files Spark would read out of order (it packs the larger first), a Spark DataFrame (a lazy
    Spark DataFrame back) and ``out``: each row's outputs or top-k are the local backend's
    (within 1e-6: other batches), in the input's order, the ids kept; bad input is refused
    before any task runs."""
    from pyspark.sql import DataFrame
    features = digits(partitions=4).features[:300]
    local = cb.predict(local_result, features, workers=2)
    ids = np.arange(1000, 700, -1)
    parts = tmp_path / "rows"
    parts.mkdir()
    frame = pd.DataFrame({"id": ids, "features": list(features.astype("float64"))})
    frame.iloc[:100].to_parquet(parts / "a.parquet")        # the smaller file first by name
    frame.iloc[100:].to_parquet(parts / "b.parquet")
    spark = session("local[2]")
    try:
        got = cb.predict(local_result, features, backend="spark", workers=3)
        assert list(got.columns) == list(local.columns) and len(got) == len(local)
        assert (got - local).abs().to_numpy().max() <= 1e-6
        top = cb.predict(local_result, str(parts), backend=cb.SparkBackend(spark, workers=2), top_k=3)
        expected = cb.predict(local_result, str(parts), workers=2, top_k=3)
        assert top["id"].tolist() == ids.tolist() and list(top.columns) == list(expected.columns)
        assert top.filter(like="class").equals(expected.filter(like="class"))
        assert (top.filter(like="prob") - expected.filter(like="prob")).abs().to_numpy().max() <= 1e-6
        lazy = cb.predict(local_result, spark.createDataFrame(frame), backend="spark")
        assert isinstance(lazy, DataFrame) and lazy.columns == ["id", *local.columns]
        rows = lazy.toPandas().set_index("id").loc[ids]
        assert abs(rows.to_numpy() - local.to_numpy()).max() <= 1e-6
        written = cb.predict(local_result, spark.createDataFrame(frame), backend="spark", out=tmp_path / "o.parquet")
        assert pd.read_parquet(written).set_index("id").loc[ids].equals(rows)
        with pytest.raises(FileExistsError, match="o.parquet' exists; Spark writes a directory"):
            cb.predict(local_result, features, backend="spark", out=tmp_path / "o.parquet")
        with pytest.raises(ValueError, match=r"the features have shape \(300, 10\), rows of \(10,\); the run "
                                             r"trained on rows of \(64,\)"):
            cb.predict(local_result, features[:, :10], backend="spark")
        with pytest.raises(ValueError, match=r"workers=2 with a Spark DataFrame: it is predicted in its own \d+ "
                                             r"partitions, its rows in their order; repartition it first"):
            cb.predict(local_result, spark.createDataFrame(frame), backend="spark", workers=2)
        with pytest.raises(ValueError, match=r"workers=3 differs from the backend's workers=2"):
            cb.predict(local_result, features, backend=cb.SparkBackend(spark, workers=2), workers=3)
    finally:
        spark.stop()
    with pytest.raises(ValueError, match="backend='spark' needs an active SparkSession"):
        cb.predict(local_result, features, backend="spark")


def test_cerebro_predict_on_spark_writes_the_rows_in_order(tmp_path, local_result):
    features = digits(partitions=4).features[:100]
    pd.DataFrame({"id": range(100), "features": list(features)}).to_parquet(tmp_path / "in.parquet")
    done = subprocess.run([sys.executable, "-m", "cerebro", "predict", str(local_result.run_dir),
                           str(tmp_path / "in.parquet"), "-o", str(tmp_path / "out"), "--backend", "spark",
                           "--top-k", "2"], capture_output=True, text=True,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str(tmp_path / "out")
    got = pd.read_parquet(tmp_path / "out")
    assert got["id"].tolist() == list(range(100)) and list(got.columns) == ["id", "class_1", "prob_1",
                                                                         "class_2", "prob_2"]
    assert got["class_1"].tolist() == local_result.best.predict(features).argmax(axis=1).tolist()


def test_a_spark_udf_takes_vector_array_and_numeric_columns_as_cb_predict_does(tmp_path, local_result):
    """``VectorAssembler``'s column (dense and sparse rows), a column
    of sparse vectors, an array column and the 64 numeric columns themselves: every row's
    outputs are ``cb.predict``'s on the same rows, bit for bit. An executor whose Python lacks
    Cerebro's dependencies names that Python, in the UDF's error and in ``cb.predict``'s."""
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import Vectors
    # digits are mostly zeros (VectorAssembler makes them sparse vectors), random rows are not (dense ones)
    features = np.concatenate([digits(partitions=4).features[:30],
                               np.random.default_rng(0).random((30, 64), dtype=np.float32)])
    names = [f"x{i}" for i in range(64)]
    spark = session("local[1]")
    try:
        df = spark.createDataFrame([(i, *map(float, row), Vectors.sparse(64, {j: float(v) for j, v in enumerate(row)
                                                                              if v}))
                                    for i, row in enumerate(features)], ["id", *names, "sparse"])
        df = VectorAssembler(inputCols=names, outputCol="features").transform(df)
        df = df.withColumn("array", vector_to_array("features"))
        assembled = {type(v).__name__ for v in df.select("features").toPandas()["features"]}
        assert assembled == {"DenseVector", "SparseVector"}
        udf = local_result.best.spark_udf(spark)
        got = df.select("id", udf("features").alias("vector"), udf("sparse").alias("sparse"),
                        udf("array").alias("array"), udf(*names).alias("columns")).toPandas().sort_values("id")
        expected = cb.predict(local_result, df.select("id", "features"), backend="spark").toPandas()
        expected = expected.sort_values("id").drop(columns="id").to_numpy()
        for kind in ("vector", "sparse", "array", "columns"):
            assert np.array_equal(np.stack(got[kind].to_numpy()), expected), kind
        assert abs(expected - local_result.best.predict(features)).max() <= 1e-6

        python = blocked_python(tmp_path)
        spark.sparkContext.pythonExec = python
        said = (f"Spark's executors run the Python {python!r} ({sys.executable} on {socket.gethostname()}), which "
                f"cannot import what Cerebro needs (ModuleNotFoundError: No module named 'torch'). Install Cerebro "
                f"with its dependencies into that Python on every node, or point Spark to a Python that has them "
                f"before the session starts: the environment variable PYSPARK_PYTHON=/path/to/python (or "
                f"spark-submit --conf spark.pyspark.python=/path/to/python). The driver runs {sys.executable!r}.")
        with pytest.raises(Exception, match=re.escape(f"ModuleNotFoundError: {said}")):
            df.select(local_result.best.spark_udf(spark)("features")).collect()
        with pytest.raises(ExecutorPythonError) as raised:
            cb.predict(local_result, features, backend="spark")
        assert str(raised.value) == said and raised.value.__cause__ is None
    finally:
        spark.stop()



def test_a_fresh_script_without_pyspark_python_predicts_on_a_local_master(tmp_path, local_result):
    """No PYSPARK_PYTHON and a python3 on the PATH without Cerebro, as in a fresh script:
    ``spark_udf`` and ``cb.predict(..., backend="spark")`` run the executors on the driver's
    interpreter (a local master), before a SparkBackend was made and after."""
    rows = digits(partitions=4).features[:20]
    np.save(tmp_path / "rows.npy", rows)
    (tmp_path / "script.py").write_text(textwrap.dedent(f"""
        import numpy as np
        from pyspark.sql import SparkSession
        import cerebro as cb

        rows, result = np.load("rows.npy"), cb.load({str(local_result.run_dir)!r})

        def session():
            return SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()

        def predicted(spark, name):
            df = spark.createDataFrame([(i, row.tolist()) for i, row in enumerate(rows)], ["id", "features"])
            got = df.select("id", result.best.spark_udf(spark)("features").alias("p")).toPandas().sort_values("id")
            np.save(name + "-udf.npy", np.stack(got["p"].to_numpy()))
            np.save(name + "-predict.npy", cb.predict(result, rows, backend="spark").to_numpy())

        spark = session()
        predicted(spark, "before")
        cb.SparkBackend(spark, workers=1)
        predicted(spark, "after")
    """))
    env = {key: value for key, value in os.environ.items() if key != "PYSPARK_PYTHON"}
    env["PATH"] = os.pathsep.join(p for p in ("/usr/bin", "/bin") if os.path.isdir(p))
    ran = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    expected = local_result.best.predict(rows)
    for name in ("before", "after"):
        for way in ("udf", "predict"):
            assert abs(np.load(tmp_path / f"{name}-{way}.npy") - expected).max() <= 1e-6, (name, way)
