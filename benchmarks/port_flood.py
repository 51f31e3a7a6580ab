"""A flooded port against a quiet one: what hostile connections cost a real run.

Part 1, the driver's worker port. The same grid (6 MLP configurations on digits, 60 epochs,
4 partitions, 2 local workers, 1 thread each) runs alternately on a quiet port and on one
flooded from before the first worker starts: 50 silent connections kept open (each reopened
as soon as the driver cuts it off at its handshake deadline) and 50 garbage connections
churned without pause. In both, one worker kills itself mid sub-epoch after 2 journaled
epochs and is replaced. Reported, medians: the fit's wall time, the time until every worker was ready (the journal's
``run_started``, from the fit's start), and the time from the loss to the replacement's
return. Every run must end with the quiet run's history, bit for bit.

Part 2, the driver's ``/metrics`` port (``fit(metrics_port=...)``). Two equal runs go at once,
each in a process of its own (a grid of tiny sub-epochs, 1 worker each: the driver's
scheduling paces them, so time taken from the driver's thread shows); one of them is asked
for ``/metrics`` by 1, 8 or 32 clients in a loop, or by a flood of connections reset as soon
as made, or by none (the noise floor); the other, its twin, by none. Whatever else the
machine does slows both alike, so the ratio of their progress (sub-epochs per second over
the schedule's span) is what the clients cost. The scenarios alternate, ``--metrics-repeats``
times each. Reported, medians: both runs' progress and their ratio, the CPU time the scraped
driver's server spent (its share of a core over the run), and the requests it answered.
The clients run in a process of their own at the lowest priority (``nice 19``): on a machine
of 2 cores they would otherwise take the runs' cores, a cost of the clients' own (and one
both runs would share), not of the driver serving them.

    .venv/bin/python benchmarks/port_flood.py [--part both|workers|metrics] [--repeats 3] [--metrics-repeats 3]
        [--out benchmarks/results/port_flood.json]
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch

import cerebro as cb
from cerebro.observe import _metrics

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _faults import epochs_journaled, striking  # noqa: E402
from _report import provenance, write_json  # noqa: E402

SPACE = {"lr": cb.choice([3e-2, 1e-2, 3e-3]), "hidden": cb.choice([16, 32])}
EPOCHS = 60


class Flood:
    """Keeps ``silent`` connections open against ``address`` and churns ``garbage`` ones."""

    def __init__(self, address: tuple[str, int], silent: int = 50, garbage: int = 50) -> None:
        self.address, self.silent, self.garbage = address, silent, garbage
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(self.address, timeout=5)
        except OSError:
            return None
        self.connections += 1
        return sock

    def _run(self) -> None:
        held: list[socket.socket] = []
        while not self._stop.is_set():
            held += [s for s in (self._open() for _ in range(self.silent - len(held))) if s is not None]
            readable = select.select(held, [], [], 0.05)[0]
            for sock in readable:                    # a challenge, or the driver hanging up
                try:
                    if sock.recv(64) == b"":
                        held.remove(sock)
                        sock.close()
                except OSError:
                    held.remove(sock)
                    sock.close()
            for _ in range(self.garbage):
                sock = self._open()
                if sock is not None:
                    try:
                        sock.sendall(b"\xff" * 512)
                    except OSError:
                        pass
                    sock.close()
        for sock in held:
            sock.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class FloodedBackend(cb.LocalBackend):
    """Local workers, with a :class:`Flood` started before the first of them."""

    flood: Flood | None = None

    def start(self, address, authkey) -> None:
        if self.flood is None:
            self.flood = Flood(tuple(address))
        super().start(address, authkey)


def build(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["hidden"], 10))
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=32)


def killing_build(build: Callable[[dict], cb.TorchTrainable], store: str, marker: str, after: int = 2):
    """``build`` whose worker SIGKILLs itself once, mid training sub-epoch, once ``after``
    epochs are journaled in ``store``; the ``marker`` file, claimed atomically, lets one worker only die."""
    def build_that_kills(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        trainable.loss = striking(trainable.loss, lambda: os.kill(os.getpid(), signal.SIGKILL), marker=marker,
                                  when=lambda: epochs_journaled(store) >= after)
        return trainable
    return build_that_kills


def digits() -> cb.Dataset:
    from sklearn.datasets import load_digits
    features, label = load_digits(return_X_y=True)
    return cb.Dataset.from_numpy((features / 16.0).astype(np.float32), label, validation=0.2, partitions=4, seed=0)


def run(scratch: str, name: str, flooded: bool) -> tuple[dict[str, Any], pd.DataFrame]:
    store, marker = os.path.join(scratch, name), os.path.join(scratch, name + ".killed")
    backend = (FloodedBackend if flooded else cb.LocalBackend)(2, threads_per_worker=1)
    started = time.monotonic()
    try:
        result = cb.GridSearch(killing_build(build, store, marker), SPACE, epochs=EPOCHS).fit(
            digits(), backend=backend, store=store, seed=5, verbose=0)
    finally:
        if flooded and backend.flood is not None:
            backend.flood.stop()
    wall = time.monotonic() - started
    events = list(result.store.events())
    ready = next(e["clock"] for e in events if e["event"] == "run_started") - started   # the driver's monotonic t0
    lost = next(e["time"] for e in events if e["event"] == "worker_lost")
    back = next((e["time"] for e in events if e["event"] == "worker_replaced"), None)
    return {"flooded": flooded, "wall_s": wall, "ready_s": ready,
            "lost_to_replaced_s": None if back is None else back - lost,
            "flood_connections": backend.flood.connections if flooded else 0}, result.history()


SCRAPED_EPOCHS = 40
SCENARIOS = (("no client (the noise floor)", None, 0), ("1 looping client", "loop", 1),
             ("8 looping clients", "loop", 8), ("32 looping clients", "loop", 32),
             ("connect-and-reset flood (8 threads)", "flood", 8))
CLIENTS = r"""
import os, socket, struct, sys, threading, time
os.nice(19)         # the clients' own CPU is theirs: they take what the run leaves
mode, port, clients = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ASK = b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
counts, stop = [0] * clients, threading.Event()


def connect():
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=60)
    except OSError:         # no server yet, or no more
        time.sleep(0.01)


def loop(i):
    while not stop.is_set():
        if (sock := connect()) is None:
            continue
        answer = b""
        try:
            sock.sendall(ASK)
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
        sock.close()
        counts[i] += answer.startswith(b"HTTP/1.0 200")


def flood(i):
    while not stop.is_set():
        if (sock := connect()) is None:
            continue
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()        # a reset, as soon as connected
        counts[i] += 1


for i in range(clients):
    threading.Thread(target=loop if mode == "loop" else flood, args=(i,), daemon=True).start()
sys.stdin.read()            # until the benchmark closes it
stop.set()
print(sum(counts), flush=True)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Kept(_metrics.RunServer):
    """The driver's /metrics server, kept where the benchmark can read what it spent."""

    servers: list[_metrics.RunServer] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        Kept.servers.append(self)


def scraped_run(store: str, port: int) -> dict[str, Any]:
    """One fit serving its /metrics on ``port`` (in a process of its own: see :func:`pair`)."""
    _metrics.RunServer = Kept      # type: ignore[misc]   (the driver makes its server through this name)
    started = time.monotonic()
    result = cb.GridSearch(build, SPACE, epochs=SCRAPED_EPOCHS).fit(
        digits(), backend=cb.LocalBackend(1, threads_per_worker=1), store=store, seed=5, verbose=0, metrics_port=port)
    wall = time.monotonic() - started
    schedule = result.schedule()
    span = float(schedule.end.max() - schedule.start.min())
    spent = Kept.servers[-1].budget.spent
    return {"wall_s": wall, "sub_epochs": len(schedule), "span_s": span, "sub_epochs_per_s": len(schedule) / span,
            "server_cpu_s": spent, "server_share": spent / span}


def pair(scratch: str, name: str, mode: str | None, clients: int) -> dict[str, Any]:
    """Two equal runs at once, each in a process of its own, one of them (``scraped``) asked by
    ``clients`` clients of ``mode`` from before it starts to its end, the other (``quiet``)
    by none: whatever else the machine does slows both alike, so their ratio is the clients'
    cost. One worker each: the two runs' drivers and workers fill the 2 cores."""
    ports = {"scraped": free_port(), "quiet": free_port()}
    asking = None if mode is None else subprocess.Popen(
        [sys.executable, "-c", CLIENTS, mode, str(ports["scraped"]), str(clients)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    first = len(os.listdir(scratch))
    runs = {role: subprocess.Popen([sys.executable, __file__, "--scraped-run", os.path.join(scratch, f"{role}-{first}"),
                                    str(port)], stdout=subprocess.PIPE, text=True) for role, port in ports.items()}
    try:
        done = {role: json.loads(run.communicate(timeout=900)[0].splitlines()[-1]) for role, run in runs.items()}
    finally:
        answered = asking.communicate(timeout=120)[0] if asking is not None else "0"
    return {"scenario": name, **{f"{role}_{k}": v for role, report in done.items() for k, v in report.items()},
            "ratio": done["scraped"]["sub_epochs_per_s"] / done["quiet"]["sub_epochs_per_s"],
            "answered": int(answered or 0)}


def metrics_port(repeats: int) -> list[dict[str, Any]]:
    """Part 2: every scenario's pair of runs ``repeats`` times, the scenarios alternating."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="cerebro-scraped-") as scratch:
        for _ in range(repeats):
            for name, mode, clients in SCENARIOS:
                runs.append(pair(scratch, name, mode, clients))
                print(f"  {name}: {runs[-1]['scraped_sub_epochs_per_s']:.1f} / {runs[-1]['quiet_sub_epochs_per_s']:.1f}"
                      f" sub-epochs/s, server {runs[-1]['scraped_server_cpu_s']:.3f} CPU s, "
                      f"{runs[-1]['answered']} answered", flush=True)
    print("| clients of one run's /metrics | sub-epochs / s, scraped run / quiet twin | scraped / quiet | the "
          "scraped driver's serving CPU s (share of a core) | requests answered (connections, flood) |")
    print("|---|---|---|---|---|")
    for name, _, _ in SCENARIOS:
        mine = [r for r in runs if r["scenario"] == name]
        scraped, quiet, ratio, cpu, share, answered = (statistics.median(r[k] for r in mine) for k in (
            "scraped_sub_epochs_per_s", "quiet_sub_epochs_per_s", "ratio", "scraped_server_cpu_s",
            "scraped_server_share", "answered"))
        print(f"| {name} | {scraped:.1f} / {quiet:.1f} | {ratio - 1:+.1%} | {cpu:.3f} ({share:.2%}) "
              f"| {answered:,.0f} |")
    return runs


def worker_port(repeats: int) -> tuple[list[dict[str, Any]], bool]:
    """Part 1: the quiet and the flooded worker port, ``repeats`` times each, alternating."""
    runs, histories = [], []
    with tempfile.TemporaryDirectory(prefix="cerebro-flood-") as scratch:
        for repeat in range(repeats):
            for flooded in (False, True):
                report, history = run(scratch, f"{'flooded' if flooded else 'quiet'}-{repeat}", flooded)
                runs.append(report)
                histories.append(history)
    equal = all(h.equals(histories[0]) for h in histories)
    print("| port | fit wall s | workers ready s | loss -> replacement back s | hostile connections |")
    print("|---|---|---|---|---|")
    for flooded in (False, True):
        mine = [r for r in runs if r["flooded"] is flooded]
        cells = [statistics.median(r[k] for r in mine) for k in ("wall_s", "ready_s", "lost_to_replaced_s")]
        print(f"| {'flooded' if flooded else 'quiet'} | " + " | ".join(f"{c:.2f}" for c in cells)
              + f" | {statistics.median(r['flood_connections'] for r in mine):.0f} |")
    print(f"every run bitwise equal to the first: {equal}")
    return runs, equal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("both", "workers", "metrics"), default="both")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--metrics-repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "port_flood.json"))
    parser.add_argument("--scraped-run", nargs=2, metavar=("STORE", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scraped_run:          # one run of a pair (see pair())
        print(json.dumps(scraped_run(args.scraped_run[0], int(args.scraped_run[1]))))
        return 0
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), **provenance()}
    equal = True
    if args.part in ("both", "workers"):
        report["runs"], equal = worker_port(args.repeats)
        report["bitwise_equal"] = equal
    if args.part in ("both", "metrics"):
        report["metrics_runs"] = metrics_port(args.metrics_repeats)
    write_json(report, args.out)
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
