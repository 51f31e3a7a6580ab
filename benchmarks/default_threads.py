"""What the reproducible default costs: one torch thread per worker against cores // workers.

One thread per worker makes 1, 2 and 4 workers give the same bits (CPU kernels sum in an
order that depends on the thread count). Before, a local worker got cores // workers
threads, which differ with the worker count. On a machine with as many workers as cores
nothing changes; with fewer workers, each used to get several threads. Measured here, side
by side in one run, alternating:

1. The trainer alone: a training sub-epoch on one in-memory partition (the
   demo's MLP and CNN on digits, and a wide MLP on 8,192 generated rows), with 1 thread and
   with cores threads, medians of repeats.
2. A whole fit: the demo's search (8 trials, MLP and CNN) for 3 epochs on 1 worker, with
   the new default (1 thread) and the old one (cores // 1 threads); and on ``cores``
   workers, where both defaults are 1 thread.

    .venv/bin/python benchmarks/default_threads.py [--repeats 3] [--out benchmarks/results/default_threads.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from _one_partition import partition, train

import cerebro as cb
from cerebro.demo import build, load_data

EPOCHS = 3


def trainer_seconds(architecture: str, threads: int) -> float:
    """One training sub-epoch with ``threads`` threads: the demo's MLP or CNN on
    a quarter of the digits, or a wide MLP (256-512-512-10) on 8,192 generated rows."""
    if architecture == "wide":
        generator = torch.Generator().manual_seed(0)
        features, label = torch.rand(8192, 256, generator=generator), torch.randint(0, 10, (8192,), generator=generator)
    else:
        from sklearn.datasets import load_digits
        digits, classes = load_digits(return_X_y=True)
        features = torch.from_numpy((digits / 16.0).reshape(-1, 1, 8, 8)).float()[:450]
        label = torch.from_numpy(classes).long()[:450]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        if architecture == "wide":
            model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                        torch.nn.ReLU(), torch.nn.Linear(512, 10))
            trainable = cb.TorchTrainable(model, torch.optim.Adam(model.parameters()),
                                          torch.nn.functional.cross_entropy, batch_size=64)
        else:
            trainable = build({"architecture": architecture, "lr": 1e-3, "batch_size": 32})
        source = partition(features, label)
        train(trainable, source, seed=0)                              # warm-up
        started = time.perf_counter()
        for seed in range(1, 4):
            train(trainable, source, seed=seed)
        return (time.perf_counter() - started) / 3
    finally:
        torch.set_num_threads(previous)


def fit_seconds(workers: int, threads: int, scratch: str, name: str) -> float:
    search = cb.GridSearch(build, {"architecture": cb.choice(["mlp", "cnn"]), "lr": cb.choice([1e-3, 3e-3]),
                                   "batch_size": cb.choice([32, 64])}, epochs=EPOCHS)
    started = time.monotonic()
    search.fit(load_data(partitions=max(2, workers)), backend=cb.LocalBackend(workers, threads_per_worker=threads),
               store=os.path.join(scratch, name), seed=0, verbose=0)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "default_threads.json"))
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    import warnings
    warnings.simplefilter("ignore", UserWarning)       # the more-threads runs warn, as they should
    trainer: dict[str, list[float]] = {}
    fits: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="cerebro-threads-") as scratch:
        for repeat in range(args.repeats):
            for architecture in ("mlp", "cnn", "wide"):
                for threads in (1, cores):
                    trainer.setdefault(f"{architecture}, {threads} thread(s)", []).append(
                        trainer_seconds(architecture, threads))
            for workers, threads in ((1, 1), (1, cores), (cores, 1)):
                key = f"{workers} worker(s) x {threads} thread(s)"
                fits.setdefault(key, []).append(fit_seconds(workers, threads, scratch, f"{key}-{repeat}"))
    print(f"machine: {cores} cores; medians of {args.repeats}")
    print("| measure | seconds (median) |")
    print("|---|---|")
    for name, values in [*trainer.items(), *fits.items()]:
        print(f"| {name} | {statistics.median(values):.3f} |")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "cores": cores, "trainer_s": trainer, "fit_s": fits}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
