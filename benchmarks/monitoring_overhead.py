"""Monitoring overhead: the same model selection with and without the dashboard and metrics.

The workload of ``backend_overhead.py`` (8 equal trials of an MLP, 2 local workers, 4
partitions), run alternately:

- off: ``fit`` alone (it still writes ``live.json``, as every run does);
- on: ``fit(metrics_port=...)``, plus a dashboard server on the run directory, and a client
  that asks both for ``/metrics`` and the dashboard for ``/state`` once a second, as an open
  page and an impatient Prometheus would (15 s is a usual scrape interval).

Reports the medians of utilization (busy / (workers x span)), time per epoch and fit wall
time, the on/off ratios, and checks that both give the same history, bit for bit
(target: utilization within noise, i.e. within the off runs' own spread).

Usage::

    .venv/bin/python benchmarks/monitoring_overhead.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from typing import Any

import torch
from _report import provenance, write_json
from backend_overhead import EPOCHS, TRIALS, WORKERS, build, data

import cerebro as cb
from cerebro.report._http import RunServer

KEYS = (("utilization", "utilization"), ("epoch_s", "time per epoch, s"), ("wall_s", "fit wall, s"),
        ("requests", "requests answered"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def watching(store: str, metrics_port: int, stop: threading.Event, answered: list[int]) -> None:
    """Serve a dashboard on ``store`` once the run exists, and ask for its state and both
    metrics endpoints once a second until ``stop``."""
    while not os.path.exists(os.path.join(store, "run.json")) and not stop.wait(0.05):
        pass
    server = RunServer(store, port=0)
    server.serve_in_thread()
    urls = [server.url + "state", server.url + "metrics", f"http://127.0.0.1:{metrics_port}/metrics"]
    while not stop.wait(1.0):
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=10) as answer:
                    answer.read()
                answered[0] += 1
            except OSError:
                pass      # the driver's endpoint is up only while fit runs
    server.shutdown()
    server.server_close()


def one_fit(store: str, monitored: bool) -> dict[str, Any]:
    search = cb.GridSearch(build, {"trial": cb.choice(list(range(TRIALS)))}, epochs=EPOCHS, metric="val_accuracy",
                           mode="max")
    stop, answered, port = threading.Event(), [0], free_port()
    watcher = threading.Thread(target=watching, args=(store, port, stop, answered)) if monitored else None
    if watcher is not None:
        watcher.start()
    started = time.perf_counter()
    result = search.fit(data(), workers=WORKERS, store=store, seed=0, verbose=0,
                        metrics_port=port if monitored else None)
    wall = time.perf_counter() - started
    stop.set()
    if watcher is not None:
        watcher.join()
    schedule = result.schedule()
    span = float(schedule.end.max() - schedule.start.min())
    return {"wall_s": wall, "epoch_s": span / EPOCHS, "requests": answered[0],
            "utilization": float((schedule.end - schedule.start).sum()) / (WORKERS * span),
            "history": result.history().to_json()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/monitoring_overhead.json")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for name in (("off", "on") if repeat % 2 == 0 else ("on", "off")):    # alternate who goes first
                runs[name].append(one_fit(os.path.join(scratch, f"{name}{repeat}"), name == "on"))
    identical = len({r.pop("history") for rs in runs.values() for r in rs}) == 1
    median = {name: {key: statistics.median(r[key] for r in rs) for key, _ in KEYS} for name, rs in runs.items()}
    spread = max(r["utilization"] for r in runs["off"]) - min(r["utilization"] for r in runs["off"])
    gap = median["off"]["utilization"] - median["on"]["utilization"]
    report = {
        **provenance(), "torch": torch.__version__,
        "workload": {"workers": WORKERS, "epochs": EPOCHS, "trials": TRIALS, "polling_s": 1.0},
        "runs": runs, "median": median, "utilization_gap": gap, "off_spread": spread,
        "within_noise": gap <= max(spread, 0.01), "identical_histories": identical,
    }
    print(f"{'':26}{'off':>10}{'on':>10}{'on/off':>10}")
    for key, label in KEYS:
        off, on = median["off"][key], median["on"][key]
        print(f"{label:26}{off:10.3f}{on:10.3f}{(on / off if off else float('nan')):10.3f}")
    print(f"utilization off - on: {gap:.4f} (the off runs' own spread: {spread:.4f}); identical histories: "
          f"{identical}")
    write_json(report, args.out)


if __name__ == "__main__":
    main()
