"""Learning-rate schedules through hops: every ``torch.optim.lr_scheduler`` a TorchTrainable
takes gives, trained sub-epoch by sub-epoch on fresh builds with the state hopping between
them, the plain loop's learning rates and weights bit for bit; ``ReduceLROnPlateau`` steps
on the epoch before's metric; a schedule given as a function gets the epoch's steps."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.optim import lr_scheduler as schedules

import cerebro as cb
from cerebro.worker import TorchTrainable

RNG = np.random.default_rng(0)
PARTS = [(RNG.random((40, 8), dtype=np.float32), RNG.integers(0, 3, 40)) for _ in range(3)]
BATCH, EPOCHS = 16, 4
STEPS = sum(-(-len(y) // BATCH) for _, y in PARTS)      # per epoch, over every partition

EPOCH_WISE = {
    "StepLR": lambda o: schedules.StepLR(o, step_size=1, gamma=0.5),
    "MultiStepLR": lambda o: schedules.MultiStepLR(o, milestones=[1, 3], gamma=0.3),
    "ExponentialLR": lambda o: schedules.ExponentialLR(o, gamma=0.8),
    "CosineAnnealingLR": lambda o: schedules.CosineAnnealingLR(o, T_max=EPOCHS),
    "CosineAnnealingWarmRestarts": lambda o: schedules.CosineAnnealingWarmRestarts(o, T_0=2),
    "LinearLR": lambda o: schedules.LinearLR(o, start_factor=0.25, total_iters=3),
    "ConstantLR": lambda o: schedules.ConstantLR(o, factor=0.5, total_iters=2),
    "PolynomialLR": lambda o: schedules.PolynomialLR(o, total_iters=EPOCHS, power=2.0),
    "LambdaLR": lambda o: schedules.LambdaLR(o, lambda epoch: 1 / (1 + epoch)),
    "MultiplicativeLR": lambda o: schedules.MultiplicativeLR(o, lambda epoch: 0.9),
    "SequentialLR": lambda o: schedules.SequentialLR(
        o, [schedules.ConstantLR(o, factor=0.5, total_iters=1), schedules.ExponentialLR(o, gamma=0.7)],
        milestones=[2]),
    "ChainedScheduler": lambda o: schedules.ChainedScheduler(
        [schedules.ExponentialLR(o, gamma=0.9), schedules.StepLR(o, step_size=2, gamma=0.5)]),
    "ReduceLROnPlateau": lambda o: schedules.ReduceLROnPlateau(o, mode="max", patience=0, factor=0.5),
}
BATCH_WISE = {
    "CyclicLR": lambda o, steps: schedules.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=5),
    "OneCycleLR": lambda o, steps: schedules.OneCycleLR(o, max_lr=0.2, total_steps=EPOCHS * steps),
}


def build(make, step: str = "epoch") -> TorchTrainable:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    made = make if step == "batch" else make(optimizer)
    return TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy, batch_size=BATCH,
                          lr_scheduler=made, lr_scheduler_step=step, lr_scheduler_metric="train_loss")


def batches(features: np.ndarray, label: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.from_numpy(features[i:i + BATCH]), torch.from_numpy(label[i:i + BATCH]))
            for i in range(0, len(label), BATCH)]


def hopped(make, step: str) -> tuple[list[float], dict]:
    """Each sub-epoch on a fresh build that takes the state the last one left, as on
    workers; the learning rate each epoch ended with."""
    state, rates, metrics = None, [], None
    for epoch in range(1, EPOCHS + 1):
        sums = None
        for partition, (features, label) in enumerate(PARTS):
            trainable = build(make, step)
            trainable.steps_per_epoch(STEPS)
            if state is not None:
                trainable.load_state(state)
            done = trainable.train_batches(batches(features, label), seed=epoch * 10 + partition, epoch=epoch,
                                           metrics=metrics)
            sums = done if sums is None else sums + done
            state = trainable.state()
        metrics = {"train_loss": sums.loss / sums.rows}
        rates.append(trainable.learning_rate())
    return rates, state["model"]


def plain_loop(make, step: str) -> tuple[list[float], dict]:
    """One model, one optimizer, one schedule: the loop a user would write."""
    trainable = build(make, step)
    model, optimizer = trainable.model, trainable.optimizer
    scheduler = make(optimizer, STEPS) if step == "batch" else trainable.lr_scheduler
    rates = []
    for epoch in range(1, EPOCHS + 1):
        total, rows = 0.0, 0
        for partition, (features, label) in enumerate(PARTS):
            torch.manual_seed(epoch * 10 + partition)
            for inputs, targets in batches(features, label):
                optimizer.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(inputs), targets)
                loss.backward()
                optimizer.step()
                if step == "batch":
                    scheduler.step()
                total, rows = total + float(loss.detach()) * len(targets), rows + len(targets)
        rates.append(optimizer.param_groups[0]["lr"])
        if step == "epoch":
            scheduler.step(total / rows) if isinstance(scheduler, schedules.ReduceLROnPlateau) else scheduler.step()
    return rates, model.state_dict()


@pytest.mark.parametrize("name", [*EPOCH_WISE, *BATCH_WISE])
def test_every_torch_schedule_through_hops_is_the_plain_loop_bit_for_bit(name):
    make, step = (EPOCH_WISE[name], "epoch") if name in EPOCH_WISE else (BATCH_WISE[name], "batch")
    rates, weights = hopped(make, step)
    expected_rates, expected_weights = plain_loop(make, step)
    assert rates == expected_rates
    assert len(set(rates)) > 1 or name == "ReduceLROnPlateau" and rates[-1] < 0.1
    assert all(torch.equal(weights[k], v) for k, v in expected_weights.items())


def test_a_plateau_schedule_refuses_a_missing_metric_and_per_batch_steps():
    trainable = build(EPOCH_WISE["ReduceLROnPlateau"])
    features, label = PARTS[0]
    trainable.train_batches(batches(features, label), seed=0, epoch=1)
    with pytest.raises(ValueError, match=r"lr_scheduler=ReduceLROnPlateau steps on lr_scheduler_metric="
                                         r"'train_loss', which epoch 1 did not log; it logged \['val_loss'\]"):
        trainable.train_batches(batches(features, label), seed=0, epoch=2, metrics={"val_loss": 1.0})
    model = torch.nn.Linear(8, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="ReduceLROnPlateau steps on an epoch's metric: use lr_scheduler_step='epoch'"):
        cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy, batch_size=4,
                          lr_scheduler=schedules.ReduceLROnPlateau(optimizer), lr_scheduler_step="batch")
    with pytest.raises(TypeError, match=r"lr_scheduler\(optimizer, steps_per_epoch\) must return a "
                                        r"torch.optim.lr_scheduler scheduler; it returned int"):
        cb.TorchTrainable(model, optimizer, torch.nn.functional.cross_entropy, batch_size=4,
                          lr_scheduler=lambda o, steps: steps).steps_per_epoch(10)
