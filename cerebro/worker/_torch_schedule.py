"""``TorchTrainable``'s learning-rate schedule: when it steps, what it may be, and stepping
an epoch-wise one to the epoch a trial is at, wherever its last epoch ended."""
from __future__ import annotations

import enum
import functools
import warnings
from collections.abc import Callable, Mapping

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

SchedulerFactory = Callable[[torch.optim.Optimizer, int], LRScheduler]


class SchedulerStep(enum.Enum):
    """When ``TorchTrainable``'s ``lr_scheduler`` steps."""

    EPOCH = "epoch"     # once per epoch, over all partitions
    BATCH = "batch"     # after every optimizer step


def check_scheduler(scheduler: object, optimizer: torch.optim.Optimizer, step: SchedulerStep | str) -> None:
    """Refuse a schedule that is no torch scheduler, schedules another optimizer, or is a
    plateau schedule stepped per batch (it steps on an epoch's metric)."""
    if scheduler is None:
        return
    if not isinstance(scheduler, LRScheduler):
        raise TypeError(f"lr_scheduler(optimizer, steps_per_epoch) must return a torch.optim.lr_scheduler "
                        f"scheduler; it returned {type(scheduler).__name__}")
    if scheduler.optimizer is not optimizer:
        raise ValueError("lr_scheduler schedules another optimizer than this TorchTrainable's optimizer")
    if isinstance(scheduler, ReduceLROnPlateau) and step is SchedulerStep.BATCH:
        raise ValueError("lr_scheduler=ReduceLROnPlateau steps on an epoch's metric: use "
                         "lr_scheduler_step='epoch'")


def step_epochs(scheduler: object, stepped: int, epoch: int, metrics: Mapping[str, float] | None,
                metric: str | None) -> int:
    """Step an epoch-wise ``scheduler`` that has stepped ``stepped`` epochs on to ``epoch - 1``
    (a plateau schedule on ``metrics``, the epoch before's, by ``metric``); how many it has
    stepped now."""
    if not isinstance(scheduler, LRScheduler) or stepped >= epoch - 1:
        return stepped
    step: Callable[[], object] = scheduler.step
    if isinstance(scheduler, ReduceLROnPlateau):
        if not metrics or metric is None or metric not in metrics:
            raise ValueError(f"lr_scheduler=ReduceLROnPlateau steps on lr_scheduler_metric={metric!r}, which epoch "
                             f"{epoch - 1} did not log; it logged {sorted(metrics or {})}")
        step = functools.partial(scheduler.step, metrics[metric])
    with warnings.catch_warnings():     # a freshly loaded optimizer has not stepped in this process
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step\\(\\)`", UserWarning)
        while stepped < epoch - 1:
            step()
            stepped += 1
    return stepped
