"""A search whose driver is killed with SIGKILL at a chosen point, for the resume tests.

``python _crash.py STORE POINT`` runs it; POINT is ``mid-epoch`` (a worker kills its driver
in the middle of a training sub-epoch once 3 epochs are journaled), ``after-checkpoint`` (at the
first training batch after the 4th epoch end), ``decision`` (ASHA's driver kills itself inside its first decision
that stops or promotes a trial, in ``report`` or in ``decide``: which of the two makes it depends
on timing, that one is made does not), ``bohb-decision`` (BOHB's, likewise, once its model has
proposed a trial), ``scheduled`` (as mid-epoch, for trials with a
learning-rate schedule and clipping, stepped per epoch or per batch) or ``long`` or
``plain`` (not killed by itself: 50 epochs, or the reference grid held at the epoch count
in the file ``STORE.hold`` (:func:`_faults.held`), for a test to stop).
The kill happens once: a marker file next to the store, claimed atomically, remembers it, so the resumed run,
which unpickles the same build and searcher, goes on undisturbed.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from _faults import claim, epochs_journaled, held, striking  # noqa: E402
from _models import build, digits, scheduled  # noqa: E402

import cerebro as cb  # noqa: E402
from cerebro.engine import Decision  # noqa: E402

SPACE = {"lr": cb.choice([3e-2, 1e-2, 3e-3]), "hidden": cb.choice([16, 32])}
SCHEDULED_SPACE = {"lr": cb.choice([0.1, 0.05]), "step": cb.choice(["epoch", "batch", "plateau"])}


# Training rows a worker holds: digits' 600 rows, 0.2 held out, over the 2 workers.
ROWS_PER_WORKER = 240


def killing_build(store: str, after: int, marker: str, base=build):
    """``base``, whose first training batch once ``after`` epochs are journaled kills the driver.

    The driver journals off its loop, after each epoch's checkpoint is on disk: on a busy disk
    the journal can lag the training by a second, as long as this whole run takes, and the kill
    would never come. So the first time a worker process has trained a trial for two epochs'
    share of its rows' batches (late in the run), that batch waits for the journal: until it
    says ``after`` epochs, or stops growing for 2 s (it has caught up: the epochs it lacks are
    still to train, here too), or 10 s have passed. Once per worker process: the build is
    unpickled once a worker, so ``waited`` is shared by its trials."""
    waited, driver = [False], os.getpid()        # made in the driver, called in its workers

    def build_that_kills(config: dict) -> cb.TorchTrainable:
        trainable = base(config)
        late, trained = math.ceil(2 * ROWS_PER_WORKER / trainable.batch_size), [0]

        def due() -> bool:
            trained[0] += 1            # asked in training batches only (striking's phase)
            if trained[0] == late and not waited[0]:
                waited[0] = True
                _wait_for_the_journal(store, after)
            return epochs_journaled(store) >= after

        trainable.loss = striking(trainable.loss, lambda: os.kill(driver, signal.SIGKILL), marker=marker,
                                  when=due)
        return trainable
    return build_that_kills


def _wait_for_the_journal(store: str, after: int) -> None:
    """Poll the journal (a condition with deadlines; heartbeats go on meanwhile) until it
    says ``after`` epochs, or has not grown for 2 s, or 10 s have passed."""
    began = grew = time.monotonic()
    seen = epochs_journaled(store)
    while seen < after and time.monotonic() - began < 10 and time.monotonic() - grew < 2:
        time.sleep(0.05)
        now = epochs_journaled(store)
        if now != seen:
            seen, grew = now, time.monotonic()


def held_build(store: str):
    """``build``, whose workers wait while ``STORE.hold`` names an epoch count the journal has
    reached: a signal sent then finds the run unfinished however fast its workers train (forked
    workers finish this grid in about a second)."""
    def build_held(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        trainable.loss = held(trainable.loss, store + ".hold", store)
        return trainable
    return build_held


class DiesAtADecision:
    """A searcher (mixed in before it) whose driver dies inside its first decision that stops
    or promotes a trial, once ``due()``."""

    marker = ""

    def report(self, trial_id, epoch, metrics):
        decision = super().report(trial_id, epoch, metrics)
        if decision is Decision.STOP:
            self._die()
        return decision

    def decide(self):
        decisions = super().decide()
        if decisions:
            self._die()
        return decisions

    def due(self) -> bool:
        return True

    def _die(self) -> None:
        if self.due() and claim(self.marker):
            os.kill(os.getpid(), signal.SIGKILL)


class KillingASHA(DiesAtADecision, cb.ASHA):
    """ASHA whose driver dies inside its first decision that stops or promotes a trial."""


class KillingBOHB(DiesAtADecision, cb.BOHB):
    """BOHB whose driver dies inside its first decision that stops or promotes a trial after
    its model proposed one."""

    def due(self) -> bool:
        return any(p["by"] == "model" for p in self.state()["proposals"].values())


BOHB_SPACE = {"lr": cb.loguniform(1e-3, 5e-2), "hidden": cb.choice([16, 32])}
BOHB_SETTINGS = {"num_trials": 12, "max_epochs": 4, "grace_period": 1, "reduction_factor": 2, "max_concurrent": 3,
                 "n_startup_trials": 3, "random_fraction": 0.0}


def assert_same_results(resumed: cb.Result, expected: cb.Result, partitions: int = 4) -> None:
    """The resumed run ended as the uninterrupted one, bitwise, each sub-epoch trained once."""
    assert resumed.finished
    pd.testing.assert_frame_equal(resumed.history(), expected.history(), check_exact=True)
    assert [(t.trial_id, t.config, t.status, t.reason) for t in resumed.trials] == \
           [(t.trial_id, t.config, t.status, t.reason) for t in expected.trials]
    for a, b in zip(resumed.trials, expected.trials):
        assert (a.best_epoch, a.best_metrics) == (b.best_epoch, b.best_metrics)
        for epoch in ("best", "last"):      # the best epoch's weights kept apart across the crash too
            assert all(torch.equal(v, b.state_dict(epoch)[k]) for k, v in a.state_dict(epoch).items())
    schedule = resumed.schedule()      # every (trial, epoch, partition) trained exactly once
    train = schedule[schedule.kind == "train"]
    assert not train.duplicated(["trial_id", "epoch", "partition"]).any()
    assert len(train) == partitions * len(resumed.history())


def searcher(point: str, store: str, marker: str) -> cb.Searcher:
    if point in ("decision", "bohb-decision"):
        search = KillingBOHB(build, BOHB_SPACE, **BOHB_SETTINGS) if point == "bohb-decision" else \
            KillingASHA(build, SPACE, num_trials=8, max_epochs=4, grace_period=1, reduction_factor=2, max_concurrent=4)
        search.marker = marker
        return search
    if point == "long":          # never killed by itself: 50 epochs for a test to kill
        return cb.GridSearch(build, SPACE, epochs=50)
    if point == "plain":         # never killed by itself: the reference grid, held for a test to stop
        return cb.GridSearch(held_build(store), SPACE, epochs=3)
    if point == "scheduled":     # killed mid-schedule: 3 of its 12 epochs journaled
        return cb.GridSearch(killing_build(store, 3, marker, scheduled), SCHEDULED_SPACE, epochs=3)
    after = {"mid-epoch": 3, "after-checkpoint": 4}[point]
    return cb.GridSearch(killing_build(store, after, marker), SPACE, epochs=3)


def reference(point: str) -> cb.Searcher:
    """The same search, never killed."""
    if point == "decision":
        return cb.ASHA(build, SPACE, num_trials=8, max_epochs=4, grace_period=1, reduction_factor=2, max_concurrent=4)
    if point == "bohb-decision":
        return cb.BOHB(build, BOHB_SPACE, **BOHB_SETTINGS)
    if point == "scheduled":
        return cb.GridSearch(scheduled, SCHEDULED_SPACE, epochs=3)
    return cb.GridSearch(build, SPACE, epochs=3)


if __name__ == "__main__":
    # A shell's background job starts with SIGINT ignored; a terminal's Ctrl-C is what is tested.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    store, point = sys.argv[1], sys.argv[2]
    search = searcher(point, store, store + ".killed")
    search.fit(digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1), store=store, seed=5, verbose=0)
