"""Data at scale: workers that stream partitions larger than their memory, side by side with
workers that hold them.

1. **Peak memory of streaming workers.** A generated dataset of uint8 images (3 x 64 x 64,
   ``--gb`` gigabytes on disk, default 4.5) trains a small CNN grid on 2 workers that stream
   their partitions (``in_memory=False``). Each worker's peak resident memory (the kernel's
   ``VmHWM``) is compared with the size of its partitions. Targets: <= 25 % of its
   partitions, and under 256 MB + the model + 300 MB.
2. **Streamed against in memory.** On a dataset that fits (``--fits-mb``, default 400 MB),
   the same grid on 2 workers in memory and streamed, alternated, ``--repeats`` times:
   training samples per second of compute (the workers' training loops, from the
   schedule) and the fit's wall time. Target: streamed >= 0.90 x in memory.
3. **Bytes read from a remote store.** The fitting dataset in a store reached through
   fsspec (``local://``), streamed: each worker copies its partitions to a local cache
   once, so the bytes read from the store per run equal the partition files' size, whatever
   the epochs and trials; without the cache each training sub-epoch would read its
   partition from the store.

    .venv/bin/python benchmarks/data_scale.py [--gb 4.5] [--fits-mb 400] [--repeats 5]
        [--out benchmarks/results/data_scale.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import threading
import time

import numpy as np
import psutil
import torch

import cerebro as cb
from cerebro.data import read_layout

ROW_BYTES = 3 * 64 * 64
GRID = {"lr": cb.choice([1e-3, 3e-3])}


def images(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noise images whose class is written in the top-left 8 x 8 block of the first channel."""
    rng = np.random.default_rng(seed)
    features = np.empty((rows, 3, 64, 64), np.uint8)
    label = rng.integers(0, 10, rows)
    for start in range(0, rows, 8192):
        chunk = features[start:start + 8192]
        chunk[:] = rng.integers(0, 256, chunk.shape, dtype=np.uint8)
        chunk[:, 0, :8, :8] = (label[start:start + 8192] * 25)[:, None, None]
    return features, label


def to_float(batch: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return batch.astype(np.float32) / 255


def build(config: dict) -> cb.TorchTrainable:
    """A patch-embedding CNN: cheap enough that reading the data is most of the work."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 8, stride=8), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 8 * 8, 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=128,
                             metrics={"accuracy": cb.metrics.accuracy}, transform=to_float, eval_transform=to_float)


class PeakMemory:
    """The peak resident memory (VmHWM) of every process this one starts, polled."""

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            for child in psutil.Process().children(recursive=True):
                try:
                    with open(f"/proc/{child.pid}/status") as f:
                        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
                except (OSError, StopIteration):
                    continue
                self.peaks[child.pid] = max(peak, self.peaks.get(child.pid, 0))


def worker_pids(result: cb.Result) -> dict[int, int]:
    """worker index -> pid, as the run started them."""
    started = next(e for e in result.store.events() if e["event"] == "run_started")
    return {int(i): w["pid"] for i, w in started["workers"].items()}


def fit(data: cb.Dataset, store: str, epochs: int, seed: int = 0) -> tuple[cb.Result, float]:
    started = time.monotonic()
    result = cb.GridSearch(build, GRID, epochs=epochs, metric="val_accuracy", mode="max").fit(
        data, workers=2, store=store, seed=seed, verbose=0)
    return result, time.monotonic() - started


def samples_per_compute_second(result: cb.Result) -> float:
    train = result.schedule()[lambda s: s.kind == "train"]
    layout = read_layout(result.store.data_dir)
    return sum(layout.rows["train"][p] for p in train.partition) / train.compute.sum()


def streaming_memory(gb: float, scratch: str) -> dict:
    rows = int(gb * 1e9 / ROW_BYTES)
    features, label = images(rows)
    data = cb.Dataset.from_numpy(features, label, validation=0.05, partitions=4, seed=0, in_memory=False)
    with PeakMemory() as memory:
        result, wall = fit(data, os.path.join(scratch, "big"), epochs=1)
    layout = read_layout(result.store.data_dir)
    model_bytes = sum(t.numel() * t.element_size() for t in result.best.state_dict().values())
    workers = []
    for index, pid in sorted(worker_pids(result).items()):
        started = next(e for e in result.store.events() if e["event"] == "run_started")
        partitions = started["workers"][str(index)]["partitions"]
        size = sum(layout.partition_bytes(p) for p in partitions)
        peak = memory.peaks.get(pid, 0)
        workers.append({"worker": index, "partitions_bytes": size, "peak_rss_bytes": peak,
                        "peak_over_partitions": peak / size,
                        "under_256MB_model_300MB": peak < 256e6 + 3 * model_bytes + 300e6})
    return {"rows": rows, "dataset_bytes_on_disk": _data_bytes(result.store.data_dir), "wall_s": wall,
            "best_val_accuracy": result.best.metrics["val_accuracy"], "workers": workers,
            "row_group_rows": layout.row_group_rows, "window_row_groups": layout.window}


def streamed_against_in_memory(mb: float, repeats: int, scratch: str) -> dict:
    features, label = images(int(mb * 1e6 / ROW_BYTES), seed=1)
    rates: dict[str, list[float]] = {"in memory": [], "streamed": []}
    walls: dict[str, list[float]] = {"in memory": [], "streamed": []}
    histories = {}
    for repeat in range(repeats):
        modes = ("in memory", "streamed") if repeat % 2 == 0 else ("streamed", "in memory")
        for mode in modes:
            data = cb.Dataset.from_numpy(features, label, validation=0.1, partitions=4, seed=0,
                                         in_memory=mode == "in memory")
            result, wall = fit(data, os.path.join(scratch, f"fits-{mode}-{repeat}"), epochs=2)
            rates[mode].append(samples_per_compute_second(result))
            walls[mode].append(wall)
            histories[mode] = result.history()
    same = histories["in memory"].equals(histories["streamed"])
    median = {mode: statistics.median(v) for mode, v in rates.items()}
    return {"rows": len(label), "samples_per_compute_s": rates, "wall_s": walls, "median_samples_per_s": median,
            "ratio_streamed_over_in_memory": median["streamed"] / median["in memory"],
            "median_wall_s": {mode: statistics.median(v) for mode, v in walls.items()},
            "bitwise_equal_histories": same}


def remote_store_reads(mb: float, scratch: str) -> dict:
    features, label = images(int(mb * 1e6 / ROW_BYTES), seed=1)
    data = cb.Dataset.from_numpy(features, label, validation=0.1, partitions=4, seed=0, in_memory=False)
    epochs = 3
    result, _ = fit(data, f"local://{scratch}/remote", epochs=epochs)
    started = next(e for e in result.store.events() if e["event"] == "run_started")
    copied = sum(_megabytes(w["data"]) for w in started["workers"].values())
    files_bytes = _data_bytes(os.path.join(scratch, "remote", "data"))
    train_files = sum(os.path.getsize(os.path.join(scratch, "remote", "data", "train", name))
                      for name in os.listdir(os.path.join(scratch, "remote", "data", "train")))
    trials = len(result.trials)
    return {"epochs": epochs, "trials": trials, "partition_files_bytes": files_bytes,
            "read_from_store_bytes": copied, "read_over_files": copied / files_bytes,
            "uncached_train_reads_per_epoch_bytes": trials * train_files}


def _megabytes(note: str) -> float:
    found = re.search(r"copied ([\d.]+) (MB|GB)", note)
    return float(found[1]) * (1e6 if found[2] == "MB" else 1e9) if found else 0.0


def _data_bytes(data_dir: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(data_dir) for name in names
               if name.endswith(".parquet"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=4.5, help="size of the streamed dataset on disk")
    parser.add_argument("--fits-mb", type=float, default=400, help="size of the dataset held in memory")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scratch", default=None, help="where the run directories go (default: a temp dir)")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "data_scale.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cerebro-data-scale-", dir=args.scratch) as scratch:
        memory = streaming_memory(args.gb, scratch)
        speed = streamed_against_in_memory(args.fits_mb, args.repeats, scratch)
        reads = remote_store_reads(args.fits_mb, scratch)
    print(f"1. streaming {memory['dataset_bytes_on_disk'] / 1e9:.2f} GB ({memory['rows']} uint8 images 3x64x64) "
          f"on 2 workers, 2 trials x 1 epoch, {memory['wall_s']:.0f} s")
    print("| worker | its partitions | peak RSS | peak / partitions (target <= 0.25) | < 256 MB + model + 300 MB |")
    print("|---|---|---|---|---|")
    for w in memory["workers"]:
        print(f"| {w['worker']} | {w['partitions_bytes'] / 1e9:.2f} GB | {w['peak_rss_bytes'] / 1e6:.0f} MB | "
              f"{w['peak_over_partitions']:.3f} | {w['under_256MB_model_300MB']} |")
    print(f"\n2. {speed['rows']} images ({args.fits_mb:.0f} MB), 2 workers, 2 trials x 2 epochs, "
          f"medians of {args.repeats}, alternated")
    print("| storage | training samples / compute s | fit wall s |")
    print("|---|---|---|")
    for mode in ("in memory", "streamed"):
        print(f"| {mode} | {speed['median_samples_per_s'][mode]:.0f} | {speed['median_wall_s'][mode]:.1f} |")
    print(f"streamed / in memory = {speed['ratio_streamed_over_in_memory']:.3f} (target >= 0.90); "
          f"histories bitwise equal: {speed['bitwise_equal_histories']}")
    print(f"\n3. a local:// store, streamed and cached, {reads['trials']} trials x {reads['epochs']} epochs: "
          f"{reads['read_from_store_bytes'] / 1e6:.0f} MB read from the store for partition files of "
          f"{reads['partition_files_bytes'] / 1e6:.0f} MB (ratio {reads['read_over_files']:.2f}; target 1.0); "
          f"uncached, training alone would read {reads['uncached_train_reads_per_epoch_bytes'] / 1e6:.0f} MB "
          f"per epoch")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "streaming_memory": memory,
                   "streamed_vs_in_memory": speed, "remote_store": reads}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
