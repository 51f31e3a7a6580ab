"""Tests of ``cb.Dataset`` and its Parquet partitions (cerebro/data), invariants 2 and 4 of DESIGN.md.

They prove that bad data fails at construction with an exact message naming the problem;
that the seeded validation split is deterministic, disjoint and complete (train + validation
rows are a permutation of all rows, the held-out count is the rounded fraction); that a
separate validation set is used as given, only shuffled by the seed; that the pandas and
Parquet constructors build the same arrays as numpy; that labels become int64 or float32;
that written partitions read back bitwise equal to ``train_arrays()`` / ``validation_arrays()``
with their N-D shapes and row counts; and that the fingerprint tracks the data.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import cerebro as cb
from cerebro.data import open_partition, read_layout, read_partition, write_partitions


def raises(error, message):
    return pytest.raises(error, match=f"^{re.escape(message)}$")


def numbered(rows: int, width: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features whose column 0 is the row number (so rows can be traced) and int labels."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(rows, width)).astype(np.float32)
    features[:, 0] = np.arange(rows)
    return features, rng.integers(0, 5, size=rows)


def row_ids(features: np.ndarray) -> np.ndarray:
    return features[:, 0].astype(np.int64)


X, Y = numbered(20)

# --------------------------------------------------------------------------------------------
# errors, each with its exact message
# --------------------------------------------------------------------------------------------


def test_features_label_length_mismatch():
    with raises(ValueError, "features have 20 rows but label has 19; "
                            "they must have the same number of rows"):
        cb.Dataset.from_numpy(X, Y[:19])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_name_row_count_and_first_row(bad):
    features = X.copy()
    features[12, 2] = bad
    features[5, 1] = np.nan
    with raises(ValueError, "features: 2 rows hold NaN or infinite values (first at row 5)"):
        cb.Dataset.from_numpy(features, Y)


def test_non_finite_in_nd_features_counts_rows_not_values():
    features = np.zeros((6, 1, 4, 4), dtype=np.float32)
    features[4, 0, 1:3, 2] = np.nan                     # two values, one row
    with raises(ValueError, "features: 1 rows hold NaN or infinite values (first at row 4)"):
        cb.Dataset.from_numpy(features, np.arange(6))


def test_nan_label():
    label = Y.astype(np.float64)
    label[[3, 9, 10]] = np.nan
    with raises(ValueError, "label: 3 rows hold NaN or infinite values (first at row 3)"):
        cb.Dataset.from_numpy(X, label)


def test_empty_data():
    with raises(ValueError, "data is empty: features and label have 0 rows"):
        cb.Dataset.from_numpy(np.zeros((0, 3)), np.zeros(0))


def test_one_dimensional_features():
    with raises(ValueError, "features must have shape (rows, ...) with at least 2 dimensions; "
                            "got shape (20,)"):
        cb.Dataset.from_numpy(X[:, 0], Y)


def test_non_numeric_features():
    with raises(TypeError, "features must be numeric, or bytes values (encoded images); got dtype <U1"):
        cb.Dataset.from_numpy(np.array([["a", "b"]] * 4), np.arange(4))
    with raises(TypeError, "features must be numeric, or bytes values (encoded images); got dtype object"):
        cb.Dataset.from_numpy(np.array([[object()]] * 4), np.arange(4))


def test_non_numeric_label():
    with raises(TypeError, "label holds strings ('cat'); a Dataset takes class indices 0..K-1 (or float targets): "
                           "encode them, e.g. y = sklearn.preprocessing.LabelEncoder().fit_transform(y) (its classes_ "
                           "map them back)"):
        cb.Dataset.from_numpy(X, np.array(["cat"] * 20))


def test_more_partitions_than_training_rows():
    # 20 rows, 0.2 held out: 16 training rows
    with raises(ValueError, "partitions=17 is more than the 16 training rows; "
                            "every partition needs at least one row"):
        cb.Dataset.from_numpy(X, Y, validation=0.2, partitions=17)
    cb.Dataset.from_numpy(X, Y, validation=0.2, partitions=16)      # exactly one row each is fine


@pytest.mark.parametrize("partitions", [0, -1, True, 2.0, "4"])
def test_partitions_must_be_a_positive_integer(partitions):
    with raises(ValueError, f"partitions={partitions!r} must be a positive integer or None "
                            f"(one partition per worker)"):
        cb.Dataset.from_numpy(X, Y, partitions=partitions)


def test_write_partitions_rechecks_its_partition_count(tmp_path):
    data = cb.Dataset.from_numpy(X, Y, validation=0.5)
    with raises(ValueError, "partitions=11 is more than the 10 training rows; "
                            "every partition needs at least one row"):
        write_partitions(data, str(tmp_path), 11)
    with raises(ValueError, "partitions=0 must be a positive integer or None "
                            "(one partition per worker)"):
        write_partitions(data, str(tmp_path), 0)


@pytest.mark.parametrize("validation", [1.0, -0.1, 1, 2.5, "0.2", [0.2], True])
def test_bad_validation_value(validation):
    with raises(ValueError, f"validation={validation!r} must be a fraction in [0, 1), "
                            f"a Dataset or a (features, label) pair"):
        cb.Dataset.from_numpy(X, Y, validation=validation)


def test_validation_fraction_that_leaves_no_training_rows():
    with raises(ValueError, "validation=0.99 leaves no training rows out of 20"):
        cb.Dataset.from_numpy(X, Y, validation=0.99)


def test_validation_set_with_other_feature_shape():
    with raises(ValueError, "validation features have shape (4,) per row; training features have (3,)"):
        cb.Dataset.from_numpy(X, Y, validation=(np.zeros((5, 4)), np.zeros(5, dtype=np.int64)))
    other = cb.Dataset.from_numpy(np.zeros((5, 1, 3)), np.zeros(5, dtype=np.int64))
    with raises(ValueError, "validation features have shape (1, 3) per row; training features have (3,)"):
        cb.Dataset.from_numpy(X, Y, validation=other)


def test_validation_set_with_other_label_dtype():
    with raises(ValueError, "validation label (float32, ()) differs from the training label (int64, ())"):
        cb.Dataset.from_numpy(X, Y, validation=(np.zeros((5, 3)), np.zeros(5)))


def test_seed_must_be_an_integer():
    with raises(ValueError, "seed=1.5 must be a non-negative integer"):
        cb.Dataset.from_numpy(X, Y, seed=1.5)


FRAME = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [4, 5, 6], "y": [0, 1, 0]})


def test_pandas_missing_feature_columns():
    with raises(ValueError, "feature columns ['z', 'w'] are not in the DataFrame; "
                            "columns are ['a', 'b', 'y']"):
        cb.Dataset.from_pandas(FRAME, features=["a", "z", "w"], label="y")


def test_pandas_missing_label_column():
    with raises(ValueError, "label column 'q' is not in the DataFrame; columns are ['a', 'b', 'y']"):
        cb.Dataset.from_pandas(FRAME, features=["a"], label="q")


def test_pandas_empty_feature_list_and_not_a_dataframe():
    with raises(ValueError, "features=[] must name at least one column"):
        cb.Dataset.from_pandas(FRAME, features=[], label="y")
    with raises(TypeError, "from_pandas needs a pandas DataFrame; got ndarray"):
        cb.Dataset.from_pandas(X, label="y")


def test_pandas_column_of_arrays_with_different_shapes():
    frame = pd.DataFrame({"x": [np.zeros(3), np.zeros(4), np.zeros(3)], "y": [0, 1, 0]})
    with pytest.raises(ValueError, match="^" + re.escape("column 'x' holds arrays of different shapes: ")):
        cb.Dataset.from_pandas(frame, label="y")


@pytest.mark.parametrize("column", ["x", "y"])
def test_pandas_non_numeric_column(column):
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0, 1, 0]})
    frame[column] = ["p", "q", "r"]
    message = ("label column 'y' holds strings ('p', 'q', 'r'); a Dataset takes class indices 0..K-1 (or float "
               "targets): encode them, e.g. df['y'] = df['y'].astype('category').cat.codes") if column == "y" else \
        f"column {column!r} must be numeric, hold numeric arrays or hold bytes; got dtype object"
    with raises(TypeError, message):
        cb.Dataset.from_pandas(frame, features=["x"], label="y")


def test_parquet_path_that_does_not_exist(tmp_path):
    path = str(tmp_path / "missing.parquet")
    with raises(FileNotFoundError, f"Parquet path {path!r} does not exist"):
        cb.Dataset.from_parquet(path, label="y")


# --------------------------------------------------------------------------------------------
# the split
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows, fraction", [(20, 0.2), (7, 0.2), (9, 0.25), (11, 0.3), (13, 0.3), (50, 0.01)])
def test_seeded_split_is_disjoint_complete_and_rounded(rows, fraction):
    features, label = numbered(rows)
    data = cb.Dataset.from_numpy(features, label, validation=fraction, seed=3)
    (train_x, train_y), (val_x, val_y) = data.train_arrays(), data.validation_arrays()
    held_out = round(rows * fraction)
    assert (len(val_x), len(train_x)) == (held_out, rows - held_out)
    assert data.num_train_rows == rows - held_out
    assert data.has_validation == (held_out > 0)
    ids = np.concatenate([row_ids(train_x), row_ids(val_x)])
    assert np.array_equal(np.sort(ids), np.arange(rows))          # a permutation of all rows
    # each row keeps its own label and features
    assert np.array_equal(np.concatenate([train_y, val_y]), label[ids])
    assert np.array_equal(np.concatenate([train_x, val_x]), features[ids])


def test_same_seed_same_split_other_seed_other_split():
    a = cb.Dataset.from_numpy(X, Y, validation=0.25, seed=7)
    b = cb.Dataset.from_numpy(X.copy(), Y.copy(), validation=0.25, seed=7)
    c = cb.Dataset.from_numpy(X, Y, validation=0.25, seed=8)
    for (xa, ya), (xb, yb) in [(a.train_arrays(), b.train_arrays()),
                               (a.validation_arrays(), b.validation_arrays())]:
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert not np.array_equal(row_ids(a.train_arrays()[0]), row_ids(c.train_arrays()[0]))


def test_training_rows_are_shuffled():
    data = cb.Dataset.from_numpy(X, Y, validation=0.2, seed=0)
    assert not np.array_equal(row_ids(data.train_arrays()[0]), np.sort(row_ids(data.train_arrays()[0])))


@pytest.mark.parametrize("validation", [None, 0, 0.0])
def test_no_validation(validation):
    data = cb.Dataset.from_numpy(X, Y, validation=validation, seed=1)
    train_x, _ = data.train_arrays()
    val_x, val_y = data.validation_arrays()
    assert not data.has_validation
    assert np.array_equal(np.sort(row_ids(train_x)), np.arange(20))
    assert val_x.shape == (0, 3) and val_y.shape == (0,)


@pytest.mark.parametrize("as_dataset", [False, True])
def test_separate_validation_is_used_as_given_shuffled_by_seed(as_dataset):
    val_x, val_y = numbered(8, seed=9)
    validation = cb.Dataset.from_numpy(val_x, val_y, validation=None) if as_dataset else (val_x, val_y)
    data = cb.Dataset.from_numpy(X, Y, validation=validation, seed=4)
    train_x, _ = data.train_arrays()
    got_x, got_y = data.validation_arrays()
    assert data.has_validation and data.num_train_rows == 20            # no rows held out
    assert np.array_equal(np.sort(row_ids(train_x)), np.arange(20))
    order = row_ids(got_x)
    assert np.array_equal(np.sort(order), np.arange(8))                 # every given row, once
    assert np.array_equal(got_x, val_x[order]) and np.array_equal(got_y, val_y[order])
    assert not np.array_equal(order, np.arange(8))                      # shuffled
    again = cb.Dataset.from_numpy(X, Y, validation=(val_x, val_y), seed=4).validation_arrays()
    assert np.array_equal(again[0], got_x)                              # by the seed


# --------------------------------------------------------------------------------------------
# dtypes and the pandas / Parquet constructors
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("label, dtype", [
    (np.arange(4, dtype=np.int8), np.int64), (np.arange(4, dtype=np.uint16), np.int64),
    (np.array([True, False, True, False]), np.int64),
    (np.arange(4, dtype=np.float64), np.float32), (np.arange(4, dtype=np.float16), np.float32),
])
def test_label_dtypes(label, dtype):
    data = cb.Dataset.from_numpy(np.ones((4, 2), dtype=np.int32), label, validation=None)
    assert data.label.dtype == dtype
    assert data.features.dtype == np.int32          # kept as given: workers hand the model float32
    assert np.array_equal(data.label, label.astype(dtype))


def test_pandas_several_scalar_columns():
    frame = pd.DataFrame({"a": [1.5, 2.5, 3.5, 4.5], "b": [10, 20, 30, 40], "c": [0.0, 0, 1, 1],
                          "y": [0, 1, 1, 0]})
    data = cb.Dataset.from_pandas(frame, features=["b", "a"], label="y", validation=None)
    assert np.array_equal(data.features, frame[["b", "a"]].to_numpy(np.float32))
    assert data.label.dtype == np.int64 and np.array_equal(data.label, [0, 1, 1, 0])


def test_pandas_single_feature_name_as_string():
    data = cb.Dataset.from_pandas(FRAME, features="b", label="y", validation=None)
    assert np.array_equal(data.features, [[4], [5], [6]])


def test_pandas_array_column():
    images = np.arange(5 * 6, dtype=np.float32).reshape(5, 6)
    frame = pd.DataFrame({"img": list(images), "y": [0.5, 1.5, 2.5, 3.5, 4.5]})
    data = cb.Dataset.from_pandas(frame, features=["img"], label="y", validation=None)
    assert np.array_equal(data.features, images)
    assert data.label.dtype == np.float32


def test_pandas_list_column_concatenated_with_scalar_column():
    frame = pd.DataFrame({"v": [[1, 2], [3, 4], [5, 6]], "s": [7.0, 8.0, 9.0], "y": [1, 0, 1]})
    data = cb.Dataset.from_pandas(frame, features=["v", "s"], label="y", validation=None)
    assert np.array_equal(data.features, [[1, 2, 7], [3, 4, 8], [5, 6, 9]])


def test_pandas_features_none_means_all_but_the_label():
    frame = pd.DataFrame({"a": [1.0, 2.0], "y": [1, 0], "b": [3.0, 4.0]})
    data = cb.Dataset.from_pandas(frame, label="y", validation=None)
    assert np.array_equal(data.features, [[1, 3], [2, 4]])
    assert np.array_equal(data.label, [1, 0])


def test_pandas_equals_numpy_with_the_same_seed():
    frame = pd.DataFrame({f"f{i}": X[:, i] for i in range(3)} | {"y": Y})
    a = cb.Dataset.from_pandas(frame, label="y", validation=0.25, seed=2)
    b = cb.Dataset.from_numpy(X, Y, validation=0.25, seed=2)
    assert a.fingerprint() == b.fingerprint()


def test_parquet_written_by_pandas(tmp_path):
    images = np.random.default_rng(1).normal(size=(12, 4)).astype(np.float32)
    frame = pd.DataFrame({"img": list(images), "extra": np.arange(12.0), "y": np.arange(12) % 3})
    path = tmp_path / "data.parquet"
    frame.to_parquet(path)

    every = cb.Dataset.from_parquet(path, label="y", validation=0.25, seed=1)
    assert np.array_equal(every.features, np.column_stack([images, np.arange(12.0)]))
    assert every.label.dtype == np.int64 and np.array_equal(every.label, np.arange(12) % 3)
    expected = cb.Dataset.from_pandas(frame, label="y", validation=0.25, seed=1)
    assert every.fingerprint() == expected.fingerprint()

    only_img = cb.Dataset.from_parquet(str(path), features="img", label="y", validation=None)
    assert np.array_equal(only_img.features, images)


# --------------------------------------------------------------------------------------------
# partitions on disk
# --------------------------------------------------------------------------------------------

def read_back(data_dir: str, split: str):
    layout = read_layout(data_dir)
    parts = [read_partition(data_dir, split, p, layout) for p in range(layout.num_partitions)]
    return parts, (np.concatenate([f for f, _ in parts]), np.concatenate([label for _, label in parts]))


def assert_bitwise(got: np.ndarray, expected: np.ndarray):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("features, label, partitions", [
    (*numbered(23, width=5), 4),                                                        # 2-D, int label
    (np.random.default_rng(2).normal(size=(30, 1, 8, 8)),
     np.random.default_rng(3).normal(size=(30, 3)), 3),                                  # N-D, 2-D float label
    # bool label, some empty validation partitions
    (np.random.default_rng(4).normal(size=(9, 2, 3)), np.arange(9) % 2 == 0, 6),
])
def test_partitions_read_back_exactly(tmp_path, features, label, partitions):
    data = cb.Dataset.from_numpy(features, label, validation=0.3, seed=11)
    layout = write_partitions(data, str(tmp_path), partitions)
    assert read_layout(str(tmp_path)) == layout
    assert layout.num_partitions == partitions
    assert layout.feature_shape == data.features.shape[1:]
    assert layout.label_shape == data.label.shape[1:]
    assert layout.label_dtype == str(data.label.dtype)
    assert layout.has_validation
    for split, expected in (("train", data.train_arrays()), ("val", data.validation_arrays())):
        parts, (got_x, got_y) = read_back(str(tmp_path), split)
        assert_bitwise(got_x, expected[0])
        assert_bitwise(got_y, expected[1])
        assert [len(f) for f, _ in parts] == [len(y) for _, y in parts] == layout.rows[split]
        assert sum(layout.rows[split]) == len(expected[0])
        assert max(layout.rows[split]) - min(layout.rows[split]) <= 1               # balanced
    assert min(layout.rows["train"]) >= 1


def test_partitions_read_back_contiguous_and_their_batches_are_writable_copies(tmp_path):
    """Batches become tensors with torch.from_numpy, which needs writable arrays."""
    write_partitions(cb.Dataset.from_numpy(X, Y), str(tmp_path), 2)
    features, label = read_partition(str(tmp_path), "train", 1)
    assert features.flags.c_contiguous
    for in_memory in (True, False):
        source = open_partition(read_layout(str(tmp_path)), str(tmp_path), "train", 1, in_memory)
        batch, labels = next(source.train_batches(seed=0, batch_size=4))
        assert batch.flags.writeable and labels.flags.writeable and len(batch) == 4


def test_partitions_with_empty_validation(tmp_path):
    features = np.random.default_rng(0).normal(size=(10, 1, 2, 2))
    data = cb.Dataset.from_numpy(features, np.arange(10.0), validation=None)
    layout = write_partitions(data, str(tmp_path), 3)
    assert layout.rows == {"train": [4, 3, 3], "val": [0, 0, 0]}
    assert not read_layout(str(tmp_path)).has_validation
    _, (train_x, train_y) = read_back(str(tmp_path), "train")
    assert_bitwise(train_x, data.train_arrays()[0])
    assert_bitwise(train_y, data.train_arrays()[1])
    for partition in range(3):
        val_x, val_y = read_partition(str(tmp_path), "val", partition)
        assert val_x.shape == (0, 1, 2, 2) and val_x.dtype == np.float32      # float64 is stored as float32
        assert val_y.shape == (0,) and val_y.dtype == np.float32


def test_partitions_with_separate_validation(tmp_path):
    val_x, val_y = numbered(5, seed=6)
    data = cb.Dataset.from_numpy(X, Y, validation=(val_x, val_y), seed=2)
    layout = write_partitions(data, str(tmp_path), 2)
    assert layout.rows == {"train": [10, 10], "val": [3, 2]}
    _, (got_x, got_y) = read_back(str(tmp_path), "val")
    assert_bitwise(got_x, data.validation_arrays()[0])
    assert_bitwise(got_y, data.validation_arrays()[1])


# --------------------------------------------------------------------------------------------
# fingerprint
# --------------------------------------------------------------------------------------------

def test_fingerprint_tracks_data_and_split():
    base = cb.Dataset.from_numpy(X, Y, validation=0.2, seed=0).fingerprint()
    assert cb.Dataset.from_numpy(X.copy(), Y.copy(), validation=0.2, seed=0).fingerprint() == base
    changed = X.copy()
    changed[17, 2] += 1.0
    assert cb.Dataset.from_numpy(changed, Y, validation=0.2, seed=0).fingerprint() != base
    relabeled = Y.copy()
    relabeled[3] = relabeled[3] + 1
    assert cb.Dataset.from_numpy(X, relabeled, validation=0.2, seed=0).fingerprint() != base
    assert cb.Dataset.from_numpy(X, Y, validation=0.2, seed=1).fingerprint() != base
    assert cb.Dataset.from_numpy(X, Y, validation=0.3, seed=0).fingerprint() != base
    assert len(base) == 16 and int(base, 16) >= 0


def test_a_datasets_repr_says_its_rows_partitions_features_label_and_storage(tmp_path):
    X = np.zeros((100, 8), dtype=np.float32)
    data = cb.Dataset.from_numpy(X, np.arange(100) % 2, partitions=4, in_memory=False, cache_dir=tmp_path)
    assert repr(data) == (f"ArrayDataset(80 training rows, 20 validation rows, partitions=4, features: float32 (8,), "
                          f"label: int64 class indices, in_memory=False, cache_dir={str(tmp_path)!r}, seed=0)")
    df = pd.DataFrame({"a": np.arange(50.0), "b": np.arange(50.0), "y": np.arange(50.0)})
    assert repr(cb.Dataset.from_pandas(df, label="y", validation=None, seed=3)) == (
        "ArrayDataset(50 training rows, 0 validation rows, partitions=one per worker, features: float32 (2,) "
        "from ['a', 'b'], label: float32 targets, in_memory='auto', seed=3)")
