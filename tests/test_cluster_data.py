"""``Dataset.from_ray`` and ``Dataset.from_dask`` (issue 36): partitions written by the
cluster's workers, which depend on the rows and the seed only, not on how the rows are cut
into blocks, nor on the engine: the same rows give the same partition files, bit for bit,
and so the same runs. Their checks, made before any run starts, name the bad value."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from _docs import script_of_section
from _models import build

import cerebro as cb
from cerebro.data import SPLITS, read_layout, read_partition

ray = pytest.importorskip("ray")
dask = pytest.importorskip("dask")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}


@pytest.fixture(scope="module")
def engines():
    """An in-process Ray of two CPUs and a Dask cluster of two worker processes."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        yield client
    ray.shutdown()


def digit_rows(rows: int = 400) -> pd.DataFrame:
    from sklearn.datasets import load_digits

    features, label = load_digits(return_X_y=True)
    frame = pd.DataFrame((features[:rows] / 16.0).astype(np.float32), columns=[f"p{i}" for i in range(64)])
    frame["digit"] = label[:rows]
    frame["holdout"] = np.arange(rows) % 5 == 0
    return frame


def cut(frame: pd.DataFrame, *at: int) -> list[pd.DataFrame]:
    bounds = [0, *at, len(frame)]
    return [frame.iloc[a:b] for a, b in zip(bounds, bounds[1:])]


def partition_bytes(data_dir) -> dict[str, bytes]:
    return {f"{split}/{name}": open(os.path.join(data_dir, split, name), "rb").read()
            for split in SPLITS for name in sorted(os.listdir(os.path.join(data_dir, split)))}


def test_the_same_rows_in_any_blocks_on_ray_or_dask_give_the_same_partition_files_and_runs(engines, tmp_path):
    frame = digit_rows()
    pixels = [f"p{i}" for i in range(64)]
    made = {
        "ray in 2 blocks": cb.Dataset.from_ray(ray.data.from_pandas(cut(frame, 150)), features=pixels,
                                               label="digit", partitions=3, seed=7),
        "ray in 4 blocks": cb.Dataset.from_ray(ray.data.from_pandas(cut(frame.iloc[::-1], 1, 90, 300)),
                                               features=pixels, label="digit", partitions=3, seed=7),
        "dask in 5 partitions": cb.Dataset.from_dask(dd.from_pandas(frame, npartitions=5), features=pixels,
                                                     label="digit", partitions=3, seed=7),
    }
    written = {}
    for name, data in made.items():
        assert (data.num_train_rows, data.has_validation, data.label_range()) == (
            made["ray in 2 blocks"].num_train_rows, True, (0, 9)), name
        layout = data.write(str(tmp_path / name), 3)
        assert sum(layout.rows["train"]) == data.num_train_rows and sum(layout.rows["val"]) == 400 - data.num_train_rows
        written[name] = partition_bytes(tmp_path / name)
    assert written["ray in 4 blocks"] == written["ray in 2 blocks"] == written["dask in 5 partitions"]
    assert len({d.fingerprint() for d in made.values()}) == 1
    # The rows are the input's, each once, the validation ones about a fifth.
    layout = read_layout(str(tmp_path / "ray in 2 blocks"))
    stored = [read_partition(str(tmp_path / "ray in 2 blocks"), s, p, layout) for s in SPLITS for p in range(3)]
    rows = np.concatenate([f for f, _ in stored])
    assert sorted(map(bytes, rows)) == sorted(map(bytes, frame[pixels].to_numpy()))
    assert 0.1 < sum(layout.rows["val"]) / 400 < 0.3 and layout.feature_shape == (64,)

    search = cb.GridSearch(build, SPACE, epochs=2)
    on_ray = search.fit(made["ray in 2 blocks"], workers=2, store=tmp_path / "run-ray", seed=1, verbose=0)
    on_dask = search.fit(made["dask in 5 partitions"], workers=2, store=tmp_path / "run-dask", seed=1, verbose=0)
    pd.testing.assert_frame_equal(on_ray.history(), on_dask.history(), check_exact=True)


def test_a_validation_column_tensor_and_bytes_features_keep_their_form(engines, tmp_path):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 255, (60, 4, 4), dtype=np.uint8)
    frame = pd.DataFrame({"image": list(images), "raw": [bytes(i) for i in images],
                          "y": rng.random(60).astype(np.float64), "val": np.arange(60) % 3 == 0})
    tensor = cb.Dataset.from_ray(ray.data.from_pandas(frame), features="image", label="y", validation="val",
                                 partitions=2)
    assert (tensor.num_train_rows, tensor.feature_dtype, tensor.label_range()) == (40, "uint8", None)
    layout = tensor.write(str(tmp_path / "tensor"), 2)
    assert (layout.feature_shape, layout.feature_dtype, layout.label_dtype) == ((4, 4), "uint8", "float32")
    val = np.concatenate([read_partition(str(tmp_path / "tensor"), "val", p, layout)[0] for p in range(2)])
    assert sorted(map(bytes, val)) == sorted(bytes(i) for i in images[::3])

    with dask.config.set({"dataframe.convert-string": False}):     # else Dask makes bytes text, and fails
        raw = dd.from_pandas(frame, npartitions=3)
    one = cb.Dataset.from_dask(raw, features="y", label="val", validation=None)     # one number a row
    assert (one.sample(3)[0].shape, one.feature_dtype, one.label_range()) == ((3, 1), "float32", (0, 1))
    encoded = cb.Dataset.from_dask(raw, features="raw", label="y", validation=None, partitions=2)
    layout = encoded.write(str(tmp_path / "bytes"), 2)
    assert (layout.feature_dtype, encoded.has_validation, sum(layout.rows["train"])) == ("bytes", False, 60)
    stored = np.concatenate([read_partition(str(tmp_path / "bytes"), "train", p, layout)[0] for p in range(2)])
    assert sorted(stored) == sorted(bytes(i) for i in images)


@pytest.mark.parametrize("engine", ["ray", "dask"])
@pytest.mark.parametrize(("change", "arguments", "error", "message"), [
    (None, {"features": ["a", "missing"]}, ValueError, "columns ['missing'] are not in the data; its columns are"),
    (None, {"features": ["a", "y"]}, ValueError, "label column 'y' is also among features=['a', 'y']"),
    (None, {"validation": 1.5}, ValueError, "validation=1.5 must be a fraction in [0, 1)"),
    (None, {"validation": "nope"}, ValueError, "validation column 'nope' is not in the data"),
    ("nan", {}, ValueError, "features: 1 rows hold NaN or infinite values"),
    ("text", {}, TypeError, "column 'a' must be numeric, hold numeric arrays or hold bytes; it holds str"),
    ("ragged", {"features": "v"}, ValueError, "column 'v' holds arrays of different shapes"),
    ("text label", {}, TypeError, "label column 'y' must hold one number per row"),
    ("empty", {}, ValueError, "data is empty: it has 0 rows"),
    ("null label", {}, ValueError, "label column 'y': 1 rows hold"),
    (None, {"partitions": 50}, ValueError, "partitions=50 is more than the"),
])
def test_bad_data_or_arguments_are_refused_naming_the_value(engines, engine, change, arguments, error, message):
    frame = pd.DataFrame({"a": np.arange(40, dtype=np.float64), "b": np.ones(40), "y": np.arange(40) % 2,
                          "v": [np.zeros(2)] * 40})
    if change == "nan":
        frame.loc[33, "a"] = np.nan
    elif change == "text":
        frame["a"] = frame["a"].astype(str).astype(object)
    elif change == "ragged":
        frame["v"] = [np.zeros(2)] * 39 + [np.zeros(3)]
    elif change == "text label":
        frame["y"] = frame["y"].map({0: "cat", 1: "dog"}).astype(object)
    elif change == "empty":
        frame = frame.iloc[:0]
    elif change == "null label":
        frame["y"] = pd.array([None, *frame["y"][1:]], dtype="Int64")
    frame = frame.drop(columns=["v"]) if arguments.get("features") != "v" else frame
    with dask.config.set({"dataframe.convert-string": False}):      # else Dask makes arrays text
        data = ray.data.from_pandas(cut(frame, 20)) if engine == "ray" else dd.from_pandas(frame, npartitions=2)
    make = cb.Dataset.from_ray if engine == "ray" else cb.Dataset.from_dask
    with pytest.raises(error) as raised:
        make(data, **{"features": ["a", "b"], "label": "y", **arguments})
    assert message in str(raised.value)


def test_other_data_is_refused_before_any_cluster_is_touched():
    with pytest.raises(TypeError, match="from_ray needs a ray.data.Dataset; got DataFrame"):
        cb.Dataset.from_ray(pd.DataFrame({"a": [1]}), features="a", label="a")
    with pytest.raises(TypeError, match="from_dask needs a dask.dataframe.DataFrame; got DataFrame"):
        cb.Dataset.from_dask(pd.DataFrame({"a": [1]}), features="a", label="a")


@pytest.mark.parametrize(("doc", "title", "printed"), [
    ("docs/ray.md", "Data in Ray", r"\d+ training rows\n\{'lr': 0\.0\d+, 'hidden': \d+\}\n"),
    ("docs/dask.md", "Data in Dask", r"DaskDataset\(\d+ training rows, \d+ validation rows, .*seed=0\)\n"
                                     r"\{'lr': 0\.0\d+, 'hidden': \d+\}\n"),
])
def test_the_data_sections_of_the_ray_and_dask_guides_run_as_written(tmp_path, doc, title, printed):
    (tmp_path / "example.py").write_text(script_of_section(doc, title, 1))
    ran = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert re.fullmatch(printed, ran.stdout), ran.stdout
    # Ray Data's INFO lines on Cerebro's jobs ("Running Dataset ...", "Execution plan of Dataset ...")
    # and its progress stay out of the terminal (issue 52)
    assert "Dataset" not in ran.stderr and "Progress" not in ran.stderr, ran.stderr[-3000:]
