"""Steering a live run through its run directory: ``cb.stop(run_dir, trial=...)`` ends one
trial "stopped by the user" while the others go on; ``cb.add_trial`` adds one to a live grid,
where it trains as that config's trial of the grid would have; both are journaled where they
took effect, and a resume replays them there to the same results; a bad command is refused
with the reason and the run untouched."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pandas as pd
import pytest
from _cli import cerebro
from _faults import epochs_journaled, journaled
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow
EPOCHS = 20


def fit(store, lrs: list[float]) -> cb.Result:
    return cb.GridSearch(build, {"lr": cb.choice(lrs), "hidden": 16}, epochs=EPOCHS).fit(
        digits(partitions=2), backend=cb.LocalBackend(2, threads_per_worker=1), seed=5, store=store, verbose=0)


def while_running(store: str, lrs: list[float], command, epochs: int = 2):
    """Run the grid in a thread; once ``epochs`` epochs are journaled, ``command()``; the
    result of the run and what the command returned or raised."""
    finished: list[cb.Result] = []
    running = threading.Thread(target=lambda: finished.append(fit(store, lrs)))
    running.start()
    deadline = time.monotonic() + 300
    while epochs_journaled(store) < epochs and running.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)       # waiting for the run to be under way, not standing in for it
    try:
        answer = command()
    except Exception as error:   # noqa: BLE001  (the test looks at it)
        answer = error
    running.join(timeout=600)
    assert not running.is_alive()
    return finished[0], answer


def replayed(result: cb.Result, tmp_path, after: str) -> cb.Result:
    """The run resumed from a copy whose journal ends at the first epoch end after the line
    ``after`` (the command's), before the decisions it led to."""
    copy = str(shutil.copytree(result.run_dir, tmp_path / "cut"))
    journal = os.path.join(copy, "journal.jsonl")
    with open(journal, "rb") as f:
        lines = f.readlines()
    command = next(i for i, line in enumerate(lines) if f'"event": "{after}"'.encode() in line)
    cut = next(i for i, line in enumerate(lines) if i > command and b'"event": "epoch_end"' in line)
    with open(journal, "wb") as f:
        f.writelines(lines[:cut + 1])
    return cb.resume(copy, verbose=0)


def test_one_trial_stopped_by_the_user_ends_there_while_the_others_go_on(tmp_path):
    store = str(tmp_path / "run")
    result, answer = while_running(store, [1e-2, 3e-3, 1e-3], lambda: cb.stop(store, trial="t0001"))
    assert answer is None
    stopped = result.trials[1]
    assert (stopped.status, stopped.reason) == ("stopped", "stopped by the user") and stopped.epochs < EPOCHS
    assert [(t.status, t.epochs) for t in (result.trials[0], result.trials[2])] == [("completed", EPOCHS)] * 2
    assert journaled(store, "trial_stop_asked") == 1
    again = replayed(result, tmp_path, "trial_stop_asked")
    pd.testing.assert_frame_equal(again.history(), result.history(), check_exact=True)
    assert [(t.status, t.reason) for t in again.trials] == [(t.status, t.reason) for t in result.trials]


def test_a_trial_added_to_a_live_grid_trains_as_that_configs_trial_of_the_grid(tmp_path):
    store = str(tmp_path / "run")
    result, answer = while_running(store, [1e-2, 3e-3], lambda: cb.add_trial(store, {"lr": 1e-3, "hidden": 16}))
    assert answer == "t0002"
    assert [(t.trial_id, t.config, t.status, t.epochs) for t in result.trials][2] == \
        ("t0002", {"lr": 1e-3, "hidden": 16}, "completed", EPOCHS)
    grid = fit(str(tmp_path / "grid"), [1e-2, 3e-3, 1e-3])
    pd.testing.assert_frame_equal(result.history(), grid.history(), check_exact=True)
    again = replayed(result, tmp_path, "trial_added")
    pd.testing.assert_frame_equal(again.history(), result.history(), check_exact=True)


def test_a_bad_command_is_refused_with_the_reason_and_the_run_untouched(tmp_path, monkeypatch, capsys):
    store = str(tmp_path / "run")

    def bad_commands() -> list[str]:
        refused = []
        for command in (lambda: cb.add_trial(store, {"lr": "fast", "hidden": 16}),
                        lambda: cb.add_trial(store, {"lr": 1e-3}),
                        lambda: cb.stop(store, trial="t0042")):
            with pytest.raises(ValueError) as error:
                command()
            refused.append(str(error.value))
        return refused

    result, refused = while_running(store, [1e-2, 3e-3], bad_commands)
    assert refused == [
        "config['lr']='fast' must be a value of the kind of choice([0.01, 0.003])'s",
        "config has keys ['lr']; the space has ['hidden', 'lr']: give every key, and no other",
        "trial 't0042' is not a live trial of this run; the live ones are ['t0000', 't0001']"]
    assert len(result.trials) == 2 and {t.status for t in result.trials} == {"completed"}
    assert journaled(store, "trial_added") == journaled(store, "trial_stop_asked") == 0
    assert os.listdir(os.path.join(store, "commands")) == []
    with pytest.raises(ValueError, match=r"has finished; trials cannot be added to it"):
        cb.add_trial(store, {"lr": 1e-3, "hidden": 16})
    done = cerebro(monkeypatch, capsys, "stop", store, "--trial", "t0000")
    assert done.returncode == 2 and "has finished; there is nothing to stop" in done.stderr


def test_trials_can_be_added_to_grid_and_random_runs_only():
    space = {"lr": cb.loguniform(1e-4, 1e-1), "layers": cb.randint(1, 4), "act": "relu"}
    request = cb.RandomSearch(build, space, epochs=3).added({"lr": 0.01, "layers": 3, "act": "tanh"})
    assert (request.config, request.max_epochs) == ({"lr": 0.01, "layers": 3, "act": "tanh"}, 3)
    with pytest.raises(ValueError, match=r"^config\['layers'\]=4 must be an integer in \[1, 4\)$"):
        cb.RandomSearch(build, space).added({"lr": 0.01, "layers": 4, "act": "relu"})
    with pytest.raises(ValueError, match=r"^config\['lr'\]=0.5 must be a number in \[0.0001, 0.1\]"):
        cb.RandomSearch(build, space).added({"lr": 0.5, "layers": 1, "act": "relu"})
    for searcher in (cb.PBT(build, space), cb.ASHA(build, space), cb.Hyperband(build, space),
                     cb.TPESearch(build, space), cb.BOHB(build, space)):
        with pytest.raises(ValueError, match=rf"^trials cannot be added to a {type(searcher).__name__} run: it "
                                             rf"chooses its trials itself"):
            searcher.added({"lr": 0.01, "layers": 1, "act": "relu"})


def test_a_run_without_a_driver_is_not_steered(tmp_path, monkeypatch, capsys):
    """An interrupted run: no driver would take the command, so none is written."""
    result = fit(str(tmp_path / "run"), [1e-2])
    journal = os.path.join(result.run_dir, "journal.jsonl")
    with open(journal, "rb") as f:
        lines = f.readlines()
    with open(journal, "wb") as f:
        f.writelines(lines[:-1])        # the run_finished line: as if its driver had died
    with pytest.raises(ValueError, match=r"^no driver runs .* now; `cerebro resume .*` goes on with it$"):
        cb.add_trial(result.run_dir, {"lr": 1e-3, "hidden": 16})
    assert not os.path.exists(os.path.join(result.run_dir, "commands"))
    done = cerebro(monkeypatch, capsys, "add", result.run_dir, "--config", "{lr: 1}")
    assert done.returncode == 2 and "is not JSON" in done.stderr
    assert json.loads(open(os.path.join(result.run_dir, "run.json")).read())["searcher"]["class"] == "GridSearch"


def test_crafted_command_files_are_answered_once_with_an_error_never_crashing_the_driver(tmp_path):
    """What anyone who can write the run directory can put in commands/: deep JSON, a
    directory, a FIFO, links, a huge file. Each is answered with an error once; the regular
    files the driver read are removed, and nothing else (never a directory's contents)."""
    from cerebro.engine._control import take_commands
    from cerebro.store import RunStore
    result = fit(str(tmp_path / "run"), [1e-2])
    commands = os.path.join(result.run_dir, "commands")
    os.makedirs(os.path.join(commands, "d.json", "inside"))
    os.mkfifo(os.path.join(commands, "f.json"))
    os.symlink("/etc/hostname", os.path.join(commands, "l.json"))
    os.symlink("/nonexistent", os.path.join(commands, "m.json"))
    with open(os.path.join(commands, "a.json"), "w") as f:
        f.write("[" * 200_000)
    with open(os.path.join(commands, "h.json"), "w") as f:
        f.write('{"kind": "add_trial", "config": "' + "x" * (2 << 20) + '"}')
    refused: set[str] = set()
    taken = take_commands(RunStore.open(result.run_dir), refused)
    assert [name for name, _ in taken] == ["a", "d", "f", "h", "l", "m"]
    assert all(isinstance(command, ValueError) for _, command in taken)
    assert sorted(os.listdir(commands)) == ["d.json", "f.json", "l.json", "m.json"]
    assert os.listdir(os.path.join(commands, "d.json")) == ["inside"]
    assert take_commands(RunStore.open(result.run_dir), refused) == []     # answered once


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), None, "5", True])
def test_a_bad_timeout_is_refused_before_anything_is_written(tmp_path, timeout):
    with pytest.raises(ValueError, match=rf"^timeout={timeout!r} must be a positive number of seconds$"):
        cb.add_trial(tmp_path, {"lr": 1e-3}, timeout=timeout)
    with pytest.raises(ValueError, match=r"must be a positive number of seconds$"):
        cb.stop(tmp_path, trial="t0000", timeout=timeout)
    assert os.listdir(tmp_path) == []
