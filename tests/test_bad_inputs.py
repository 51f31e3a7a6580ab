"""Invariant 4, exhaustively: each bad input fails with a message naming the value and the
rule, before any worker starts and before anything is written to the store.

One table, one case per row: how to make the mistake, the error type, and the message it must
give (matched whole). Mistakes in data, the search space, the searchers' and ``fit``'s
arguments, the backends, the store, ``build`` (checked on the driver on a few configurations
and two rows of data), ``cb.load`` and ``cb.resume``."""
from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest
import torch

import cerebro as cb

X = np.random.default_rng(0).random((60, 8)).astype(np.float32)
Y = np.arange(60) % 3
SPACE = {"lr": cb.choice([0.1])}


def linear(outputs: int = 3, batch_size: int = 8, loss=torch.nn.functional.cross_entropy) -> cb.TorchTrainable:
    model = torch.nn.Linear(8, outputs)
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=batch_size)


def build(config: dict) -> cb.TorchTrainable:
    return linear()


def build_with_metrics(metrics) -> cb.TorchTrainable:
    model = torch.nn.Linear(8, 3)
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy,
                             batch_size=8, metrics=metrics)


def build_with_adam(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Linear(8, 3)
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=8)


def build_batch_size_0(config: dict) -> cb.TorchTrainable:
    return linear(batch_size=0)


def build_per_row_loss(config: dict) -> cb.TorchTrainable:
    return linear(loss=torch.nn.CrossEntropyLoss(reduction="none"))


def build_two_outputs(config: dict) -> cb.TorchTrainable:
    return linear(outputs=2)


def build_with_a_metric_that_raises(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Linear(8, 3)
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy,
                             batch_size=8, metrics={"ratio": lambda outputs, targets: outputs.sum() / targets.sum(1)})


def build_own_classification_loss(config: dict) -> cb.TorchTrainable:
    return linear(loss=lambda outputs, targets: torch.nn.functional.nll_loss(outputs.log_softmax(1), targets))


def build_that_raises(config: dict) -> cb.TorchTrainable:
    raise RuntimeError(f"no model for {config}")


def data(**kwargs) -> cb.Dataset:
    return cb.Dataset.from_numpy(X, Y, **{"partitions": 2, **kwargs})


def fit(tmp_path, search=None, dataset=None, **kwargs):
    """A fit whose store must not exist afterwards: nothing was written, no worker started."""
    store = tmp_path / "run"
    try:
        return (search or cb.GridSearch(build, SPACE, epochs=1)).fit(
            dataset if dataset is not None else data(), store=store, **{"workers": 1, "verbose": 0, **kwargs})
    finally:
        assert not store.exists()


def a_file(tmp_path) -> str:
    path = tmp_path / "afile"
    path.write_text("not a directory")
    return str(path)


CASES = {   # name -> (make the mistake(tmp_path), error type, the whole message as a regex)
    # --- data --------------------------------------------------------------------------------
    "string labels": (lambda t: cb.Dataset.from_numpy(X, np.array(["b", "a", "c", "d"] * 15)), TypeError,
                      r"label holds strings \('a', 'b', 'c', \.\.\.\); a Dataset takes class indices 0\.\.K-1 \(or "
                      r"float targets\): encode them, e\.g\. y = sklearn\.preprocessing\.LabelEncoder\(\)"
                      r"\.fit_transform\(y\) \(its classes_ map them back\)"),
    "a label column of strings": (
        lambda t: cb.Dataset.from_pandas(pd.DataFrame({"a": X[:, 0], "y": pd.Categorical(["x", "y"] * 30)}),
                                         label="y"), TypeError,
        r"label column 'y' holds strings \('x', 'y'\); a Dataset takes class indices 0\.\.K-1 \(or float "
        r"targets\): encode them, e\.g\. df\['y'\] = df\['y'\]\.astype\('category'\)\.cat\.codes"),
    "negative labels": (
        lambda t: fit(t, dataset=cb.Dataset.from_numpy(X, Y - 1, partitions=2)), ValueError,
        r"one training step of build\(\{'lr': 0\.1\}\) on 4 training rows, run on the driver before any worker "
        r"starts, fails as every trial would at its first batch: ValueError: the labels hold class indices -1\.\.1 "
        r"but a class index cannot be negative: the model outputs 3 values per row, one per class 0\.\.2; encode "
        r"the classes as 0\.\.2 \(e\.g\. y - y\.min\(\)\)"),
    "one-hot labels for a loss that takes class indices": (
        lambda t: fit(t, dataset=cb.Dataset.from_numpy(X, np.eye(3, dtype=np.int64)[Y], partitions=2)), ValueError,
        r"the labels are one-hot \(int64, shape \(rows, 3\)\) but loss=cross_entropy takes one class index a row, "
        r"shape \(rows,\): give y\.argmax\(1\) \(or the rows as float32, which cross_entropy takes as class "
        r"probabilities\)"),
    "one-hot labels for a loss of its own": (
        lambda t: fit(t, search=cb.GridSearch(build_own_classification_loss, SPACE, epochs=1),
                      dataset=cb.Dataset.from_numpy(X, np.eye(3, dtype=np.int64)[Y], partitions=2)), ValueError,
        r"one training step of build\(\{'lr': 0\.1\}\) on 4 training rows, run on the driver before any worker "
        r"starts, fails as every trial would at its first batch: RuntimeError: .*target.*\. The labels have shape "
        r"\(rows, 3\) \(int64\): for one class index a row give y\.argmax\(1\); for class probabilities, "
        r"y\.astype\('float32'\)"),
    "no labels": (lambda t: cb.Dataset.from_numpy(X, None), TypeError,
                  r"label=None: a Dataset needs a label for every row \(class indices 0\.\.K-1 or float targets\)"),
    "float labels for a classification loss": (
        lambda t: fit(t, dataset=cb.Dataset.from_numpy(X, (Y * 0.5).astype(np.float32), partitions=2)), ValueError,
        r"the label is float32 but loss=cross_entropy takes class indices; encode the classes as integers 0\.\.K-1: "
        r"y\.astype\(int\), or for Spark ML's double labels \(StringIndexer's\), "
        r"df\.withColumn\('label', df\['label'\]\.cast\('int'\)\) before from_spark"),
    "class indices beyond the model's outputs": (
        lambda t: fit(t, search=cb.GridSearch(build_two_outputs, SPACE, epochs=1)), ValueError,
        r"one training step of build\(\{'lr': 0\.1\}\) on 4 training rows, run on the driver before any worker "
        r"starts, fails as every trial would at its first batch: ValueError: the labels hold class indices 0\.\.2 "
        r"but the model outputs 2 values per row, one per class 0\.\.1; give its last layer 3 outputs, or encode "
        r"the classes as 0\.\.1"),
    "a metric that raises": (
        lambda t: fit(t, search=cb.GridSearch(build_with_a_metric_that_raises, SPACE, epochs=1)), ValueError,
        r"one training step of build\(\{'lr': 0\.1\}\) on 4 training rows, run on the driver before any worker "
        r"starts, fails as every trial would at its first batch: IndexError: Dimension out of range .*"),
    "float labels for a loss of its own that takes class indices": (
        lambda t: fit(t, search=cb.GridSearch(build_own_classification_loss, SPACE, epochs=1),
                      dataset=cb.Dataset.from_numpy(X, Y.astype(np.float32), partitions=2)), ValueError,
        r"one training step of build\(\{'lr': 0\.1\}\) on 4 training rows, run on the driver before any worker "
        r"starts, fails as every trial would at its first batch: RuntimeError: .*Long.*Float.*"),
    "1-D features": (lambda t: cb.Dataset.from_numpy(X[:, 0], Y), ValueError,
                     r"features must have shape \(rows, \.\.\.\) with at least 2 dimensions; got shape \(60,\)"),
    "infinite features": (lambda t: cb.Dataset.from_numpy(np.where(X > 0.99, np.inf, X), Y), ValueError,
                          r"features: \d+ rows hold NaN or infinite values \(first at row \d+\)"),
    "NaN labels": (lambda t: cb.Dataset.from_numpy(X, np.where(Y == 1, np.nan, Y)), ValueError,
                   r"label: 20 rows hold NaN or infinite values \(first at row 1\)"),
    "object features": (lambda t: cb.Dataset.from_numpy(X.astype(object), Y), TypeError,
                        r"features must be numeric, or bytes values \(encoded images\); got dtype object"),
    "a text column among the features": (
        lambda t: cb.Dataset.from_pandas(pd.DataFrame({"a": ["x"] * 60, "b": X[:, 0], "y": Y}), features=["a", "b"],
                                         label="y"), TypeError,
        r"column 'a' must be numeric, hold numeric arrays or hold bytes; got dtype object"),
    "validation features of another shape": (
        lambda t: cb.Dataset.from_numpy(X, Y, validation=(X[:, :4], Y)), ValueError,
        r"validation features have shape \(4,\) per row; training features have \(8,\)"),
    "features and labels of different lengths": (
        lambda t: cb.Dataset.from_numpy(X, Y[:50]), ValueError,
        r"features have 60 rows but label has 50; they must have the same number of rows"),
    "complex features": (lambda t: cb.Dataset.from_numpy(X.astype(np.complex64), Y), TypeError,
                         r"features must be real numbers; got dtype complex64 \(split a complex value into its real "
                         r"and imaginary parts\)"),
    "uint64 labels beyond int64": (lambda t: cb.Dataset.from_numpy(X, np.full(60, 2 ** 63, dtype=np.uint64)),
                                   ValueError, r"label holds 9223372036854775808, beyond int64's range; class "
                                               r"indices must be 0\.\.K-1"),
    "a label column among the features": (
        lambda t: cb.Dataset.from_pandas(pd.DataFrame({"a": X[:, 0], "y": Y}), features=["a", "y"], label="y"),
        ValueError, r"label column 'y' is also among features=\['a', 'y'\]; a model must not see its label"),
    "a store that is no path": (
        lambda t: cb.GridSearch(build, SPACE, epochs=1).fit(data(), workers=1, store=5, verbose=0), TypeError,
        r"store=5 must be a path or URL \(a str or os\.PathLike\), not int"),
    "metrics given as a list": (
        lambda t: build_with_metrics([cb.metrics.accuracy]), TypeError,
        r"metrics must be a dict of name -> metric, e\.g\. \{'accuracy': cb\.metrics\.accuracy\} \(logged as "
        r"val_accuracy\), not a list"),
    "an empty store": (lambda t: cb.GridSearch(build, SPACE, epochs=1).fit(data(), workers=1, store="", verbose=0),
                       ValueError, r"store='' must name a directory \(or a URL\)"),
    "no rows": (lambda t: cb.Dataset.from_numpy(X[:0], Y[:0]), ValueError,
                r"data is empty: features and label have 0 rows"),
    "validation fraction of 1.5": (lambda t: data(validation=1.5), ValueError,
                                   r"validation=1\.5 must be a fraction in \[0, 1\), a Dataset or a \(features, "
                                   r"label\) pair"),
    "partitions=0": (lambda t: data(partitions=0), ValueError,
                     r"partitions=0 must be a positive integer or None \(one partition per worker\)"),
    "partitions=-1": (lambda t: data(partitions=-1), ValueError,
                      r"partitions=-1 must be a positive integer or None \(one partition per worker\)"),
    "partitions=2.5": (lambda t: data(partitions=2.5), ValueError,
                       r"partitions=2\.5 must be a positive integer or None \(one partition per worker\)"),
    "more partitions than rows": (lambda t: fit(t, dataset=cb.Dataset.from_numpy(X[:6], Y[:6], partitions=8)),
                                  ValueError, r"partitions=8 is more than the 5 training rows; every partition "
                                              r"needs at least one row"),
    "a seed that is not an integer": (lambda t: data(seed="a"), ValueError, r"seed='a' must be a non-negative integer"),
    "a negative data seed": (lambda t: data(seed=-1), ValueError, r"seed=-1 must be a non-negative integer"),
    "a missing feature column": (
        lambda t: cb.Dataset.from_pandas(pd.DataFrame({"a": X[:, 0], "y": Y}), features=["a", "b"], label="y"),
        ValueError, r"feature columns \['b'\] are not in the DataFrame; columns are \['a', 'y'\]"),
    "a missing label column": (
        lambda t: cb.Dataset.from_pandas(pd.DataFrame({"a": X[:, 0], "y": Y}), features=["a"], label="z"),
        ValueError, r"label column 'z' is not in the DataFrame; columns are \['a', 'y'\]"),
    "a missing Parquet path": (lambda t: cb.Dataset.from_parquet(str(t / "nope.parquet"), label="y"),
                               FileNotFoundError, r"Parquet path '.*nope\.parquet' does not exist"),
    "data that is not a Dataset": (lambda t: fit(t, dataset=X), TypeError,
                                   r"data must be a cerebro\.Dataset \(e\.g\. cb\.Dataset\.from_numpy\(X, y\)\); "
                                   r"got ndarray"),
    # --- the search space ----------------------------------------------------------------------
    "an empty space": (lambda t: fit(t, cb.GridSearch(build, {}, epochs=1)), ValueError,
                       r"space=\{\} must name at least one parameter"),
    "an empty choice": (lambda t: cb.choice([]), ValueError, r"choice: values=\[\] must hold at least one option"),
    "uniform reversed": (lambda t: cb.uniform(1, 0), ValueError, r"uniform: low=1 must be smaller than high=0"),
    "uniform of zero width": (lambda t: cb.uniform(1, 1), ValueError, r"uniform: low=1 must be smaller than high=1"),
    "loguniform from 0": (lambda t: cb.loguniform(0, 1), ValueError, r"loguniform: low=0 must be greater than 0"),
    "loguniform reversed": (lambda t: cb.loguniform(0.1, 0.0001), ValueError,
                            r"loguniform: low=0\.1 must be smaller than high=0\.0001"),
    "randint reversed": (lambda t: cb.randint(5, 1), ValueError, r"randint: low=5 must be smaller than high=1"),
    "randint of zero width": (lambda t: cb.randint(5, 5), ValueError, r"randint: low=5 must be smaller than high=5"),
    "a configuration value that is an object": (
        lambda t: cb.choice([torch.nn.ReLU()]), ValueError,
        r"choice: ReLU\(\) cannot be stored as a configuration value; use numbers, strings, booleans, None or "
        r"lists or dicts of them \(map names to objects inside build\)"),
    "a constant that is a function": (
        lambda t: fit(t, cb.GridSearch(build, {"f": len}, epochs=1)), ValueError,
        r"space\['f'\]: <built-in function len> cannot be stored as a configuration value; use numbers, strings, "
        r"booleans, None or lists or dicts of them \(map names to objects inside build\)"),
    "a space key that is a history column": (
        lambda t: fit(t, cb.GridSearch(build, {"epoch": cb.choice([1, 2])}, epochs=1)), ValueError,
        r"space key 'epoch' is also a column of result\.history\(\) \(trial_id, epoch, exploited_from, "
        r"warm_started_from, train_loss, val_loss\); rename it"),
    "a space key that is a metric": (
        lambda t: fit(t, cb.GridSearch(build, {"val_loss": 3.0}, epochs=1)), ValueError,
        r"space key 'val_loss' is also a column of result\.history\(\) .*; rename it"),
    "a grid over a continuous range": (
        lambda t: fit(t, cb.GridSearch(build, {"lr": cb.uniform(0.1, 1)}, epochs=1)), ValueError,
        r"GridSearch can only enumerate cb\.choice values; space\['lr'\] is uniform\(0\.1, 1\)\. Use "
        r"cb\.choice\(\[\.\.\.\]\) or cb\.RandomSearch"),
    # --- the searchers ---------------------------------------------------------------------------
    "epochs=2.5": (lambda t: fit(t, cb.GridSearch(build, SPACE, epochs=2.5)), ValueError,
                   r"epochs=2\.5 must be an integer >= 1"),
    "epochs=0": (lambda t: fit(t, cb.GridSearch(build, SPACE, epochs=0)), ValueError,
                 r"epochs=0 must be an integer >= 1"),
    "num_trials=0": (lambda t: fit(t, cb.RandomSearch(build, SPACE, num_trials=0)), ValueError,
                     r"num_trials=0 must be an integer >= 1"),
    "a metric the trainable does not log": (
        lambda t: fit(t, cb.GridSearch(build, SPACE, epochs=1, metric="val_f1")), ValueError,
        r"metric='val_f1' is not logged; logged metrics are \['train_loss', 'val_loss'\]"),
    "mode='maximize'": (lambda t: fit(t, cb.GridSearch(build, SPACE, epochs=1, mode="maximize")), ValueError,
                        r"mode='maximize' must be 'min' or 'max'"),
    "ASHA reduction_factor=1": (lambda t: fit(t, cb.ASHA(build, SPACE, reduction_factor=1)), ValueError,
                                r"reduction_factor=1 must be a number >= 2"),
    "ASHA grace_period beyond max_epochs": (
        lambda t: fit(t, cb.ASHA(build, SPACE, grace_period=10, max_epochs=3)), ValueError,
        r"grace_period=10 must be at most max_epochs=3"),
    "Hyperband eta=1": (lambda t: fit(t, cb.Hyperband(build, SPACE, eta=1)), ValueError,
                        r"eta=1 must be a number >= 2"),
    # --- build, checked on the driver ---------------------------------------------------------------
    "a build that returns a model, not a trainer": (
        lambda t: fit(t, cb.GridSearch(lambda config: torch.nn.Linear(8, 3), SPACE, epochs=1)), TypeError,
        r"build\(config\) must return a cerebro\.Trainable \(a cerebro\.TorchTrainable, a cerebro\.KerasTrainable, "
        r"or a subclass of your own: docs/extending\.md\); got Linear"),
    "batch_size=0": (lambda t: fit(t, cb.GridSearch(build_batch_size_0, SPACE, epochs=1)), ValueError,
                     r"build\(config\) fails for the configuration tried on the driver, "
                     r"\{'lr': 0\.1\}: ValueError: batch_size=0 must be a positive integer\n(.|\n)*"),
    "a build that always raises": (
        lambda t: fit(t, cb.ASHA(build_that_raises, {"lr": cb.choice([0.1, 0.2])}, metric="val_f1")), ValueError,
        r"build\(config\) fails for each of the 2 configurations tried on the driver, e\.g\. \{'lr': 0\.[12]\}: "
        r"RuntimeError: no model for \{'lr': 0\.[12]\}\n(.|\n)*"),
    "a loss that is not a scalar": (
        lambda t: fit(t, cb.GridSearch(build_per_row_loss, SPACE, epochs=1)), ValueError,
        r"loss=CrossEntropyLoss with reduction='none' returns one value per row; the loss must return the "
        r"batch's mean \(reduction='mean'\)"),
    "a list where a choice was meant": (
        lambda t: fit(t, cb.GridSearch(build_with_adam, {"lr": [1e-3, 1e-2]}, epochs=1)), ValueError,
        r"build\(config\) fails for the configuration tried on the driver, \{'lr': \[0\.001, 0\.01\]\}: TypeError: "
        r"'<=' not supported between instances of 'float' and 'list'\. Space key 'lr' is a list, which every trial "
        r"gets whole; for a choice among its values write cb\.choice\(\[0\.001, 0\.01\]\)\n(.|\n)*"),
    "labels as a column": (
        lambda t: fit(t, dataset=cb.Dataset.from_numpy(X, Y.reshape(-1, 1), partitions=2)), ValueError,
        r"one training step of build\(\{'lr': 0\.1\}\) on 4 training rows, run on the driver before any worker "
        r"starts, fails as every trial would at its first batch: RuntimeError: 0D or 1D target tensor expected, "
        r"multi-target not supported\. The labels have shape \(rows, 1\); for one class index a row give a 1-D "
        r"label: label\.ravel\(\)"),
    # --- fit's settings, the backends and the store -------------------------------------------------
    "a fit seed that is not an integer": (lambda t: fit(t, seed=1.5), ValueError,
                                          r"seed=1\.5 must be a non-negative integer or None"),
    "a negative fit seed": (lambda t: fit(t, seed=-1), ValueError, r"seed=-1 must be a non-negative integer or None"),
    "workers=0": (lambda t: fit(t, workers=0), ValueError, r"workers=0 must be a positive integer"),
    "verbose=2": (lambda t: fit(t, verbose=2), ValueError, r"verbose=2 must be 0 \(silent\) or 1 \(progress\)"),
    "a negative trial_timeout": (lambda t: fit(t, trial_timeout=-1), ValueError,
                                 r"trial_timeout=-1 must be a positive number of seconds or None"),
    "a negative max_failures": (lambda t: fit(t, max_failures=-1), ValueError,
                                r"max_failures=-1 must be an integer >= 0 or None"),
    "max_trial_losses=0": (lambda t: fit(t, max_trial_losses=0), ValueError,
                            r"max_trial_losses=0 must be a positive integer"),
    "an unknown backend": (lambda t: fit(t, backend="yarn", workers=None), ValueError,
                           r"backend='yarn' must be 'local' or a Backend instance such as "
                           r"cb\.LocalBackend\(workers=4\)"),
    "threads_per_worker=0": (lambda t: cb.LocalBackend(2, threads_per_worker=0), ValueError,
                             r"threads_per_worker=0 must be a positive integer"),
    "a heartbeat timeout under a second": (lambda t: cb.LocalBackend(2, heartbeat_timeout=0.5), ValueError,
                                           r"heartbeat_timeout=0\.5 must be a number of seconds > 1"),
    "a store that is a file": (
        lambda t: cb.GridSearch(build, SPACE, epochs=1).fit(data(), workers=1, store=a_file(t), verbose=0),
        FileExistsError, r"store '.*afile' is a file, not a directory; choose a new or empty directory"),
    "a store that holds a run": (
        lambda t: cb.GridSearch(build, SPACE, epochs=1).fit(data(), workers=1, store=finished_run(t), verbose=0),
        FileExistsError, r"store '(.*done)' already holds a run; to finish or extend it: cb\.resume\('\1'\) or "
                         r"`cerebro resume \1`; to read it: cb\.load\('\1'\); for a new run, choose another store "
                         r"or delete this one"),
    "cb.load of a directory that is not a run": (lambda t: cb.load(t), FileNotFoundError,
                                                 r"'.*' is not a Cerebro run directory \(no run\.json\)"),
    "cb.resume of a directory that is not a run": (lambda t: cb.resume(t), FileNotFoundError,
                                                   r"'.*' is not a Cerebro run directory \(no run\.json\)"),
}

def finished_run(tmp_path) -> str:
    """A directory that holds a run (its run.json is what says so)."""
    store = tmp_path / "done"
    store.mkdir()
    (store / "run.json").write_text("{}")
    return str(store)


def test_a_fit_that_fails_before_its_run_begins_leaves_the_store_as_it_found_it(tmp_path, monkeypatch):
    """Nothing to resume yet (no run.json), so nothing may block the corrected fit: a store it
    made is removed, one that was empty is emptied (partitions and .lock alike)."""
    dataset = data()

    def write_then_fail(data_dir: str, partitions: int) -> None:
        os.makedirs(data_dir)
        open(os.path.join(data_dir, "train-0.parquet"), "w").close()
        raise OSError("No space left on device")
    monkeypatch.setattr(dataset, "write", write_then_fail)
    empty = tmp_path / "empty"
    empty.mkdir()
    for store in (tmp_path / "new", empty):
        with pytest.raises(OSError, match="^No space left on device$"):
            cb.GridSearch(build, SPACE, epochs=1).fit(dataset, workers=1, store=store, verbose=0)
    assert not (tmp_path / "new").exists() and list(empty.iterdir()) == []


def test_what_a_killed_fit_left_is_cleared_by_the_next_fit_unless_a_live_fit_holds_it(tmp_path):
    from cerebro.store import RunStore, StoreInUseError
    from cerebro.store._lock import lock_local
    half = tmp_path / "half"
    (half / "data").mkdir(parents=True)
    (half / "data" / "train-0.parquet").write_bytes(b"partial")
    (half / ".lock").write_text("")
    held = lock_local(str(half), str(half / ".lock"))        # a fit still writing its partitions
    try:
        with pytest.raises(StoreInUseError, match="a fit is writing its partitions there"):
            RunStore.create(half)
        with pytest.raises(FileNotFoundError, match="holds no run.json yet: a fit is writing its partitions there"):
            cb.load(half)
    finally:
        held.close()
    with pytest.raises(FileNotFoundError, match=r"holds no run\.json, only \.lock, data: a fit stopped there"):
        cb.load(half)
    RunStore.create(half)                                     # the killed fit's leftovers go
    assert list(half.iterdir()) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    (half / "data").symlink_to(elsewhere)                     # an attacker's link: never followed
    with pytest.raises(FileExistsError, match="is a directory that is not empty"):
        RunStore.create(half)
    assert (elsewhere / "keep.txt").read_text() == "keep"
    (half / "data").unlink()
    (half / "notes.txt").write_text("mine")                   # anything else is the user's: refused
    with pytest.raises(FileExistsError, match="is a directory that is not empty"):
        RunStore.create(half)


def test_a_store_under_home_is_under_home():
    from cerebro.store import RunStore
    assert RunStore("~/cerebro-runs/x").path == os.path.join(os.path.expanduser("~"), "cerebro-runs", "x")


def test_the_table_is_exhaustive_enough():
    assert len(CASES) >= 40


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_refused_with_a_message_naming_it(tmp_path, name):
    make, error, message = CASES[name]
    with pytest.raises(error) as raised:
        make(tmp_path)
    assert re.fullmatch(message, str(raised.value)), str(raised.value)


def build_by_outputs(config: dict) -> cb.TorchTrainable:
    return linear(outputs=config["outputs"])


@pytest.mark.slow
def test_a_model_whose_output_does_not_fit_the_labels_fails_its_trial_with_the_shapes(tmp_path):
    """What differs between configurations is the trials' to fail, at their first sub-epoch."""
    result = cb.GridSearch(build_by_outputs, {"outputs": cb.choice([3, 2])}, epochs=2).fit(
        data(), workers=1, store=tmp_path / "run", verbose=0)
    assert [t.status for t in result.trials] == ["completed", "failed"]
    assert re.search(r"IndexError: Target 2 is out of bounds\.\non a batch of features \(8, 8\) float32 -> "
                     r"outputs \(8, 2\) float32, labels \(8,\) int64", result.trials[1].error), result.trials[1].error


def build_with_own_per_row_loss(config: dict) -> cb.TorchTrainable:
    return linear(loss=lambda outputs, targets: torch.nn.functional.cross_entropy(outputs, targets, reduction="none"))


def test_a_loss_of_its_own_that_is_not_a_scalar_is_refused_before_any_worker_starts(tmp_path):
    with pytest.raises(ValueError) as raised:
        fit(tmp_path, search=cb.GridSearch(build_with_own_per_row_loss, SPACE, epochs=1))
    assert str(raised.value) == (
        "one training step of build({'lr': 0.1}) on 4 training rows, run on the driver before any worker starts, "
        "fails as every trial would at its first batch: ValueError: loss(outputs, targets) must return a scalar "
        "(the batch's mean loss); it returned a tensor of shape (4,) (a loss with reduction='none'?)")


def test_a_model_too_large_to_build_on_the_driver_skips_the_preflight_step(tmp_path, monkeypatch):
    """Over PREFLIGHT_MAX_BYTES (as the meta build sizes it) the driver builds nothing for real:
    a loss that would be refused there is left to the workers."""
    import cerebro.engine._preflight as preflight
    from cerebro.engine._preflight import check_build
    with pytest.raises(ValueError, match="^one training step of build"):
        check_build(build_with_own_per_row_loss, [{"lr": 0.1}], "val_loss", data())
    monkeypatch.setattr(preflight, "PREFLIGHT_MAX_BYTES", build({}).nbytes() - 1)
    assert isinstance(check_build(build_with_own_per_row_loss, [{"lr": 0.1}], "val_loss", data()), cb.TorchTrainable)


@pytest.mark.parametrize("text, says", [
    ("{not json", r"it is not JSON \(Expecting property name enclosed in double quotes: line 1 column 2 \(char 1\)\)"),
    ("[1, 2]", r"it holds a JSON list, not an object"),
    ('{"seed": 1}', r"its 'workers' must be a whole number, not missing"),
    ('{"seed": 1, "workers": 2, "searcher": "grid"}', r"its 'searcher.class' must be a string, not missing"),
    ('{"seed": 1, "workers": 2, "searcher": {"class": "GridSearch", "metric": "val_loss", "mode": "min"}, '
     '"data": {"partitions": true}}', r"its 'data.partitions' must be a whole number, not True"),
])
def test_a_damaged_run_json_is_named_with_what_is_wrong_not_a_traceback(tmp_path, text, says, monkeypatch, capsys):
    from _cli import cerebro

    from cerebro.store import RunInfoError
    (tmp_path / "run.json").write_text(text)
    (tmp_path / "journal.jsonl").write_text("")
    message = f"{re.escape(str(tmp_path))}/run.json is damaged: {says}"
    with pytest.raises(RunInfoError, match=f"^{message}$"):
        cb.load(tmp_path)
    done = cerebro(monkeypatch, capsys, "status", str(tmp_path))
    assert done.returncode == 2 and re.fullmatch(f"error: {message}\n", done.stderr), done.stderr


def logging_build(log: str):
    """``build`` (the one above) that notes, in ``log``, its process and whether it runs in
    the driver's checks each time it is called."""
    def build_that_logs(config: dict) -> cb.TorchTrainable:
        from cerebro.worker import in_preflight
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {in_preflight()}\n")
        return build(config)
    return build_that_logs


@pytest.mark.slow
def test_the_drivers_builds_are_in_preflight_and_the_workers_are_not(tmp_path):
    log = str(tmp_path / "builds.log")
    cb.GridSearch(logging_build(log), {"lr": cb.choice([0.1, 0.2])}, epochs=1).fit(
        data(), workers=1, store=tmp_path / "run", verbose=0)
    with open(log) as f:
        calls = [line.split() for line in f]
    driver = [flag for pid, flag in calls if int(pid) == os.getpid()]
    workers = [flag for pid, flag in calls if int(pid) != os.getpid()]
    assert driver and set(driver) == {"True"}          # a build with side effects can skip them there
    assert len(workers) == 2 and set(workers) == {"False"}


HUGE = "x" * 100_000


@pytest.mark.parametrize("make", [
    lambda: cb.choice(HUGE), lambda: cb.uniform(HUGE, 1.0), lambda: cb.loguniform(0.1, HUGE),
    lambda: cb.randint(0, HUGE), lambda: cb.quniform(0.0, 1.0, HUGE),
    lambda: cb.GridSearch(build, {HUGE: cb.choice([1]), "nested": {HUGE: object()}}, epochs=1),
    lambda: cb.GridSearch(build, {"lr": cb.choice([{HUGE: {2: 3}}])}, epochs=1),
    lambda: cb.GridSearch(build, {"lr": cb.choice([{HUGE: object()}])}, epochs=1)],
    ids=["choice", "uniform", "loguniform", "randint", "quniform", "space key", "dict key", "dict value"])
def test_a_100_kb_value_in_a_search_space_is_quoted_by_its_start_and_length(make):
    with pytest.raises((TypeError, ValueError)) as refused:       # it was quoted whole: 100 KB in one message
        make()
    assert "(100002 characters)" in str(refused.value) and len(str(refused.value)) < 1_000, str(refused.value)[:300]


@pytest.mark.parametrize("call", [
    lambda t: cb.GridSearch(build, SPACE, epochs=1, metric=HUGE).fit(
        cb.Dataset.from_numpy(X, Y, partitions=2), workers=1, store=t / "s", verbose=0),
    lambda t: cb.GridSearch(build, SPACE, epochs=1).fit(cb.Dataset.from_numpy(X, Y), backend=HUGE, store=t / "s"),
    lambda t: cb.GridSearch(build, SPACE, epochs=1).fit(cb.Dataset.from_numpy(X, Y), metrics_port=0,
                                                        metrics_host=HUGE, store=t / "s"),
    lambda t: cb.Dataset.from_numpy(X, Y, validation=HUGE),
    lambda t: cb.load(t / HUGE[:200] / HUGE[:200] / HUGE[:200] / HUGE[:200] / HUGE[:200] / HUGE[:200])],
    ids=["metric", "backend", "metrics_host", "validation", "store"])
def test_a_100_kb_argument_is_quoted_by_its_start_and_length(call, tmp_path):
    with pytest.raises((TypeError, ValueError, FileNotFoundError)) as refused:
        call(tmp_path)
    said = str(refused.value)
    assert "characters)" in said and len(said) < 1_000, said[:300]
