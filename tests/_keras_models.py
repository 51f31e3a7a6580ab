"""Keras builds for the tests; the backend is whatever KERAS_BACKEND says in this process."""
from __future__ import annotations

import keras

import cerebro as cb


def make_model(architecture: str) -> keras.Model:
    if architecture == "cnn":
        return keras.Sequential([keras.Input((64,)), keras.layers.Reshape((8, 8, 1)),
                                 keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.Dropout(0.25),
                                 keras.layers.Flatten(), keras.layers.Dense(10)])
    layers = [keras.Input((64,)), keras.layers.Dense(32, activation="relu")]
    if architecture == "mlp":
        layers.append(keras.layers.Dropout(0.2))
    return keras.Sequential([*layers, keras.layers.Dense(10)])


def build(config: dict) -> cb.KerasTrainable:
    """``architecture``: mlp (with dropout), cnn (with dropout) or plain (no randomness);
    ``plateau``: a ReduceLROnPlateau callback on val_loss in "max" mode (a falling loss lowers
    the rate at every epoch's end but the first)."""
    model = make_model(config.get("architecture", "mlp"))
    model.compile(keras.optimizers.Adam(config.get("lr", 3e-3)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    callbacks = [keras.callbacks.ReduceLROnPlateau("val_loss", factor=0.5, patience=0, mode="max")] \
        if config.get("plateau") else None
    return cb.KerasTrainable(model, batch_size=32, callbacks=callbacks)
