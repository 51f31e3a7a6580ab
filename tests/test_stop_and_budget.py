"""A run stopped on purpose, by ``time_budget`` or ``cb.stop``, ends at its trials' epoch
boundaries, resumable, its live trials ``parked`` and ranked with the others by their best
epoch (``result.best`` and ``cerebro status``), and its resume (``cb.resume``, or the script's
``fit(..., resume=True)`` run again) reaches the uninterrupted run's results bitwise."""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import warnings

import pandas as pd
import pytest
import torch
from _crash import assert_same_results
from _faults import epochs_journaled, journaled
from _models import build, digits
from click.testing import CliRunner

import cerebro as cb
from cerebro.cli import main

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([1e-2, 3e-3, 1e-3, 3e-4])}
EPOCHS = 40


def search(epochs: int = EPOCHS) -> cb.GridSearch:
    return cb.GridSearch(build, SPACE, epochs=epochs)


def fit(store, epochs: int = EPOCHS, **settings) -> cb.Result:
    return search(epochs).fit(digits(partitions=2), backend=cb.LocalBackend(2, threads_per_worker=1), seed=3,
                              store=store, verbose=0, **settings)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> cb.Result:
    return fit(tmp_path_factory.mktemp("whole") / "run")


def assert_stopped_at_epoch_boundaries(result: cb.Result, state: str) -> None:
    """Stopped at epoch boundaries, saying why; the trials it had not ended are parked."""
    assert not result.finished and result.state == state
    assert [e["event"] for e in result.store.events()][-1] == "run_interrupted"
    assert all(t.status in ("parked", "stopped") and t.epochs < EPOCHS for t in result.trials)
    parked = [t.trial_id for t in result.trials if t.status == "parked"]
    schedule, history = result.schedule(), result.history()    # a parked trial's epochs begun all ended
    train = schedule[(schedule.kind == "train") & schedule.trial_id.isin(parked)]
    assert len(train) == 2 * len(history[history.trial_id.isin(parked)])


def assert_best_so_far(result: cb.Result) -> cb.TrialResult:
    """``result.best`` is the trial whose best epoch is the best of all (parked ones too), and
    the weights of that epoch are there: read without a warning, they are not the last's."""
    history = result.history()
    best_row = history.loc[history.val_loss.idxmin()]
    best = result.best
    assert (best.trial_id, best.best_epoch, best.best_metrics["val_loss"]) == \
        (best_row.trial_id, best_row.epoch, best_row.val_loss)
    assert [t.trial_id for t in result.ranked() if t.best_epoch is not None] == \
        history.groupby("trial_id").val_loss.min().sort_values(kind="stable").index.tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights = best.state_dict()
    assert best.epoch_number("best") == best.best_epoch
    assert best.best_epoch == best.epochs or not all(torch.equal(v, best.state_dict("last")[k])
                                                     for k, v in weights.items())
    return best


def status_lines(store) -> list[str]:
    """``cerebro status`` at 80 columns: its first line (as long as the store's path makes it)
    and the trials' rows (id, status) of its table, which fits, as every line after it."""
    done = CliRunner().invoke(main, ["status", str(store)], env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert all(len(line) <= 80 for line in lines[1:]), done.output
    return [lines[0], *(" ".join(line.split()[:2]) for line in lines if re.match(r"^ ?t\d{4} ", line))]


def test_a_time_budget_stops_the_run_and_the_script_run_again_goes_on(tmp_path, uninterrupted, caplog):
    """No trial ran to its end within the budget: the best so far is the best parked one. The
    script run again with resume=True goes on, bitwise; once more, it returns the finished
    run as it is; another search there is refused, saying how it differs."""
    store = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="cerebro"):
        stopped = fit(store, time_budget=1.0)
    assert_stopped_at_epoch_boundaries(stopped, "budget")
    assert {t.status for t in stopped.trials} == {"parked"}
    with open(store / "run.json") as f:
        note = json.load(f)["time_budget"]
    assert note["seconds"] == 1.0 and "depends on timing" in note["note"]
    messages = [r.getMessage() for r in caplog.records if r.name == "cerebro"]
    assert messages[0] == note["note"] and "its time_budget of 1 s has passed" in messages[1]
    best = assert_best_so_far(stopped)
    page = open(cb.report.write_report(str(store), tmp_path / "report.html"), encoding="utf-8").read()
    assert f"Best so far: <b>{best.trial_id}</b> at epoch {best.best_epoch}: val_loss = " in page
    assert status_lines(store) == [f"stopped by its time_budget: 0 of 4 trials ended, 4 parked; `cerebro resume "
                                   f"{store}` goes on", *(f"{t.trial_id} parked" for t in stopped.ranked())]
    assert status_lines(store)[1] == f"{best.trial_id} parked"
    resumed = fit(store, resume=True)
    assert_same_results(resumed, uninterrupted, partitions=2)
    journal = (store / "journal.jsonl").read_bytes()
    again = fit(store, resume=True)         # finished: returned as it is, nothing run
    assert again.finished and (store / "journal.jsonl").read_bytes() == journal
    pd.testing.assert_frame_equal(again.history(), uninterrupted.history(), check_exact=True)
    created = json.loads((store / "run.json").read_text())["created"]
    with pytest.raises(FileExistsError) as refused:
        fit(store, epochs=EPOCHS + 1, resume=True)
    assert str(refused.value) == (
        f"store {str(store)!r} holds another search (GridSearch, created {created}): its epochs is {EPOCHS}, this "
        f"search's {EPOCHS + 1}. fit(..., resume=True) goes on only with the same search (space, searcher settings, "
        f"data and seed); to go on with that run: cb.resume({str(store)!r}); for this search, choose another store "
        f"or delete that one")
    with pytest.raises(FileExistsError, match=r"\): its seed is 3, this fit's 4\. fit\(\.\.\., resume=True\)"):
        search().fit(digits(partitions=2), workers=2, seed=4, store=store, verbose=0, resume=True)
    fewer, recorded = digits(partitions=2, rows=500), resumed.store.read_run_info()["data"]["fingerprint"]
    with pytest.raises(FileExistsError, match=rf"\): its data's fingerprint is {recorded}, this data's "
                                              rf"{fewer.fingerprint()} \(other rows, labels or split\)\. fit"):
        search().fit(fewer, workers=2, seed=3, store=store, verbose=0, resume=True)
    assert (store / "journal.jsonl").read_bytes() == journal


def test_cb_stop_stops_a_live_run_and_resume_goes_on(tmp_path, uninterrupted):
    """The slowest-learning trial is stopped by the user early, then the run: the parked trials
    rank above it, as their best epochs are better; resume finishes them bitwise as the
    uninterrupted run did, the stopped one staying stopped where it was."""
    store = str(tmp_path / "run")
    finished: list[cb.Result] = []
    running = threading.Thread(target=lambda: finished.append(fit(store)))
    running.start()
    deadline = time.monotonic() + 300
    while epochs_journaled(store) < 4 and running.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)       # waiting for the run to be under way, not standing in for it
    cb.stop(store, trial="t0003")            # lr 3e-4: the worst at any epoch
    while (journaled(store, "trial_ended") < 1 or epochs_journaled(store) < 16) and running.is_alive() and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    cb.stop(store)
    running.join(timeout=300)
    assert not running.is_alive() and not os.path.exists(os.path.join(store, "stop"))
    stopped = finished[0]
    assert_stopped_at_epoch_boundaries(stopped, "stopped")
    assert [str(t.status) for t in stopped.trials] == ["parked", "parked", "parked", "stopped"]
    best = assert_best_so_far(stopped)
    assert best.status == "parked" and stopped.ranked()[-1].trial_id == "t0003"
    assert status_lines(store) == [f"stopped by cerebro stop: 1 of 4 trials ended, 3 parked; `cerebro resume "
                                   f"{store}` goes on", *(f"{t.trial_id} {t.status}" for t in stopped.ranked())]
    resumed = cb.resume(store, verbose=0)
    assert resumed.finished
    history, expected = resumed.history(), uninterrupted.history()
    user_stopped = stopped.trials[3].epochs
    pd.testing.assert_frame_equal(history, expected[(expected.trial_id != "t0003") | (expected.epoch <= user_stopped)]
                                  .reset_index(drop=True), check_exact=True)
    for a, b in zip(resumed.trials[:3], uninterrupted.trials[:3]):
        assert (a.status, a.best_epoch) == (b.status, b.best_epoch) == ("completed", b.best_epoch)
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert (resumed.trials[3].status, resumed.trials[3].reason) == ("stopped", "stopped by the user")


class PausesAfterTheFirstEpoch(cb.Searcher):
    """One trial, paused after its first epoch; ``decide`` looks at the run (as ``cb.load`` and
    ``cerebro status`` would from anywhere) once the pause is journaled, then lets it go on."""

    def start(self, seed):
        self._pending, self._paused = True, False

    def suggest(self):
        pending, self._pending = self._pending, False
        return [cb.engine.TrialRequest({"lr": 1e-2}, 2)] if pending else []

    def report(self, trial_id, epoch, metrics):
        self._paused = epoch == 1
        return cb.engine.Decision.PAUSE if self._paused else cb.engine.Decision.CONTINUE

    def decide(self):
        if not self._paused:
            return {}
        self._paused = False
        deadline = time.monotonic() + 60
        while b'"decision": "pause"' not in open(os.path.join(self.store, "journal.jsonl"), "rb").read():
            assert time.monotonic() < deadline, "the pause was not journaled"
            time.sleep(0.05)       # the journal is written off the driver's thread
        live = cb.load(self.store)
        self.seen.append((str(live.state), *(f"{t.trial_id} {t.status}" for t in live.trials), live.best.trial_id))
        return {"t0000": cb.engine.Decision.CONTINUE}


def test_a_trial_the_searcher_paused_is_paused_while_the_run_goes(tmp_path):
    search = PausesAfterTheFirstEpoch(build, {"lr": 1e-2})
    search.store, search.seen = str(tmp_path / "run"), []
    result = search.fit(digits(partitions=1, rows=100), workers=1, store=search.store, seed=0, verbose=0)
    assert search.seen == [("running", "t0000 paused", "t0000")]
    assert result.state == "finished" and [str(t.status) for t in result.trials] == ["completed"]


def test_a_finished_run_cannot_be_stopped(uninterrupted, monkeypatch, capsys):
    from _cli import cerebro
    with pytest.raises(ValueError, match=r"has finished; there is nothing to stop$"):
        cb.stop(uninterrupted.run_dir)
    done = cerebro(monkeypatch, capsys, "stop", uninterrupted.run_dir)
    assert done.returncode == 2 and "has finished; there is nothing to stop" in done.stderr


def test_resume_true_needs_the_store_to_go_on_with(tmp_path):
    with pytest.raises(ValueError, match=r"^resume=True goes on with the run in store=, so give the store \(the same "
                                         r"each time the script runs\), e\.g\. store='runs/exp1'$"):
        fit(None, resume=True)
    with pytest.raises(TypeError, match=r"^resume='yes' must be"):
        fit(tmp_path / "run", resume="yes")
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("budget", [0, -1.0, "10"])
def test_a_bad_time_budget_is_refused_before_any_work(tmp_path, budget):
    with pytest.raises((ValueError, TypeError), match=rf"time_budget={budget!r} must be a positive number"):
        fit(tmp_path / "run", time_budget=budget)
    assert not os.path.exists(tmp_path / "run")
