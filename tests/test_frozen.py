"""Frozen layers computed once per partition (``TorchTrainable(frozen=...)``, DESIGN invariant
11): the same results as the plain model with those layers frozen inside it, the frozen
layers run once per row of each partition instead of once per batch of every epoch of every
trial, freeze depth as a hyperparameter (a deeper prefix computed from a shallower one's
outputs), heads-only checkpoints, and every way out (model(), predict, safetensors,
TorchScript, ONNX) composing the frozen layers and the head."""
from __future__ import annotations

import collections
import logging
import os
import re
import threading

import numpy as np
import pytest
import torch
from _frozen_models import Scale, backbone, both_builds, builds, scaled_builds
from _models import digits
from safetensors.torch import load_file

import cerebro as cb
from cerebro.data import InMemoryPartition, open_partition, read_layout
from cerebro.worker._fingerprint import fingerprint
from cerebro.worker._frozen import FrozenPart, Materialized, _Kept, draws

SPACE = {"lr": cb.choice([1e-2, 3e-3]), "depth": cb.choice([2, 4])}


def rows_seen(path: str) -> int:
    with open(path) as f:
        return sum(int(line) for line in f)


# --- the parts ------------------------------------------------------------------------------
def test_a_frozen_prefix_has_a_digest_per_layer_chained_equal_only_for_equal_weights():
    one, two = backbone(), backbone()
    assert FrozenPart(one).digests() == FrozenPart(two).digests()
    assert FrozenPart(one[:2]).digests() == FrozenPart(one).digests()[:2]
    with torch.no_grad():
        two[3].weight[0, 0] += 1e-6
    assert FrozenPart(two).digests()[:3] == FrozenPart(one).digests()[:3]
    assert FrozenPart(two).digests()[3] != FrozenPart(one).digests()[3]


def _differ_only_in(change) -> tuple[FrozenPart, FrozenPart]:
    one, two = backbone(), backbone()
    change(two[1])
    return FrozenPart(one), FrozenPart(two)


@pytest.mark.parametrize("change", [
    pytest.param(lambda layer: setattr(layer, "eps", 1e-3), id="a plain attribute"),
    pytest.param(lambda layer: setattr(layer, "note", ("a", Scale(2.0))), id="a tuple holding a module"),
    pytest.param(lambda layer: layer.register_forward_hook(lambda module, inputs, out: out * 2), id="a forward hook"),
    pytest.param(lambda layer: layer.register_forward_pre_hook(lambda module, inputs: None), id="a pre hook"),
    pytest.param(lambda layer: layer.register_buffer("shift", torch.zeros(48), persistent=False),
                 id="a non-persistent buffer"),
    pytest.param(lambda layer: layer.register_parameter("gain", torch.nn.Parameter(torch.ones(1), requires_grad=False)),
                 id="a parameter that requires no grad"),
    pytest.param(lambda layer: setattr(layer, "forward", lambda x: x), id="a forward of its own"),
])
def test_frozen_layers_that_differ_in_anything_that_computes_them_have_other_digests(change):
    one, two = _differ_only_in(change)
    assert one.digests()[:1] == two.digests()[:1] and one.digests()[1:] != two.digests()[1:]
    assert one.unfaithful is None and two.unfaithful is None


class _Slotted(torch.nn.Module):
    __slots__ = ("__factor",)          # stored as _Slotted__factor

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.__factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.__factor


def _made_in_build(factor: float) -> torch.nn.Module:
    class Act:                         # a helper class of build's: other code per factor
        @staticmethod
        def f(x: torch.Tensor) -> torch.Tensor:
            return x * factor

    class Backbone(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return Act.f(x)
    return Backbone()


def _hooked_sequential(factor: float) -> torch.nn.Module:
    torch.manual_seed(0)
    chain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    chain.register_forward_hook(lambda module, inputs, out: out * factor)
    return chain


class _Defaulted(torch.nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.table = collections.defaultdict(lambda: factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.table["unseen"]


@pytest.mark.parametrize("make", [Scale, _Slotted, _made_in_build, _hooked_sequential, _Defaulted],
                         ids=["attribute", "private slot", "helper class made in build", "hook on the Sequential",
                              "defaultdict's factory"])
def test_frozen_modules_computing_other_outputs_never_share_a_digest(make):
    one, two, again = FrozenPart(make(1.0)), FrozenPart(make(-0.0)), FrozenPart(make(1.0))
    assert one.digests() != two.digests() and one.digests() == again.digests()
    assert one.unfaithful is None and two.unfaithful is None
    x = torch.ones(1, 4)
    assert not torch.equal(one(x), two(x))
    assert torch.equal(torch.from_numpy(one.run_from(0, x, torch.device("cpu"))), one(x))


def test_a_plain_attribute_tells_two_frozen_layers_apart_and_equal_builds_share():
    assert FrozenPart(Scale(0.01)).digests() != FrozenPart(Scale(10.0)).digests()
    assert FrozenPart(Scale(0.5)).digests() == FrozenPart(Scale(0.5)).digests()
    assert fingerprint(torch.nn.Dropout(0.5).train()) != fingerprint(torch.nn.Dropout(0.5).eval())
    hooked = [backbone(), backbone()]
    for model in hooked:       # equal hooks registered in two builds: the handles' numbers differ, not the code
        model[0].register_forward_hook(lambda module, inputs, out: out + 1)
    assert FrozenPart(hooked[0]).digests() == FrozenPart(hooked[1]).digests()


@pytest.mark.parametrize("holding, said", [
    (lambda layer: setattr(layer, "lock", threading.Lock()),
     r"^frozen layer 2 \(Scale\)\.lock is a _thread\.lock, whose state is held by compiled code"),
    (lambda layer: setattr(layer, "hook", (lambda lock: lambda x: (lock, x)[1])(threading.Lock())),
     r"^frozen layer 2 \(Scale\)\.hook's closure lock is a _thread\.lock"),
    (lambda layer: torch.manual_seed(0) and setattr(layer, "inner", torch.jit.script(torch.nn.Linear(2, 2))),
     r"^frozen layer 2 \(Scale\)\._modules\['inner'\] is TorchScript"),
])
def test_a_frozen_layer_holding_what_cannot_be_compared_is_neither_shared_nor_materialized(holding, said, partition):
    made = []
    for factor in (0.01, 10.0):
        layer = Scale(factor)
        holding(layer)
        made.append(FrozenPart(torch.nn.Sequential(*backbone()[:2], layer)))
    assert all(re.match(said, frozen.unfaithful) for frozen in made)
    # Digested by class and weights alone (what names their stored copy), so never shared or kept:
    assert made[0].digests() == made[1].digests()
    kept = Materialized()
    for frozen in made:
        head = torch.nn.Linear(48, 10)
        trainable = cb.TorchTrainable(head, torch.optim.SGD(head.parameters(), lr=0.1),
                                      torch.nn.functional.cross_entropy, batch_size=8, frozen=frozen.module)
        kept.share(trainable)
        assert trainable.frozen is frozen.module
        assert kept.for_trial(trainable, 0, "train", partition, torch.device("cpu")) is None
    assert kept.computed == 0


def test_frozen_must_be_a_module_and_is_kept_out_of_the_state_that_hops():
    head = torch.nn.Linear(32, 10)
    with pytest.raises(TypeError, match=r"^frozen must be a torch.nn.Module \(the layers to keep frozen\), or None; "
                                        r"got str$"):
        cb.TorchTrainable(head, torch.optim.SGD(head.parameters(), lr=0.1), torch.nn.functional.cross_entropy,
                          batch_size=8, frozen="resnet18")
    frozen = backbone()
    trainable = cb.TorchTrainable(head, torch.optim.SGD(head.parameters(), lr=0.1),
                                  torch.nn.functional.cross_entropy, batch_size=8, frozen=frozen)
    assert set(trainable.state()["model"]) == {"weight", "bias"}
    assert not any(p.requires_grad for p in frozen.parameters()) and not frozen.training
    features = np.random.default_rng(0).random((5, 64), dtype=np.float32)
    composed = trainable.trained_model()
    assert torch.equal(composed(torch.from_numpy(features)), head(frozen(torch.from_numpy(features))))
    assert set(trainable.trained_weights()) == {f"0.{k}" for k in frozen.state_dict()} | {"1.weight", "1.bias"}


def test_a_transform_that_draws_from_its_rng_is_told_from_one_that_does_not():
    features = np.random.default_rng(0).random((8, 64), dtype=np.float32)
    assert not draws(None, features)
    assert not draws(lambda x, rng: x * 2, features)
    assert draws(lambda x, rng: x + rng.normal(size=x.shape).astype(np.float32), features)


@pytest.fixture
def partition(tmp_path) -> InMemoryPartition:
    """One partition of the digits, held in memory as a worker holds it."""
    data_dir = str(tmp_path / "data")
    digits(partitions=1, rows=300).write(data_dir, 1)
    return open_partition(read_layout(data_dir), data_dir, "train", 0, True)


def test_outputs_are_computed_once_and_a_deeper_prefix_from_a_shallower_ones(partition, tmp_path):
    count = str(tmp_path / "count")
    layers = backbone(count)
    kept, cpu = Materialized(budget=1 << 30), torch.device("cpu")
    shallow = kept.source(FrozenPart(layers[:3]), None, 0, "train", partition, cpu)
    assert rows_seen(count) == partition.rows
    expected = backbone()[:2](torch.from_numpy(partition.features.astype(np.float32))).detach().numpy()
    assert np.allclose(shallow.features, expected, rtol=0, atol=1e-6)
    assert np.array_equal(shallow.label, partition.label)
    again = kept.source(FrozenPart(backbone(count)[:3]), None, 0, "train", partition, cpu)
    assert again.features is shallow.features and kept.computed == 1 and rows_seen(count) == partition.rows
    deep = kept.source(FrozenPart(backbone(count)), None, 0, "train", partition, cpu)
    assert kept.computed == 2 and rows_seen(count) == partition.rows        # from the kept prefix
    full = backbone()(torch.from_numpy(partition.features.astype(np.float32))).detach().numpy()
    assert np.allclose(deep.features, full, rtol=0, atol=1e-6)
    for seed in (1, 2):        # the sample order of the stored partition, row for row
        ours = [label for _, label in deep.train_batches(seed, 32)]
        stored = [label for _, label in partition.train_batches(seed, 32)]
        assert all(np.array_equal(a, b) for a, b in zip(ours, stored, strict=True))


def test_a_streamed_partitions_outputs_are_mapped_from_local_disk_and_removed_with_the_worker(tmp_path):
    data_dir = str(tmp_path / "data")
    digits(partitions=1, rows=300).write(data_dir, 1)
    streamed = open_partition(read_layout(data_dir), data_dir, "train", 0, False)
    in_memory = open_partition(read_layout(data_dir), data_dir, "train", 0, True)
    kept, cpu = Materialized(budget=1 << 30), torch.device("cpu")
    mapped = kept.source(FrozenPart(backbone()), None, 0, "train", streamed, cpu)
    held = Materialized(budget=1 << 30).source(FrozenPart(backbone()), None, 0, "train", in_memory, cpu)
    assert isinstance(mapped.features, np.memmap) and not isinstance(held.features, np.memmap)
    assert np.array_equal(mapped.features, held.features)
    files = [os.path.join(kept._directory, n) for n in os.listdir(kept._directory) if n.endswith(".npy")]
    assert len(files) == 1 and os.path.getsize(files[0]) >= mapped.features.nbytes
    kept.close()
    assert not os.path.exists(files[0])


def test_what_is_kept_within_the_budget_is_what_saves_most_compute_per_byte():
    def entry(seconds: float, rows: int) -> _Kept:
        return _Kept(np.zeros((rows, 10), np.float32), np.zeros(rows, np.int64), seconds)
    kept = Materialized(budget=entry(0, 300).nbytes, disk_budget=0)      # room for 300 rows
    assert kept.keep(("a", "", 0, "train"), entry(1.0, 100))
    assert kept.keep(("b", "", 0, "train"), entry(9.0, 100))
    assert kept.keep(("c", "", 0, "train"), entry(5.0, 150))        # a, the cheapest per byte, goes
    assert set(kept._kept) == {("b", "", 0, "train"), ("c", "", 0, "train")}
    assert not kept.keep(("d", "", 0, "train"), entry(0.1, 200))    # worth less than all: not kept
    assert set(kept._kept) == {("b", "", 0, "train"), ("c", "", 0, "train")}


# --- whole runs -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("frozen")
    frozen_build, plain_build = builds(str(scratch / "frozen-rows"))
    _, plain_counted = builds(str(scratch / "plain-rows"))
    search = {"space": SPACE, "epochs": 3, "metric": "val_accuracy", "mode": "max"}
    frozen = cb.GridSearch(frozen_build, **search).fit(digits(partitions=2), workers=2, store=scratch / "frozen",
                                                       seed=0, verbose=0)
    plain = cb.GridSearch(plain_counted, **search).fit(digits(partitions=2), workers=2, store=scratch / "plain",
                                                       seed=0, verbose=0)
    return frozen, plain, scratch


@pytest.mark.slow
def test_a_run_with_frozen_layers_equals_the_plain_run_bitwise_running_them_once_per_row(runs):
    frozen, plain, scratch = runs
    assert frozen.history().equals(plain.history())
    for ours, theirs in zip(frozen.trials, plain.trials, strict=True):
        heads = ours.state_dict()
        assert all(torch.equal(v, theirs.state_dict()[f"1.{k}"]) for k, v in heads.items())
    rows = 600        # digits(rows=600): train and validation, every row of both partitions
    # Each partition once through the first layer for each depth there (a deeper one may come
    # from a shallower one's outputs), against every batch of every epoch of every trial.
    assert rows <= rows_seen(str(scratch / "frozen-rows")) <= 2 * rows
    assert rows_seen(str(scratch / "plain-rows")) >= 4 * 3 * rows


@pytest.mark.slow
def test_the_winner_is_served_composed_from_its_frozen_layers_and_its_head(runs, tmp_path):
    frozen, plain, _ = runs
    features = digits(partitions=1).validation_arrays()[0][:50]
    ours, theirs = frozen.best.predict(features), plain.best.predict(features)
    assert np.array_equal(ours, theirs)
    module = frozen.best.model()
    assert torch.equal(module(torch.from_numpy(features)), torch.from_numpy(theirs))
    frozen.best.save_weights(tmp_path / "best.safetensors")
    saved = load_file(tmp_path / "best.safetensors")
    assert saved.keys() == module.state_dict().keys() and any(k.startswith("0.") for k in saved)
    module[0][0] = torch.nn.Identity()       # the test's row counter is no TorchScript
    scripted = torch.jit.script(module)
    assert torch.equal(scripted(torch.from_numpy(features)), torch.from_numpy(ours))
    table = cb.predict(frozen.run_dir, features, workers=1)
    assert np.array_equal(table[[f"output_{i}" for i in range(10)]].to_numpy(), ours)


@pytest.mark.slow
def test_an_augmenting_transform_runs_the_frozen_layers_per_training_batch_said_once(tmp_path, caplog):
    def jitter(features: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (features + rng.normal(0, 0.01, features.shape)).astype(np.float32)
    frozen_build, plain_build = builds(transform=jitter)
    search = {"space": {"lr": cb.choice([1e-2]), "depth": cb.choice([2])}, "epochs": 2}
    with caplog.at_level(logging.WARNING, logger="cerebro"):
        frozen = cb.GridSearch(frozen_build, **search).fit(digits(partitions=2), workers=2,
                                                           store=tmp_path / "frozen", seed=0, verbose=0)
    plain = cb.GridSearch(plain_build, **search).fit(digits(partitions=2), workers=2, store=tmp_path / "plain",
                                                     seed=0, verbose=0)
    assert frozen.history().equals(plain.history())
    said = [r.getMessage() for r in caplog.records if "draws from its rng (augmentation)" in r.getMessage()]
    assert len(said) == 1 and "they run on every training batch" in said[0]
    assert os.path.exists(os.path.join(frozen.run_dir, "trials", "t0000", "checkpoint.state"))
    import onnxruntime

    from cerebro.serve._export import export_onnx
    export_onnx(frozen.best, tmp_path / "best.onnx")       # composed: the features in, the outputs out
    features = digits(partitions=1).validation_arrays()[0][:20]
    session = onnxruntime.InferenceSession(str(tmp_path / "best.onnx"), providers=["CPUExecutionProvider"])
    assert np.allclose(session.run(None, {"features": features})[0], frozen.best.predict(features), atol=1e-5)


@pytest.mark.slow
def test_frozen_weights_are_stored_once_per_run_and_serve_the_winner_after_the_pretrained_file_changed(tmp_path):
    weights = str(tmp_path / "backbone.safetensors")
    from safetensors.torch import save_file
    save_file(backbone().state_dict(), weights)

    def build(config: dict) -> cb.TorchTrainable:
        layers = backbone()
        layers.load_state_dict(load_file(weights))
        torch.manual_seed(5)
        head = torch.nn.Sequential(*layers[config["depth"]:], torch.nn.Linear(32, 10))
        return cb.TorchTrainable(model=head, frozen=layers[:config["depth"]], batch_size=32,
                                 optimizer=torch.optim.Adam(head.parameters(), lr=1e-2),
                                 loss=torch.nn.functional.cross_entropy)
    result = cb.GridSearch(build, {"depth": cb.choice([2, 4])}, epochs=1).fit(
        digits(partitions=2), workers=2, store=tmp_path / "run", seed=0, verbose=0)
    stored = sorted(os.listdir(os.path.join(result.run_dir, "frozen")))
    assert len(stored) == 2 and all(name.endswith(".safetensors") for name in stored)
    features = digits(partitions=1).validation_arrays()[0][:20]
    before = {t.trial_id: t.predict(features) for t in result.trials}
    torch.manual_seed(99)       # "the pretrained weights were replaced since"
    save_file({k: torch.randn_like(v) if v.is_floating_point() else v for k, v in backbone().state_dict().items()},
              weights)
    loaded = cb.load(result.run_dir)
    assert all(np.array_equal(t.predict(features), before[t.trial_id]) for t in loaded.trials)
    import mlflow.pyfunc

    from cerebro.serve._pyfunc import save_pyfunc
    save_pyfunc(loaded.trials[1], str(tmp_path / "served"))          # the weights it trained on, both parts
    served = mlflow.pyfunc.load_model(str(tmp_path / "served"))
    assert np.array_equal(served.predict(features), before["t0001"])
    for name in stored:
        os.unlink(os.path.join(result.run_dir, "frozen", name))
    with pytest.raises(ValueError, match=r"^t0000 trained on frozen layers [0-9a-f]{12}, but build\(config\) makes "
                                         r"others now \([0-9a-f]{12}: were the pretrained weights it loads replaced"):
        cb.load(result.run_dir).trials[0].model()


@pytest.mark.slow
def test_a_streamed_run_with_frozen_layers_equals_the_plain_run_in_memory(runs, tmp_path):
    """Storage never changes results (invariant 6): the frozen outputs of streamed partitions
    are mapped from the workers' disks, and the run is the in-memory plain run's, bit for bit."""
    _, plain, _ = runs
    frozen_build, _ = builds()
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    streamed = cb.Dataset.from_numpy((x[:600] / 16.0).astype(np.float32), y[:600], validation=0.2, partitions=2,
                                     seed=0, in_memory=False)
    result = cb.GridSearch(frozen_build, SPACE, epochs=3, metric="val_accuracy", mode="max").fit(
        streamed, workers=2, store=tmp_path / "streamed", seed=0, verbose=0)
    assert result.history().equals(plain.history())


@pytest.mark.slow
def test_a_run_with_frozen_layers_resumed_to_more_epochs_ends_as_the_longer_run(runs, tmp_path):
    """Resume starts new workers: they compute the frozen outputs again, and the heads go on
    from their checkpoints (heads and optimizer only) to the 3-epoch plain run's results."""
    _, plain, _ = runs
    search = cb.GridSearch(builds()[0], SPACE, epochs=2, metric="val_accuracy", mode="max")
    shorter = search.fit(digits(partitions=2), workers=2, store=tmp_path / "run", seed=0, verbose=0)
    assert cb.resume(shorter.run_dir, epochs=3, verbose=0).history().equals(plain.history())


def test_a_transforms_key_is_pickled_once_per_transform_not_once_per_sub_epoch(partition, monkeypatch):
    from cerebro.worker import _frozen
    pickled = []
    monkeypatch.setattr(_frozen, "transform_key", lambda t: pickled.append(t) or "key")
    head = torch.nn.Linear(32, 10)

    def scale(features: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return features.astype(np.float32) * 2
    trainable = cb.TorchTrainable(head, torch.optim.SGD(head.parameters(), lr=0.1), torch.nn.functional.cross_entropy,
                                  batch_size=32, transform=scale, frozen=backbone())
    kept = Materialized(budget=1 << 30)
    for _ in range(3):
        assert kept.for_trial(trainable, 0, "train", partition, torch.device("cpu")) is not None
    assert pickled == [scale] and kept.computed == 1


def frozen_and_plain(frozen_build, plain_build, search: dict, workers: int, tmp_path, caplog) -> tuple:
    """The grid ``search`` run with the frozen build (its warnings in ``caplog``) and with the plain one."""
    with caplog.at_level(logging.WARNING, logger="cerebro"):
        frozen = cb.GridSearch(frozen_build, **search).fit(digits(partitions=2), workers=workers,
                                                           store=tmp_path / "frozen", seed=0, verbose=0)
    plain = cb.GridSearch(plain_build, **search).fit(digits(partitions=2), workers=workers, store=tmp_path / "plain",
                                                     seed=0, verbose=0)
    return frozen, plain


@pytest.mark.slow
@pytest.mark.parametrize("holding", [None, lambda layer: setattr(layer, "lock", threading.Lock())],
                         ids=["digested", "unfaithful"])
def test_trials_whose_frozen_layers_differ_in_a_plain_attribute_give_the_plain_runs_results(holding, tmp_path,
                                                                                             caplog):
    frozen_build, plain_build = scaled_builds(holding)
    search = {"space": {"scale": cb.choice([0.01, 10.0])}, "epochs": 2, "metric": "val_accuracy", "mode": "max"}
    frozen, plain = frozen_and_plain(frozen_build, plain_build, search, 2, tmp_path, caplog)
    assert frozen.history().equals(plain.history())
    accuracies = frozen.history().groupby("scale")["val_accuracy"].last()
    assert accuracies[0.01] != accuracies[10.0]
    said = [r.getMessage() for r in caplog.records if "cannot be told apart" in r.getMessage()]
    assert said == ([] if holding is None else [said[0]])
    if holding is not None:
        assert "frozen layer 2 (Scale).lock is a _thread.lock" in said[0]


@pytest.mark.parametrize("crafted", ["sparse", "truncated"])
def test_a_crafted_stored_frozen_file_is_refused_naming_it_without_reading_it_whole(crafted, tmp_path):
    from safetensors.torch import save

    from cerebro.worker._frozen_weights import restore_frozen

    class Store:
        def file(self, *parts: str) -> str:
            return str(tmp_path.joinpath(*parts))
    trained_on = "ab" * 32
    path = tmp_path / "frozen" / f"{trained_on}.safetensors"
    path.parent.mkdir()
    frozen = backbone()
    if crafted == "sparse":       # 3 GiB on disk that costs nothing: never read into memory
        with open(path, "wb") as f:
            f.truncate(3 << 30)
    else:
        path.write_bytes(save({k: v.contiguous() for k, v in frozen.state_dict().items()})[:-100])
    head = torch.nn.Linear(32, 10)
    trainable = cb.TorchTrainable(head, torch.optim.SGD(head.parameters(), lr=0.1),
                                  torch.nn.functional.cross_entropy, batch_size=8, frozen=frozen)
    named = re.escape(str(path))
    said = (rf"^{named} cannot hold the frozen layers \(\d+ bytes of weights\): {named} holds more than"
            if crafted == "sparse" else rf"^{named} is damaged: ")
    with pytest.raises(ValueError, match=said):
        restore_frozen(trainable, trained_on, Store(), "t0003")


class _KeptTraining(torch.nn.Module):
    """A Dropout its module keeps in training mode, whatever eval() says: it draws on every call."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(p)

    def train(self, mode: bool = True) -> _KeptTraining:
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x)


class _Noise(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.from_numpy(np.random.normal(size=tuple(x.shape)).astype(np.float32))


@pytest.mark.parametrize("drawing", [lambda: _KeptTraining(0.5), _Noise],
                         ids=["dropout kept in training", "numpy noise"])
def test_frozen_layers_that_draw_random_numbers_are_not_materialized_and_leave_the_generators_as_they_were(drawing,
                                                                                                          partition):
    kept, cpu = Materialized(budget=1 << 30), torch.device("cpu")
    trainables = []
    for frozen, width in ((torch.nn.Sequential(*backbone()[:2], drawing()), 48), (backbone(), 32)):
        head = torch.nn.Linear(width, 10)
        trainables.append(cb.TorchTrainable(head, torch.optim.SGD(head.parameters(), lr=0.1),
                                            torch.nn.functional.cross_entropy, batch_size=8, frozen=frozen))
    states = torch.get_rng_state(), np.random.get_state()[1].copy()
    assert kept.for_trial(trainables[0], 0, "train", partition, cpu) is None and kept.computed == 0
    assert torch.equal(torch.get_rng_state(), states[0]) and np.array_equal(np.random.get_state()[1], states[1])
    assert kept.for_trial(trainables[1], 0, "train", partition, cpu) is not None and kept.computed == 1


@pytest.mark.slow
def test_trials_whose_frozen_layers_draw_random_numbers_give_the_plain_runs_results_said_once(tmp_path, caplog):
    def parts(config: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
        frozen = torch.nn.Sequential(*backbone()[:2], _KeptTraining(config["p"]))
        torch.manual_seed(5)
        return frozen, torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(48, 10))
    frozen_build, plain_build = both_builds(parts)
    search = {"space": {"p": cb.choice([0.5, 0.3])}, "epochs": 2, "metric": "val_accuracy", "mode": "max"}
    frozen, plain = frozen_and_plain(frozen_build, plain_build, search, 1, tmp_path, caplog)
    assert frozen.history().equals(plain.history())
    said = [r.getMessage() for r in caplog.records if "draw random numbers" in r.getMessage()]
    assert len(said) == 1 and "they run on every batch, as the plain model does" in said[0]
