"""What losing a worker costs: time from its death to its sub-epoch running again, and the
extra wall time of the run, against the same run undisturbed.

The same grid (8 MLP configurations, 12 epochs, 16,384 generated rows, 4 partitions) runs
on 2 local workers, alternately undisturbed and with one worker killed: by SIGKILL (found at
once: its connection closes), by SIGKILL with replacement off (``max_restarts=0``: the
survivor runs the rest alone), or frozen by SIGSTOP (found when its heartbeats stop, after
``heartbeat_timeout``). The disturbance hits the first loss computed once 8 epochs are
journaled, i.e. in the middle of a sub-epoch; the worker writes the time it happened. Every
disturbed run must end with the undisturbed run's history, bit for bit.

Usage::

    .venv/bin/python benchmarks/recovery.py [--repeats 3] [--out benchmarks/results/recovery.json]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pandas as pd
import torch

import cerebro as cb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _faults import epochs_journaled, striking  # noqa: E402

HEARTBEAT_TIMEOUT = 5.0
EPOCHS = 12
SPACE = {"hidden": cb.choice([64, 256]), "lr": cb.choice([1e-3, 3e-3]), "batch_size": cb.choice([32, 64])}


def dataset() -> cb.Dataset:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(16384, 64)).astype(np.float32)
    label = (features @ rng.normal(size=(64, 10)).astype(np.float32)).argmax(1)
    return cb.Dataset.from_numpy(features, label, validation=0.2, partitions=4, seed=0)


def build(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["hidden"], 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=config["batch_size"])


def disturbing(store: str, marker: str, how: str):
    """``build`` whose worker is killed or frozen once, mid training sub-epoch, after 8
    journaled epochs; the marker, claimed atomically, holds the time it happened."""
    def disturbing_build(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        trainable.loss = striking(
            trainable.loss, lambda: os.kill(os.getpid(), signal.SIGSTOP if how == "sigstop" else signal.SIGKILL),
            marker=marker, when=lambda: epochs_journaled(store) >= 8, note=lambda: repr(time.monotonic()))
        return trainable
    return disturbing_build


def run(data: cb.Dataset, scratch: str, name: str, how: str | None) -> dict[str, Any]:
    store, marker = os.path.join(scratch, name), os.path.join(scratch, name + ".marker")
    search = cb.GridSearch(build if how is None else disturbing(store, marker, how), SPACE, epochs=EPOCHS)
    backend = cb.LocalBackend(2, threads_per_worker=1, heartbeat_timeout=HEARTBEAT_TIMEOUT,
                              max_restarts=0 if how == "sigkill_no_replacement" else 2)
    started = time.perf_counter()
    result = search.fit(data, backend=backend, store=store, seed=0, verbose=0)
    entry: dict[str, Any] = {"how": how or "undisturbed", "wall_s": time.perf_counter() - started,
                             "history": result.history()}
    events = list(result.store.events())
    schedule = result.schedule()
    entry["schedule_s"] = float(schedule.end.max() - schedule.start.min())
    if how is not None:
        with open(marker) as f:
            hit = float(f.read())
        clock0 = next(e["clock"] for e in events if e["event"] == "run_started")
        lost = next(e for e in events if e["event"] == "worker_lost")
        task = lost["running"]
        rerun = schedule[(schedule.trial_id == task["trial_id"]) & (schedule.epoch == task["epoch"])
                         & (schedule.partition == task["partition"]) & (schedule.kind == task["kind"])]
        entry["detected_after_s"] = lost["time"] - (hit - clock0)
        entry["rerun_started_after_s"] = float(rerun.start.iloc[0]) - (hit - clock0)
        back = [e["time"] for e in events if e["event"] == "worker_replaced"]
        entry["worker_back_after_s"] = back[0] - (hit - clock0) if back else None
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/recovery.json")
    args = parser.parse_args()
    data = dataset()
    runs: dict[str, list[dict[str, Any]]] = {"undisturbed": [], "sigkill": [], "sigkill_no_replacement": [],
                                             "sigstop": []}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for how in runs:
                entry = run(data, scratch, f"{how}{repeat}", None if how == "undisturbed" else how)
                runs[how].append(entry)
                print(f"{how:22} wall {entry['wall_s']:6.1f} s  schedule {entry['schedule_s']:6.1f} s  "
                      + (f"detected after {entry['detected_after_s']:5.2f} s  sub-epoch again after "
                         f"{entry['rerun_started_after_s']:5.2f} s" if how != "undisturbed" else ""), flush=True)
    expected = runs["undisturbed"][0]["history"]
    for entries in runs.values():
        for entry in entries:
            pd.testing.assert_frame_equal(entry.pop("history"), expected, check_exact=True)
    base = statistics.median(e["schedule_s"] for e in runs["undisturbed"])
    table = ["| run | median wall s | median schedule s | extra vs undisturbed | death → detected | "
             "death → sub-epoch runs again | death → worker back |", "|---|---|---|---|---|---|---|"]
    summary = {}
    for how, entries in runs.items():
        row = {"wall_s": statistics.median(e["wall_s"] for e in entries),
               "schedule_s": statistics.median(e["schedule_s"] for e in entries)}
        row["extra_s"] = row["schedule_s"] - base
        if how != "undisturbed":
            row["detected_after_s"] = statistics.median(e["detected_after_s"] for e in entries)
            row["rerun_started_after_s"] = statistics.median(e["rerun_started_after_s"] for e in entries)
            back = [e["worker_back_after_s"] for e in entries if e["worker_back_after_s"] is not None]
            row["worker_back_after_s"] = statistics.median(back) if back else None
        summary[how] = row
        back = "" if row.get("worker_back_after_s") is None else f"{row['worker_back_after_s']:.2f} s"
        table.append(f"| {how} | {row['wall_s']:.1f} | {row['schedule_s']:.1f} | {row['extra_s']:+.1f} s | "
                     + (f"{row['detected_after_s']:.2f} s | {row['rerun_started_after_s']:.2f} s | {back} |"
                        if how != "undisturbed" else "| | |"))
    print("\n".join(table))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([sys.executable, *sys.argv]), "heartbeat_timeout": HEARTBEAT_TIMEOUT,
                   "summary": summary, "runs": runs, "table": "\n".join(table)}, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(table) + "\n")
    print(f"every disturbed run ended with the undisturbed history, bit for bit; wrote {args.out}")


if __name__ == "__main__":
    main()
