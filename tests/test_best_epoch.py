"""Each trial's best epoch (by the searcher's metric and mode): its metrics, its weights kept
on disk as it happened and evaluated to the recorded metric, the trials ranked by it, and
every kept epoch's weights by number; the same on one worker and two."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _models import build
from sklearn.datasets import load_digits

import cerebro as cb

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([3e-2, 3e-3]), "architecture": cb.choice(["mlp"])}


def split_digits() -> tuple[cb.Dataset, np.ndarray, np.ndarray]:
    features, label = load_digits(return_X_y=True)
    features = (features[:600] / 16.0).astype(np.float32)
    x_val, y_val = features[480:], label[480:600]
    return cb.Dataset.from_numpy(features[:480], label[:480], validation=(x_val, y_val), partitions=2,
                                 seed=0), x_val, y_val


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same grid, ranked by the largest train_loss (so epoch 1 is each trial's best: a
    loss that falls), on one worker and on two."""
    data, x_val, y_val = split_digits()
    results = [cb.GridSearch(build, SPACE, epochs=3, metric="train_loss", mode="max").fit(
        data, backend=cb.LocalBackend(workers, threads_per_worker=1), seed=4,
        store=tmp_path_factory.mktemp("run") / f"w{workers}", verbose=0) for workers in (1, 2)]
    return results, x_val, y_val


def test_the_best_epoch_is_the_best_row_of_the_history_and_metrics_stay_the_last(runs):
    (result, _), _, _ = runs
    history = result.history()
    for trial in result.trials:
        rows = history[history.trial_id == trial.trial_id]
        best = rows.loc[rows.train_loss.idxmax()]
        assert trial.best_epoch == int(best.epoch) == 1 and trial.epochs == 3
        assert trial.best_metrics["train_loss"] == best.train_loss
        assert trial.metrics == {k: v for k, v in rows.iloc[-1].items() if k.startswith(("train_", "val_"))}


def test_the_best_epochs_weights_evaluate_to_the_recorded_validation_loss(runs):
    (result, _), x_val, y_val = runs
    for trial in result.trials:
        for epoch, metrics in (("best", trial.best_metrics), ("last", trial.metrics)):
            model = trial.model(epoch)
            with torch.no_grad():
                loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x_val)), torch.from_numpy(y_val))
            assert loss.item() == pytest.approx(metrics["val_loss"], rel=1e-5)
        assert not all(torch.equal(a, b) for a, b in zip(trial.state_dict("best").values(),
                                                          trial.state_dict("last").values()))


def test_kept_epochs_are_reached_by_number_and_others_are_refused(runs):
    """A finished trial keeps its best and its last epoch (the copy before the last goes)."""
    (result, _), _, _ = runs
    trial = result.trials[0]
    for number, name in ((1, "best"), (3, "last")):
        assert all(torch.equal(a, b) for a, b in zip(trial.state_dict(number).values(),
                                                      trial.state_dict(name).values()))
    for number in (2, 7):
        with pytest.raises(ValueError, match=rf"^t0000 kept no weights of epoch {number}; it kept epochs \[1, 3\]$"):
            trial.state_dict(number)
    with pytest.raises(ValueError, match=r"epoch='first' must be 'best', 'last' or an epoch number"):
        trial.state_dict("first")


def test_trials_are_ranked_by_their_best_epoch_or_by_their_last(runs):
    (result, _), _, _ = runs
    by_best = sorted(result.trials, key=lambda t: -t.best_metrics["train_loss"])
    by_last = sorted(result.trials, key=lambda t: -t.metrics["train_loss"])
    assert result.ranked() == by_best and result.best is by_best[0]
    assert result.ranked(scope="last") == by_last
    summary = result.summary()
    assert summary.trial_id.tolist() == [t.trial_id for t in by_best]
    assert summary.best_epoch.tolist() == [1, 1] and summary.best_train_loss.tolist() == \
        [t.best_metrics["train_loss"] for t in by_best]
    with pytest.raises(ValueError, match=r"scope='first' must be 'best' or 'last'"):
        result.ranked(scope="first")


def test_one_worker_and_two_keep_the_same_best_weights(runs):
    (one, two), _, _ = runs
    for a, b in zip(one.trials, two.trials):
        assert (a.best_epoch, a.best_metrics) == (b.best_epoch, b.best_metrics)
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_trial_without_a_finite_metric_has_no_best_epoch(tmp_path):
    data, _, _ = split_digits()
    result = cb.GridSearch(build, {"diverge": cb.choice([True, False])}, epochs=1).fit(
        data, workers=1, store=tmp_path / "run", seed=0, verbose=0)
    diverged, completed = result.trials
    assert diverged.best_epoch is None and diverged.best_metrics == {}
    assert completed.best_epoch == 1 and result.best is completed and not math.isnan(completed.best_metrics["val_loss"])
    assert result.ranked() == [completed, diverged]
