"""Keras 3 trials through the trainer waist: invariants 1 and 2 on TensorFlow and JAX, the
searchers, a plain Keras loop, and bad input refused before any worker starts.

The Keras backend is fixed when a process first imports Keras, so runs on other backends
have a driver process of their own (``_keras_run.py``); this process's is TensorFlow.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import cerebro as cb  # noqa: E402

keras = pytest.importorskip("keras")
if keras.backend.backend() != "tensorflow":     # another test module imported Keras first
    pytest.skip("this module's driver needs the TensorFlow backend", allow_module_level=True)

from _keras_models import build, make_model  # noqa: E402
from _models import digits  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "workers"), [("tensorflow", [1, 4]), ("jax", [1, 2])])
def test_keras_mlp_and_cnn_with_dropout_are_bitwise_equal_on_any_worker_count(tmp_path, backend, workers):
    """4 partitions on 1 or 4 workers (JAX: 1 and 2: each worker compiles for long, and 4
    compiling at once on CI's 2 cores took 104 s)."""
    run = subprocess.run([sys.executable, os.path.join(HERE, "_keras_run.py"), str(tmp_path), *map(str, workers)],
                         env={**os.environ, "KERAS_BACKEND": backend}, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    runs = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["workers"] for r in runs] == workers
    for r in runs:
        assert r["backend"] == backend and r["statuses"] == ["completed", "completed"], r["errors"]
    assert len({r["weights"] for r in runs}) == 1 and len({r["history"] for r in runs}) == 1


def fit(tmp_path, searcher: cb.Searcher, workers: int, name: str, data: cb.Dataset | None = None) -> cb.Result:
    return searcher.fit(data or digits(partitions=2, rows=300), workers=workers, store=tmp_path / name, seed=3,
                        verbose=0)


def weights(result: cb.Result) -> list[np.ndarray]:
    return [tensor.numpy() for trial in result.trials for tensor in trial.state_dict().values()]


def assert_same_runs(one: cb.Result, two: cb.Result) -> None:
    assert [t.status for t in one.trials] == [t.status for t in two.trials]
    assert all(np.array_equal(a, b) for a, b in zip(weights(one), weights(two), strict=True))
    assert one.history().equals(two.history())


@pytest.mark.slow
@pytest.mark.parametrize("searcher", [
    cb.ASHA(build, {"lr": cb.loguniform(1e-3, 3e-2)}, num_trials=4, max_epochs=3, reduction_factor=2),
    cb.PBT(build, {"lr": cb.loguniform(1e-3, 3e-2)}, population=3, epochs=4, perturbation_interval=2),
], ids=["asha", "pbt"])
def test_asha_and_pbt_with_keras_trials_are_equal_on_1_and_2_workers(tmp_path, searcher):
    one, two = fit(tmp_path, searcher, 1, "one"), fit(tmp_path, searcher, 2, "two")
    assert {t.status for t in one.trials} <= {"completed", "stopped"}
    assert_same_runs(one, two)
    if isinstance(searcher, cb.PBT):
        assert one.history()["exploited_from"].notna().any()   # an exploit carried Adam's state


@pytest.mark.slow
def test_one_partition_equals_a_plain_keras_loop(tmp_path):
    # A model without dropout: Cerebro reseeds the seed generators every sub-epoch, which a
    # plain loop does not; without them, the two must agree bit for bit.
    from cerebro.data import read_layout, read_partition, sample_order
    from cerebro.engine._seeds import init_seed, subepoch_seed

    result = cb.GridSearch(build, {"architecture": cb.choice(["plain"])}, epochs=2, metric="train_loss").fit(
        digits(partitions=1, rows=300, validation=0.0), workers=1, store=tmp_path / "run", seed=5, verbose=0)
    trial = result.trials[0]

    data_dir = os.path.join(result.run_dir, "data")
    layout = read_layout(data_dir)
    features, label = read_partition(data_dir, "train", 0, layout)
    keras.utils.set_random_seed(init_seed(5, trial.trial_id) % 2**32)
    plain = build({"architecture": "plain"}).model
    for epoch in (1, 2):
        order = sample_order(layout.sample_order, subepoch_seed(5, trial.trial_id, epoch, 0), len(label),
                             layout.row_group_rows, layout.window)
        for start in range(0, len(order), 32):
            rows = order[start:start + 32]
            plain.train_on_batch(features[rows], label[rows])
    made = [v.numpy() for v in plain.weights]
    assert all(np.array_equal(a, b) for a, b in zip(made, weights(result), strict=True))

    # The user gets the Keras model back, and `cerebro export` writes it as a .keras file.
    from click.testing import CliRunner

    from cerebro.cli import main
    assert isinstance(result.best.model(), keras.Model)
    exported = CliRunner().invoke(main, ["export", str(result.run_dir), "-o", str(tmp_path / "best.keras")])
    assert exported.exit_code == 0, exported.output
    loaded = keras.saving.load_model(tmp_path / "best.keras")
    assert all(np.array_equal(v.numpy(), w) for v, w in zip(loaded.weights, made, strict=True))


@pytest.mark.slow
def test_tensorboard_and_mlflow_log_keras_trials_as_they_log_torch_ones(tmp_path):
    from mlflow.tracking import MlflowClient
    from safetensors import safe_open
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = cb.GridSearch(build, {"lr": cb.choice([3e-3, 1e-2])}, epochs=2, metric="val_accuracy", mode="max").fit(
        digits(partitions=2, rows=300), workers=2, store=tmp_path / "run", seed=1, verbose=0, mlflow=True)
    history = result.history()
    client = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("cerebro").experiment_id])
    children = {r.data.tags["cerebro.trial_id"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert sorted(children) == [t.trial_id for t in result.trials]
    for trial in result.trials:
        rows = history[history.trial_id == trial.trial_id]
        scalars = EventAccumulator(os.path.join(result.run_dir, "tensorboard", trial.trial_id))
        scalars.Reload()
        assert sorted(scalars.Tags()["scalars"]) == ["train_accuracy", "train_loss", "train_lr", "val_accuracy",
                                                    "val_loss"]
        expected = [(e, pytest.approx(v, rel=1e-6)) for e, v in zip(rows.epoch, rows.val_accuracy)]
        assert [(s.step, s.value) for s in scalars.Scalars("val_accuracy")] == expected
        in_mlflow = client.get_metric_history(children[trial.trial_id].info.run_id, "val_accuracy")
        assert [(m.step, m.value) for m in in_mlflow] == expected
        assert children[trial.trial_id].data.params["lr"] == json.dumps(trial.config["lr"])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    import mlflow.pyfunc  # the best trial as a pyfunc model, its weights beside it as safetensors
    artifact = client.download_artifacts(parent.info.run_id, "best_model", str(tmp_path / "best"))
    with safe_open(os.path.join(artifact, "artifacts", "weights.safetensors"), "pt") as saved:
        assert all(torch.equal(saved.get_tensor(k), v) for k, v in result.best.state_dict().items())
    rows = np.random.default_rng(0).random((5, 64)).astype(np.float32)
    assert np.array_equal(mlflow.pyfunc.load_model(artifact).predict(rows), result.best.predict(rows))


def test_a_keras_model_that_is_not_compiled_is_refused():
    with pytest.raises(ValueError, match=r"^the Keras model is not compiled with a loss: call model.compile"):
        cb.KerasTrainable(make_model("mlp"), batch_size=32)


def test_a_torch_model_in_keras_trainable_is_refused():
    with pytest.raises(TypeError, match=r"^model must be a keras.Model; got a torch.nn.Module: use cb.TorchTrainable$"):
        cb.KerasTrainable(torch.nn.Linear(4, 2), batch_size=32)


def test_a_keras_model_given_its_optimizer_and_loss_compiles():
    trainable = cb.KerasTrainable(make_model("plain"), batch_size=8, optimizer=keras.optimizers.SGD(0.1),
                                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                  metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(3, name="top3")])
    assert trainable.metric_names() == ("accuracy", "top3")
    assert set(trainable.state()) == {"model", "optimizer"}


def test_a_keras_backend_that_cannot_train_is_refused_before_any_worker_starts(tmp_path):
    code = ("import keras, cerebro as cb\n"
            "model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])\n"
            "model.compile('sgd', 'mse')\n"
            "cb.KerasTrainable(model, batch_size=4)\n")
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, "KERAS_BACKEND": "numpy"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == ("ValueError: Keras backend 'numpy' cannot train; set KERAS_BACKEND "
                                                   "to one of tensorflow, jax, torch")


def test_an_uncompiled_keras_build_fails_the_fit_before_any_worker_starts(tmp_path):
    def uncompiled(config):
        return cb.KerasTrainable(make_model("mlp"), batch_size=32)

    with pytest.raises(ValueError, match="build\\(config\\) fails for the configuration tried on the driver"
                                         ".*the Keras model is not compiled with a loss"):
        cb.GridSearch(uncompiled, {"lr": cb.choice([0.1])}).fit(digits(), workers=2, store=tmp_path / "run",
                                                                 verbose=0)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_sigkilled_worker_then_a_killed_driver_and_resume_give_the_uninterrupted_keras_results(tmp_path):
    from _crash import assert_same_results
    from _keras_run import search
    from chaos import _running, count, journal, live_workers, wait_for
    script = os.path.join(HERE, "_keras_run.py")
    args = ["2", "--epochs", "4", "--rows", "1797"]
    # The uninterrupted run and the resume in this process (its Keras is TensorFlow too), the
    # run to kill in a driver of its own, as _keras_run.py makes it.
    expected = search(4).fit(digits(partitions=4, rows=1797), store=tmp_path / "expected", seed=7, verbose=0,
                             backend=cb.LocalBackend(2, threads_per_worker=1))

    run_dir = str(tmp_path / "faulted" / "2")
    with open(tmp_path / "driver.log", "wb") as log:
        driver = subprocess.Popen([sys.executable, script, str(tmp_path / "faulted"), *args], stdout=log, stderr=log)
        try:
            wait_for(lambda: count(journal(run_dir), "sub_epoch") >= 2 or driver.poll() is not None, 300,
                     "two sub-epochs")
            os.kill(live_workers(journal(run_dir))[0], signal.SIGKILL)
            wait_for(lambda: count(journal(run_dir), "worker_lost") + count(journal(run_dir), "workers_restarted")
                     or driver.poll() is not None, 120, "the driver to notice its lost worker")
            wait_for(lambda: count(journal(run_dir), "epoch_end") >= 3 or driver.poll() is not None, 300,
                     "three epochs")
            assert driver.poll() is None, "the run ended before its driver could be killed"
            orphans = live_workers(journal(run_dir))
            driver.kill()
        finally:
            driver.kill()
            driver.wait(60)
    wait_for(lambda: not any(_running(pid) for pid in orphans), 60, "the dead driver's workers to exit")
    assert not cb.load(run_dir).finished

    result = cb.resume(run_dir, backend=cb.LocalBackend(2, threads_per_worker=1), verbose=0)
    assert count(result.store.events(), "worker_lost") + count(result.store.events(), "workers_restarted") >= 1
    assert_same_results(result, expected)


@pytest.mark.slow
def test_a_keras_run_on_spark_local_mode_equals_the_local_one(tmp_path):
    from _spark import session

    search = cb.GridSearch(build, {"architecture": cb.choice(["mlp", "cnn"])}, epochs=2)
    local = search.fit(digits(partitions=4, rows=400), backend=cb.LocalBackend(2, threads_per_worker=1),
                       store=tmp_path / "local", seed=7, verbose=0)
    spark = session("local[2]")
    try:
        on_spark = search.fit(digits(partitions=4, rows=400), store=tmp_path / "spark", seed=7, verbose=0,
                              backend=cb.SparkBackend(spark, workers=2, threads_per_worker=1))
    finally:
        spark.stop()
    assert {info["launched_by"].split(" of ")[0] for info in on_spark.workers.values()} == {"spark task 0",
                                                                                            "spark task 1"}
    assert [t.status for t in local.trials] == ["completed", "completed"]
    assert_same_runs(local, on_spark)


@pytest.mark.slow
def test_cerebro_demo_with_keras_models_runs_the_demos_grid(tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "cerebro")
    completed = subprocess.run([command, "demo", "--framework", "keras", "--epochs", "1", "--store",
                                str(tmp_path / "run")], capture_output=True, text=True, timeout=600,
                               env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    loaded = cb.load(tmp_path / "run")
    assert loaded.finished and len(loaded.trials) == 8
    assert all(t.status == "completed" for t in loaded.trials)
    assert f"best: {loaded.best.trial_id}" in completed.stdout
    assert isinstance(loaded.best.model(), keras.Model)
    # TensorFlow's start-up banners and retracing warnings: from neither the driver nor a worker
    assert not re.search(r"^[IW]\d{4} |retracing|absl::InitializeLog", completed.stderr, flags=re.M), \
        completed.stderr[-3000:]


def test_a_metric_named_acc_is_logged_as_keras_logs_it():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["acc"])
    trainable = cb.KerasTrainable(model, batch_size=2)
    features, label = np.eye(4, dtype=np.float32), np.array([0, 1, 2, 0])
    sums = trainable.train_batches([(features[:2], label[:2]), (features[2:], label[2:])], seed=0, epoch=0)
    assert trainable.metric_names() == ("acc",) and sums.rows == 4 and set(sums.metrics) == {"acc"}


def test_the_exported_state_keeps_its_values_while_the_model_trains_on():
    # The state is exported as views of the variables where the backend never writes
    # through them; training on must leave what was exported (and not yet sent) as it was.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainable = cb.KerasTrainable(model, batch_size=2)
    features, label = np.eye(4, dtype=np.float32), np.array([0, 1, 2, 0])
    trainable.train_batches([(features, label)], seed=0, epoch=1)
    exported = trainable.state()
    copied = {part: {name: tensor.clone() for name, tensor in values.items()} for part, values in exported.items()}
    trainable.train_batches([(features, label)], seed=1, epoch=1)
    assert all(torch.equal(exported[part][name], copied[part][name]) for part in copied for name in copied[part])
    assert not all(torch.equal(a, b) for a, b in zip(trainable.state()["model"].values(), copied["model"].values()))


@pytest.mark.slow
def test_reduce_lr_on_plateau_runs_at_each_epochs_end_the_same_on_1_and_2_workers(tmp_path):
    """Keras's ReduceLROnPlateau on the epoch's val_loss over every partition: history's
    train_lr halves after each epoch whose val_loss did not rise (mode "max"), as Keras's
    rule says, and 1 and 2 workers give the same bits."""
    search = cb.GridSearch(build, {"architecture": "plain", "lr": cb.choice([3e-3]), "plateau": True}, epochs=4)
    one, two = fit(tmp_path, search, 1, "one"), fit(tmp_path, search, 2, "two")
    assert_same_runs(one, two)
    history = one.history().sort_values("epoch")
    expected, best = [float(np.float32(3e-3))], None
    for loss in history["val_loss"].tolist()[:-1]:
        if best is None or loss - 1e-4 > best:
            best, rate = loss, expected[-1]
        else:
            rate = float(np.float32(expected[-1] * 0.5))
        expected.append(rate)
    assert history["train_lr"].tolist() == expected and expected[-1] < expected[0]


@pytest.mark.parametrize("callback, instead", [
    (keras.callbacks.EarlyStopping(), "give the search early stopping instead: cb.GridSearch(..., patience=N"),
    (keras.callbacks.CSVLogger("log.csv"), "KerasTrainable runs ReduceLROnPlateau only, at each epoch's end"),
])
def test_keras_callbacks_other_than_reduce_lr_on_plateau_are_refused_by_name(callback, instead):
    model = make_model("plain")
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=re.escape(f"callbacks=[{type(callback).__name__}(...)] cannot run per "
                                                   f"sub-epoch on workers: {instead}")):
        cb.KerasTrainable(model, batch_size=32, callbacks=[callback])


def build_exact(config: dict) -> cb.KerasTrainable:
    import torchmetrics
    model = make_model("plain")
    model.compile(keras.optimizers.Adam(config["lr"]), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return cb.KerasTrainable(model, batch_size=32, metrics={
        "acc": "accuracy", "f1": torchmetrics.classification.MulticlassF1Score(10, average="macro"),
        "auroc": torchmetrics.classification.MulticlassAUROC(10, average="macro")})


@pytest.mark.slow
def test_torchmetrics_on_keras_trials_are_exact_over_the_validation_set_and_the_same_on_1_and_2_workers(tmp_path):
    from _models import check_exact_f1_and_auroc
    search = cb.GridSearch(build_exact, {"lr": cb.choice([1e-2, 1e-3])}, epochs=2, metric="val_f1", mode="max")
    one, two = fit(tmp_path, search, 1, "one"), fit(tmp_path, search, 2, "two")
    assert_same_runs(one, two)
    assert one.history().equals(two.history())
    assert {"train_acc", "val_acc", "val_f1", "val_auroc"} <= set(one.history()) and "train_f1" not in one.history()
    check_exact_f1_and_auroc(one, *digits(partitions=2, rows=300).validation_arrays())


def test_an_exact_keras_metric_is_logged_for_validation_only(tmp_path):
    search = cb.GridSearch(build_exact, {"lr": 1e-2}, epochs=1, metric="train_f1", mode="max")
    with pytest.raises(ValueError, match=re.escape("metric='train_f1' is not logged; logged metrics are "
                                                   "['train_loss', 'train_acc', 'val_loss', 'val_acc', 'val_f1', "
                                                   "'val_auroc']")):
        fit(tmp_path, search, 1, "run")


def test_a_torchmetrics_metric_in_a_keras_metrics_list_is_refused_for_want_of_a_name():
    import torchmetrics
    model = make_model("plain")
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match=re.escape("metrics=[... MulticlassF1Score(...) ...]: a torchmetrics Metric "
                                                   "needs a name to be logged under; give metrics as a dict, e.g. "
                                                   "{'f1': MulticlassF1Score(...)}")):
        cb.KerasTrainable(model, batch_size=32, metrics=["accuracy", torchmetrics.classification.MulticlassF1Score(10)])


def test_keras_metrics_given_as_a_dict_are_logged_under_its_keys_and_the_compiled_loss_is_kept():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainable = cb.KerasTrainable(model, batch_size=2, metrics={"hit_rate": "accuracy"})
    features, label = np.eye(4, dtype=np.float32), np.array([0, 1, 2, 0])
    sums = trainable.evaluate_batches([(features, label)])
    assert trainable.metric_names() == ("hit_rate",) and set(sums.metrics) == {"hit_rate"} and sums.rows == 4
    assert isinstance(model.loss, keras.losses.SparseCategoricalCrossentropy)


def keras_classifier(width: int = 64, classes: int = 10, loss="sparse_categorical_crossentropy") -> keras.Model:
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(classes)])
    model.compile("adam", loss)
    return model


def digits_with(label: np.ndarray) -> cb.Dataset:
    features = digits(partitions=None, rows=60, validation=0.0).train_arrays()[0]
    return cb.Dataset.from_numpy(features, label, partitions=2, seed=0)


DIGITS = digits(partitions=None, rows=60, validation=0.0).train_arrays()[1]


@pytest.mark.parametrize("made, label, message", [
    ({}, DIGITS + 2,
     "the labels hold class indices 2..11 but the model outputs 10 values per row, one per class 0..9; give its "
     "last layer 12 outputs, or encode the classes as 0..9"),
    ({"width": 32}, DIGITS,
     "the model takes rows of shape (32,) (its keras.Input) but the features have rows of shape (64,): build it "
     "with keras.Input((64,)), or give it rows of shape (32,)"),
    ({}, DIGITS.astype(np.float64),
     "the label is float32 but loss=sparse_categorical_crossentropy takes class indices; encode the classes as "
     "integers 0..K-1: y.astype(int), or for Spark ML's double labels (StringIndexer's), "
     "df.withColumn('label', df['label'].cast('int')) before from_spark"),
    ({"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}, DIGITS - 1,
     "the labels hold class indices -1..8 but a class index cannot be negative: the model outputs 10 values per "
     "row, one per class 0..9; encode the classes as 0..9 (e.g. y - y.min())"),
    ({}, np.eye(10, dtype=np.int64)[DIGITS],
     "the labels are one-hot (int64, shape (rows, 10)) but loss=sparse_categorical_crossentropy takes one class "
     "index a row, shape (rows,): give y.argmax(1), or compile the model with loss='categorical_crossentropy'"),
    ({"loss": "categorical_crossentropy"}, DIGITS,
     "loss=categorical_crossentropy takes one-hot labels, shape (rows, classes), but the labels are int64 class "
     "indices, shape (rows,): compile the model with loss='sparse_categorical_crossentropy', or give "
     "keras.utils.to_categorical(y)"),
    ({"loss": keras.losses.CategoricalCrossentropy()}, np.eye(12, dtype=np.float32)[DIGITS],
     "the labels have 12 values a row, one per class, but the model outputs 10; give its last layer 12 outputs"),
], ids=["classes beyond the outputs", "another input width", "float labels for a sparse loss", "negative labels",
        "one-hot labels for a sparse loss", "class indices for a one-hot loss", "one-hot rows wider than the outputs"])
def test_rows_a_keras_model_cannot_train_on_are_refused_on_the_driver_as_torch_trials_are(tmp_path, made, label,
                                                                                           message):
    search = cb.GridSearch(lambda config: cb.KerasTrainable(keras_classifier(**made), batch_size=8), {"lr": 0.1},
                           epochs=1)
    with pytest.raises(ValueError) as refused:
        search.fit(digits_with(label), workers=1, store=tmp_path / "run", verbose=0)
    assert str(refused.value) == message
    assert not (tmp_path / "run").exists()       # no worker started, nothing written


def test_a_keras_run_goes_on_where_some_configurations_fit_the_rows():
    """The driver refuses the rows only where every configuration tried is refused: here the
    first has too few outputs, the second fits (the first's trials fail on their own)."""
    from cerebro.engine._preflight import check_build

    def build(config):
        return cb.KerasTrainable(keras_classifier(classes=config["classes"]), batch_size=8)

    configs = [{"classes": 5}, {"classes": 10}]
    assert check_build(build, configs, "val_loss", digits(partitions=2, rows=60)).model.outputs[0].shape[-1] == 5
    with pytest.raises(ValueError, match=r"^the labels hold class indices 0\.\.9 but the model outputs 5 values"):
        check_build(build, configs[:1], "val_loss", digits(partitions=2, rows=60))


QUIET = """
import numpy as np
import cerebro
import keras
for _ in range(7):        # a new model each time: TensorFlow warns of retracing from the fifth on
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.predict_on_batch(np.zeros((1, 4), np.float32))
print("predicted")
"""


@pytest.mark.slow
def test_tensorflows_start_up_lines_and_retracing_warnings_stay_out_of_the_terminal_unless_asked_for():
    """Two fresh processes, as a user's script: TensorFlow imported after Cerebro prints none
    of its banners nor its retracing warnings; TF_CPP_MIN_LOG_LEVEL=0 shows them."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | {"KERAS_BACKEND": "tensorflow"}
    quiet = subprocess.run([sys.executable, "-c", QUIET], env=env, capture_output=True, text=True, timeout=300)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "predicted\n", "")
    shown = subprocess.run([sys.executable, "-c", QUIET], env=env | {"TF_CPP_MIN_LOG_LEVEL": "0"},
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0 and "oneDNN" in shown.stderr and "triggered tf.function retracing" in shown.stderr
