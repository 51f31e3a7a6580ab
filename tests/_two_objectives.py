"""A two-objective search space and curve for the multi-objective tests, simulated (``cb.simulate``)."""
from __future__ import annotations

import math

import cerebro as cb

SPACE = {"lr": cb.loguniform(1e-4, 1e-1), "width": cb.choice([8, 16, 32, 64, 128])}
BOTH = {"metric": ["val_accuracy", "params"], "mode": ["max", "min"]}


def nothing(config):
    """The build of a simulated search: never called."""
    raise AssertionError("cb.simulate built a model")


def curve(config, epoch):
    """Accuracy that grows with the width and peaks at lr=1e-2; params that grow with the width."""
    gap = abs(math.log10(config["lr"]) + 2) / 3
    return {"val_accuracy": 1 - gap - 1 / (epoch * config["width"]), "params": float(74 * config["width"])}
