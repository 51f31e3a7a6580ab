"""Invariant 4: bad input to ``fit`` fails with a message naming the problem, before any
worker starts or anything is written to the store."""
from __future__ import annotations

import math
import re
import threading

import numpy as np
import pytest
from _models import build, digits

import cerebro as cb

SPACE = {"lr": cb.choice([1e-2, 1e-3])}


def fails_before_work(tmp_path, make_search, message, error=ValueError, data=None, **fit):
    """``make_search()`` or its ``fit`` raises ``message``; nothing is written (a searcher's
    own arguments fail in its constructor, the rest at ``fit``)."""
    store = tmp_path / "run"
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        make_search().fit(digits(partitions=None) if data is None else data, store=store, **{"verbose": 0, **fit})
    assert not store.exists()


def test_grid_rejects_primitives_it_cannot_enumerate(tmp_path):
    def search():
        return cb.GridSearch(build, {"lr": cb.loguniform(1e-4, 1e-1), "hidden": cb.choice([8])})
    fails_before_work(tmp_path, search, "GridSearch can only enumerate cb.choice values; space['lr'] is "
                                        "loguniform(0.0001, 0.1). Use cb.choice([...]) or cb.RandomSearch")


@pytest.mark.parametrize("epochs", [0, -1, 2.5, True])
def test_epochs_must_be_at_least_one(tmp_path, epochs):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE, epochs=epochs),
                      f"epochs={epochs!r} must be an integer >= 1")


def test_random_search_needs_trials(tmp_path):
    fails_before_work(tmp_path, lambda: cb.RandomSearch(build, SPACE, num_trials=0),
                      "num_trials=0 must be an integer >= 1")


def test_unknown_metric_names_the_logged_ones(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE, metric="val_acc"),
                      "metric='val_acc' is not logged; logged metrics are "
                      "['train_loss', 'train_accuracy', 'val_loss', 'val_accuracy']")


def test_validation_metric_without_validation_data(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE), "metric='val_loss' is not logged (the data "
                      "has no validation split); logged metrics are ['train_loss', 'train_accuracy']",
                      data=digits(partitions=2, validation=0))


def test_mode_must_be_min_or_max(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE, mode="maximize"),
                      "mode='maximize' must be 'min' or 'max'")


def test_build_that_cannot_be_pickled(tmp_path):
    lock = threading.Lock()

    def unpicklable(config):
        with lock:
            return build(config)

    fails_before_work(tmp_path, lambda: cb.GridSearch(unpicklable, SPACE),
                      f"build={unpicklable!r} cannot be pickled to send to the workers: "
                      f"TypeError: cannot pickle '_thread.lock' object", error=TypeError)


def test_build_must_return_a_trainable(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(lambda config: "a model", SPACE),
                      "build(config) must return a cerebro.Trainable (a cerebro.TorchTrainable, a "
                      "cerebro.KerasTrainable, or a subclass of your own: docs/extending.md); got str",
                      error=TypeError)


def test_more_partitions_than_training_rows(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE),
                      "partitions=16 is more than the 8 training rows; every partition needs at least one row",
                      data=digits(partitions=None, rows=10), workers=16)


def test_data_must_be_a_dataset(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE),
                      "data must be a cerebro.Dataset (e.g. cb.Dataset.from_numpy(X, y)); got list",
                      error=TypeError, data=[[1.0], [2.0]])


def test_backend_must_be_known(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE),
                      "backend='spark' must be 'local' or a Backend instance such as cb.LocalBackend(workers=4)",
                      backend="spark")


def test_workers_must_agree_with_the_backend(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE),
                      "workers=3 differs from the backend's workers=2; give the number of workers to the backend only",
                      backend=cb.LocalBackend(workers=2), workers=3)


@pytest.mark.parametrize("workers", [0, -2, 1.5])
def test_workers_must_be_positive(tmp_path, workers):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE), f"workers={workers!r} must be a positive integer",
                      workers=workers)


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_seed_must_be_a_non_negative_integer(tmp_path, seed):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE),
                      f"seed={seed!r} must be a non-negative integer or None", seed=seed)


def test_space_must_be_a_dict(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, [("lr", 0.1)]),
                      "space=[('lr', 0.1)] must be a dict from parameter name to a value or primitive",
                      error=TypeError)


def test_a_store_whose_file_system_is_unknown_or_unreachable_is_refused_early(tmp_path):
    with pytest.raises(ValueError, match=re.escape("store='nosuchfs://x/runs': its file system cannot be used "
                                                   "here: Protocol not known: nosuchfs")):
        cb.GridSearch(build, SPACE).fit(digits(partitions=2), store="nosuchfs://x/runs", verbose=0)
    with pytest.raises(OSError, match=re.escape("store 'hdfs://127.0.0.1:1/runs/exp1' cannot be reached: ")):
        cb.GridSearch(build, SPACE).fit(digits(partitions=2), store="hdfs://127.0.0.1:1/runs/exp1", verbose=0)


ADAPTIVE_SPACE = {"lr": cb.loguniform(1e-3, 1e-1), "hidden": cb.choice([8, 16])}


@pytest.mark.parametrize("search, message", [
    (lambda: cb.Hyperband(build, ADAPTIVE_SPACE, max_epochs=9, eta=1), "eta=1 must be a number >= 2"),
    (lambda: cb.Hyperband(build, ADAPTIVE_SPACE, max_epochs=0), "max_epochs=0 must be an integer >= 1"),
    (lambda: cb.ASHA(build, ADAPTIVE_SPACE, max_epochs=0), "max_epochs=0 must be an integer >= 1"),
    (lambda: cb.ASHA(build, ADAPTIVE_SPACE, reduction_factor=1.5), "reduction_factor=1.5 must be a number >= 2"),
    (lambda: cb.ASHA(build, ADAPTIVE_SPACE, max_epochs=3, grace_period=4),
     "grace_period=4 must be at most max_epochs=3"),
    (lambda: cb.TPESearch(build, {"layers": cb.choice([[8], [8, 8]])}),
     "TPESearch cannot sample space['layers']=choice([[8], [8, 8]]): its value [8] is not a number, string, "
     "bool or None (choose a name and map it inside build)"),
    (lambda: cb.TPESearch(build, ADAPTIVE_SPACE, n_startup_trials=-1), "n_startup_trials=-1 must be an integer >= 0"),
    (lambda: cb.TPESearch(build, ADAPTIVE_SPACE, epochs=3, grace_period=4), "grace_period=4 must be at most epochs=3"),
    (lambda: cb.TPESearch(build, ADAPTIVE_SPACE, grace_period=0), "grace_period=0 must be an integer >= 1"),
    (lambda: cb.TPESearch(build, ADAPTIVE_SPACE, grace_period=1, reduction_factor=1), "reduction_factor=1 must be a "
     "number >= 2"),
    (lambda: cb.PBT(build, ADAPTIVE_SPACE, mutations=["momentum"]),
     "mutations: 'momentum' is not a key of the space; keys: ['hidden', 'lr']"),
    (lambda: cb.PBT(build, {**ADAPTIVE_SPACE, "batch_size": 32}, mutations=["batch_size"]),
     "mutations: space['batch_size'] is the constant 32; only a primitive (cb.uniform, cb.choice, ...) can be "
     "mutated"),
    (lambda: cb.PBT(build, {"hidden": cb.choice([8, 16])}),
     "PBT has nothing to explore: the space has no cb.uniform or "
     "cb.loguniform key; name the keys to mutate with mutations=[...]"),
    (lambda: cb.PBT(build, ADAPTIVE_SPACE, population=1), "population=1 must be at least 2: PBT copies between trials"),
    (lambda: cb.PBT(build, ADAPTIVE_SPACE, quantile_fraction=0.75), "quantile_fraction=0.75 must be in (0, 0.5]"),
])
def test_adaptive_searchers_reject_bad_settings(tmp_path, search, message):
    fails_before_work(tmp_path, search, message)


def test_tpe_rejects_a_primitive_it_does_not_know(tmp_path):
    class Beta(cb.search.Distribution):
        def sample(self, rng):
            return float(rng.beta(2, 2))

        def __repr__(self):
            return "Beta()"
    fails_before_work(tmp_path, lambda: cb.TPESearch(build, {"lr": Beta()}),
                      "TPESearch cannot sample space['lr']=Beta(); use cb.choice, cb.uniform, cb.loguniform, "
                      "cb.randint or cb.quniform")


@pytest.mark.parametrize("fit, message", [
    ({"trial_timeout": 0}, "trial_timeout=0 must be a positive number of seconds or None"),
    ({"trial_timeout": "1m"}, "trial_timeout='1m' must be a positive number of seconds or None"),
    ({"max_failures": -1}, "max_failures=-1 must be an integer >= 0 or None"),
    ({"max_failures": 1.5}, "max_failures=1.5 must be an integer >= 0 or None"),
    ({"workers": 0}, "workers=0 must be a positive integer"),
    ({"backend": "ray"}, "backend='ray' must be 'local' or a Backend instance such as cb.LocalBackend(workers=4)"),
    ({"seed": -3}, "seed=-3 must be a non-negative integer or None"),
    ({"verbose": 2}, "verbose=2 must be 0 (silent) or 1 (progress)"),
    ({"seed": True}, "seed=True must be a non-negative integer or None"),
])
def test_fit_settings_are_checked(tmp_path, fit, message):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE), message, **fit)


def test_tensorboard_must_be_a_bool(tmp_path):
    fails_before_work(tmp_path, lambda: cb.GridSearch(build, SPACE), "tensorboard='yes' must be True or False",
                      TypeError,
                      tensorboard="yes")


@pytest.mark.parametrize("backend, message", [
    (lambda: cb.LocalBackend(2, heartbeat_timeout=0), "heartbeat_timeout=0 must be a number of seconds > 1"),
    (lambda: cb.LocalBackend(2, max_restarts=-1), "max_restarts=-1 must be an integer >= 0"),
    (lambda: cb.LocalBackend(2, threads_per_worker=0), "threads_per_worker=0 must be a positive integer"),
    (lambda: cb.LocalBackend(True), "workers=True must be a positive integer"),
    (lambda: cb.LocalBackend(2, max_restarts=1.0), "max_restarts=1.0 must be an integer >= 0"),
    (lambda: cb.LocalBackend(2, heartbeat_timeout=math.nan), "heartbeat_timeout=nan must be a number of seconds > 1"),
])
def test_backend_settings_are_checked(backend, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        backend()


def test_backend_takes_numpy_integers_as_plain_ints():
    backend = cb.LocalBackend(np.int64(2), threads_per_worker=np.int32(1), max_restarts=np.int64(0))
    assert (backend.workers, backend.threads_per_worker, backend.max_restarts) == (2, 1, 0)
    assert all(type(v) is int for v in (backend.workers, backend.threads_per_worker, backend.max_restarts))


def test_resume_of_a_directory_that_holds_no_run(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(repr(str(tmp_path)))} is not a Cerebro run "
                                                f"directory \\(no run.json\\)$"):
        cb.resume(tmp_path, verbose=0)
