"""Keras callbacks on a :class:`KerasTrainable`, at the epoch level that MOP has: a trial's
epoch ends on the driver (its metrics are row-weighted means over every partition), so a
callback that acts on an epoch's metrics runs at the start of the trial's next epoch, on
the worker that trains it, with those metrics, and its state hops with the model.

``ReduceLROnPlateau`` is the one that does so: Keras's own ``on_epoch_end`` runs on the
metrics under Keras's names (``loss``, ``val_accuracy``). ``EarlyStopping`` is the
searcher's ``patience``; other callbacks are refused by name, with what does their work.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

_INSTEAD = {
    "EarlyStopping": "give the search early stopping instead: cb.GridSearch(..., patience=N, min_delta=d) (or "
                     "any searcher) stops a trial after N epochs without an improvement of its metric",
    "ModelCheckpoint": "Cerebro checkpoints every epoch and keeps the best one (result.best.model())",
    "TensorBoard": "fit(..., tensorboard=True) logs every trial's metrics",
    "LearningRateScheduler": "give the optimizer a keras.optimizers.schedules.LearningRateSchedule",
}


def plateau_of(callbacks: Sequence[Any] | None) -> Any:
    """The ``ReduceLROnPlateau`` among ``callbacks``, or None; refuses any other callback."""
    import keras

    found = None
    for callback in callbacks or ():
        name = type(callback).__name__
        if isinstance(callback, keras.callbacks.ReduceLROnPlateau) and found is None:
            found = callback
            continue
        instead = _INSTEAD.get(name, "KerasTrainable runs ReduceLROnPlateau only, at each epoch's end")
        raise ValueError(f"callbacks=[{name}(...)] cannot run per sub-epoch on workers: {instead}")
    return found


def history_name(monitor: str) -> str:
    """Keras's name of a logged value as ``history()`` has it: ``loss`` -> ``train_loss``."""
    return monitor if monitor.startswith("val_") else f"train_{monitor}"


def step_plateau(callback: Any, model: Any, epoch: int, metrics: Mapping[str, float]) -> None:
    """Keras's ``on_epoch_end`` of the epoch before ``epoch``, on ``metrics`` (history's names)."""
    wanted = history_name(callback.monitor)
    if wanted not in metrics:
        raise ValueError(f"ReduceLROnPlateau(monitor={callback.monitor!r}) steps on {wanted}, which epoch "
                         f"{epoch - 1} did not log; it logged {sorted(metrics)}")
    callback.set_model(model)
    logs = {name.removeprefix("train_"): value for name, value in metrics.items()}
    callback.on_epoch_end(epoch - 2, logs)      # Keras counts epochs from 0


def plateau_state(callback: Any) -> dict[str, float]:
    """What the callback has learnt so far, to hop with the model."""
    best = callback.best
    return {"best": math.nan if best is None else float(best), "has_best": float(best is not None),
            "wait": float(callback.wait), "cooldown_counter": float(callback.cooldown_counter)}


def load_plateau_state(callback: Any, state: Mapping[str, float]) -> None:
    callback.best = float(state["best"]) if state["has_best"] else None
    callback.wait, callback.cooldown_counter = int(state["wait"]), int(state["cooldown_counter"])
