"""Invariant 6: storage never changes results. Streamed and in-memory partitions give the
same bits (one sample order); images stay uint8 or PNG bytes on disk and are made into the
model's inputs by a seeded ``transform``; a remote store is read through each worker's local
cache; a lost worker's partitions are streamed by their new holder; a broken transform fails
its trial only."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import cloudpickle
import numpy as np
import pandas as pd
import pytest
import torch
from _models import build, crashing_once, digit_images, digits, image_build, png_digits

import cerebro as cb
from cerebro.data import _partitions, read_layout, read_partition
from cerebro.store import TaskKind
from cerebro.worker._protocol import Heartbeat, Hello, Ready, RunSubEpoch, Setup
from cerebro.worker._wire import authenticate

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([1e-2, 3e-2]), "architecture": cb.choice(["mlp", "cnn"])}


@pytest.fixture(autouse=True)
def small_row_groups(monkeypatch):
    """Row groups of 7 digits rows (of 264 bytes), so a partition spans several shuffle
    windows of 8 row groups and streaming is not trivially the same as holding it."""
    monkeypatch.setattr(_partitions, "ROW_GROUP_BYTES", 2048)


def assert_same(a: cb.Result, b: cb.Result) -> None:
    pd.testing.assert_frame_equal(a.history(), b.history(), check_exact=True)
    assert [(t.trial_id, t.status) for t in a.trials] == [(t.trial_id, t.status) for t in b.trials]
    for x, y in zip(a.trials, b.trials):
        assert all(torch.equal(v, y.state_dict()[k]) for k, v in x.state_dict().items())


def worker_notes(result: cb.Result) -> list[str]:
    return [w["data"] for e in result.store.events() if e["event"] == "run_started" for w in e["workers"].values()]


def digits_data(in_memory, partitions: int = 4, **kwargs) -> cb.Dataset:
    data = digits(partitions=partitions)
    return cb.Dataset.from_numpy(data.features, data.label, partitions=partitions, seed=0, in_memory=in_memory,
                                 **kwargs)


@pytest.mark.parametrize("searcher", ["grid", "asha"])
def test_streamed_and_in_memory_runs_are_bitwise_equal(tmp_path, searcher):
    def run(in_memory: bool) -> cb.Result:
        search = cb.GridSearch(build, SPACE, epochs=2) if searcher == "grid" else \
            cb.ASHA(build, SPACE, num_trials=6, max_epochs=3, grace_period=1, reduction_factor=2)
        return search.fit(digits_data(in_memory), workers=2, store=tmp_path / str(in_memory), seed=1, verbose=0)

    in_memory, streamed = run(True), run(False)
    assert_same(in_memory, streamed)
    layout = read_layout(streamed.store.data_dir)
    assert layout.row_group_rows == 7 and layout.rows["train"][0] > 8 * 7        # several windows
    assert worker_notes(in_memory) == ["in memory (in_memory=True): partitions of 0.08 MB"] * 2
    assert all(note.startswith("streamed (in_memory=False)") for note in worker_notes(streamed))


def test_auto_holds_small_partitions_in_memory_and_says_why(tmp_path):
    result = cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
        digits_data("auto"), workers=2, store=tmp_path / "run", seed=1, verbose=0)
    notes = worker_notes(result)
    assert len(notes) == 2 and all(n.startswith("in memory (in_memory='auto'): partitions of 0.08 MB, less than "
                                                "half of the ") and n.endswith(" GB free") for n in notes)


@pytest.mark.parametrize("encoded", [False, True], ids=["uint8", "png"])
def test_images_train_with_a_seeded_augmentation_bitwise_on_1_and_2_workers_and_streamed(tmp_path, encoded):
    features, label = png_digits() if encoded else digit_images()

    def run(workers: int, in_memory: bool) -> cb.Result:
        data = cb.Dataset.from_numpy(features, label, partitions=2, seed=0, in_memory=in_memory)
        return cb.GridSearch(image_build, {"lr": cb.choice([1e-2, 3e-3]), "png": encoded}, epochs=3).fit(
            data, workers=workers, store=tmp_path / f"{workers}-{in_memory}", seed=4, verbose=0)

    one = run(1, True)
    assert_same(one, run(2, True))
    assert_same(one, run(2, False))
    stored, _ = read_partition(one.store.data_dir, "train", 0)
    assert stored.dtype == (object if encoded else np.uint8)     # kept as given, on disk and in memory
    assert one.best.metrics["val_accuracy"] > 0.8


def test_a_remote_store_is_read_through_each_workers_local_cache(tmp_path):
    cache = tmp_path / "cache"
    search = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-2])}, epochs=2)
    remote = search.fit(digits_data(False, cache_dir=cache), workers=2, store=f"local://{tmp_path}/remote",
                        seed=1, verbose=0)
    local = search.fit(digits_data(True), workers=2, store=tmp_path / "local", seed=1, verbose=0)
    assert_same(remote, local)
    notes = worker_notes(remote)
    assert len(notes) == 2 and all(re.search(rf"; copied 0\.\d\d MB from the store to {cache}/cerebro-worker-[01]-", n)
                                   for n in notes)
    assert os.listdir(cache) == []                  # each worker removed its copy when it ended


@pytest.fixture(scope="module")
def remote_data_dir(tmp_path_factory) -> str:
    """The data directory of a run on a ``local://`` store: remote to its workers."""
    store = tmp_path_factory.mktemp("remote")
    return cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
        digits_data(False), workers=1, store=f"local://{store}", seed=1, verbose=0).store.data_dir


@pytest.mark.parametrize("direct_hops", [False, True])
@pytest.mark.parametrize("end", ["sigterm", "driver gone mid-sub-epoch"])
def test_a_worker_that_ends_removes_its_copy_and_its_outbox(tmp_path, remote_data_dir, direct_hops, end):
    """A worker ends through its clean-up, its copy of a remote store's partitions going with
    it (and its state server and outbox, where it serves states to its peers): on SIGTERM,
    the backend's last word to a worker that did not end when told to, and where the driver
    is gone (killed: its socket closed) while the worker's training is stuck in a batch."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    server = socket.create_server(("127.0.0.1", 0))
    worker = subprocess.Popen([sys.executable, "-m", "cerebro.worker", "127.0.0.1", str(server.getsockname()[1]), "0"],
                              stdin=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(scratch),
                                                            "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        worker.stdin.write(b"key".hex() + "\n")
        worker.stdin.close()
        channel = authenticate(server.accept()[0], b"key")
        assert isinstance(channel.recv(), Hello)
        channel.send(Setup([0, 1], remote_data_dir, cloudpickle.dumps(build), 1, 0.2, in_memory=False,
                           direct_hops=direct_hops))
        ready = channel.recv()
        assert isinstance(ready, Ready) and f"from the store to {scratch}/cerebro-worker-0-" in ready.data
        assert [name.rsplit("-", 1)[0] for name in os.listdir(scratch)] == ["cerebro-worker-0"]
        if end == "sigterm":
            worker.terminate()
        else:
            channel.send(RunSubEpoch(1, "t0001", {"stuck": True}, TaskKind.TRAIN, 1, 0, 1, 1, 0, None))
            while (beat := channel.recv()).task_id != 1:       # the sub-epoch has begun
                assert isinstance(beat, Heartbeat)
            channel.close()
        assert worker.wait(timeout=60) == 0
    finally:
        worker.kill()
        server.close()
    assert os.listdir(scratch) == []


def test_a_lost_workers_partitions_are_streamed_by_their_new_holder(tmp_path):
    space = {"lr": cb.choice([1e-2, 3e-2])}
    lost = cb.GridSearch(crashing_once(str(tmp_path / "crashed")), space, epochs=2).fit(
        digits_data(False), backend=cb.LocalBackend(2, max_restarts=0), store=tmp_path / "lost", seed=1, verbose=0)
    undisturbed = cb.GridSearch(build, space, epochs=2).fit(
        digits_data(True), workers=2, store=tmp_path / "undisturbed", seed=1, verbose=0)
    assert_same(lost, undisturbed)
    [moved] = [e for e in lost.store.events() if e["event"] == "partitions_moved"]
    [(survivor, partitions)] = moved["moved"].items()
    after = lost.schedule()[lambda s: (s.start > moved["time"]) & s.partition.isin(partitions)]
    assert len(after) and set(after.worker) == {int(survivor)}


def test_bytes_features_need_a_transform_before_any_work(tmp_path):
    features, label = png_digits(60)
    with pytest.raises(ValueError, match=r"^the features are bytes \(encoded data\) and build\(config\) gives no "
                                         r"transform to decode them; pass TorchTrainable\(transform=fn\), "
                                         r"fn\(features, rng\) -> array$"):
        cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
            cb.Dataset.from_numpy(features, label), workers=1, store=tmp_path / "run", verbose=0)
    assert not (tmp_path / "run" / "journal.jsonl").exists()


@pytest.mark.parametrize("transform, error, where", [
    ("broken", "RuntimeError: this transform is broken", "_models.py"),
    ("half", "ValueError: transform returned (16, 1, 8, 8) float32 for a batch of 32 rows; it must return one "
             "row per row", "_trainable.py"),
])
def test_a_broken_transform_fails_its_trial_with_its_traceback_and_the_others_go_on(tmp_path, transform, error,
                                                                                      where):
    features, label = digit_images()
    data = cb.Dataset.from_numpy(features, label, partitions=2, seed=0, in_memory=False)
    result = cb.GridSearch(image_build, {"transform": cb.choice(["augment", transform])}, epochs=2).fit(
        data, workers=2, store=tmp_path / "run", seed=0, verbose=0)
    good, bad = result.trials
    assert (good.status, bad.status) == ("completed", "failed")
    assert bad.error.startswith("Traceback") and bad.error.rstrip().endswith(error) and where in bad.error


def test_undecodable_bytes_fail_the_trial_that_decodes_them(tmp_path):
    features, label = png_digits(200)
    features[37] = b"not a png"
    data = cb.Dataset.from_numpy(features, label, partitions=2, seed=0)
    result = cb.GridSearch(image_build, {"png": True, "lr": cb.choice([1e-2, 3e-3])}, epochs=1).fit(
        data, workers=2, store=tmp_path / "run", seed=0, verbose=0)
    assert [t.status for t in result.trials] == ["failed", "failed"]
    assert all("UnidentifiedImageError: cannot identify image file" in t.error for t in result.trials)
