"""Invariant 3: a run whose driver is SIGKILLed resumes to the results of an uninterrupted
run, bitwise, also after its journal tail or a checkpoint was damaged; one driver per run
directory; no worker outlives its driver."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pandas as pd
import psutil
import pytest
import torch
from _crafted import craft_checkpoint, pickled_payload
from _crash import assert_same_results, reference
from _faults import epochs_journaled, hold_at
from _models import build, digits, failing_after

import cerebro as cb
from cerebro.engine import VisitScheme, visit_order

pytestmark = pytest.mark.slow
CRASH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_crash.py")


def crashed_run(tmp_path, point: str) -> str:
    store = str(tmp_path / "run")
    child = subprocess.run([sys.executable, CRASH, store, point], capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-2000:]        # killed, not finished
    assert os.path.exists(store + ".killed")
    assert not cb.load(store).finished
    return store


_UNINTERRUPTED: dict[str, cb.Result] = {}


def uninterrupted(tmp_path, point: str) -> cb.Result:
    """The search of ``point`` run without a fault. It is deterministic and tests only read
    it, so it runs once per session (in the first test's ``tmp_path``), not once per test."""
    if point not in _UNINTERRUPTED:
        _UNINTERRUPTED[point] = reference(point).fit(
            digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1),
            store=tmp_path / f"uninterrupted-{point}", seed=5, verbose=0)
    return _UNINTERRUPTED[point]


def workers_of(store: str) -> list[int]:
    return [w["pid"] for e in cb.load(store).store.events() if e["event"] in ("run_started", "run_resumed")
            for w in e["workers"].values()]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)      # polling a condition, with a deadline
    return condition()


@pytest.mark.parametrize("point", ["mid-epoch", "after-checkpoint", "decision", "scheduled"])
def test_a_killed_driver_resumes_to_the_uninterrupted_results(tmp_path, point):
    store = crashed_run(tmp_path, point)
    killed = cb.load(store)       # no end journaled, and no driver holds it: it died; its live trials wait
    assert killed.state == "died" and killed.run_error is None
    assert "parked" in {str(t.status) for t in killed.trials} <= {"parked", "completed", "stopped"}
    orphans = workers_of(store)
    assert orphans and wait_until(lambda: all(gone(pid) for pid in orphans), timeout=10)
    resumed = cb.resume(store, verbose=0)
    assert_same_results(resumed, uninterrupted(tmp_path, point))
    events = [e["event"] for e in resumed.store.events()]
    assert events.count("run_resumed") == 1 and events[-1] == "run_finished"
    with pytest.warns(UserWarning, match=r"has finished; there is nothing to resume"):
        assert cb.resume(store, verbose=0).finished      # resuming a finished run changes nothing


def test_a_run_killed_on_two_workers_resumes_on_one_to_the_same_results(tmp_path):
    store = crashed_run(tmp_path, "mid-epoch")
    resumed = cb.resume(store, backend=cb.LocalBackend(1, threads_per_worker=1), verbose=0)
    assert [len(e["workers"]) for e in resumed.store.events() if e["event"] == "run_resumed"] == [1]
    assert_same_results(resumed, uninterrupted(tmp_path, "mid-epoch"))


def flip_byte(path: str, offset_from_end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, os.SEEK_END)
        byte = f.read(1)
        f.seek(-offset_from_end, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("damage", ["flipped", "torn"])
def test_a_damaged_journal_tail_is_dropped_and_the_run_resumes(tmp_path, damage):
    store = crashed_run(tmp_path, "mid-epoch")
    journal = os.path.join(store, "journal.jsonl")
    before = len(list(cb.load(store).store.events()))
    if damage == "flipped":
        flip_byte(journal, 20)
    else:
        with open(journal, "r+b") as f:
            f.truncate(os.path.getsize(journal) - 15)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(list(cb.load(store).store.events())) == before - 1     # the damaged record is not used
    assert [str(w.message) for w in caught] == ([f"{journal} line {before} is damaged (it fails its CRC-32) and was "
                                                 f"skipped"] if damage == "flipped" else [])
    resumed = cb.resume(store, verbose=0)
    assert any(e["event"] == "journal_repaired" for e in resumed.store.events())
    assert_same_results(resumed, uninterrupted(tmp_path, "mid-epoch"))


@pytest.mark.parametrize("damage", ["flipped byte", "crafted pickle"])
def test_a_damaged_checkpoint_is_rolled_back_and_its_epochs_redone(tmp_path, damage):
    """A crafted one too: a pickle with a valid header and CRC-32 whose payload would write a
    marker file is reported, names its file, runs nothing, and is rolled back like a CRC error."""
    store = crashed_run(tmp_path, "mid-epoch")
    live = [t for t in cb.load(store).trials if t.status == "parked" and t.epochs >= 1]
    victim = live[0].trial_id
    latest = os.path.join(store, "trials", victim, "checkpoint.state")
    marker = tmp_path / "ran"
    if damage == "flipped byte":
        flip_byte(latest, 100)
    else:
        header = json.loads(open(latest, "rb").readline())
        craft_checkpoint(latest, pickled_payload(str(marker)), header["epoch"], trial_id=victim,
                         format=header["format"])
    problem = cb.load(store).store.checkpoints(victim)[0]["problem"]
    assert ("CRC" if damage == "flipped byte" else "not a Cerebro data message") in problem
    resumed = cb.resume(store, verbose=0)
    rolled = [e for e in resumed.store.events() if e["event"] == "trial_rolled_back"]
    assert [e["trial_id"] for e in rolled] == [victim]
    assert rolled[0]["checkpoints"][0].startswith(latest + ": ")
    assert_same_results(resumed, uninterrupted(tmp_path, "mid-epoch"))
    assert not marker.exists()


def test_one_driver_per_run_directory_until_it_dies(tmp_path):
    store = str(tmp_path / "run")
    child = subprocess.Popen([sys.executable, CRASH, store, "long"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: os.path.exists(os.path.join(store, "journal.jsonl")), timeout=120)
        with pytest.raises(RuntimeError, match=r"^store '.*' is in use by another driver \(pid \d+ on .*\); "
                                               r"wait for it to end or stop it, then resume$"):
            cb.resume(store, verbose=0)
    finally:
        child.kill()
        child.wait()
    resumed = cb.resume(store, verbose=0)
    assert resumed.finished and all(t.status == "completed" for t in resumed.trials)


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_stops_cleanly_and_the_run_resumes(tmp_path, signal_name):
    store = str(tmp_path / "run")
    hold_at(store + ".hold", 2)         # the run waits there, so the signal never finds it finished
    child = subprocess.Popen([sys.executable, CRASH, store, "plain"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: epochs_journaled(store) >= 2, timeout=120)
        child.send_signal(getattr(signal, signal_name))
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode != 0 and "KeyboardInterrupt" in stderr
    os.remove(store + ".hold")
    events = list(cb.load(store).store.events())
    assert events[-1]["event"] == "run_interrupted"
    assert all(gone(pid) for pid in workers_of(store))       # stopped with the driver, not orphaned
    resumed = cb.resume(store, verbose=0)
    assert_same_results(resumed, uninterrupted(tmp_path, "mid-epoch"))


def test_a_run_made_before_visit_schemes_resumes_with_the_order_it_started_with(tmp_path):
    """run.json records the visit order scheme; one written before schemes existed has none
    and used a random order per trial and epoch, which its resumed epochs keep."""
    store = crashed_run(tmp_path, "mid-epoch")
    path = os.path.join(store, "run.json")
    with open(path) as f:
        info = json.load(f)
    assert info.pop("visit_order") == "latin"
    with open(path, "w") as f:
        json.dump(info, f)
    before = {(row.trial_id, row.epoch) for row in cb.load(store).history().itertuples()}
    resumed = cb.resume(store, verbose=0)
    schedule = resumed.schedule()
    after = 0
    for (trial_id, epoch), rows in schedule[schedule.kind == "train"].groupby(["trial_id", "epoch"]):
        scheme = VisitScheme.LATIN if (trial_id, epoch) in before else VisitScheme.RANDOM
        after += scheme is VisitScheme.RANDOM
        assert rows.sort_values("start").partition.tolist() == visit_order(5, trial_id, epoch, 4, scheme)
    assert before and after


def build_of_another_model(config: dict) -> cb.TorchTrainable:
    return build(dict(config, hidden=7))


def test_resume_with_a_build_of_another_model_is_refused_and_the_run_stays_resumable(tmp_path):
    store = crashed_run(tmp_path, "mid-epoch")
    journal = open(os.path.join(store, "journal.jsonl"), "rb").read()
    with pytest.raises(cb.ResumeError, match=r"^build does not make the model this run trained: t\d{4}'s checkpoint "
                                             r"has 0\.bias of shape \((16|32),\), build\(config\) makes \(7,\); "
                                             r"resume with the run's own build .*; nothing was resumed$"):
        cb.resume(store, build_of_another_model, verbose=0)
    assert open(os.path.join(store, "journal.jsonl"), "rb").read() == journal
    assert_same_results(cb.resume(store, verbose=0), uninterrupted(tmp_path, "mid-epoch"))


def build_without_metrics(config: dict) -> cb.TorchTrainable:
    trainable = build(config)
    trainable.metrics = {}
    return trainable


def test_resume_with_a_build_that_does_not_log_the_runs_metric_is_refused(tmp_path):
    store = crashed_run(tmp_path, "mid-epoch")
    info_path = os.path.join(store, "run.json")
    info = json.load(open(info_path))
    info["searcher"]["metric"] = "val_accuracy"          # as if the run ranked by accuracy
    json.dump(info, open(info_path, "w"))
    journal = open(os.path.join(store, "journal.jsonl"), "rb").read()
    with pytest.raises(cb.ResumeError, match=r"^build does not fit this run: for t\d{4}'s config .*, ValueError: "
                                             r"metric='val_accuracy' is not logged; logged metrics are "
                                             r"\['train_loss', 'val_loss'\]; nothing was resumed$"):
        cb.resume(store, build_without_metrics, verbose=0)
    assert open(os.path.join(store, "journal.jsonl"), "rb").read() == journal


def damage_line(store: str, event: str) -> tuple[str, int]:
    """Flip a byte in the first ``event`` line that has good lines after it; its path and number."""
    journal = os.path.join(store, "journal.jsonl")
    lines = open(journal, "rb").read().splitlines(keepends=True)
    victim = next(i for i, line in enumerate(lines) if line.startswith(b'{"event": "%s"' % event.encode()))
    assert victim < len(lines) - 2
    flip_byte(journal, sum(len(line) for line in lines[victim:]) - 40)
    return journal, victim + 1


def test_a_damaged_middle_line_resume_does_without_is_skipped_and_nothing_is_redone(tmp_path):
    store = crashed_run(tmp_path, "mid-epoch")
    journal, number = damage_line(store, "sub_epoch")
    before = open(journal, "rb").read()
    with pytest.warns(UserWarning) as caught:
        resumed = cb.resume(store, verbose=0)
    assert f"{journal} line {number} is damaged (it fails its CRC-32) and was skipped: it held 'sub_epoch', " \
           f"an event resume does without" in [str(w.message) for w in caught]
    after = open(journal, "rb").read()
    assert after.startswith(before.rsplit(b"\n", 1)[0])     # every line kept but a torn tail
    events = [e["event"] for e in resumed.store.events()]
    assert "trial_rolled_back" not in events
    expected = uninterrupted(tmp_path, "mid-epoch")
    pd.testing.assert_frame_equal(resumed.history(), expected.history(), check_exact=True)
    for a, b in zip(resumed.trials, expected.trials):
        assert a.status == b.status and all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_a_damaged_middle_line_resume_needs_cuts_the_journal_there_and_the_rest_is_redone(tmp_path):
    store = crashed_run(tmp_path, "mid-epoch")
    journal, number = damage_line(store, "epoch_end")
    with pytest.warns(UserWarning, match=rf"^{journal} line {number} is damaged \(it fails its CRC-32\) and was "
                                         rf"skipped$"):
        kept = len(list(cb.load(store).store.events()))
    good_before = sum(1 for line in open(journal, "rb").read().splitlines()[:number - 1])
    with pytest.warns(UserWarning, match=rf"^{journal} line {number} is damaged \(it fails its CRC-32\) and held "
                                         rf"'epoch_end', an event resume needs: the run goes on from line "
                                         rf"{number - 1}, and the work of the {kept - good_before} events after it "
                                         rf"is redone$"):
        resumed = cb.resume(store, verbose=0)
    assert any(e["event"] == "journal_repaired" for e in resumed.store.events())
    assert_same_results(resumed, uninterrupted(tmp_path, "mid-epoch"))


def test_a_finished_run_with_a_damaged_middle_line_is_not_resumed(tmp_path):
    store = crashed_run(tmp_path, "mid-epoch")
    cb.resume(store, verbose=0)
    journal, number = damage_line(store, "epoch_end")
    before = open(journal, "rb").read()
    with pytest.warns(UserWarning, match=r"has finished; there is nothing to resume"):
        assert cb.resume(store, verbose=0).finished
    assert open(journal, "rb").read() == before


def test_failed_trials_are_retried_from_their_last_good_epoch_to_the_results_of_a_run_without_the_bug(tmp_path):
    search = cb.GridSearch(failing_after(20, lr=3e-2), {"lr": cb.choice([1e-2, 3e-2])}, epochs=3)
    failed = search.fit(digits(partitions=2), workers=2, store=tmp_path / "run", seed=3, verbose=0)
    assert [t.status for t in failed.trials] == ["completed", "failed"] and failed.finished
    assert failed.trials[1].epochs == 1 and "bug: the loss fails after 20 steps" in failed.trials[1].error
    with pytest.warns(UserWarning, match=r"has finished; there is nothing to resume"):
        cb.resume(failed.run_dir, verbose=0)            # without retry_failed a finished run stays as it is
    retried = cb.resume(failed.run_dir, build, retry_failed=True, verbose=0)
    fixed = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-2])}, epochs=3).fit(
        digits(partitions=2), workers=2, store=tmp_path / "fixed", seed=3, verbose=0)
    assert retried.finished and [(t.status, t.error) for t in retried.trials] == [("completed", None)] * 2
    pd.testing.assert_frame_equal(retried.history(), fixed.history(), check_exact=True)
    for a, b in zip(retried.trials, fixed.trials):
        assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    events = [e for e in retried.store.events() if e["event"] == "trial_retried"]
    assert [(e["trial_id"], e["epoch"]) for e in events] == [("t0001", 1)]
    assert not os.path.exists(os.path.join(failed.run_dir, "trials", "t0001", "error.txt"))
    assert len(retried.schedule()[lambda s: (s.trial_id == "t0001") & (s.kind == "train")]) == 3 * 2
