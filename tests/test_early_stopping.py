"""Early stopping (``patience``, ``min_delta``): a trial whose metric stopped improving ends
``stopped`` with the reason, at the same epoch on one worker and two, and a resume that
replays the journal stops it there too."""
from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([1e-2, 3e-3])}


def plateaued(tmp_path, workers: int, **settings) -> cb.Result:
    """A grid ranked by the largest train_loss, which falls: no epoch improves on the first."""
    return cb.GridSearch(build, SPACE, epochs=6, metric="train_loss", mode="max", **settings).fit(
        digits(partitions=2), backend=cb.LocalBackend(workers, threads_per_worker=1), seed=1,
        store=tmp_path / f"run{workers}", verbose=0)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("stopped")
    return plateaued(tmp_path, 1, patience=2), plateaued(tmp_path, 2, patience=2)


def test_a_trial_without_improvement_for_patience_epochs_stops_saying_why(stopped):
    result, _ = stopped
    for trial in result.trials:
        best = trial.best_metrics["train_loss"]
        assert (trial.status, trial.epochs, trial.best_epoch) == ("stopped", 3, 1)
        assert trial.reason == f"no improvement of train_loss by more than 0 for 2 epochs (best {best:.4g} at epoch 1)"
    assert result.history().groupby("trial_id").epoch.max().tolist() == [3, 3]


def test_one_worker_and_two_stop_the_same_trials_at_the_same_epochs(stopped):
    one, two = stopped
    pd.testing.assert_frame_equal(one.history(), two.history(), check_exact=True)
    assert [(t.status, t.reason) for t in one.trials] == [(t.status, t.reason) for t in two.trials]


def test_a_resume_from_before_the_stop_replays_it(stopped, tmp_path):
    """The journal cut right after the epoch at which t0000 stopped (its decision and end
    lost): the resumed run stops it there, as the uninterrupted run did."""
    result, _ = stopped
    copy = str(shutil.copytree(result.run_dir, tmp_path / "cut"))
    journal = os.path.join(copy, "journal.jsonl")
    with open(journal, "rb") as f:
        lines = f.readlines()
    cut = next(i for i, line in enumerate(lines) if b'"event": "epoch_end"' in line and b'"t0000"' in line
               and b'"epoch": 3' in line)
    with open(journal, "wb") as f:
        f.writelines(lines[:cut + 1])
    resumed = cb.resume(copy, verbose=0)
    pd.testing.assert_frame_equal(resumed.history(), result.history(), check_exact=True)
    assert [(t.status, t.epochs, t.reason) for t in resumed.trials] == \
        [(t.status, t.epochs, t.reason) for t in result.trials]


def test_min_delta_asks_for_a_larger_improvement(tmp_path):
    """val_loss falls every epoch, but by less than 1.0: with min_delta=1.0 nothing counts."""
    result = cb.GridSearch(build, SPACE, epochs=4, patience=1, min_delta=1.0).fit(
        digits(partitions=2), workers=1, seed=1, store=tmp_path / "run", verbose=0)
    assert [(t.status, t.epochs) for t in result.trials] == [("stopped", 2), ("stopped", 2)]
    assert all(t.reason.startswith("no improvement of val_loss by more than 1 for 1 epochs") for t in result.trials)


def test_without_patience_every_trial_trains_its_epochs(tmp_path):
    result = plateaued(tmp_path, 1)
    assert [(t.status, t.epochs) for t in result.trials] == [("completed", 6), ("completed", 6)]


@pytest.mark.parametrize("settings, message", [
    ({"patience": 0}, "patience=0 must be"), ({"patience": 2.5}, "patience=2.5 must be"),
    ({"min_delta": -0.1}, "min_delta=-0.1 must be")])
def test_bad_early_stopping_settings_are_refused_before_any_work(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        cb.GridSearch(build, SPACE, epochs=2, **settings).fit(digits(partitions=2), workers=1,
                                                             store=tmp_path / "run", verbose=0)
    assert not os.path.exists(tmp_path / "run")
