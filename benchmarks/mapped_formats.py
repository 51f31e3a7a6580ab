"""Streamed partitions: our mapped Parquet against Arrow IPC through ``pyarrow.memory_map``.

Issue 34 asked whether the hand-written Parquet page-header reader of ``cerebro/data/_mapped.py``
should give way to Arrow IPC files read through ``pyarrow.memory_map`` (zero copy, no format
code of ours), if that keeps the streamed speed. One partition of ``--rows`` image rows (3 x 32
x 32 uint8, a fixed-size binary column, and an int64 label) is written both ways; then each
format gathers the rows of shuffled batches of 256, as a streaming worker does, and so does an
in-memory array (the reference). Alternated ``--repeats`` times, medians; throughput as a
ratio to in memory, and the growth of this process's resident memory over one pass.

    .venv/bin/python benchmarks/mapped_formats.py [--rows 100000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.ipc as ipc

from cerebro.data._mapped import map_partition
from cerebro.data._partitions import column, partition_file, write_table

SHAPE, BATCH, GROUP = (3, 32, 32), 256, 4096


def _pass(gather, order: np.ndarray) -> tuple[float, float]:
    """Seconds to gather every batch of ``order``, and the resident memory it added (MB)."""
    process = psutil.Process()
    before, started, total = process.memory_info().rss, time.perf_counter(), 0
    for start in range(0, len(order), BATCH):
        features, label = gather(np.sort(order[start:start + BATCH]))
        total += int(features[0, 0, 0, 0]) + int(label[0])     # touch what was gathered
    return time.perf_counter() - started, (process.memory_info().rss - before) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "mapped_formats.json"))
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    features = rng.integers(0, 256, (args.rows, *SHAPE), dtype=np.uint8)
    label = rng.integers(0, 10, args.rows)
    table = pa.table({"features": column(features), "label": pa.array(label)})
    with tempfile.TemporaryDirectory() as scratch:
        write_table(table, scratch, "train", 0, GROUP)
        mapped = map_partition(partition_file(scratch, "train", 0), [(SHAPE, "uint8"), ((), "int64")], args.rows, GROUP)
        ipc_path = os.path.join(scratch, "part-00000.arrow")
        with pa.OSFile(ipc_path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table.combine_chunks())      # one record batch: each column one buffer
        batch = ipc.open_file(pa.memory_map(ipc_path)).get_batch(0)     # zero copy: views of the mapped file
        ipc_features = np.frombuffer(batch.column(0).buffers()[1], np.uint8).reshape(-1, *SHAPE)
        ipc_label = np.frombuffer(batch.column(1).buffers()[1], np.int64)
        positions = np.arange(BATCH)
        ways = {"in memory": lambda rows: (features[rows], label[rows]),
                "mapped Parquet (ours)": lambda rows: tuple(c[positions[:len(rows)]] for c in mapped.rows(rows)),
                "Arrow IPC, memory_map": lambda rows: (ipc_features[rows], ipc_label[rows])}
        for rows in (np.array([5, 17, 4099]),):     # the three read the same rows
            first = [way(rows) for way in ways.values()]
            assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(first, first[1:]))
        times: dict[str, list[float]] = {name: [] for name in ways}
        grown: dict[str, list[float]] = {name: [] for name in ways}
        for repeat in range(args.repeats):
            order = np.random.default_rng(repeat).permutation(args.rows)
            for name, way in ways.items():
                seconds, mb = _pass(way, order)
                times[name].append(seconds)
                grown[name].append(mb)
    base = statistics.median(times["in memory"])
    report = {name: {"median_s": statistics.median(t), "throughput_vs_in_memory": base / statistics.median(t),
                     "rss_growth_mb_median": statistics.median(grown[name])} for name, t in times.items()}
    print(f"{args.rows} rows of {np.prod(SHAPE)} bytes, batches of {BATCH}, {args.repeats} passes each, alternated")
    print(f"{'format':<24} {'median s':>9} {'vs in memory':>13} {'RSS growth MB':>14}")
    for name, r in report.items():
        print(f"{name:<24} {r['median_s']:>9.3f} {r['throughput_vs_in_memory']:>13.3f} "
              f"{r['rss_growth_mb_median']:>14.0f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": args.rows, "repeats": args.repeats, "cpus": os.cpu_count(), "report": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
