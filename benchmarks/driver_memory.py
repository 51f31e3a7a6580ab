"""The driver's memory against the number of trials: is it a control plane?

Each run trains ``N`` trials of one MLP (512-2048-1024-2, Adam: a ~36 MB state) for
``--epochs`` epochs on 2 local workers, in a process of its own, and samples that driver
process's RSS every 10 ms from a thread. The table gives the peak above the RSS just before
``fit`` (the baseline: imports and data loaded), in MB and in states; the target (issue 34):
the peak for 16 trials within 1.3x that for 4, and at most ~8 states above the baseline.
The workers' memory is not counted: it grows with the trials they hold, by design.

    .venv/bin/python benchmarks/driver_memory.py                 # 4, 16 and 64 trials, ~6 min on 2 cores
    .venv/bin/python benchmarks/driver_memory.py --trials 4 16   # fewer
    .venv/bin/python benchmarks/driver_memory.py --hops driver   # every hop through the driver

With direct hops (the default) no state passes through the driver: the worker that ends an
epoch writes the state to the store and the driver takes that file as the checkpoint;
``--hops driver`` sends every hop through it, as before direct hops.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS, FEATURES = 512, 512


def build(config: dict):
    import torch

    import cerebro as cb
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 2))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=1e-4),
                             torch.nn.functional.cross_entropy, batch_size=256)


def one_run(trials: int, epochs: int, hops: str) -> dict:
    """In this process: fit ``trials`` trials and return the driver's peak RSS above the baseline."""
    import numpy as np
    import psutil

    import cerebro as cb
    rng = np.random.default_rng(0)
    data = cb.Dataset.from_numpy(rng.random((ROWS, FEATURES), dtype=np.float32), rng.integers(0, 2, ROWS),
                                 partitions=2, validation=0.25, seed=0)
    process = psutil.Process()
    baseline, peak, done = process.memory_info().rss, [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    search = cb.GridSearch(build, {"copy": cb.choice(list(range(trials)))}, epochs=epochs)
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        result = search.fit(data, backend=cb.LocalBackend(2, hops=hops), store=os.path.join(scratch, "run"), seed=0,
                            verbose=0)
        seconds = time.perf_counter() - started
        state = sum(v.numel() * v.element_size() for v in result.best.state_dict().values()) * 3   # + Adam's
    done.set()
    sampler.join()
    return {"trials": trials, "epochs": epochs, "hops": hops, "baseline_mb": baseline / 2**20,
            "peak_above_mb": (peak[0] - baseline) / 2**20, "state_mb": state / 2**20, "seconds": seconds,
            "completed": sum(t.status == "completed" for t in result.trials)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--hops", choices=["direct", "driver"], default="direct")
    parser.add_argument("--out", help="default: results/driver_memory[_driver].json")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)      # the child's own run
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_run(args.one, args.epochs, args.hops)))
        return
    runs = []
    for trials in args.trials:
        done = subprocess.run([sys.executable, __file__, "--one", str(trials), "--epochs", str(args.epochs),
                               "--hops", args.hops], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{'trials':>6} {'state MB':>9} {'peak above baseline MB':>23} {'in states':>10} {'vs 4 trials':>12} "
          f"{'fit s':>7}")
    first = runs[0]["peak_above_mb"]
    for run in runs:
        print(f"{run['trials']:>6} {run['state_mb']:>9.1f} {run['peak_above_mb']:>23.0f} "
              f"{run['peak_above_mb'] / run['state_mb']:>10.1f} {run['peak_above_mb'] / first:>12.2f} "
              f"{run['seconds']:>7.1f}")
    out = args.out or os.path.join(HERE, "results", f"driver_memory{'' if args.hops == 'direct' else '_driver'}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"runs": runs, "cpus": os.cpu_count(), "python": sys.version.split()[0]}, f, indent=1)


if __name__ == "__main__":
    main()
