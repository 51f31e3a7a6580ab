"""What the driver's preflight step (one training step of a torch build on 4 real rows, on the
CPU, before any worker starts) adds to ``fit``'s checks: ``check_build`` timed with and
without it, in-process (no workers), for a small MLP and a ResNet-sized CNN on 3x224x224 images.

    .venv/bin/python benchmarks/preflight_cost.py

Prints a table and writes benchmarks/results/preflight_cost.json.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
import torch

import cerebro as cb
import cerebro.engine._preflight as preflight


def mlp(config: dict) -> cb.TorchTrainable:
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=32,
                             metrics={"accuracy": cb.metrics.accuracy})


def cnn(config: dict) -> cb.TorchTrainable:
    """A ResNet-sized stem and stages (no torchvision here): 3x224x224 images, 1.6 M weights."""
    nn = torch.nn
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    for width in (128, 256, 512):
        layers += [nn.Conv2d(width // 2, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9),
                             torch.nn.functional.cross_entropy, batch_size=32)


def median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(name: str, build, shape: tuple[int, ...], repeats: int) -> dict:
    rng = np.random.default_rng(0)
    data = cb.Dataset.from_numpy(rng.random((64, *shape), dtype=np.float32), np.arange(64) % 10, partitions=2)
    configs = [{"lr": 1e-2}]
    with_step = median_ms(lambda: preflight.check_build(build, configs, "val_loss", data), repeats)
    step, preflight.check_a_step = preflight.check_a_step, lambda *args, **kwargs: None
    try:
        without = median_ms(lambda: preflight.check_build(build, configs, "val_loss", data), repeats)
    finally:
        preflight.check_a_step = step
    return {"model": name, "with_step_ms": round(with_step, 1), "without_ms": round(without, 1),
            "step_adds_ms": round(with_step - without, 1)}


def main() -> None:
    torch.set_num_threads(1)
    rows = [measure("MLP 64-32-10", mlp, (64,), 15)]
    rows.append(measure("CNN 3x224x224, 1.6 M weights", cnn, (3, 224, 224), 5))
    print("| model | check_build with the step, ms | without, ms | the step adds, ms |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['model']} | {row['with_step_ms']} | {row['without_ms']} | {row['step_adds_ms']} |")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "preflight_cost.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
