"""Grid, random, TPE (plain and pruned by ASHA's rule), Hyperband, ASHA and PBT on one
workload and about the same budget.

The budget is counted in trial-epochs (one trial training one epoch over all the data);
each searcher gets about ``BUDGET`` of them, all on MOP with the same 2 workers and seed.
For each: the best validation accuracy found against wall time (the "anytime" curve, from
the run's journal), the trial-epochs it used, and its trials' statuses. Writes JSON, a
Markdown table and a PNG figure.

Usage::

    .venv/bin/python benchmarks/search_quality.py [--quick] [--out benchmarks/results/search_quality.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import numpy as np
import torch

import cerebro as cb

WORKERS = 2


def dataset(rows: int) -> cb.Dataset:
    """The nonlinear task of compare.py: |x| on half the features, 10 classes."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(rows, 64)).astype(np.float32)
    weights = rng.normal(size=(64, 10)).astype(np.float32)
    signal = np.abs(features[:, :32]) @ weights[:32] + features[:, 32:] @ weights[32:]
    label = (signal + 0.5 * rng.normal(size=(rows, 10))).argmax(1)
    return cb.Dataset.from_numpy(features, label, validation=0.2, partitions=WORKERS, seed=0)


def build(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(),
                                torch.nn.Linear(config["hidden"], 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
    return cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy, batch_size=config["batch_size"],
                             metrics={"accuracy": cb.metrics.accuracy})


SPACE = {"lr": cb.loguniform(1e-4, 3e-2), "hidden": cb.choice([32, 128, 256]),
         "batch_size": cb.choice([32, 128]), "weight_decay": cb.uniform(0.0, 0.05)}
GRID = {"lr": cb.choice([3e-4, 3e-3]), "hidden": cb.choice([32, 256]), "batch_size": cb.choice([32, 128]),
        "weight_decay": cb.choice([0.0, 0.01])}


def searchers(quick: bool) -> dict[str, cb.Searcher]:
    """About 96 trial-epochs each (24 with --quick)."""
    e = 3 if quick else 6                  # epochs of the fixed-length searchers
    objective = {"metric": "val_accuracy", "mode": "max"}
    grid = {k: v for k, v in GRID.items() if k in ("lr", "hidden")} if quick else GRID
    return {
        "grid": cb.GridSearch(build, {**SPACE, **grid}, epochs=e, **objective),
        "random": cb.RandomSearch(build, SPACE, num_trials=len(grid) * 4 if quick else 16, epochs=e, **objective),
        "tpe": cb.TPESearch(build, SPACE, num_trials=8 if quick else 16, epochs=e, max_concurrent=4,
                            n_startup_trials=4 if quick else 6, **objective),
        "hyperband": cb.Hyperband(build, SPACE, max_epochs=3 if quick else 9, eta=3, **objective),
        "asha": cb.ASHA(build, SPACE, num_trials=10 if quick else 28, max_epochs=3 if quick else 9, grace_period=1,
                        reduction_factor=3, max_concurrent=8, **objective),
        "tpe_asha": cb.TPESearch(build, SPACE, num_trials=10 if quick else 28, epochs=3 if quick else 9,
                                 max_concurrent=8, n_startup_trials=4 if quick else 8, grace_period=1,
                                 reduction_factor=3, **objective),
        "pbt": cb.PBT(build, SPACE, population=4 if quick else 8, epochs=e if quick else 12,
                      perturbation_interval=1 if quick else 2, **objective),
    }


def run(name: str, search: cb.Searcher, data: cb.Dataset, store: str) -> dict[str, Any]:
    started = time.perf_counter()
    result = search.fit(data, workers=WORKERS, store=store, seed=0, verbose=0)
    wall = time.perf_counter() - started
    best_so_far, curve = -np.inf, []
    for event in result.store.events():        # the anytime curve: best val accuracy seen by each time
        if event["event"] == "epoch_end" and event["metrics"]["val_accuracy"] > best_so_far:
            best_so_far = event["metrics"]["val_accuracy"]
            curve.append((event["time"], best_so_far))
    history = result.history()
    return {"searcher": name, "wall_s": wall, "trial_epochs": len(history), "trials": len(result.trials),
            "statuses": dict(Counter(str(t.status) for t in result.trials)), "best_val_accuracy": result.best.metrics[
                "val_accuracy"], "best_config": result.best.config, "best_trial": result.best.trial_id,
            "anytime": curve}


def figure(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in results:
        times, values = zip(*r["anytime"])
        ax.step([*times, r["wall_s"]], [*values, values[-1]], where="post",
                label=f"{r['searcher']} ({r['trial_epochs']} trial-epochs)")
    ax.set(xlabel="seconds since the run started", ylabel="best validation accuracy so far",
           title="search quality on the same workload and budget")
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4,096 rows and about 24 trial-epochs each")
    parser.add_argument("--out", default="benchmarks/results/search_quality.json")
    parser.add_argument("--figure", default="benchmarks/figures/search_quality.png")
    args = parser.parse_args()
    data = dataset(4096 if args.quick else 16384)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, search in searchers(args.quick).items():
            entry = run(name, search, data, os.path.join(scratch, name))
            results.append(entry)
            print(f"{name:10} wall {entry['wall_s']:6.1f} s  trial-epochs {entry['trial_epochs']:4d}  "
                  f"trials {entry['trials']:3d}  best val acc {entry['best_val_accuracy']:.4f}  "
                  f"{entry['statuses']}", flush=True)
    table = ["| searcher | wall s | trial-epochs | trials | statuses | best val accuracy | best config |",
             "|---|---|---|---|---|---|---|"]
    table += [f"| {r['searcher']} | {r['wall_s']:.1f} | {r['trial_epochs']} | {r['trials']} | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(r['statuses'].items()))} | {r['best_val_accuracy']:.4f} | "
              f"{json.dumps(r['best_config'], default=float)} |" for r in results]
    print("\n".join(table))
    figure(results, args.figure)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([sys.executable, *sys.argv]), "quick": args.quick,
                   "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__},
                   "results": results, "table": "\n".join(table), "figure": args.figure}, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(table) + "\n")
    print(f"wrote {args.out}, its table as .md, and {args.figure}")


if __name__ == "__main__":
    main()
