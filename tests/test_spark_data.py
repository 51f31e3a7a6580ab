"""``Dataset.from_spark``: every feature-column form, its errors, and partitions written by
Spark that either backend trains on."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from _models import build, digit_images, image_build, png_digits
from _spark import blocked_python, session
from pyspark.sql import functions as F

import cerebro as cb
from cerebro.data import read_layout, read_partition
from cerebro.data._spark_python import ExecutorPythonError

pytestmark = pytest.mark.slow

ROWS = 200
RNG = np.random.default_rng(0)
X = RNG.random((ROWS, 64)).astype(np.float32)
Y = RNG.integers(0, 10, ROWS)


@pytest.fixture(scope="module")
def spark():
    spark = session("local[2]")
    yield spark
    spark.stop()


@pytest.fixture(scope="module")
def frame(spark):
    from pyspark.ml.linalg import Vectors
    pdf = pd.DataFrame({"array": list(X), "label": Y, "is_val": np.arange(ROWS) % 5 == 0})
    df = spark.createDataFrame(pdf.assign(array=pdf.array.map(lambda a: a.tolist())))
    vectors = spark.createDataFrame([(Vectors.dense(x.tolist()), int(y)) for x, y in zip(X, Y)], ["vector", "label"])
    return df, vectors


def rows_written(data: cb.Dataset, path) -> tuple[np.ndarray, np.ndarray, dict]:
    layout = data.write(str(path), 3)
    parts = [read_partition(str(path), split, p) for split in ("train", "val") for p in range(3)]
    return np.concatenate([f for f, _ in parts]), np.concatenate([y for _, y in parts]), layout.rows


def same_rows(features: np.ndarray, label: np.ndarray) -> bool:
    key = lambda f, y: sorted(map(tuple, np.column_stack([f, y]).tolist()))  # noqa: E731
    return key(features, label) == key(X, Y)


def test_array_vector_and_column_list_forms_write_every_row_once(frame, tmp_path):
    df, vectors = frame
    columns = df.select(*[df.array[i].alias(f"f{i}") for i in range(64)], "label")
    fingerprints = set()
    for name, data in [("array", cb.Dataset.from_spark(df, features="array", label="label", seed=1)),
                       ("vector", cb.Dataset.from_spark(vectors, features="vector", label="label", seed=1)),
                       ("columns", cb.Dataset.from_spark(columns, features=[f"f{i}" for i in range(64)],
                                                          label="label", seed=1))]:
        features, label, rows = rows_written(data, tmp_path / name)
        assert same_rows(features, label), name
        assert label.dtype == np.int64 and features.dtype == np.float32
        assert sum(rows["train"]) + sum(rows["val"]) == ROWS and 20 <= sum(rows["val"]) <= 60
        fingerprints.add(data.fingerprint())
    assert len(fingerprints) == 1   # the three forms place the same rows in the same partitions


def test_a_validation_column_marks_the_validation_rows(frame, tmp_path):
    df, _ = frame
    data = cb.Dataset.from_spark(df, features="array", label="label", validation="is_val", seed=0)
    assert repr(data) == (f"SparkDataset({ROWS - ROWS // 5} training rows, {ROWS // 5} validation rows, "
                          f"partitions=one per worker, features: float32 from ['array'], label: int64 class indices, "
                          f"in_memory='auto', seed=0)")
    layout = data.write(str(tmp_path), 2)
    assert sum(layout.rows["val"]) == ROWS // 5 and read_layout(str(tmp_path)).rows == layout.rows
    for split in ("train", "val"):          # the executors' files, each with its size and CRC-32
        for partition in range(2):
            with open(tmp_path / split / f"part-{partition:05d}.parquet", "rb") as f:
                content = f.read()
            assert read_layout(str(tmp_path)).file_check(split, partition) == (len(content), zlib.crc32(content))


def test_partitions_do_not_depend_on_the_dataframes_partitioning(frame, tmp_path):
    df, _ = frame
    one = cb.Dataset.from_spark(df.coalesce(1), features="array", label="label", seed=3)
    many = cb.Dataset.from_spark(df.repartition(7), features="array", label="label", seed=3)
    one.write(str(tmp_path / "one"), 3)
    many.write(str(tmp_path / "many"), 3)
    assert one.fingerprint() == many.fingerprint()
    for p in range(3):
        for split in ("train", "val"):
            a, b = read_partition(str(tmp_path / "one"), split, p), read_partition(str(tmp_path / "many"), split, p)
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_errors_name_the_column(spark, frame):
    df, _ = frame
    cases = [
        (dict(features="nope", label="label"), ValueError, "column 'nope' is not in the DataFrame; columns are "
                                                           "['array', 'label', 'is_val']"),
        (dict(features="array", label="missing"), ValueError, "column 'missing' is not in the DataFrame"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            cb.Dataset.from_spark(df, **kwargs)
    text = spark.createDataFrame([([1.0, 2.0], "a")], ["f", "y"])
    indexed = ("label column 'y' must be numeric; it is string: encode the classes as indices first, e.g. "
               "pyspark.ml.feature.StringIndexer(inputCol='y', outputCol='label_index')")
    with pytest.raises(TypeError, match=re.escape(indexed)):
        cb.Dataset.from_spark(text, features="f", label="y")
    nulls = spark.createDataFrame([([1.0, None], 1), ([1.0, 2.0], 0)], "f array<double>, y int")
    with pytest.raises(ValueError, match=re.escape("feature column 'f': 1 rows hold nulls")):
        cb.Dataset.from_spark(nulls, features="f", label="y")
    ragged = spark.createDataFrame([([1.0, 2.0], 1), ([1.0], 0)], "f array<double>, y int")
    with pytest.raises(ValueError, match=re.escape("feature column 'f' holds arrays of different lengths (1 to 2); "
                                                   "every row needs the same length")):
        cb.Dataset.from_spark(ragged, features="f", label="y")
    nan_label = spark.createDataFrame([([1.0], float("nan")), ([2.0], 0.5)], "f array<double>, y double")
    with pytest.raises(ValueError, match=re.escape("label column 'y': 1 rows hold NaN or infinite values")):
        cb.Dataset.from_spark(nan_label, features="f", label="y")
    with pytest.raises(TypeError, match=re.escape("feature column 'y' must be an array of numbers (of any depth), "
                                                  "a pyspark.ml Vector or binary; it is int")):
        cb.Dataset.from_spark(ragged, features="y", label="y")


def test_spark_ml_double_labels_are_refused_before_any_work_with_the_cast_to_make(spark, tmp_path):
    """StringIndexer gives double labels; a classification loss is refused at fit's preflight
    (which reads a few rows with one small job), before any partition is written."""
    from pyspark.ml.feature import StringIndexer
    named = spark.createDataFrame([(x.tolist(), f"digit {y}") for x, y in zip(X, Y)], ["features", "name"])
    indexed = StringIndexer(inputCol="name", outputCol="label").fit(named).transform(named)
    data = cb.Dataset.from_spark(indexed, features="features", label="label", partitions=2)
    features, label = data.sample(3)
    assert features.shape == (3, 64) and features.dtype == np.float32 and label.dtype == np.float32
    search = cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1)
    with pytest.raises(ValueError, match=re.escape("df.withColumn('label', df['label'].cast('int'))")):
        search.fit(data, workers=2, store=tmp_path / "run", verbose=0)
    assert not (tmp_path / "run" / "data").exists()
    cast = cb.Dataset.from_spark(indexed.withColumn("label", F.col("label").cast("int")), features="features",
                                 label="label", partitions=2)
    assert cast.sample(3)[1].dtype == np.int64


def test_executors_whose_python_cannot_import_cerebro_get_one_message_naming_it(spark, frame, tmp_path,
                                                                                 monkeypatch):
    """A Python on the executors without Cerebro's dependencies: one error naming it and the fix."""
    python = blocked_python(tmp_path)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python)
    data = cb.Dataset.from_spark(frame[0], features="array", label="label")
    with pytest.raises(ExecutorPythonError) as raised:
        data.write(str(tmp_path / "data"), 2)
    assert str(raised.value).startswith(f"Spark's executors run the Python {str(python)!r}, which cannot import "
                                        f"what Cerebro needs (ModuleNotFoundError: No module named 'torch'). ")
    assert "PYSPARK_PYTHON=/path/to/python" in str(raised.value) and raised.value.__cause__ is None


def test_a_local_master_runs_the_executors_on_the_drivers_python_unless_told_otherwise(tmp_path):
    """No PYSPARK_PYTHON, and a python3 on the PATH without pyspark or Cerebro: from_spark on a
    local master still writes its partitions, as the executors run the driver's interpreter."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import numpy as np
        from pyspark.sql import SparkSession
        import cerebro as cb
        spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
        df = spark.createDataFrame([([float(i), 1.0], i % 2) for i in range(20)], ["f", "y"])
        layout = cb.Dataset.from_spark(df, features="f", label="y").write({str(tmp_path / "data")!r}, 2)
        print(spark.sparkContext.pythonExec == sys.executable, sum(layout.rows["train"]) + sum(layout.rows["val"]))
    """))
    env = {key: value for key, value in os.environ.items() if key != "PYSPARK_PYTHON"}
    env["PATH"] = os.pathsep.join(p for p in ("/usr/bin", "/bin") if os.path.isdir(p))
    completed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split() == ["True", "20"]


def test_spark_written_partitions_train_identically_on_both_backends(spark, frame, tmp_path):
    df, _ = frame
    data = cb.Dataset.from_spark(df, features="array", label="label", partitions=2, seed=0)
    search = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-3])}, epochs=2)
    on_spark = search.fit(data, backend=cb.SparkBackend(spark, workers=2), seed=1, store=tmp_path / "s", verbose=0)
    on_local = search.fit(data, backend=cb.LocalBackend(2, threads_per_worker=1), seed=1, store=tmp_path / "l",
                          verbose=0)
    pd.testing.assert_frame_equal(on_spark.history(), on_local.history(), check_exact=True)
    fingerprints = {r.store.read_run_info()["data"]["fingerprint"] for r in (on_spark, on_local)}
    assert len(fingerprints) == 1
    for a, b in zip(on_spark.trials, on_local.trials):
        assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_duplicate_rows_are_spread_over_partitions_and_splits(spark, tmp_path):
    df = spark.createDataFrame([([1.0, 2.0], 1)] * 400 + [([float(i), 0.0], 0) for i in range(100)],
                               "f array<double>, y int")
    layout = cb.Dataset.from_spark(df, features="f", label="y", validation=0.2, seed=0).write(str(tmp_path), 4)
    assert sum(layout.rows["train"]) + sum(layout.rows["val"]) == 500
    assert 60 <= sum(layout.rows["val"]) <= 140          # about 20%, duplicates included
    assert min(layout.rows["train"]) >= 60               # no partition takes all the copies


def test_a_binary_column_of_png_images_is_stored_as_bytes_and_trains_with_its_transform(spark, tmp_path):
    encoded, label = png_digits(300)
    df = spark.createDataFrame(pd.DataFrame({"content": encoded, "label": label}))
    data = cb.Dataset.from_spark(df, features="content", label="label", partitions=2, seed=0)
    assert data.feature_dtype == "bytes"
    result = cb.GridSearch(image_build, {"png": True, "lr": cb.choice([1e-2])}, epochs=2).fit(
        data, workers=2, store=tmp_path / "run", seed=0, verbose=0)
    assert [t.status for t in result.trials] == ["completed"]
    stored = [read_partition(result.store.data_dir, s, p)[0] for s in ("train", "val") for p in range(2)]
    assert sorted(v for part in stored for v in part) == sorted(encoded)       # every image once, as it was
    # cb.predict in Spark tasks takes the column the run trained on, the images as they came
    got = cb.predict(result, df.withColumn("id", F.monotonically_increasing_id()), backend="spark").toPandas()
    expected = result.best.predict(np.array(encoded, dtype=object))
    assert abs(got.sort_values("id").drop(columns="id").to_numpy() - expected).max() <= 1e-6


def test_an_n_d_array_column_keeps_its_shape(spark, tmp_path):
    images, label = digit_images(100)
    df = spark.createDataFrame(pd.DataFrame({"image": [i.tolist() for i in images], "label": label}))
    layout = cb.Dataset.from_spark(df, features="image", label="label", validation=None, seed=0).write(
        str(tmp_path), 2)
    assert layout.feature_shape == (1, 8, 8)
    features = np.concatenate([read_partition(str(tmp_path), "train", p)[0] for p in range(2)])
    assert features.shape == (100, 1, 8, 8)
    key = lambda array: sorted(map(bytes, array.astype(np.float32).reshape(len(array), -1)))  # noqa: E731
    assert key(features) == key(images)


def test_cb_predict_on_spark_takes_the_feature_columns_from_spark_trained_on(spark, tmp_path):
    """A run on a list of numeric columns (and on a Vector column) predicts a Spark DataFrame
    with those columns as ``predict`` does the same rows, in its row order."""
    from pyspark.ml.functions import array_to_vector
    columns = [f"x{i}" for i in range(64)]
    df = spark.createDataFrame(pd.DataFrame(X.astype(np.float64), columns=columns).assign(label=Y))
    vectors = df.select(array_to_vector(F.array(*columns)).alias("v"), "label")
    search = cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1)
    for source, features in ((df, columns), (vectors, "v")):
        data = cb.Dataset.from_spark(source, features=features, label="label", partitions=2, seed=0)
        result = search.fit(data, workers=2, store=tmp_path / str(len(features)), seed=0, verbose=0)
        got = cb.predict(result, source.drop("label"), backend="spark").toPandas()
        assert list(got.columns) == [f"output_{i}" for i in range(10)]
        assert abs(got.to_numpy() - result.best.predict(X)).max() <= 1e-6
    with pytest.raises(ValueError, match=r"the data lacks the feature columns \['x63'\] the run trained on"):
        cb.predict(result_of_columns(tmp_path), df.drop("x63"), backend="spark")


def result_of_columns(tmp_path) -> cb.Result:
    return cb.load(tmp_path / "64")
