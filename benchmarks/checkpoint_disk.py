"""Disk a many-trial run needs for its weights, keeping every finished trial's best and last
epoch (the default) or only the best ``--keep`` trials' (``keep_checkpoints``).

A random search of ``--trials`` MLPs (64-``--hidden``-10 with Adam, whose state is 3x the
weights) over the digits, ``--epochs`` epochs each, on 2 local workers; the table prints the
bytes under ``trials/`` when the run has ended, and the largest seen while it ran (sampled
every 50 ms), for each setting, and writes the numbers to ``--out``.

    .venv/bin/python benchmarks/checkpoint_disk.py          # ~4 min on 2 cores
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import cerebro as cb  # noqa: E402


def disk(directory: str) -> int:
    """Bytes of the distinct files under ``directory`` (a hard link counted once)."""
    seen, total = set(), 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                info = os.stat(os.path.join(root, name))
            except FileNotFoundError:
                continue        # deleted while we walked
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def build(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["hidden"], 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=64)


def measure(keep: int | None, args: argparse.Namespace, data: cb.Dataset, root: str) -> dict:
    store = os.path.join(root, f"keep-{keep}")
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], disk(os.path.join(store, "trials")))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    search = cb.RandomSearch(build, {"lr": cb.loguniform(1e-4, 1e-1), "hidden": args.hidden},
                             num_trials=args.trials, epochs=args.epochs)
    result = search.fit(data, workers=2, store=store, seed=0, verbose=0, tensorboard=False, keep_checkpoints=keep)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    final = disk(os.path.join(store, "trials"))
    return {"keep_checkpoints": keep, "trials": len(result.trials), "final_bytes": final,
            "peak_bytes": max(peak[0], final), "seconds": round(seconds, 1), "best": result.best.trial_id}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--keep", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "checkpoint_disk.json"))
    args = parser.parse_args()
    features, label = load_digits(return_X_y=True)
    data = cb.Dataset.from_numpy((features / 16).astype("float32"), label, validation=0.2, partitions=2, seed=0)
    with tempfile.TemporaryDirectory() as root:
        rows = [measure(keep, args, data, root) for keep in (None, args.keep)]
    print(f"{'keep_checkpoints':>16} {'trials':>6} {'final MiB':>10} {'peak MiB':>9} {'seconds':>8} {'best':>6}")
    for row in rows:
        print(f"{str(row['keep_checkpoints']):>16} {row['trials']:>6} {row['final_bytes'] / 2**20:>10.1f} "
              f"{row['peak_bytes'] / 2**20:>9.1f} {row['seconds']:>8} {row['best']:>6}")
    print(f"ratio of the final disk: {rows[0]['final_bytes'] / rows[1]['final_bytes']:.1f}x")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"settings": {k: v for k, v in vars(args).items() if k != "out"}, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
