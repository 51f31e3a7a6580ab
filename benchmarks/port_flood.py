"""A flooded port against a quiet one: what hostile connections cost a real run.

The same grid (6 MLP configurations on digits, 60 epochs, 4 partitions, 2 local workers, 1
thread each) runs alternately on a quiet port and on one flooded from before the first
worker starts: 50 silent connections kept open (each reopened as soon as the driver cuts it
off at its handshake deadline) and 50 garbage connections churned without pause. In both,
one worker kills itself mid sub-epoch after 2 journaled epochs and is replaced. Reported,
medians: the fit's wall time, the time until every worker was ready (the journal's
``run_started``, from the fit's start), and the time from the loss to the replacement's
return. Every run must end with the quiet run's history, bit for bit.

    .venv/bin/python benchmarks/port_flood.py [--repeats 3] [--out benchmarks/results/port_flood.json]
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import statistics
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _faults import epochs_journaled, striking  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "port_flood.json"))
    args = parser.parse_args(argv)
    runs, histories = [], []
    with tempfile.TemporaryDirectory(prefix="cerebro-flood-") as scratch:
        for repeat in range(args.repeats):
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
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "runs": runs, "bitwise_equal": equal}, f, indent=1)
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
