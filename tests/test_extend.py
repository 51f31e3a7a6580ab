"""Extending a run (``cb.resume(run_dir, epochs=N)``, ``cerebro resume --epochs``): a grid,
random or PBT run trained on to N epochs is bitwise the run that had ``epochs=N`` from the
start (history, weights, decisions, early stops, exploits), on another worker count too;
ASHA, BOHB, Hyperband and TPE runs are refused, saying why, with nothing written."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}


def fit(searcher: cb.Searcher, store, workers: int = 2) -> cb.Result:
    return searcher.fit(digits(partitions=2), backend=cb.LocalBackend(workers, threads_per_worker=1), seed=3,
                        store=store, verbose=0)


def assert_same_run(extended: cb.Result, longer: cb.Result) -> None:
    """The same history, statuses, reasons, best epochs and last weights, bitwise."""
    pd.testing.assert_frame_equal(extended.history(), longer.history(), check_exact=True)
    assert [(t.trial_id, t.status, t.reason, t.epochs, t.best_epoch, t.config) for t in extended.trials] == \
        [(t.trial_id, t.status, t.reason, t.epochs, t.best_epoch, t.config) for t in longer.trials]
    for a, b in zip(extended.trials, longer.trials):
        for epoch in ("last", "best"):
            mine, theirs = a.state_dict(epoch), b.state_dict(epoch)
            assert mine.keys() == theirs.keys()
            assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_an_extended_grid_is_bitwise_the_grid_that_had_the_epochs_from_the_start(tmp_path):
    short = fit(cb.GridSearch(build, SPACE, epochs=2), tmp_path / "short")
    assert {t.status for t in short.trials} == {"completed"} and short.finished
    extended = cb.resume(short.run_dir, epochs=4, workers=1, verbose=0)
    longer = fit(cb.GridSearch(build, SPACE, epochs=4), tmp_path / "longer")
    assert_same_run(extended, longer)
    assert extended.finished and [t.epochs for t in extended.trials] == [4, 4, 4, 4]
    assert '"epochs": 4' in open(os.path.join(short.run_dir, "run.json")).read()
    extended_twice = cb.resume(short.run_dir, epochs=5, verbose=0)
    assert_same_run(extended_twice, fit(cb.GridSearch(build, SPACE, epochs=5), tmp_path / "five"))


def test_early_stopping_and_pbt_exploits_happen_in_the_extension_as_in_the_longer_run(tmp_path):
    """A random search whose trials stop by patience after the old budget, and PBT, whose
    generation at the old last epoch (no exploit there in the short run) exploits."""
    random = dict(num_trials=3, metric="train_loss", mode="max", patience=2)
    short = fit(cb.RandomSearch(build, {"lr": cb.loguniform(1e-3, 3e-2)}, epochs=2, **random), tmp_path / "r2")
    assert {t.status for t in short.trials} == {"completed"}
    longer = fit(cb.RandomSearch(build, {"lr": cb.loguniform(1e-3, 3e-2)}, epochs=5, **random), tmp_path / "r5")
    assert {t.status for t in longer.trials} == {"stopped"}
    assert_same_run(cb.resume(short.run_dir, epochs=5, verbose=0), longer)
    pbt = dict(population=4, perturbation_interval=2, quantile_fraction=0.25)
    space = {"lr": cb.loguniform(1e-3, 3e-2)}
    short = fit(cb.PBT(build, space, epochs=2, **pbt), tmp_path / "p2")
    longer = fit(cb.PBT(build, space, epochs=4, **pbt), tmp_path / "p4")
    assert short.lineage().empty and not longer.lineage().empty     # the exploit at epoch 2 is the extension's
    extended = cb.resume(short.run_dir, epochs=4, verbose=0)
    assert_same_run(extended, longer)
    pd.testing.assert_frame_equal(extended.lineage(), longer.lineage(), check_exact=True)


def test_a_crash_during_the_extension_resumes_to_the_same_run(tmp_path):
    """The journal cut after the extension's first epoch end: a plain resume goes on with the
    extended budget, from the line that extended it."""
    short = fit(cb.GridSearch(build, SPACE, epochs=1), tmp_path / "short")
    extended = cb.resume(short.run_dir, epochs=3, verbose=0)
    copy = str(shutil.copytree(short.run_dir, tmp_path / "cut"))
    journal = os.path.join(copy, "journal.jsonl")
    with open(journal, "rb") as f:
        lines = f.readlines()
    extension = next(i for i, line in enumerate(lines) if b'"event": "run_extended"' in line)
    cut = next(i for i, line in enumerate(lines) if i > extension and b'"event": "epoch_end"' in line)
    with open(journal, "wb") as f:
        f.writelines(lines[:cut + 1])
    assert_same_run(cb.resume(copy, verbose=0), extended)


@pytest.mark.parametrize("searcher, why", [
    (lambda: cb.ASHA(build, SPACE, num_trials=2, max_epochs=2, reduction_factor=2),
     "its rungs are placed by max_epochs"),
    (lambda: cb.BOHB(build, SPACE, num_trials=2, max_epochs=2, reduction_factor=2),
     "its rungs are placed by max_epochs, so with another budget other trials would have been promoted, and its model"),
    (lambda: cb.Hyperband(build, SPACE, max_epochs=2, eta=2), "its brackets and rungs are sized by max_epochs"),
    (lambda: cb.TPESearch(build, {"lr": cb.loguniform(1e-3, 1e-2)}, num_trials=2, epochs=1),
     "each trial it suggested was drawn from the metrics"),
])
def test_searchers_whose_decisions_depend_on_the_budget_are_refused_with_nothing_written(tmp_path, searcher, why):
    result = fit(searcher(), tmp_path / "run")
    before = {name: open(os.path.join(result.run_dir, name), "rb").read() for name in ("journal.jsonl", "run.json")}
    name = type(searcher()).__name__
    with pytest.raises(ValueError) as refused:
        cb.resume(result.run_dir, epochs=4, verbose=0)
    assert str(refused.value).startswith(f"a {name} run cannot be extended: {why}")
    assert str(refused.value).endswith("; to train its best trials longer, run cb.GridSearch over their configs "
                                       "([t.config for t in result.ranked()[:k]]) with the epochs you want")
    assert before == {n: open(os.path.join(result.run_dir, n), "rb").read() for n in before}


def test_a_shorter_budget_is_refused_and_the_same_one_returns_the_run(tmp_path):
    result = fit(cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=2), tmp_path / "run")
    with pytest.raises(ValueError, match=r"^epochs=1 must be an integer of at least the run's epochs \(2\): a run "
                                         r"is extended, never shortened"):
        cb.resume(result.run_dir, epochs=1, verbose=0)
    with pytest.warns(UserWarning, match="has finished with epochs=2 already"):
        same = cb.resume(result.run_dir, epochs=2, verbose=0)
    pd.testing.assert_frame_equal(same.history(), result.history(), check_exact=True)
    done = subprocess.run([sys.executable, "-m", "cerebro", "resume", result.run_dir, "--epochs", "3", "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert cb.load(result.run_dir).trials[0].epochs == 3
