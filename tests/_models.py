"""Small data and build functions shared by the tests (importable by the workers too)."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import torch
from _faults import claim, striking, training
from sklearn.datasets import load_digits

import cerebro as cb
from cerebro.worker import in_preflight


def digits(partitions: int | None = 4, rows: int | None = 600, validation: float = 0.2) -> cb.Dataset:
    features, label = load_digits(return_X_y=True)
    features, label = features[:rows] / 16.0, label[:rows]
    return cb.Dataset.from_numpy(features.astype(np.float32), label, validation=validation,
                                 partitions=partitions, seed=0)


def make_model(architecture: str, hidden: int = 32) -> torch.nn.Module:
    if architecture == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    return torch.nn.Sequential(torch.nn.Unflatten(1, (1, 8, 8)), torch.nn.Conv2d(1, 4, 3, padding=1),
                               torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Flatten(),
                               torch.nn.Linear(256, 10))


def build(config: dict) -> cb.TorchTrainable:
    """MLP or CNN with Adam; ``fail`` raises, ``diverge`` makes the loss NaN, ``crash`` kills the worker,
    ``slow`` sleeps in every batch, ``stuck`` never ends its first batch."""
    if config.get("fail"):
        raise ValueError("boom: this configuration cannot be built")
    model = make_model(config.get("architecture", "mlp"), config.get("hidden", 32))

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if in_preflight():                  # the faults below are for the workers
            return torch.nn.functional.cross_entropy(outputs, targets)
        if config.get("crash"):
            os._exit(3)
        if config.get("slow"):
            time.sleep(config["slow"])      # a trial that takes long (for trial_timeout)
        if config.get("stuck"):
            threading.Event().wait()        # a batch that never ends (the worker still sends heartbeats)
        value = torch.nn.functional.cross_entropy(outputs, targets)
        return value * float("nan") if config.get("diverge") else value

    return cb.TorchTrainable(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-2)),
                             loss=loss, batch_size=config.get("batch_size", 32),
                             metrics={"accuracy": cb.metrics.accuracy})


def scheduled(config: dict) -> cb.TorchTrainable:
    """An MLP trained by SGD with momentum, a learning-rate schedule stepped per epoch
    (``step``: "epoch", StepLR), per batch ("batch", ExponentialLR) or on the epoch before's
    validation loss ("plateau", ReduceLROnPlateau: in "max" mode, so a falling loss lowers
    the rate), and gradient clipping."""
    model = make_model("mlp")
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    step = config.get("step", "epoch")
    if step == "epoch":
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    elif step == "plateau":
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=0, factor=0.5)
    else:
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.99)
    return cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy, batch_size=16,
                             lr_scheduler=scheduler, lr_scheduler_step="batch" if step == "batch" else "epoch",
                             clip_grad_norm=0.5)


def crashing_once(marker: str, how: str = "exit"):
    """``build``, except that the first training batch computed anywhere kills its Python
    worker (``os._exit``, a real SIGKILL, or SIGSTOP: a hang); the marker file, claimed
    atomically, records that it happened, so every later loss is computed as usual."""
    def crash() -> None:
        if how in ("sigkill", "sigstop"):
            os.kill(os.getpid(), getattr(signal, how.upper()))
        os._exit(1)

    def crash_once_build(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        trainable.loss = striking(trainable.loss, crash, marker=marker)
        return trainable
    return crash_once_build


def eval_waits_for_next_epoch(gate: str):
    """An MLP with Adam and a StepLR schedule (the rate halves each epoch, so a training batch
    knows it is past the first epoch), where the first eval batch anywhere waits until a
    training batch of a later epoch has run: the run ends only if the next epoch starts
    while that epoch's evals still run. The wait is bounded, so a scheduler that held the
    next epoch for the evals fails the trial with the reason instead of hanging."""
    def gated_build(config: dict) -> cb.TorchTrainable:
        model = make_model("mlp")
        first_rate = config.get("lr", 1e-2)
        optimizer = torch.optim.Adam(model.parameters(), lr=first_rate)
        started = os.path.join(gate, "later-epoch-trained")

        def gated_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            if in_preflight():
                return torch.nn.functional.cross_entropy(outputs, targets)
            if training() and optimizer.param_groups[0]["lr"] < first_rate:
                claim(started)
            elif not training() and claim(os.path.join(gate, "eval-waited")):
                deadline = time.monotonic() + 120
                while not os.path.exists(started):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the next epoch did not start while this epoch's evals ran")
                    time.sleep(0.01)
            return torch.nn.functional.cross_entropy(outputs, targets)

        return cb.TorchTrainable(model, optimizer, gated_loss, batch_size=32, metrics={"accuracy": cb.metrics.accuracy},
                                 lr_scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5))
    return gated_build


def penalized(config: dict) -> cb.TorchTrainable:
    """A rigged learning curve: a zero-initialised linear model trained with SGD at
    ``config["lr"]`` (default 0: it never changes), whose loss is cross-entropy plus
    ``config["penalty"]``, so with lr 0 every epoch's val_loss is log(10) + penalty."""
    model = torch.nn.Linear(64, 10)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(outputs, targets) + config["penalty"]

    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.0)), loss,
                             batch_size=64)


def failing_after(steps: int, lr: float):
    """``build`` with a bug that shows mid-run: the loss of a trial with learning rate ``lr``
    raises once its optimizer has taken ``steps`` steps (the step count hops with the state)."""
    def build_with_a_bug(config: dict) -> cb.TorchTrainable:
        trainable = build(config)
        loss, optimizer = trainable.loss, trainable.optimizer

        def buggy_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            taken = max((int(state["step"]) for state in optimizer.state.values()), default=0)
            if config.get("lr") == lr and taken >= steps:
                raise RuntimeError(f"bug: the loss fails after {steps} steps")
            return loss(outputs, targets)

        trainable.loss = buggy_loss
        return trainable
    return build_with_a_bug


# --- images: uint8 arrays and PNG bytes, with a seeded augmentation -----------------------------

def digit_images(rows: int = 600) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as uint8 images of shape (rows, 1, 8, 8)."""
    features, label = load_digits(return_X_y=True)
    return (features[:rows] * 15.9375).astype(np.uint8).reshape(-1, 1, 8, 8), label[:rows]


def png_digits(rows: int = 600) -> tuple[list[bytes], np.ndarray]:
    """The same images, each encoded as PNG."""
    import io

    from PIL import Image
    images, label = digit_images(rows)
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image[0]).save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    return encoded, label


def to_float(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return images.astype(np.float32) / 255


def augment(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Flip half the images left-right and add a little noise, drawing only from ``rng``."""
    images = to_float(images, rng)
    flip = rng.random(len(images)) < 0.5
    images[flip] = images[flip][..., ::-1]
    return images + rng.normal(0, 0.02, images.shape).astype(np.float32)


def decode(encoded: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    import io

    from PIL import Image
    return np.stack([np.asarray(Image.open(io.BytesIO(value)))[None] for value in encoded])


def broken(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    raise RuntimeError("this transform is broken")


def half(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return to_float(images, rng)[: len(images) // 2]


def image_build(config: dict) -> cb.TorchTrainable:
    """A small CNN with dropout on uint8 images (or, with ``png``, on PNG bytes), augmented
    by ``transform``: "augment" (the default), "broken" (raises) or "half" (returns half the rows)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Flatten(), torch.nn.Linear(256, 10))
    train = {"augment": augment, "broken": broken, "half": half}[config.get("transform", "augment")]
    evaluate = to_float
    if config.get("png"):
        train, evaluate = (lambda x, rng, train=train: train(decode(x, rng), rng)), \
            (lambda x, rng: to_float(decode(x, rng), rng))
    return cb.TorchTrainable(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-2)),
                             loss=torch.nn.functional.cross_entropy, batch_size=32,
                             metrics={"accuracy": cb.metrics.accuracy}, transform=train, eval_transform=evaluate)


def check_exact_f1_and_auroc(result: cb.Result, features: np.ndarray, label: np.ndarray) -> None:
    """Each trial's last val_f1 and val_auroc are scikit-learn's on its own predictions of
    the validation rows, and the best trial is the one with the highest best val_f1."""
    import pytest
    from sklearn.metrics import f1_score, roc_auc_score
    for trial in result.trials:
        outputs = trial.predict(features, epoch="last")
        probabilities = torch.softmax(torch.from_numpy(outputs), dim=1).numpy()
        assert trial.metrics["val_f1"] == pytest.approx(f1_score(label, outputs.argmax(1), average="macro"), abs=1e-6)
        assert trial.metrics["val_auroc"] == pytest.approx(roc_auc_score(label, probabilities, multi_class="ovr"),
                                                           abs=1e-6)
    assert result.best.trial_id == max(result.trials, key=lambda t: t.best_metrics["val_f1"]).trial_id
