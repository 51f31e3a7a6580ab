"""Fault injection for the tests and benchmarks: a fault hits exactly once, and only where it
is meant to.

A fault is injected from inside a trial's ``loss``, which runs in every worker process, in
training and in evaluation, and, since an epoch's eval visits run alongside the trial's next
epoch, in two workers at the same moment. So "once" cannot be "if the marker file is absent,
create it and strike": two workers can both see it absent. :func:`claim` is one atomic step
(``open`` with ``O_CREAT | O_EXCL``): of any number of processes, exactly one gets ``True``.
And "while training" is checked, not assumed: :func:`training` tells a training batch (torch
computes gradients) from an eval batch (the trainer evaluates under ``torch.no_grad``). A
fault never hits the driver's preflight step (:func:`cerebro.worker.in_preflight`): it is
meant for a worker.

Example::

    def build_that_kills(config):
        trainable = build(config)
        trainable.loss = striking(trainable.loss, lambda: os.kill(os.getpid(), signal.SIGKILL),
                                  marker="/tmp/killed", when=lambda: epochs_journaled(store) >= 2)
        return trainable
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

import torch

from cerebro.worker import in_preflight

TRAIN, EVAL, ANY = "train", "eval", "any"


def claim(marker: str, note: str = "") -> bool:
    """Creates ``marker`` holding ``note`` and returns True, or returns False where it exists:
    True for exactly one caller, in any process, however many try at once."""
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w") as f:
        f.write(note)
    return True


def training() -> bool:
    """Whether the loss being computed is a training batch's (gradients on), not an eval
    visit's (the trainer evaluates under ``torch.no_grad``)."""
    return torch.is_grad_enabled()


def in_phase(phase: str) -> bool:
    if phase not in (TRAIN, EVAL, ANY):
        raise ValueError(f"phase={phase!r} must be {TRAIN!r}, {EVAL!r} or {ANY!r}")
    return phase == ANY or training() == (phase == TRAIN)


def striking(loss: Callable[..., Any], strike: Callable[[], Any], *, marker: str,
             when: Callable[[], bool] = lambda: True, phase: str = TRAIN,
             note: Callable[[], str] = str) -> Callable[..., Any]:
    """``loss``, except that the first call in ``phase`` for which ``when()`` holds, in any
    process, claims ``marker`` (writing ``note()`` in it) and calls ``strike()`` (kill, stop,
    raise) before computing the loss. ``when`` is asked first, so a marker is only claimed by
    a call that strikes."""
    in_phase(phase)      # a bad phase fails where the build is written, not in a worker

    def loss_that_strikes(outputs, targets):
        if not in_preflight() and in_phase(phase) and when() and claim(marker, note()):
            strike()
        return loss(outputs, targets)
    return loss_that_strikes


def held(loss: Callable[..., Any], hold: str, store: str) -> Callable[..., Any]:
    """``loss``, except that a worker's call waits while the file ``hold`` names a number of
    epoch ends the run in ``store`` has reached: a test looks at a live run where it holds it,
    however slow the machine (a browser starting), and lets it go on by changing the file
    (:func:`hold_at`) or removing it."""
    def held_loss(outputs, targets):
        while not in_preflight() and _holding(hold, store):
            time.sleep(0.05)        # polling the file the test changes
        return loss(outputs, targets)
    return held_loss


def hold_at(hold: str, epochs: int) -> None:
    """Make a :func:`held` run wait once its journal has ``epochs`` epoch ends (atomically: a
    worker never reads half a file)."""
    with open(f"{hold}.part", "w", encoding="utf-8") as f:
        f.write(str(epochs))
    os.replace(f"{hold}.part", hold)


def _holding(hold: str, store: str) -> bool:
    try:
        with open(hold, encoding="utf-8") as f:
            epochs = int(f.read())
    except FileNotFoundError:
        return False
    return epochs_journaled(store) >= epochs


def epochs_journaled(store: str) -> int:
    """How many ``epoch_end`` events the run in ``store`` has journaled (0 before its journal)."""
    return journaled(store, "epoch_end")


def journaled(store: str, event: str) -> int:
    """How many ``event`` events the run in ``store`` has journaled (0 before its journal)."""
    try:
        with open(os.path.join(store, "journal.jsonl"), "rb") as f:
            return f.read().count(f'"event": "{event}"'.encode())
    except FileNotFoundError:
        return 0


def waiting_for_the_replacement(build: Callable[[dict], Any], store: str, batches: int = 20) -> Callable[[dict], Any]:
    """``build`` whose training, once a worker is lost, trains ``batches`` more batches in each
    worker process and then waits (up to 2 minutes a batch) until the lost worker's
    replacement has joined: the others train on meanwhile, and the run cannot end before
    the replacement trains, however slowly it starts."""
    since_the_loss = [0]     # per worker process: the closure is copied into each

    def build_that_waits(config: dict) -> Any:
        trainable = build(config)
        loss = trainable.loss

        def loss_that_waits(outputs, targets):
            if training() and journaled(store, "worker_lost") > journaled(store, "worker_replaced"):
                since_the_loss[0] += 1
                deadline = time.monotonic() + 120
                while since_the_loss[0] > batches and time.monotonic() < deadline \
                        and journaled(store, "worker_lost") > journaled(store, "worker_replaced"):
                    time.sleep(0.2)     # a worker's heartbeats go on from their own thread meanwhile
            return loss(outputs, targets)
        trainable.loss = loss_that_waits
        return trainable
    return build_that_waits


def assert_replaced_alone(events: list[dict], result: Any, launched_by: Callable[[int], str],
                          names_the_launch: bool = True) -> None:
    """One worker was lost and started anew, as a new process launched as
    ``launched_by(worker)`` (a regex) says (``names_the_launch``: a launch of its own, e.g. a
    new Spark job), and trained; every other worker kept its process from the start and
    trained on after the loss."""
    names = [e["event"] for e in events]
    assert names.count("worker_lost") == 1 and names.count("worker_replaced") == 1, names
    assert "workers_restarted" not in names and "partitions_moved" in names
    lost = next(e for e in events if e["event"] == "worker_lost")
    back = next(e for e in events if e["event"] == "worker_replaced")
    started = {int(index): info for index, info in next(e for e in events if e["event"] == "run_started")
               ["workers"].items()}
    survivors = {info["pid"] for index, info in started.items() if index != lost["worker"]}
    schedule = result.schedule()
    assert survivors <= set(schedule[schedule.start > lost["time"]].pid)
    assert survivors <= {info["pid"] for info in result.workers.values()}
    new = result.workers[lost["worker"]]
    assert back["worker"] == lost["worker"] and new["pid"] not in {info["pid"] for info in started.values()}
    assert re.fullmatch(launched_by(lost["worker"]), new["launched_by"]), new["launched_by"]
    assert new["launched_by"] != started[lost["worker"]]["launched_by"] or not names_the_launch
    assert new["pid"] in set(schedule[schedule.start > back["time"]].pid)
