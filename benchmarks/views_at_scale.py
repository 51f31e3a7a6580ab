"""Every view of a run at 100, 1,000 and 10,000 trials (issue 60, part 3): ``cb.load``,
``result.ranked()`` and ``result.history()`` (in this process, Cerebro imported), ``cerebro
status`` and ``cerebro report`` (each a process of its own, as a user runs them: imports
included), the report's size, and the dashboard's ``/state`` and ``/metrics`` while the run
goes on (a ``RunServer`` on the run's journal cut at 90 %, which then grows a tenth of the
rest at a time, each step followed by a request to each, as the page polls; then ``/state``
until its charts show the whole run). The runs are ``cb.simulate``'s: random search (one
epoch a trial) and ASHA (``max_epochs=9``) on 2 simulated workers. Median of 3 runs of each
view; wall and CPU seconds of the commands.

    .venv/bin/python benchmarks/views_at_scale.py                     # ~10 min on 2 cores
    .venv/bin/python benchmarks/views_at_scale.py --sizes 100 1000    # a minute
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import cerebro as cb
from cerebro.report._http import RunServer

HERE = os.path.dirname(os.path.abspath(__file__))
SPACE = {"lr": cb.loguniform(1e-4, 1e-1), "width": cb.choice([32, 64, 128, 256]), "dropout": cb.uniform(0, 0.5)}
TARGETS = {"load_s": 2.0, "ranked_s": 2.0, "history_s": 2.0, "status_s": 2.0, "report_s": 15.0, "report_mb": 10.0,
           "state_max_s": 0.2, "metrics_max_s": 0.2}
REPEATS = 3


def no_model(config: dict) -> None:
    """Never called by cb.simulate."""


def objective(config: dict, epoch: int) -> dict[str, float]:
    loss = abs(math.log10(config["lr"] / 3e-3)) + config["dropout"] / 4 + 8 / (epoch * math.sqrt(config["width"]))
    return {"train_loss": loss, "val_loss": 1.1 * loss}


SEARCHES = {
    "random": lambda trials: cb.RandomSearch(no_model, SPACE, num_trials=trials, epochs=1, metric="train_loss"),
    "asha": lambda trials: cb.ASHA(no_model, SPACE, num_trials=trials, max_epochs=9),
}


def timed(view) -> tuple[float, object]:
    """The median of :data:`REPEATS` calls' seconds, and the last call's answer."""
    seconds, answer = [], None
    for _ in range(REPEATS):
        started = time.perf_counter()
        answer = view()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), answer


def command(*args: str) -> tuple[float, float]:
    """The median wall and CPU seconds of ``cerebro ARGS`` in a process of its own."""
    walls, cpus = [], []
    for _ in range(REPEATS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cerebro", *args], check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def ask(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as answer:
        body = answer.read()
    return time.perf_counter() - started, body


def dashboard(run_dir: str, scratch: str) -> dict:
    """The dashboard of the run as it was at 90 % of its journal, then going on to its end."""
    live = os.path.join(scratch, "live")
    os.makedirs(live)
    shutil.copy(os.path.join(run_dir, "run.json"), live)
    with open(os.path.join(run_dir, "journal.jsonl"), "rb") as f:
        lines = f.readlines()
    cut = len(lines) * 9 // 10
    with open(os.path.join(live, "journal.jsonl"), "wb") as f:
        f.writelines(lines[:cut])
    started = time.perf_counter()
    server = RunServer(live, port=0)
    start = time.perf_counter() - started
    server.serve_in_thread()
    try:
        state_s, metrics_s = [], []
        seconds, body = ask(server.url + "state")
        state = json.loads(body)
        step = math.ceil((len(lines) - cut) / 10)
        for at in range(cut, len(lines), step):          # the run goes on
            with open(os.path.join(live, "journal.jsonl"), "ab") as f:
                f.writelines(lines[at:at + step])
            seconds, body = ask(server.url + f"state?since={state['version']}&figures={state['figures_version']}")
            state_s.append(seconds)
            state = {**state, **json.loads(body)} if body else state
            metrics_s.append(ask(server.url + "metrics")[0])
            time.sleep(0.2)
        started = time.perf_counter()
        while True:          # as the page polls, until it shows the run finished
            seconds, body = ask(server.url + f"state?figures={state['figures_version']}")
            state_s.append(seconds)
            state = json.loads(body)
            if "not finished" not in state["sections"]["headline"]:
                break
            assert time.perf_counter() - started < 600, "the dashboard never showed the run's end"
            time.sleep(0.2)
        caught_up = time.perf_counter() - started
    finally:
        server.shutdown()
        server.server_close()
    return {"dashboard_start_s": start, "state_median_s": statistics.median(state_s), "state_max_s": max(state_s),
            "metrics_median_s": statistics.median(metrics_s), "metrics_max_s": max(metrics_s),
            "state_requests": len(state_s), "caught_up_s": caught_up}


def measure(search: str, trials: int, scratch: str) -> dict:
    run_dir = os.path.join(scratch, "run")
    started = time.perf_counter()
    cb.simulate(SEARCHES[search](trials), objective, workers=2, seed=0, store=run_dir)
    row = {"search": search, "trials": trials, "simulate_s": time.perf_counter() - started}
    with open(os.path.join(run_dir, "journal.jsonl"), "rb") as f:
        row["journal_lines"] = sum(1 for _ in f)
    row["journal_mb"] = os.path.getsize(os.path.join(run_dir, "journal.jsonl")) / 1e6
    row["load_s"], result = timed(lambda: cb.load(run_dir))
    row["ranked_s"], ranked = timed(result.ranked)
    row["history_s"], history = timed(result.history)
    row["history_rows"], row["best"] = len(history), ranked[0].trial_id
    row["status_s"], row["status_cpu_s"] = command("status", run_dir)
    report = os.path.join(scratch, "report.html")
    row["report_s"], row["report_cpu_s"] = command("report", run_dir, "-o", report)
    row["report_mb"] = os.path.getsize(report) / 1e6
    with open(report, encoding="utf-8") as f:
        row["report_names_best"] = f"<b>{row['best']}</b>" in f.read()
    row.update(dashboard(run_dir, scratch))
    row["met"] = {name: row[name] <= limit for name, limit in TARGETS.items()}
    return row


COLUMNS = ("search", "trials", "journal_lines", "load_s", "ranked_s", "history_s", "status_s", "report_s",
           "report_mb", "state_median_s", "state_max_s", "metrics_median_s", "metrics_max_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--out", default=os.path.join(HERE, "results", "views_at_scale.json"))
    arguments = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS), flush=True)
    for trials in arguments.sizes:
        for search in SEARCHES:
            with tempfile.TemporaryDirectory() as scratch:
                row = measure(search, trials, scratch)
            rows.append(row)
            print("| " + " | ".join(f"{row[c]:,.3f}" if isinstance(row[c], float) else f"{row[c]:,}"
                                    if isinstance(row[c], int) else str(row[c]) for c in COLUMNS) + " |", flush=True)
    missed = [(r["search"], r["trials"], name) for r in rows for name, met in r["met"].items() if not met]
    print("targets " + ", ".join(f"{name} <= {limit}" for name, limit in TARGETS.items()) + ": "
          + ("all met" if not missed else f"missed: {missed}"))
    os.makedirs(os.path.dirname(os.path.abspath(arguments.out)), exist_ok=True)
    with open(arguments.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "targets": TARGETS, "rows": rows,
                   "machine": {"cpus": os.cpu_count(), "load_average_before": load_before,
                               "load_average_after": os.getloadavg(), "python": platform.python_version(),
                               "cerebro": cb.__version__}}, f, indent=1)


if __name__ == "__main__":
    main()
