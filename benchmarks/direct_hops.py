"""Direct hops (issue 34, part 3): a hop's cost against the floor of moving its bytes.

1. Fetch against a loopback copy. A second process holds a state of 12 MB and one of 100 MB
   (one float32 tensor each, as Adam's states are large flat tensors) in a worker's outbox and
   serves it (:class:`cerebro.worker._peers.StateServer`). This process fetches it as a worker
   does: connect, HMAC handshake, request, read, parse into tensors. The floor: the same
   bytes sent by a plain socket from the same process, read into a buffer allocated for them.
   Alternated, medians; ratio = fetch / copy, target <= 1.2.
2. Hops in a run, through the driver and direct: one ~1M-parameter trial on 2 workers with
   one-batch partitions (``overhead.py``'s hop latency), hop = (end - start) - compute, for
   ``hops="driver"`` and ``hops="direct"``, alternated ``--alternate`` times; the median of
   the runs' medians.

    .venv/bin/python benchmarks/direct_hops.py            # ~3 min on 2 cores
    .venv/bin/python benchmarks/direct_hops.py --quick    # smoke run
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
from overhead import hop_latency, machine, table

from cerebro.store import pack_tensors
from cerebro.worker._outbox import Outbox
from cerebro.worker._peers import StateServer, fetch

KEY = b"b" * 32
SIZES_MB = (12, 100)


def _serve(sizes: tuple[int, ...], ready: Any) -> None:
    """The holder: an outbox with one state per size, and a plain socket sending its bytes."""
    outbox = Outbox(budget=1 << 40)
    raw = {}
    for size in sizes:
        state = pack_tensors({"exp_avg": torch.rand(size * (1 << 20) // 4, generator=torch.Generator().manual_seed(0))})
        outbox.put(f"t{size}", 1, state)
        raw[size] = outbox.get(f"t{size}", 1)
    server = StateServer("127.0.0.1", KEY, outbox)
    plain = socket.create_server(("127.0.0.1", 0))
    ready.send((server.address, plain.getsockname()[:2]))
    while True:
        sock, _ = plain.accept()
        size = int.from_bytes(sock.recv(8), "little")
        if size == 0:
            return
        sock.sendall(raw[size])
        sock.close()


def _copy(address: tuple[str, int], size: int, nbytes: int) -> float:
    started = time.perf_counter()
    with socket.create_connection(address) as sock:
        sock.sendall(size.to_bytes(8, "little"))
        buffer = memoryview(bytearray(nbytes))
        got = 0
        while got < nbytes:
            got += sock.recv_into(buffer[got:])
    return time.perf_counter() - started


def fetch_against_copy(repeats: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    holder = context.Process(target=_serve, args=(SIZES_MB, there), daemon=True)
    holder.start()
    server, plain = here.recv()
    out = {}
    try:
        for size in SIZES_MB:
            fetches, copies, nbytes = [], [], 0
            for _ in range(repeats):
                started = time.perf_counter()
                state, nbytes = fetch(server, KEY, f"t{size}", 1)
                state["exp_avg"].tensor()       # as a worker reads it: tensors over the received bytes
                fetches.append(time.perf_counter() - started)
                copies.append(_copy(plain, size, nbytes))
            fetch_ms, copy_ms = 1e3 * statistics.median(fetches), 1e3 * statistics.median(copies)
            out[f"{size}MB"] = {"bytes": nbytes, "fetch_ms": fetch_ms, "copy_ms": copy_ms,
                                "ratio": fetch_ms / copy_ms, "repeats": repeats}
    finally:
        with socket.create_connection(plain) as sock:
            sock.sendall((0).to_bytes(8, "little"))
        holder.join(10)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--alternate", type=int, default=3, help="runs of each hop mode, alternated")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "direct_hops.json"))
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"machine": machine(), "fetch": fetch_against_copy(5 if args.quick else 21)}
    runs: dict[str, list[dict[str, Any]]] = {"driver": [], "direct": []}
    for _ in range(1 if args.quick else args.alternate):
        for hops in runs:
            runs[hops].append(hop_latency(args.quick, hops))
    for hops, done in runs.items():
        report[f"hop_{hops}"] = {optimizer: {"state_mb": done[0][optimizer]["state_mb"],
                                             "median_ms": statistics.median(r[optimizer]["median_ms"] for r in done),
                                             "run_medians_ms": [r[optimizer]["median_ms"] for r in done]}
                                 for optimizer in ("adam", "sgd")}
    rows = [(f"fetch {size} MB / loopback copy ({r['fetch_ms']:.1f} / {r['copy_ms']:.1f} ms)",
             f"{r['ratio']:.2f}", "<= 1.2", r["ratio"] <= 1.2)
            for size, r in ((s, report["fetch"][f"{s}MB"]) for s in SIZES_MB)]
    for hops in ("driver", "direct"):
        for optimizer in ("adam", "sgd"):
            hop = report[f"hop_{hops}"][optimizer]
            rows.append((f"hop in a run, {optimizer} {hop['state_mb']:.1f} MB, hops={hops}, median of medians ms",
                         f"{hop['median_ms']:.1f}", "", None))
    table(rows)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(f"written to {args.out}")
    return 0 if all(ok is not False for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
