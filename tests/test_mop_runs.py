"""Invariants 1 and 2 of DESIGN.md, proven on real runs with local worker processes.

One grid (MLP and CNN with dropout, two learning rates) runs on 1, 2 and 4 workers with
``partitions=4`` and the same seed, and once more on 2 workers; every run must produce the
same weights and histories bit for bit, and every schedule must be a valid MOP schedule.
"""
from __future__ import annotations

import os

import pandas as pd
import pytest
import torch
from _models import build, digits, eval_waits_for_next_epoch

import cerebro as cb
from cerebro.engine import visit_order

pytestmark = pytest.mark.slow

SEED = 7
SPACE = {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.choice([1e-2, 3e-3])}
EPOCHS = 3


class BarrierGridSearch(cb.GridSearch):
    """Grid search whose every epoch ends with its evals, as for a searcher that needs them."""

    def continues_after(self, trial_id: str, epoch: int) -> bool:
        return False


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, cb.Result]:
    out = {}
    for name, workers in (("1", 1), ("2", 2), ("4", 4), ("2-rerun", 2), ("2-barrier", 2)):
        searcher = BarrierGridSearch if name.endswith("barrier") else cb.GridSearch
        search = searcher(build, SPACE, epochs=EPOCHS, metric="val_accuracy", mode="max")
        # Convolutions add up in a thread-count dependent order, so threads stay equal.
        backend = cb.LocalBackend(workers=workers, threads_per_worker=1)
        out[name] = search.fit(digits(partitions=4), backend=backend, seed=SEED, verbose=0,
                               store=tmp_path_factory.mktemp("runs") / f"w{name}")
    return out


@pytest.mark.parametrize("name", ["1", "2", "4"])
def test_every_trial_trains_on_every_partition_once_per_epoch_in_seeded_order(runs, name):
    result = runs[name]
    schedule = result.schedule()
    assert len(result.trials) == 4 and all(t.status == "completed" for t in result.trials)
    for kind in ("train", "eval"):
        visits = schedule[schedule.kind == kind].groupby(["trial_id", "epoch", "partition"]).size()
        assert len(visits) == 4 * EPOCHS * 4 and (visits == 1).all()
    for (trial_id, epoch), rows in schedule[schedule.kind == "train"].groupby(["trial_id", "epoch"]):
        assert rows.sort_values("start").partition.tolist() == visit_order(SEED, trial_id, epoch, 4)


@pytest.mark.parametrize("name", ["1", "2", "4", "2-barrier"])
def test_no_worker_runs_two_sub_epochs_and_no_trial_is_on_two_workers(runs, name):
    schedule = runs[name].schedule()
    workers = int(name[0])
    assert (schedule.worker == schedule.partition % workers).all()  # data never moves
    for _, rows in schedule.groupby("worker"):
        rows = rows.sort_values("start")
        assert (rows.start.to_numpy()[1:] >= rows.end.to_numpy()[:-1]).all()
    for trial_id, rows in schedule.groupby("trial_id"):
        rows = rows.sort_values("start").reset_index(drop=True)
        for i, a in rows.iterrows():
            for _, b in rows.iloc[i + 1:].iterrows():
                overlap = a.start < b.end and b.start < a.end
                # a trial trains on one worker at a time; its eval visits read a frozen state
                assert not overlap or "eval" in (a.kind, b.kind), (trial_id, a.to_dict(), b.to_dict())
        # An epoch's evals come after its training. Grid search goes on whatever the metrics,
        # so they may run alongside the next epoch (the one after waits for them; that they
        # do overlap is proven by test_grid_search_starts_the_next_epoch_while_evals_run);
        # with a searcher that needs them, the next epoch waits.
        for epoch in range(1, EPOCHS + 1):
            train = rows[(rows.epoch == epoch) & (rows.kind == "train")]
            evals = rows[(rows.epoch == epoch) & (rows.kind == "eval")]
            later = rows[(rows.epoch == epoch + 1) & (rows.kind == "train")]
            assert train.end.max() <= evals.start.min()
            assert later.empty or train.end.max() <= later.start.min()
            if name.endswith("barrier"):
                assert later.empty or evals.end.max() <= later.start.min()
            elif not later.empty:
                assert (rows[rows.epoch == epoch + 2].start >= evals.end.max()).all()


def test_grid_search_starts_the_next_epoch_while_evals_run(tmp_path):
    """The first eval visit waits until the next epoch's training has run a batch, so this
    run ends only if grid search starts an epoch while the epoch before is being evaluated."""
    gate = tmp_path / "gate"
    gate.mkdir()
    search = cb.GridSearch(eval_waits_for_next_epoch(str(gate)), {"lr": cb.choice([1e-2])}, epochs=2,
                           metric="val_accuracy", mode="max")
    result = search.fit(digits(partitions=4), backend=cb.LocalBackend(workers=2), seed=SEED, verbose=0,
                        store=tmp_path / "run")
    assert [t.status for t in result.trials] == ["completed"], result.trials[0].error
    assert (gate / "eval-waited").exists() and (gate / "later-epoch-trained").exists()
    schedule = result.schedule()
    evals = schedule[(schedule.epoch == 1) & (schedule.kind == "eval")]
    later = schedule[(schedule.epoch == 2) & (schedule.kind == "train")]
    assert evals.end.max() > later.start.min()


def test_evals_alongside_the_next_epoch_change_no_result(runs):
    """Overlapping an epoch's evals with the next epoch changes when they run, not what."""
    overlapped, barrier = runs["2"], runs["2-barrier"]
    pd.testing.assert_frame_equal(overlapped.history(), barrier.history(), check_exact=True)
    for a, b in zip(overlapped.trials, barrier.trials):
        state_a, state_b = a.state_dict(), b.state_dict()
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


@pytest.mark.parametrize("other", ["2", "4", "2-rerun"])
def test_same_seed_gives_bitwise_identical_weights_and_histories_on_any_worker_count(runs, other):
    reference, result = runs["1"], runs[other]
    pd.testing.assert_frame_equal(reference.history(), result.history(), check_exact=True)
    for a, b in zip(reference.trials, result.trials):
        assert a.config == b.config
        state_a, state_b = a.state_dict(), b.state_dict()
        assert state_a.keys() == state_b.keys()
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def test_load_rebuilds_the_same_result(runs):
    result = runs["2"]
    loaded = cb.load(result.run_dir)
    assert loaded.finished
    assert loaded.best.trial_id == result.best.trial_id
    assert loaded.best.metrics == result.best.metrics
    pd.testing.assert_frame_equal(loaded.history(), result.history(), check_exact=True)
    pd.testing.assert_frame_equal(loaded.schedule(), result.schedule(), check_exact=True)
    model = loaded.best.model()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in result.best.state_dict().items())


def test_best_honours_metric_and_mode(runs):
    result = runs["2"]
    last = result.history().groupby("trial_id").last()
    assert result.best.trial_id == last.val_accuracy.idxmax()
    assert result.summary().trial_id.tolist()[0] == result.best.trial_id


def test_run_directory_holds_settings_journal_checkpoints_history_and_schedule(runs):
    result = runs["4"]
    import json
    info = json.load(open(os.path.join(result.run_dir, "run.json")))
    assert info["seed"] == SEED and info["workers"] == 4 and info["data"]["partitions"] == 4
    assert info["searcher"] == {"class": "GridSearch", "metric": "val_accuracy", "mode": "max",
                                "space": {"architecture": "choice(['mlp', 'cnn'])",
                                          "lr": "choice([0.01, 0.003])"}, "epochs": EPOCHS}
    assert info["data"]["fingerprint"] == runs["1"].store.read_run_info()["data"]["fingerprint"]
    for trial in result.trials:
        assert json.load(open(os.path.join(result.run_dir, "trials", trial.trial_id, "config.json"))) == trial.config
        assert os.path.exists(os.path.join(result.run_dir, "trials", trial.trial_id, "checkpoint.state"))
    history = pd.read_csv(os.path.join(result.run_dir, "history.csv"))
    assert len(history) == 4 * EPOCHS
    schedule = pd.read_csv(os.path.join(result.run_dir, "schedule.csv"))
    assert len(schedule) == 4 * EPOCHS * 8
    assert set(result.history().columns) >= {"trial_id", "epoch", "train_loss", "train_accuracy",
                                              "val_loss", "val_accuracy", "architecture", "lr"}


def design_example_build(config: dict) -> cb.TorchTrainable:
    """The API example of DESIGN.md: an MLP with Adam."""
    model = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["hidden"], 10))
    return cb.TorchTrainable(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             loss=torch.nn.functional.cross_entropy, batch_size=config["batch_size"],
                             metrics={"accuracy": cb.metrics.accuracy})


def test_default_backend_is_bitwise_reproducible_across_worker_counts_for_mlps(tmp_path):
    """With every default left alone, matrix-multiply models agree bit for bit on 1 and 4
    workers (one torch thread per worker, whatever the worker count)."""
    space = {"lr": cb.loguniform(1e-3, 1e-1), "batch_size": cb.choice([32, 64]), "hidden": cb.choice([64, 256])}
    search = cb.RandomSearch(design_example_build, space, num_trials=3, epochs=2, metric="val_accuracy", mode="max")
    one, four = (search.fit(digits(partitions=4), workers=w, seed=3, store=tmp_path / f"w{w}", verbose=0)
                 for w in (1, 4))
    for result in (one, four):
        info = result.store.read_run_info()
        assert info["threads_per_worker"] == 1
        assert info["reproducible"] == {"across_worker_counts_and_backends": True, "why_not": None}
    pd.testing.assert_frame_equal(one.history(), four.history(), check_exact=True)
    for a, b in zip(one.trials, four.trials):
        assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_default_backend_is_bitwise_reproducible_across_worker_counts_for_cnns_with_dropout(tmp_path):
    search = cb.GridSearch(build, {"architecture": "cnn", "lr": cb.choice([1e-2, 3e-3])}, epochs=2)
    one, two, four = (search.fit(digits(partitions=4), workers=w, seed=7, store=tmp_path / f"w{w}", verbose=0)
                      for w in (1, 2, 4))
    for other in (two, four):
        pd.testing.assert_frame_equal(one.history(), other.history(), check_exact=True)
        for a, b in zip(one.trials, other.trials):
            assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_more_threads_per_worker_says_what_it_gives_up(tmp_path):
    search = cb.GridSearch(design_example_build, {"lr": 0.01, "batch_size": 32, "hidden": 64}, epochs=1)
    with pytest.warns(UserWarning, match=r"^threads_per_worker=2: CPU kernels \(matrix products, convolutions\) "
                                         r"add up in an order that depends on the thread count, so this run is "
                                         r"bitwise equal only to runs with the same threads_per_worker; 1 \(the "
                                         r"local default\) gives the same bits on any worker count$") as caught:
        result = search.fit(digits(partitions=2), backend=cb.LocalBackend(1, threads_per_worker=2), seed=0,
                            store=tmp_path / "run", verbose=0)
    assert len([w for w in caught if "threads_per_worker" in str(w.message)]) == 1
    assert result.store.read_run_info()["reproducible"] == {"across_worker_counts_and_backends": False,
                                                             "why_not": str(caught[0].message)}


def test_communicated_bytes_are_journaled(runs):
    result = runs["2"]     # what they count: tests/test_direct_hops.py
    assert result.bytes_communicated > 0
    assert cb.load(result.run_dir).bytes_communicated == result.bytes_communicated
