"""A Keras model's leading ``trainable=False`` layers computed once per partition (DESIGN
invariant 11, :mod:`cerebro.worker._keras_frozen`): found without any argument, the same
results as the run with materialization switched off (``CEREBRO_MATERIALIZE=0``), the frozen
layers run once per row of each partition, shared by the trials whose frozen layers are the
same, and a model that is not a chain trains as it is.

This process's Keras backend is TensorFlow (see ``test_keras.py``).
"""
from __future__ import annotations

import json
import os
import re
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

import tensorflow as tf  # noqa: E402
from _models import digits  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from cerebro.data import open_partition, read_layout  # noqa: E402
from cerebro.engine._preflight import PREFLIGHT_ROWS  # noqa: E402
from cerebro.worker._frozen import DRAWS_ROWS, Materialized  # noqa: E402
from cerebro.worker._keras_frozen import KerasFrozenPart, StoredBatch  # noqa: E402

CPU = torch.device("cpu")


class Counted(keras.layers.Layer):
    """An identity that writes the rows of each call run eagerly to ``path``: the frozen layers
    a worker runs itself, not inside a compiled training or test step."""

    def __init__(self, path: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.count_to = path

    def call(self, x):
        if self.count_to and tf.executing_eagerly():
            with open(self.count_to, "a") as f:
                f.write(f"{x.shape[0]}\n")
        return x

    def get_config(self) -> dict:
        return {**super().get_config(), "path": self.count_to}


def rows_seen(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(int(line) for line in f)


def pretrained(depth: int = 2, count: str = "") -> list:
    """The frozen base: the same weights in every build ("pretrained"), ``depth`` Dense layers."""
    keras.utils.set_random_seed(11)
    layers = [Counted(count), keras.layers.Dense(48, activation="relu"), keras.layers.Dense(32, activation="relu")]
    for layer in layers:
        layer.trainable = False
    return layers[:depth + 1]


def compiled(model: keras.Model, lr: float) -> cb.KerasTrainable:
    model.compile(keras.optimizers.Adam(lr), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return cb.KerasTrainable(model, batch_size=32)


def make(arch: str, lr: float = 3e-3, count: str = "", depth: int = 2) -> cb.KerasTrainable:
    """``seq``: a Sequential model, frozen Dense layers then a head with dropout; ``nested``: a
    functional chain on a frozen base model with BatchNormalization; ``branch``: a frozen
    layer then two branches (not a chain: no frozen part)."""
    inputs = keras.Input((64,))
    if arch == "seq":
        base = pretrained(depth, count)
        keras.utils.set_random_seed(5)
        return compiled(keras.Sequential([inputs, *base, keras.layers.Dense(16, activation="relu"),
                                          keras.layers.Dropout(0.2), keras.layers.Dense(10)]), lr)
    if arch == "nested":
        base = keras.Sequential([keras.Input((64,)), *pretrained()[1:2], keras.layers.BatchNormalization()])
        base.layers[-1].moving_mean.assign(np.full(48, 0.25, np.float32))     # statistics of "pretraining"
        base.trainable = False
        keras.utils.set_random_seed(5)
        return compiled(keras.Model(inputs, keras.layers.Dense(10)(base(inputs, training=False))), lr)
    hidden = pretrained(1)[1](inputs)
    keras.utils.set_random_seed(5)
    joined = keras.layers.Concatenate()([keras.layers.Dense(16)(hidden), keras.layers.Dense(16)(hidden)])
    return compiled(keras.Model(inputs, keras.layers.Dense(10)(joined)), lr)


def build(config: dict) -> cb.KerasTrainable:
    """``seq_fast``: ``seq`` at another learning rate, with the same frozen layers."""
    arch = config["arch"]
    return make(arch.removesuffix("_fast"), 1e-2 if arch.endswith("_fast") else 3e-3, config["count"])


def batches(features: np.ndarray, label: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(features[i:i + 32], label[i:i + 32]) for i in range(0, len(label), 32)]


# --- the parts ------------------------------------------------------------------------------
def test_the_frozen_prefix_is_found_in_sequential_and_chain_models_and_not_elsewhere():
    assert len(make("seq").frozen_part().layers) == 3            # the counter and two Dense layers
    nested = make("nested").frozen_part()
    assert len(nested.layers) == 1 and isinstance(nested.layers[0], keras.Sequential)
    assert make("branch").frozen_part() is None
    dropped = keras.Sequential([keras.Input((64,)), keras.layers.Dropout(0.5), keras.layers.Dense(10)])
    dropped.layers[0].trainable = False          # frozen, but it draws in training: not computed once
    assert compiled(dropped, 1e-3).frozen_part() is None
    plain = make("seq")
    assert plain.frozen_part().head.optimizer is plain.model.optimizer

    class Subclassed(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.base, self.out = pretrained(1)[1], keras.layers.Dense(10)

        def call(self, x):
            return self.out(self.base(x))
    subclassed = Subclassed()
    subclassed.build((None, 64))
    assert compiled(subclassed, 1e-3).frozen_part() is None


def test_digests_are_equal_for_equal_weights_whatever_the_layer_names_and_chained():
    one, two = make("seq").frozen_part(), make("seq").frozen_part()
    assert one.layers[1].name != two.layers[1].name
    assert len(one.digests()) == 3 and one.digests() == two.digests()
    assert make("seq", depth=1).frozen_part().digests() == one.digests()[:2]
    kernel = two.layers[2].kernel
    kernel.assign(kernel.numpy() + np.eye(*kernel.shape, dtype=np.float32) * 1e-6)
    changed = KerasFrozenPart(two.layers, two.head).digests()
    assert changed[:2] == one.digests()[:2] and changed[2] != one.digests()[2]
    assert make("nested").frozen_part().digests() == make("nested").frozen_part().digests()


@pytest.mark.parametrize("arch", ["seq", "nested"])
def test_the_head_on_stored_outputs_trains_and_evaluates_bitwise_as_the_whole_model(arch):
    features = np.random.default_rng(0).random((160, 64), dtype=np.float32)
    label = np.random.default_rng(1).integers(0, 10, 160)
    ours, plain = make(arch), make(arch)
    outputs = ours.frozen_part().run_from(0, features, CPU)
    stored = [StoredBatch(batch) for batch in batches(outputs, label)]
    for epoch in (1, 2):
        assert ours.train_batches(stored, 7 + epoch, epoch) == plain.train_batches(batches(features, label),
                                                                                  7 + epoch, epoch)
    assert ours.evaluate_batches(stored) == plain.evaluate_batches(batches(features, label))
    mine, theirs = ours.state(), plain.state()
    for part in ("model", "optimizer"):         # every weight, the frozen ones too, as without a frozen part
        assert mine[part].keys() == theirs[part].keys()
        assert all(torch.equal(mine[part][k], theirs[part][k]) for k in mine[part])
    assert len(mine["model"]) == len(ours.model.weights)
    assert ours.model.train_function is None and ours.frozen_part().head.train_function is not None


@pytest.fixture
def partition(tmp_path):
    data_dir = str(tmp_path / "data")
    digits(partitions=1, rows=300).write(data_dir, 1)
    return open_partition(read_layout(data_dir), data_dir, "train", 0, True)


def test_outputs_are_computed_once_shared_by_equal_prefixes_and_a_deeper_from_a_shallower(partition, tmp_path,
                                                                                          monkeypatch):
    count = str(tmp_path / "count")
    kept = Materialized(budget=1 << 30)
    checked = 2 * DRAWS_ROWS        # whether a prefix draws: its first rows run twice, once per prefix
    shallow = kept.for_trial(make("seq", count=count, depth=1), 0, "train", partition, CPU)
    assert rows_seen(count) == partition.rows + checked and kept.computed == 1
    again = kept.for_trial(make("seq", 1e-2, count=count, depth=1), 0, "train", partition, CPU)
    assert again.features is shallow.features and kept.computed == 1
    deep = kept.for_trial(make("seq", count=count), 0, "train", partition, CPU)
    assert kept.computed == 2 and rows_seen(count) == partition.rows + 2 * checked     # from the kept prefix
    whole = make("seq").frozen_part().run_from(0, partition.features.astype(np.float32), CPU)
    assert np.array_equal(deep.features, whole) and np.array_equal(deep.label, partition.label)
    monkeypatch.setenv("CEREBRO_MATERIALIZE", "0")
    assert kept.for_trial(make("seq"), 0, "train", partition, CPU) is None


# --- whole runs -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same grid with materialization and without: two Sequential trials sharing their
    frozen layers, a nested base model, and a model that is not a chain."""
    scratch = tmp_path_factory.mktemp("frozen-keras")
    space = {"arch": cb.choice(["seq", "seq_fast", "nested", "branch"]), "count": cb.choice([str(scratch / "rows")])}
    searcher = cb.GridSearch(build, space, epochs=2, metric="val_accuracy", mode="max")
    data = digits(partitions=2, rows=300)
    frozen = searcher.fit(data, workers=2, store=scratch / "frozen", seed=0, verbose=0)
    seen = rows_seen(str(scratch / "rows"))
    os.environ["CEREBRO_MATERIALIZE"] = "0"
    try:
        plain = searcher.fit(data, workers=2, store=scratch / "plain", seed=0, verbose=0)
    finally:
        del os.environ["CEREBRO_MATERIALIZE"]
    return frozen, plain, seen, rows_seen(str(scratch / "rows")) - seen


@pytest.mark.slow
def test_a_keras_run_with_frozen_layers_equals_it_without_materialization_bitwise(runs, tmp_path):
    frozen, plain, _, _ = runs
    assert [t.status.value for t in frozen.trials] == ["completed"] * 4, [t.error for t in frozen.trials]
    assert frozen.history().equals(plain.history())
    for ours, theirs in zip(frozen.trials, plain.trials, strict=True):
        mine, others = ours.state_dict(), theirs.state_dict()
        assert mine.keys() == others.keys() and all(torch.equal(mine[k], others[k]) for k in mine)
    features = digits(partitions=1).validation_arrays()[0][:50]
    assert np.array_equal(frozen.best.predict(features), plain.best.predict(features))
    seq = next(t for t in frozen.trials if t.config["arch"] == "seq")
    seq.save_weights(tmp_path / "seq.safetensors")          # every weight, the frozen ones too
    saved = load_file(tmp_path / "seq.safetensors")
    assert saved.keys() == seq.state_dict().keys() and len(saved) == len(seq.model().weights)


@pytest.mark.slow
def test_the_frozen_layers_run_once_per_row_of_each_partition_for_all_trials_that_share_them(runs):
    _, _, materialized, switched_off = runs
    # 300 rows (train and validation of both partitions), each through the counter once for
    # the two Sequential trials (the nested and branch ones have none), and the first rows
    # twice where each worker, and the driver on its preflight rows, tell whether the frozen
    # layers draw; switched off, the frozen layers run only inside the compiled steps, on
    # every batch, and never eagerly.
    assert materialized == 300 + 2 * 2 * DRAWS_ROWS + 2 * min(DRAWS_ROWS, PREFLIGHT_ROWS) and switched_off == 0


# JAX's CPU matmuls give a row other bits in a batch of another size, and jitted than not:
# the head's run there is within 1e-6 of the whole model's, not bitwise.
JAX_HEAD_AGAINST_WHOLE = """
import json, numpy as np, keras, torch, cerebro as cb
from sklearn.datasets import load_digits
from cerebro.worker._keras_frozen import StoredBatch
def make():
    keras.utils.set_random_seed(11)
    frozen = [keras.layers.Dense(48, activation="relu"), keras.layers.Dense(32, activation="relu")]
    for layer in frozen:
        layer.trainable = False
    model = keras.Sequential([keras.Input((64,)), *frozen, keras.layers.Dropout(0.2), keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return cb.KerasTrainable(model, batch_size=32)
features, label = load_digits(return_X_y=True)
features, label = (features[:600] / 16).astype(np.float32), label[:600]
ours, whole = make(), make()
stored = ours.frozen_part().run_from(0, features, torch.device("cpu"))
worst = 0.0
for epoch in (1, 2, 3):
    order = np.random.default_rng(epoch).permutation(len(label))
    rows = [order[i:i + 32] for i in range(0, len(order), 32)]
    a = ours.train_batches([StoredBatch((stored[r], label[r])) for r in rows], epoch, epoch)
    b = whole.train_batches([(features[r], label[r]) for r in rows], epoch, epoch)
    worst = max(worst, abs(a.loss - b.loss) / a.rows, abs(a.metrics["accuracy"] - b.metrics["accuracy"]) / a.rows)
weights = max(float((x - y).abs().max()) for x, y in zip(ours.state()["model"].values(),
                                                         whole.state()["model"].values()))
print(json.dumps({"backend": keras.backend.backend(), "metrics": worst, "weights": weights}))
"""


@pytest.mark.slow
def test_on_jax_the_head_trains_within_1e_6_of_the_whole_model():
    run = subprocess.run([sys.executable, "-c", JAX_HEAD_AGAINST_WHOLE], env={**os.environ, "KERAS_BACKEND": "jax"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(run.stdout.splitlines()[-1])
    assert measured["backend"] == "jax" and measured["metrics"] <= 1e-6 and measured["weights"] <= 1e-6, measured


# --- told apart by everything that computes them ----------------------------------------------
class Scaled(keras.layers.Layer):
    """A user's layer whose function is a private attribute, absent from its configuration."""

    factor = 1.0          # a class default each layer's own value hides

    def call(self, x):
        return x * self._factor * self.factor * self.table["gain"] * self.gains[0] * self.box.gain


class Box:
    def __init__(self, gain: float) -> None:
        self.gain = gain


def scaled(attribute: str = "", value: object = None, nested: bool = False, lr: float = 3e-3) -> cb.KerasTrainable:
    """Frozen Dense then ``Scaled`` (``attribute`` set to ``value``), or the two as one frozen
    base model (``nested``), then a trained head."""
    keras.utils.set_random_seed(11)
    dense, layer = keras.layers.Dense(48, activation="relu"), Scaled()
    layer._factor, layer.table, layer.gains, layer.box = 1.0, {"gain": 1.0}, [1.0], Box(1.0)
    if attribute:
        setattr(layer, attribute, value)
    inputs = keras.Input((64,))
    if nested:
        base = keras.Sequential([keras.Input((64,)), dense, layer])
        base.trainable = False
        hidden = base(inputs, training=False)
    else:
        for frozen in (dense, layer):
            frozen.trainable = False
        hidden = layer(dense(inputs))
    keras.utils.set_random_seed(5)
    return compiled(keras.Model(inputs, keras.layers.Dense(10)(hidden)), lr)


@pytest.mark.parametrize("attribute, one, other", [
    ("_factor", 0.01, 10.0), ("factor", 0.01, 10.0), ("table", {"gain": 0.01}, {"gain": 10.0}),
    ("gains", [0.01], [10.0]), ("_factor", np.float32(0.01), np.float32(10.0)), ("box", Box(0.01), Box(10.0)),
], ids=["private", "hiding a class default", "dict", "list", "numpy scalar", "plain object"])
@pytest.mark.parametrize("nested", [False, True], ids=["in the model", "in a base model"])
def test_frozen_keras_layers_differing_in_an_attribute_their_config_leaves_out_have_other_digests(attribute, one,
                                                                                                   other, nested):
    first, second, again = (scaled(attribute, v, nested).frozen_part() for v in (one, other, one))
    assert first.digests() != second.digests() and first.digests() == again.digests()
    assert first.unfaithful is None and second.unfaithful is None
    features = np.random.default_rng(0).random((4, 64), dtype=np.float32)
    assert not np.array_equal(first.run_from(0, features, CPU), second.run_from(0, features, CPU))


def test_a_frozen_keras_layer_holding_what_cannot_be_compared_is_neither_shared_nor_materialized(partition):
    import threading
    made = [scaled("lock", threading.Lock()) for _ in range(2)]
    said = made[0].frozen_part().unfaithful
    assert said is not None and re.match(r"^frozen layer scaled(_\d+)?\.lock is a _thread\.lock, whose state is held "
                                         r"by compiled code", said)
    assert made[0].frozen_part().digests() != made[1].frozen_part().digests()
    kept = Materialized(budget=1 << 30)
    assert all(kept.for_trial(trainable, 0, "train", partition, CPU) is None for trainable in made)
    assert kept.computed == 0


@pytest.mark.slow
@pytest.mark.parametrize("opaque", [False, True], ids=["digested", "unfaithful"])
def test_keras_trials_whose_frozen_layers_differ_in_a_private_attribute_give_the_plain_runs_results(opaque, tmp_path,
                                                                                                    caplog):
    import logging
    import threading

    def build(config: dict) -> cb.KerasTrainable:
        trainable = scaled("_factor", config["scale"], lr=1e-2)
        if opaque:
            trainable.model.layers[2].lock = threading.Lock()
        return trainable
    searcher = cb.GridSearch(build, {"scale": cb.choice([0.01, 10.0])}, epochs=2, metric="val_accuracy", mode="max")
    data = digits(partitions=2, rows=300)
    with caplog.at_level(logging.WARNING, logger="cerebro"):
        frozen = searcher.fit(data, workers=1, store=tmp_path / "frozen", seed=0, verbose=0)
    said = [r.getMessage() for r in caplog.records if "cannot be told apart" in r.getMessage()]
    assert said == ([] if not opaque else [said[0]])
    assert not opaque or re.search(r"\(frozen layer scaled(_\d+)?\.lock is a _thread\.lock", said[0])
    os.environ["CEREBRO_MATERIALIZE"] = "0"
    try:
        plain = searcher.fit(data, workers=1, store=tmp_path / "plain", seed=0, verbose=0)
    finally:
        del os.environ["CEREBRO_MATERIALIZE"]
    assert frozen.history().equals(plain.history())
    accuracies = frozen.history().groupby("scale")["val_accuracy"].last()
    assert accuracies[0.01] != accuracies[10.0]


class Noisy(keras.layers.Layer):
    """Noise drawn from Keras's global generator: no seed generator of its own to tell it by."""

    def call(self, x):
        return x + keras.random.normal(keras.ops.shape(x))


def test_a_frozen_keras_layer_that_draws_without_a_seed_generator_is_not_materialized(partition):
    keras.utils.set_random_seed(11)
    layers = [keras.layers.Dense(48, activation="relu"), Noisy()]
    for layer in layers:
        layer.trainable = False
    model = keras.Sequential([keras.Input((64,)), *layers, keras.layers.Dense(10)])
    trainable = compiled(model, 1e-3)
    assert len(trainable.frozen_part().layers) == 2 and trainable.frozen_part().unfaithful is None
    kept = Materialized(budget=1 << 30)
    assert kept.for_trial(trainable, 0, "train", partition, CPU) is None and kept.computed == 0
    assert kept.for_trial(make("seq"), 0, "train", partition, CPU) is not None and kept.computed == 1
