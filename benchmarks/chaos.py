"""Chaos: a model selection that survives a seeded storm of faults with the same bits.

One 16-trial ASHA search (digits, 4 partitions, 2 workers) runs undisturbed, then again while
a seeded schedule of faults hits it: SIGKILL of a worker, SIGSTOP of a worker (found when
its heartbeats stop, then continued), SIGKILL of the driver followed by ``cb.resume``, and,
while the driver is dead, a torn journal tail or a flipped byte in a live trial's latest
checkpoint. Faults are spaced by the run's progress (sub-epochs journaled), so every one
lands in the middle of real work. The disturbed run must end bitwise equal to the undisturbed
one: history, trial statuses and reasons, every searcher decision, every trial's weights,
and each (trial, epoch, partition) trained exactly once. It reports the faults survived, the
extra wall time and what was lost (nothing, or the differences).

The driver runs as a child process (``--child``) so that it can be killed; the controller
reads the run's journal to find the workers' pids and the run's progress.

    .venv/bin/python benchmarks/chaos.py                      # local, 24 faults, ~3-5 min on 2 cores
    .venv/bin/python benchmarks/chaos.py --backend spark      # Spark local[2]
    .venv/bin/python benchmarks/chaos.py --quick --faults 6   # a small version (the test suite's)
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

import cerebro as cb

HEARTBEAT_TIMEOUT = 2.0
SEED = 7
DRIVER_TIMEOUT_S = {"quick": 300, "full": 1800}
KINDS = {   # fault kind -> weight in the schedule
    "worker SIGKILL": 4,
    "worker SIGSTOP": 2,
    "driver SIGKILL": 2,
    "driver SIGKILL + torn journal tail": 1,
    "driver SIGKILL + flipped checkpoint byte": 1,
}


# --- the search (module level: the child's build is pickled by value) -------------------------
def build(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(config["hidden"], 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=config["batch_size"],
                             metrics={"accuracy": cb.metrics.accuracy})


def search(quick: bool) -> cb.Searcher:
    space = {"hidden": cb.choice([16, 32, 64, 128]), "lr": cb.loguniform(1e-3, 3e-2),
             "batch_size": cb.choice([32, 64])}
    if quick:
        return cb.ASHA(build, space, num_trials=4, max_epochs=3, grace_period=1, reduction_factor=2,
                       max_concurrent=4, metric="val_accuracy", mode="max")
    return cb.ASHA(build, space, num_trials=16, max_epochs=9, grace_period=1, reduction_factor=3,
                   max_concurrent=8, metric="val_accuracy", mode="max")


def dataset() -> cb.Dataset:
    from sklearn.datasets import load_digits
    features, label = load_digits(return_X_y=True)
    return cb.Dataset.from_numpy((features / 16.0).astype(np.float32), label, validation=0.2, partitions=4, seed=0)


def backend(kind: str) -> cb.Backend:
    if kind == "spark":
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)     # executors run this venv's Python
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[2]").appName("cerebro-chaos")
                 .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
        return cb.SparkBackend(spark, workers=2, threads_per_worker=1, heartbeat_timeout=HEARTBEAT_TIMEOUT,
                               max_restarts=1000)
    return cb.LocalBackend(2, threads_per_worker=1, heartbeat_timeout=HEARTBEAT_TIMEOUT, max_restarts=1000)


def child(mode: str, store: str, kind: str, quick: bool) -> None:
    """The driver: fit the search, or resume it after a kill. A driver that hangs dumps every
    thread's stack into its log and exits, so a deadlock fails the run instead of stalling it."""
    faulthandler.dump_traceback_later(DRIVER_TIMEOUT_S["quick" if quick else "full"], exit=True)
    if mode == "fit":
        search(quick).fit(dataset(), backend=backend(kind), store=store, seed=SEED, verbose=0,
                          max_trial_losses=1000)
    else:
        cb.resume(store, backend=backend(kind), verbose=0)


# --- the controller -----------------------------------------------------------------------------
@dataclass
class Disturbed:
    """A disturbed run in progress: its driver process and what was done to it."""

    store: str
    kind: str
    quick: bool
    log: Any
    driver: subprocess.Popen | None = None
    applied: list[dict[str, Any]] = field(default_factory=list)
    drivers: int = 0

    def start_driver(self, mode: str) -> None:
        self.drivers += 1
        self.driver = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", mode, self.store, "--backend", self.kind]
            + (["--quick"] if self.quick else []), stdout=self.log, stderr=self.log, start_new_session=True)


def journal(store: str) -> list[dict[str, Any]]:
    """The journal's whole lines (a line being written is left out)."""
    try:
        with open(os.path.join(store, "journal.jsonl"), "rb") as f:
            content = f.read()
    except FileNotFoundError:
        return []
    events = []
    for line in content.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            events.append(json.loads(line))
        except ValueError:
            break
    return events


def live_workers(events: list[dict[str, Any]]) -> list[int]:
    """The pids of the workers the journal says the current driver has, still running."""
    pids: dict[int, int] = {}
    for event in events:
        if event["event"] in ("run_started", "run_resumed", "workers_restarted", "worker_replaced"):
            pids = {int(index): info["pid"] for index, info in event["workers"].items()}
        elif event["event"] == "worker_lost":
            pids.pop(int(event["worker"]), None)
    return sorted(pid for pid in pids.values() if _running(pid))


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def count(events: list[dict[str, Any]], name: str) -> int:
    return sum(e["event"] == name for e in events)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.02)     # polling the journal and processes, with a deadline


def schedule(faults: int, seed: int) -> list[str]:
    """``faults`` fault kinds, drawn with the weights of KINDS, each kind at least once."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    drawn = kinds[:min(faults, len(kinds))] + rng.choices(kinds, weights=list(KINDS.values()),
                                                          k=max(0, faults - len(kinds)))
    rng.shuffle(drawn)
    return drawn


def apply(run: Disturbed, fault: str, rng: random.Random) -> dict[str, Any]:
    """Do ``fault`` to the running driver and its workers; returns what was done."""
    events = journal(run.store)
    if fault.startswith("worker"):
        pids = live_workers(events)
        if not pids:
            return {"fault": fault, "skipped": "no live worker"}
        pid, lost = rng.choice(pids), count(events, "worker_lost") + count(events, "workers_restarted")
        try:
            os.kill(pid, signal.SIGSTOP if fault == "worker SIGSTOP" else signal.SIGKILL)
        except ProcessLookupError:      # it ended between the journal's word and the signal
            return {"fault": fault, "skipped": f"worker {pid} ended before the signal"}
        wait_for(lambda: count(journal(run.store), "worker_lost") + count(journal(run.store), "workers_restarted")
                 > lost or run.driver.poll() is not None, 120, f"the driver to notice {fault} of pid {pid}")
        if fault == "worker SIGSTOP":
            try:
                os.kill(pid, signal.SIGCONT)   # it wakes up to a closed connection and must leave quietly
            except ProcessLookupError:
                pass                           # the driver already ended it
        return {"fault": fault, "pid": pid}
    run.driver.send_signal(signal.SIGKILL)
    run.driver.wait()
    orphans = live_workers(events)
    wait_for(lambda: not any(_running(p) for p in orphans), 60, "the dead driver's workers to exit")
    done: dict[str, Any] = {"fault": fault, "driver_pid": run.driver.pid}
    if fault.endswith("torn journal tail"):
        path = os.path.join(run.store, "journal.jsonl")
        with open(path, "rb") as f:
            last = f.read().splitlines(keepends=True)[-1]
        cut = rng.randint(1, len(last) - 1)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - cut)
        done["bytes_cut"] = cut
    elif fault.endswith("flipped checkpoint byte"):
        events = journal(run.store)
        ended = {e["trial_id"] for e in events if e["event"] == "trial_ended"}
        live = sorted(t for t in {e["trial_id"] for e in events if e["event"] == "epoch_end"} - ended
                      # a kill between moving the latest checkpoint aside and writing the next leaves none
                      if os.path.exists(os.path.join(run.store, "trials", t, "checkpoint.state")))
        if live:
            trial = rng.choice(live)
            path = os.path.join(run.store, "trials", trial, "checkpoint.state")
            header = len(open(path, "rb").readline())
            offset = rng.randrange(header, os.path.getsize(path))
            with open(path, "r+b") as f:
                f.seek(offset)
                byte = f.read(1)
                f.seek(offset)
                f.write(bytes([byte[0] ^ 0x10]))
            done.update(trial=trial, offset=offset)
        else:
            done["skipped_damage"] = "no live trial with a checkpoint"
    run.start_driver("resume")
    return done


def disturbed_run(scratch: str, kind: str, quick: bool, faults: int, seed: int,
                  expected_sub_epochs: int) -> tuple[Disturbed, float]:
    """The search under ``faults`` scheduled faults; returns it with its wall time."""
    rng = random.Random(seed + 1)
    store = os.path.join(scratch, f"disturbed-{kind}")
    log = open(os.path.join(scratch, f"disturbed-{kind}.log"), "ab")
    run = Disturbed(store, kind, quick, log)
    started = time.monotonic()
    run.start_driver("fit")
    gap = max(2, expected_sub_epochs // (faults + 2))
    for fault in schedule(faults, seed):
        target = count(journal(store), "sub_epoch") + rng.randint(gap // 2, gap + gap // 2)
        try:
            wait_for(lambda due=target: count(journal(store), "sub_epoch") >= due or run.driver.poll() is not None,
                     600, f"{target} sub-epochs journaled")
        except TimeoutError:
            break
        if run.driver.poll() is not None:
            break                                  # it finished before this fault was due
        run.applied.append(apply(run, fault, rng))
    code = run.driver.wait()
    log.close()
    if code != 0:
        raise RuntimeError(f"the disturbed run's driver ended with code {code}:\n{tail(log.name)}")
    return run, time.monotonic() - started


def undisturbed_run(scratch: str, kind: str, quick: bool, name: str) -> tuple[str, float]:
    store = os.path.join(scratch, f"{name}-{kind}")
    started = time.monotonic()
    with open(store + ".log", "ab") as log:
        code = subprocess.call([sys.executable, os.path.abspath(__file__), "--child", "fit", store, "--backend", kind]
                               + (["--quick"] if quick else []), stdout=log, stderr=log)
    if code != 0:
        raise RuntimeError(f"the undisturbed run ended with code {code}:\n{tail(store + '.log')}")
    return store, time.monotonic() - started


def tail(path: str, lines: int = 200) -> str:
    """The end of a driver's log: the scratch directory, and the log with it, go at the end."""
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def differences(disturbed: cb.Result, expected: cb.Result) -> list[str]:
    """What the disturbed run lost or changed: empty when it is bitwise the undisturbed one."""
    found = []
    if not disturbed.finished:
        found.append("the disturbed run did not finish")
    try:
        pd.testing.assert_frame_equal(disturbed.history(), expected.history(), check_exact=True)
    except AssertionError as error:
        found.append(f"history: {str(error).splitlines()[0]}")
    trials = [(t.trial_id, t.config, t.status, t.reason) for t in disturbed.trials]
    if trials != [(t.trial_id, t.config, t.status, t.reason) for t in expected.trials]:
        found.append("trial statuses or reasons differ")
    mine, theirs = decisions(disturbed), decisions(expected)
    if mine != theirs:
        found.append(f"searcher decisions differ: only disturbed {sorted(set(mine) - set(theirs))}, "
                     f"only undisturbed {sorted(set(theirs) - set(mine))}")
    for a, b in zip(disturbed.trials, expected.trials):
        mine, theirs = a.state_dict(), b.state_dict()
        if list(mine) != list(theirs) or not all(torch.equal(mine[k], theirs[k]) for k in mine):
            found.append(f"weights of {a.trial_id} differ")
    train = disturbed.schedule()
    train = train[train.kind == "train"]
    if train.duplicated(["trial_id", "epoch", "partition"]).any() or len(train) != 4 * len(disturbed.history()):
        found.append("some (trial, epoch, partition) did not train exactly once")
    return found


def decisions(result: cb.Result) -> list[tuple]:
    """What the searcher decided for each trial after each epoch, once each. Whether an
    answer came from ``report`` or, after a pause, from ``decide`` depends on which trial
    reported last, i.e. on timing; the answer itself must not (a resumed run replays the
    journal's, never journals them twice)."""
    made, epoch = set(), {}
    for event in result.store.events():
        if event["event"] == "epoch_end":
            epoch[event["trial_id"]] = event["epoch"]
        elif event["event"] == "decision" and event["decision"] != "pause":
            made.add((event["trial_id"], event["epoch"], event["decision"]))
        elif event["event"] == "decide":
            made.update((trial, epoch[trial], decision if isinstance(decision, str) else
                         json.dumps(decision, sort_keys=True)) for trial, decision in event["decisions"].items())
    return sorted(made)


def chaos(kind: str, faults: int, seed: int, quick: bool, scratch: str) -> dict[str, Any]:
    """One undisturbed run, the disturbed one, another undisturbed one; the comparison."""
    reference, first = undisturbed_run(scratch, kind, quick, "undisturbed")
    expected_sub_epochs = count(journal(reference), "sub_epoch")
    run, disturbed_wall = disturbed_run(scratch, kind, quick, faults, seed, expected_sub_epochs)
    _, second = undisturbed_run(scratch, kind, quick, "undisturbed-again")
    expected, disturbed = cb.load(reference), cb.load(run.store)
    events = journal(run.store)
    undisturbed_wall = (first + second) / 2
    kinds = Counter(a["fault"] for a in run.applied if "skipped" not in a)
    return {
        "backend": kind, "seed": seed, "faults_scheduled": faults,
        "faults_survived": sum(kinds.values()) + sum(1 for a in run.applied if "trial" in a or "bytes_cut" in a),
        "faults": dict(kinds), "damage": {"torn journal tails": sum("bytes_cut" in a for a in run.applied),
                                          "flipped checkpoint bytes": sum("trial" in a for a in run.applied)},
        "drivers": run.drivers, "workers_lost": count(events, "worker_lost"),
        "workers_restarted": count(events, "workers_restarted"),
        "trials_rolled_back": count(events, "trial_rolled_back"),
        "journals_repaired": count(events, "journal_repaired"),
        "sub_epochs_journaled": count(events, "sub_epoch"), "sub_epochs_undisturbed": expected_sub_epochs,
        "wall_s": {"undisturbed": [round(first, 1), round(second, 1)], "disturbed": round(disturbed_wall, 1)},
        "extra_wall_s": round(disturbed_wall - undisturbed_wall, 1),
        "extra_wall_ratio": round(disturbed_wall / undisturbed_wall, 2),
        "trials": len(disturbed.trials), "epochs": len(disturbed.history()),
        "differences": differences(disturbed, expected), "applied": run.applied,
    }


def table(reports: list[dict[str, Any]]) -> None:
    head = ("backend", "faults survived", "drivers", "workers lost", "rolled back", "journal repaired",
            "undisturbed s", "disturbed s", "extra", "bitwise equal")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in reports:
        print(f"| {r['backend']} | {r['faults_survived']} ({', '.join(f'{n} {k}' for k, n in r['faults'].items())}) "
              f"| {r['drivers']} | {r['workers_lost']} | {r['trials_rolled_back']} | {r['journals_repaired']} "
              f"| {r['wall_s']['undisturbed'][0]} / {r['wall_s']['undisturbed'][1]} | {r['wall_s']['disturbed']} "
              f"| {r['extra_wall_s']:+} s (x{r['extra_wall_ratio']}) "
              f"| {'yes' if not r['differences'] else 'NO: ' + '; '.join(r['differences'])} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["local", "spark"], action="append",
                        help="local (default) and/or spark; repeat for both")
    parser.add_argument("--faults", type=int, default=24, help="faults to schedule (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="the fault schedule's seed")
    parser.add_argument("--quick", action="store_true", help="a 4-trial search (the test suite's size)")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "chaos.json"))
    parser.add_argument("--child", nargs=2, metavar=("MODE", "STORE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    kinds = args.backend or ["local"]
    if args.child:
        child(args.child[0], args.child[1], kinds[0], args.quick)
        return 0
    reports = []
    with tempfile.TemporaryDirectory(prefix="cerebro-chaos-") as scratch:
        for kind in kinds:
            reports.append(chaos(kind, args.faults, args.seed, args.quick, scratch))
    table(reports)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "runs": reports}, f, indent=1, default=str)
    print(f"wrote {args.out}")
    return 0 if all(not r["differences"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
