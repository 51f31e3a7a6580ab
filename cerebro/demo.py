"""The demo: a real model selection on scikit-learn's bundled 8x8 digits (no download).

Two architectures (an MLP and a small CNN) x two learning rates x two batch sizes = 8
trials, trained at once with MOP on local workers. ``cerebro demo`` runs it; the tests
import ``build``, ``SPACE`` and ``load_data`` to check that MOP converges like plain SGD.
"""
from __future__ import annotations

import torch
from sklearn.datasets import load_digits

import cerebro as cb

SPACE = {
    "architecture": cb.choice(["mlp", "cnn"]),
    "lr": cb.choice([1e-3, 3e-3]),
    "batch_size": cb.choice([32, 64]),
}
EPOCHS = 10


def load_data(partitions: int | None = None, seed: int = 0) -> cb.Dataset:
    """1,797 images of 8x8 pixels scaled to [0, 1]; 20% held out for validation."""
    features, label = load_digits(return_X_y=True)
    return cb.Dataset.from_numpy((features / 16.0).reshape(-1, 1, 8, 8), label, validation=0.2,
                                 partitions=partitions, seed=seed)


def make_model(architecture: str) -> torch.nn.Module:
    if architecture == "mlp":
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))
    return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(256, 10))


def build(config: dict) -> cb.TorchTrainable:
    model = make_model(config["architecture"])
    return cb.TorchTrainable(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             loss=torch.nn.functional.cross_entropy, batch_size=config["batch_size"],
                             metrics={"accuracy": cb.metrics.accuracy})


def search(epochs: int = EPOCHS) -> cb.GridSearch:
    return cb.GridSearch(build, SPACE, epochs=epochs, metric="val_accuracy", mode="max")
