"""A run stopped on purpose, by ``time_budget`` or ``cb.stop``, ends at its trials' epoch
boundaries, resumable, and its resume reaches the uninterrupted run's results bitwise."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time

import pytest
from _crash import assert_same_results
from _faults import epochs_journaled
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([1e-2, 3e-3, 1e-3, 3e-4])}
EPOCHS = 40


def search() -> cb.GridSearch:
    return cb.GridSearch(build, SPACE, epochs=EPOCHS)


def fit(store, **settings) -> cb.Result:
    return search().fit(digits(partitions=2), backend=cb.LocalBackend(2, threads_per_worker=1), seed=3, store=store,
                        verbose=0, **settings)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> cb.Result:
    return fit(tmp_path_factory.mktemp("whole") / "run")


def assert_stopped_at_epoch_boundaries(result: cb.Result) -> None:
    assert not result.finished
    assert [e["event"] for e in result.store.events()][-1] == "run_interrupted"
    assert all(t.status == "running" and t.epochs < EPOCHS for t in result.trials)
    schedule = result.schedule()      # every epoch begun was trained to its end: none cut short
    train = schedule[schedule.kind == "train"]
    assert len(train) == 2 * len(result.history())


def test_a_time_budget_stops_the_run_at_epoch_boundaries_and_resume_goes_on(tmp_path, uninterrupted, caplog):
    store = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="cerebro"):
        stopped = fit(store, time_budget=1.0)
    assert_stopped_at_epoch_boundaries(stopped)
    with open(store / "run.json") as f:
        note = json.load(f)["time_budget"]
    assert note["seconds"] == 1.0 and "depends on timing" in note["note"]
    messages = [r.getMessage() for r in caplog.records if r.name == "cerebro"]
    assert messages[0] == note["note"] and "its time_budget of 1 s has passed" in messages[1]
    assert_same_results(cb.resume(store, verbose=0), uninterrupted, partitions=2)


def test_cb_stop_stops_a_live_run_and_resume_goes_on(tmp_path, uninterrupted):
    store = str(tmp_path / "run")
    finished: list[cb.Result] = []
    running = threading.Thread(target=lambda: finished.append(fit(store)))
    running.start()
    deadline = time.monotonic() + 300
    while epochs_journaled(store) < 6 and running.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)       # waiting for the run to be under way, not standing in for it
    cb.stop(store)
    running.join(timeout=300)
    assert not running.is_alive() and not os.path.exists(os.path.join(store, "stop"))
    assert_stopped_at_epoch_boundaries(finished[0])
    assert_same_results(cb.resume(store, verbose=0), uninterrupted, partitions=2)


def test_a_finished_run_cannot_be_stopped(uninterrupted):
    with pytest.raises(ValueError, match=r"has finished; there is nothing to stop$"):
        cb.stop(uninterrupted.run_dir)
    done = subprocess.run([sys.executable, "-m", "cerebro", "stop", uninterrupted.run_dir], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "has finished; there is nothing to stop" in done.stderr


@pytest.mark.parametrize("budget", [0, -1.0, "10"])
def test_a_bad_time_budget_is_refused_before_any_work(tmp_path, budget):
    with pytest.raises((ValueError, TypeError), match=rf"time_budget={budget!r} must be a positive number"):
        fit(tmp_path / "run", time_budget=budget)
    assert not os.path.exists(tmp_path / "run")
