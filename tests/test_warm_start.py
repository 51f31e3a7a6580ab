"""Warm start: a trial whose config equals a finished trial of an earlier run starts from that
trial's best-epoch (or last-epoch) state, bitwise, says so in history(), resumes from it after a
crash as if uninterrupted; data of another feature layout is refused before any worker starts."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
WIDE = {"lr": cb.choice([1e-2, 0.0]), "hidden": cb.choice([16, 32])}    # lr 0: Adam leaves the weights as they are


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> cb.Result:
    return cb.GridSearch(build, WIDE, epochs=2, metric="val_accuracy", mode="max").fit(
        digits(), workers=2, store=tmp_path_factory.mktemp("w") / "wide", seed=0, verbose=0)


def narrow(wide: cb.Result, **kwargs) -> cb.GridSearch:
    best = wide.ranked()[0].config
    return cb.GridSearch(build, {"lr": best["lr"], "hidden": cb.choice([best["hidden"], 64])}, epochs=2,
                         metric="val_accuracy", mode="max", warm_start=wide, **kwargs)


@pytest.mark.parametrize("which", ["best", "last"])
def test_a_trial_of_an_equal_config_starts_from_the_earlier_trials_state(tmp_path, wide, which):
    result = narrow(wide, warm_start_epoch=which).fit(digits(), workers=2, store=tmp_path / "n", seed=1, verbose=0)
    source = wide.ranked()[0]
    epoch = source.best_epoch if which == "best" else source.epochs
    history = result.history()
    assert history["warm_started_from"].tolist() == [f"{wide.run_dir}:{source.trial_id}@{epoch}"] * 2 + [None] * 2
    assert [t.warm_started_from for t in result.trials] == [f"{wide.run_dir}:{source.trial_id}@{epoch}", None]


def test_a_warm_started_trial_starts_from_the_earlier_trials_weights_bitwise(tmp_path, wide):
    # A trial that cannot move (lr 0) ends with the weights it started from: the earlier trial's.
    frozen = cb.GridSearch(build, {"lr": 0.0, "hidden": 16}, epochs=1, warm_start=wide.run_dir).fit(
        digits(), workers=2, store=tmp_path / "f", seed=1, verbose=0)
    [earlier] = [t for t in wide.trials if t.config == {"lr": 0.0, "hidden": 16}]
    assert frozen.trials[0].warm_started_from is not None
    weights, expected = frozen.trials[0].state_dict("last"), earlier.state_dict("best")
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], v) for k, v in expected.items())
    built = cb.GridSearch(build, {"lr": 0.0, "hidden": 16}, epochs=1).fit(      # not warm-started: build's
        digits(), workers=2, store=tmp_path / "b", seed=1, verbose=0).trials[0].state_dict("last")
    assert not all(torch.equal(built[k], v) for k, v in expected.items())


def test_data_of_another_feature_layout_is_refused_before_any_worker_starts(tmp_path, wide):
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    other = cb.Dataset.from_numpy((X[:600, :32] / 16).astype("float32"), y[:600], partitions=4, seed=0)
    # The driver's preflight step meets it first: the model built for 64 features gets 32.
    with pytest.raises(ValueError, match=r"^one training step on 4 training rows, run on the driver before any worker "
                                         r"starts, fails for each of the 2 configurations tried, e\.g\. build\(.*\), "
                                         r"as every trial would at its first batch: RuntimeError: mat1 and mat2 shapes "
                                         r"cannot be multiplied \(4x32 and 64x\d+\)$"):
        narrow(wide).fit(other, workers=2, store=tmp_path / "n", seed=1, verbose=0)
    assert not os.path.exists(tmp_path / "n")       # the corrected fit may use the same store


def test_a_warm_started_run_killed_in_its_first_epoch_resumes_to_the_uninterrupted_results(tmp_path, wide):
    """A slow store (each warm start's epoch-0 checkpoint takes a second to write) widens the
    window in which the driver dies with that checkpoint unwritten: the journal must not say
    the trial was warm-started before its state is in the store."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {HERE!r})
        import cerebro as cb
        from cerebro.store import RunStore
        from _crash import killing_build
        from _models import digits
        from test_warm_start import narrow
        write = RunStore.write_checkpoint
        def slow_write(self, trial_id, state, epoch, *args):
            if epoch == 0:
                time.sleep(1.0)
            return write(self, trial_id, state, epoch, *args)
        RunStore.write_checkpoint = slow_write
        store = sys.argv[1]
        search = narrow(cb.load({str(wide.run_dir)!r}))
        search.build = killing_build(store, 0, store + ".killed")
        search.fit(digits(), workers=2, store=store, seed=1, verbose=0)
    """))
    store = str(tmp_path / "killed")
    child = subprocess.run([sys.executable, str(script), store], capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-2000:]
    assert not cb.load(store).finished and cb.load(store).history().empty
    resumed = cb.resume(store, workers=2, verbose=0)
    expected = narrow(wide).fit(digits(), workers=2, store=tmp_path / "whole", seed=1, verbose=0)
    pd.testing.assert_frame_equal(resumed.history().drop(columns="warm_started_from"),
                                  expected.history().drop(columns="warm_started_from"), check_exact=True)
    assert resumed.history()["warm_started_from"].tolist() == expected.history()["warm_started_from"].tolist()
    for a, b in zip(resumed.trials, expected.trials, strict=True):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
