"""Trials that take too long: a sub-epoch past ``trial_timeout``, a batch that never ends
(its worker given up), and the hang rule (``hang_after``) that finds one without a timeout."""
from __future__ import annotations

import os
import re

import pytest
import torch
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow


def test_a_trial_slower_than_trial_timeout_ends_as_timeout_and_the_others_finish(tmp_path):
    space = {"slow": cb.choice([0, 0.25])}
    result = cb.GridSearch(build, space, epochs=2).fit(digits(partitions=2), workers=2, seed=0,
                                                       store=tmp_path / "run", verbose=0, trial_timeout=1)
    assert [t.status for t in result.trials] == ["completed", "timeout"]
    assert re.fullmatch(r"its train sub-epoch of epoch 1 on partition [01] took more than trial_timeout=1 s",
                        result.trials[1].reason)
    assert result.best.trial_id == "t0000"


def test_a_batch_that_never_ends_is_a_timeout_and_its_worker_is_given_up(tmp_path):
    space = {"stuck": cb.choice([False, True])}
    result = cb.GridSearch(build, space, epochs=2).fit(
        digits(partitions=2), backend=cb.LocalBackend(2, heartbeat_timeout=2), seed=0, store=tmp_path / "run",
        verbose=0, trial_timeout=1)
    assert [t.status for t in result.trials] == ["completed", "timeout"]
    assert re.fullmatch(r"its train sub-epoch of epoch 1 on partition [01] ran past trial_timeout=1 s and 2 s more "
                        r"inside one batch; its worker was given up", result.trials[1].reason)
    events = list(result.store.events())
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert len(lost) == 1 and lost[0]["reason"] == "was stuck in a batch of t0001"
    assert lost[0]["running"]["trial_id"] == "t0001"
    stuck = next(e for e in events if e["event"] == "run_started")["workers"][str(lost[0]["worker"])]
    with pytest.raises(ProcessLookupError):     # the stuck process was ended, not left behind
        os.kill(stuck["pid"], 0)
    assert result.trials[0].epochs == 2 and result.finished


def test_a_batch_that_never_ends_is_found_without_a_trial_timeout_and_a_slow_one_is_not(tmp_path):
    """The hang rule (``hang_after``): a sub-epoch that begins no batch for that long, and 10x
    its trial's longest wait for one, ends its trial as timeout and gives up its worker; a
    trial slow in every batch goes on; the first trial finishes with the bits of a run
    without the hung ones."""
    space = {"slow": cb.choice([0, 0.3]), "stuck": cb.choice([False, True])}
    result = cb.GridSearch(build, space, epochs=2).fit(digits(partitions=2), workers=2, seed=0,
                                                       store=tmp_path / "run", verbose=0, hang_after=3)
    statuses = {(t.config["slow"], t.config["stuck"]): t.status for t in result.trials}
    assert statuses == {(0, False): "completed", (0, True): "timeout", (0.3, False): "completed",
                        (0.3, True): "timeout"}
    for trial in (t for t in result.trials if t.status == "timeout"):
        assert re.fullmatch(r"no batch of its train sub-epoch of epoch 1 on partition [01] began for \d+ s \(it had "
                            r"begun 1; hang_after=3 s, and its longest wait for a batch before was \d+\.\d s\): it "
                            r"hangs, and its worker was given up", trial.reason), trial.reason
    lost = [e for e in result.store.events() if e["event"] == "worker_lost"]
    assert sorted(e["reason"] for e in lost) == sorted(f"was stuck in a batch of {t.trial_id}" for t in result.trials
                                                      if t.status == "timeout")
    alone = cb.GridSearch(build, {"slow": 0, "stuck": cb.choice([False])}, epochs=2).fit(
        digits(partitions=2), workers=2, seed=0, store=tmp_path / "alone", verbose=0)
    first, same = result.trials[0], alone.trials[0]        # t0000 both: the same seeds
    assert first.config == same.config and first.metrics == same.metrics
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), same.state_dict().values()))


def test_the_hang_rule_waits_for_hang_after_and_ten_times_the_trials_longest_wait():
    from cerebro.engine import TRAIN, Task
    from cerebro.engine._hangs import HangWatch, Running
    watch = HangWatch(hang_after=30.0)
    running = Running(7, Task("t0003", TRAIN, 2, 1, 0), started=100.0)
    watch.heard(running, 1, 101.0)
    watch.heard(running, 2, 106.0)          # a batch that took 5 s: now 50 s without one is a hang
    assert watch.hangs(running, 150.0) is None and watch.hangs(running, 156.5) == (
        "no batch of its train sub-epoch of epoch 2 on partition 1 began for 50 s (it had begun 2; hang_after=30 s, "
        "and its longest wait for a batch before was 5.0 s): it hangs, and its worker was given up")
    other = Running(8, Task("t0004", TRAIN, 1, 0, 1), started=200.0)      # another trial: the floor
    assert watch.hangs(other, 230.0) is None and watch.hangs(other, 230.5) is not None
    assert HangWatch(hang_after=None).hangs(other, 1e9) is None
