"""Which weights a run keeps on disk: by default every finished trial's best and last epoch
(no ``prev`` copies once it ended); with ``keep_checkpoints=k`` only the k best finished
trials', the others' deleted as trials end (their directories too: no file a trial), with the
same weights as a run that kept all."""
from __future__ import annotations

import os

import pytest
import torch
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([3e-2, 1e-2, 3e-3, 1e-3])}


KEPT = {"config.json", "checkpoint.state", "checkpoint.best.state"}


def files_of(run_dir: str, trial_id: str) -> set[str]:
    directory = os.path.join(run_dir, "trials", trial_id)
    return set(os.listdir(directory)) if os.path.isdir(directory) else set()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retention")
    return [cb.GridSearch(build, SPACE, epochs=3).fit(digits(partitions=2), backend=cb.LocalBackend(
        2, threads_per_worker=1), seed=2, store=tmp / f"keep{keep}", verbose=0, keep_checkpoints=keep)
        for keep in (None, 2)]


def test_by_default_a_finished_trial_keeps_its_best_and_last_epoch_only(runs):
    every, _ = runs
    for trial in every.trials:
        assert files_of(every.run_dir, trial.trial_id) == KEPT
        trial.state_dict("best"), trial.state_dict("last")


def test_keep_checkpoints_keeps_the_weights_of_the_best_k_trials_only(runs):
    every, kept = runs
    ranked = [t.trial_id for t in kept.ranked()]
    for trial in kept.trials:
        if trial.trial_id in ranked[:2]:
            assert files_of(kept.run_dir, trial.trial_id) == KEPT
            same = next(t for t in every.trials if t.trial_id == trial.trial_id)
            assert all(torch.equal(a, b) for a, b in zip(trial.state_dict().values(), same.state_dict().values()))
        else:
            assert files_of(kept.run_dir, trial.trial_id) == set()      # nor its config.json, nor its directory
            assert not os.path.exists(os.path.join(kept.run_dir, "trials", trial.trial_id))
            with pytest.raises(FileNotFoundError, match=rf"^{trial.trial_id} kept no weights: the run kept only the "
                                                        rf"best 2 finished trials' \(keep_checkpoints=2\)$"):
                trial.state_dict()
    assert kept.best.trial_id == every.best.trial_id == ranked[0]
    assert cb.load(kept.run_dir).keep_checkpoints == 2


@pytest.mark.parametrize("keep", [0, -1, 1.5, "2"])
def test_a_bad_keep_checkpoints_is_refused_before_any_work(tmp_path, keep):
    with pytest.raises((ValueError, TypeError), match=rf"keep_checkpoints={keep!r} must be a positive integer or None"):
        cb.GridSearch(build, SPACE, epochs=1).fit(digits(partitions=2), workers=1, store=tmp_path / "run",
                                                  verbose=0, keep_checkpoints=keep)
    assert not os.path.exists(tmp_path / "run")
