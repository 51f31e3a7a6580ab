"""The tests every trainer passes (the trainer waist, scikit-learn's common-tests idea): torch
(``TorchTrainable``), Keras 3 (``KerasTrainable``, on this process's Keras backend) and
docs/extending.md's worked example (``SoftmaxRegression``, numpy). In this process, with no
worker: its state is data with every weight under ``"model"``; the same seed and batches
give the same bits; a state that hops (written and read as a worker sends it) and trains on
gives the bits of the trainer that never let it go; evaluation changes nothing and counts
every row; predictions keep the rows' order; the weights alone give the trained model's
predictions. The whole runs of each are in its own module (test_keras.py, the backends' and
searchers' tests); the worked example's is its section of docs/extending.md, run here."""
from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _docs import module_of_section, run_section
from sklearn.datasets import load_digits

import cerebro as cb
from cerebro.store._state_codec import pack_tensors, read_message, unpack_tensors, write_message
from cerebro.worker import StateMismatchError, Sums
from cerebro.worker._trainable import seed_build

CPU = torch.device("cpu")
BATCH = 16
FEATURES, LABEL = load_digits(return_X_y=True)
FEATURES, LABEL = (FEATURES[:96] / 16.0).astype(np.float32), LABEL[:96]


def torch_trainable() -> cb.TorchTrainable:
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=1e-2), torch.nn.functional.cross_entropy,
                             batch_size=BATCH, metrics={"accuracy": cb.metrics.accuracy})


def keras_trainable() -> cb.KerasTrainable:
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return cb.KerasTrainable(model, batch_size=BATCH)


def worked_example() -> cb.Trainable:
    return module_of_section("docs/extending.md", "A trainer")["SoftmaxRegression"](
        features=64, classes=10, lr=0.5, batch_size=BATCH)


TRAINERS: dict[str, Callable[[], cb.Trainable]] = {
    "torch": torch_trainable, "keras": keras_trainable, "extending": worked_example}


# Keras compiles each new model's training step, seconds each: its cases are in the full suite only.
@pytest.fixture(params=[pytest.param(name, marks=[pytest.mark.slow] if name == "keras" else []) for name in TRAINERS])
def make(request: pytest.FixtureRequest) -> Callable[[], cb.Trainable]:
    """A fresh trainable with the same initial weights each time (the worker seeds every build)."""
    def built() -> cb.Trainable:
        seed_build(0)
        return TRAINERS[request.param]()
    return built


def batches(trainable: cb.Trainable, rows: slice, *, train: bool) -> list[Any]:
    """The rows ``rows`` of the digits as ``trainable`` takes them, in batches of 16."""
    rng = np.random.default_rng(0)
    return [trainable.batch(FEATURES[i:i + BATCH], LABEL[i:i + BATCH], rng, train=train, device=CPU)
            for i in range(rows.start, rows.stop, BATCH)]


def hop(state: Any) -> Any:
    """``state`` written and read back as a worker sends it to the next: data only."""
    written = io.BytesIO()
    write_message(written, pack_tensors(state))
    written.seek(0)
    return unpack_tensors(read_message(written))


def assert_same_bits(a: Any, b: Any, where: str = "state") -> None:
    assert type(a) is type(b) or isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_bits(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_bits(x, y, f"{where}[{index}]")
    else:
        assert a == b, where


def test_the_state_is_data_with_each_weight_under_model(make):
    trainable = make()
    trainable.train_batches(batches(trainable, slice(0, 32), train=True), seed=1, epoch=1)
    state = hop(trainable.state())
    weights = state["model"]
    assert {name: tuple(t.shape) for name, t in weights.items()} == \
        {name: tuple(shape) for name, shape in trainable.weight_shapes().items()}
    assert all(isinstance(t, torch.Tensor) and t.device == CPU for t in weights.values())
    trainable.check_state(state)
    name = next(iter(weights))
    with pytest.raises(StateMismatchError, match=name):
        trainable.check_weights({**weights, name: torch.zeros(3, 3)})
    assert trainable.nbytes() >= sum(t.numel() * t.element_size() for t in weights.values())


def test_the_same_seed_and_batches_give_the_same_bits(make):
    first, second = make(), make()
    for trainable in (first, second):
        sums = trainable.train_batches(batches(trainable, slice(0, 64), train=True), seed=7, epoch=1)
        assert sums.rows == 64 and set(sums.metrics) <= set(trainable.metric_names())
    assert_same_bits(hop(first.state()), hop(second.state()))


def test_a_state_that_hops_trains_on_to_the_bits_of_one_that_stayed(make):
    """Two sub-epochs on one trainable equal the first on it and the second on a fresh one
    that loaded its state: what MOP does at every hop."""
    stayed, fresh = make(), make()
    stayed.train_batches(batches(stayed, slice(0, 48), train=True), seed=1, epoch=1)
    fresh.load_state(hop(stayed.state()))
    sums = [trainable.train_batches(batches(trainable, slice(48, 96), train=True), seed=2, epoch=1)
            for trainable in (stayed, fresh)]
    assert sums[0] == sums[1]
    assert_same_bits(hop(stayed.state()), hop(fresh.state()))


def test_evaluation_changes_nothing_and_counts_every_row(make):
    trainable = make()
    trainable.train_batches(batches(trainable, slice(0, 32), train=True), seed=1, epoch=1)
    before = hop(trainable.state())
    sums = trainable.evaluate_batches(batches(trainable, slice(32, 96), train=False))
    assert isinstance(sums, Sums) and sums.rows == 64 and np.isfinite(sums.loss)
    assert set(sums.metrics) == set(trainable.metric_names()) - set(trainable.exact_metrics())
    assert all(0 <= value <= sums.rows for value in sums.metrics.values())    # accuracy: a row-weighted sum
    assert_same_bits(hop(trainable.state()), before)


def test_predictions_keep_the_rows_order_and_the_weights_alone_give_them(make):
    trainable = make()
    trainable.train_batches(batches(trainable, slice(0, 64), train=True), seed=1, epoch=1)
    whole = trainable.predict_batches(batches(trainable, slice(0, 96), train=False))
    halves = [trainable.predict_batches(batches(trainable, rows, train=False))
              for rows in (slice(0, 48), slice(48, 96))]
    assert isinstance(whole, np.ndarray) and whole.shape == (96, 10)
    np.testing.assert_array_equal(np.concatenate(halves), whole)
    finished = make()
    finished.load_weights(hop(trainable.state())["model"])
    np.testing.assert_array_equal(finished.predict_batches(batches(finished, slice(0, 96), train=False)), whole)
    assert finished.trained_model() is not None


@pytest.mark.slow
def test_the_worked_trainer_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace, printed = run_section("docs/extending.md", "A trainer", 2)
    result = namespace["result"]
    assert [t.status for t in result.trials] == ["completed", "completed"]
    assert result.best.config == {"lr": 0.5, "batch_size": 32} and result.best.metrics["val_accuracy"] > 0.9
    assert printed.splitlines()[0] == f"{result.best.config} val_accuracy {result.best.metrics['val_accuracy']:.3f}"
    predicted = result.best.predict(namespace["X"][:8] / 16.0)
    assert predicted.shape == (8, 10) and np.allclose(predicted.sum(axis=1), 1, atol=1e-5)
    assert printed.splitlines()[1] == f"predicted {predicted.argmax(axis=1)} labels {namespace['y'][:8]}"
    assert isinstance(cb.load("runs/softmax").best.model(), namespace["SoftmaxRegression"])
