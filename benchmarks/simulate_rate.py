"""How fast ``cb.simulate`` runs a search: trial-epochs per second, with the Result read back,
for random search and ASHA on 1, 4 and 16 simulated workers (median of 3 in one run).

    .venv/bin/python benchmarks/simulate_rate.py            # prints a table, writes results/simulate_rate.json
"""
from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time

import cerebro as cb

SPACE = {"lr": cb.loguniform(1e-4, 1e-1), "width": cb.choice([32, 64, 128, 256]), "dropout": cb.uniform(0, 0.5)}
HERE = os.path.dirname(os.path.abspath(__file__))


def no_model(config: dict) -> None:
    """Never called by cb.simulate."""


def objective(config: dict, epoch: int) -> dict[str, float]:
    return {"val_loss": abs(math.log10(config["lr"] / 3e-3)) + config["dropout"] / 4
            + 8 / (epoch * math.sqrt(config["width"]))}


SEARCHERS = {
    "RandomSearch, 1,000 trials x 10 epochs": lambda: cb.RandomSearch(no_model, SPACE, num_trials=1000, epochs=10),
    "ASHA, 3,000 trials, max 27 epochs": lambda: cb.ASHA(no_model, SPACE, num_trials=3000, max_epochs=27,
                                                         max_concurrent=64),
}


def measure(make, workers: int) -> tuple[float, int]:
    """Seconds for one simulated run and its Result, and the trial-epochs it ran."""
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        result = cb.simulate(make(), objective, workers=workers, seed=0, store=os.path.join(directory, "run"))
        seconds = time.perf_counter() - started
        return seconds, len(result.history())


def main() -> None:
    rows = []
    print("| search | workers | trial-epochs | seconds (median of 3) | trial-epochs / s |\n|---|---|---|---|---|")
    for name, make in SEARCHERS.items():
        for workers in (1, 4, 16):
            runs = [measure(make, workers) for _ in range(3)]
            seconds, epochs = statistics.median(s for s, _ in runs), runs[0][1]
            rows.append({"search": name, "workers": workers, "trial_epochs": epochs, "seconds": seconds,
                         "rate": epochs / seconds})
            print(f"| {name} | {workers} | {epochs:,} | {seconds:.2f} | {epochs / seconds:,.0f} |")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "simulate_rate.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
