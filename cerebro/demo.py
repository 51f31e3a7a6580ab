"""The demo: a real model selection on scikit-learn's bundled 8x8 digits (no download).

Two architectures (an MLP and a small CNN) x two learning rates x two batch sizes = 8
trials, trained at once with MOP on local workers. ``cerebro demo`` runs it with PyTorch
models, ``cerebro demo --framework keras`` with the same models in Keras 3 (on the backend
``KERAS_BACKEND`` names). The tests import ``build``, ``SPACE`` and ``load_data`` to check
that MOP converges like plain SGD.
"""
from __future__ import annotations

from typing import Any

import torch
from sklearn.datasets import load_digits

import cerebro as cb

from ._extras import require

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


def make_keras_model(architecture: str) -> Any:
    import keras  # the [keras] extra; torch users never import it
    layers: list[Any] = [keras.Input((1, 8, 8))]
    if architecture == "mlp":
        layers += [keras.layers.Flatten(), keras.layers.Dense(128, activation="relu")]
    else:   # channels last: TensorFlow's CPU convolutions take no other layout
        layers += [keras.layers.Permute((2, 3, 1)), keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                   keras.layers.MaxPooling2D(2), keras.layers.Flatten()]
    return keras.Sequential([*layers, keras.layers.Dense(10)])


def build_keras(config: dict) -> cb.KerasTrainable:
    import keras
    model = make_keras_model(config["architecture"])
    model.compile(keras.optimizers.Adam(config["lr"]), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return cb.KerasTrainable(model, batch_size=config["batch_size"])


FRAMEWORKS = {"torch": build, "keras": build_keras}


def search(epochs: int = EPOCHS, framework: str = "torch") -> cb.GridSearch:
    """The demo's grid; ``framework`` is "torch" or "keras"."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r} is not one of {', '.join(map(repr, FRAMEWORKS))}")
    if framework == "keras":
        require("the Keras demo", "keras")
    return cb.GridSearch(FRAMEWORKS[framework], SPACE, epochs=epochs, metric="val_accuracy", mode="max")
