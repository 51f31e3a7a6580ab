"""The PyTorch trainer: a :class:`Trainable` over a ``torch.nn.Module`` and its optimizer."""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from ..metrics import ModelMetric
from ._exact import is_metric, merges, sub_epoch_state
from ._frozen import FrozenPart
from ._protocol import Sums
from ._state_check import Spec, check_torch_optimizer, dtype_name
from ._torch_checks import broadcast_refused, check_loss
from ._torch_schedule import SchedulerFactory, SchedulerStep, check_scheduler, step_epochs
from ._trainable import (
    Trainable,
    Transform,
    callable_transforms,
    check_deadline,
    describe,
    positive_batch_size,
    seed_torch,
)

BatchMetric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Metric = BatchMetric | ModelMetric
Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class TorchTrainable(Trainable):
    """A model with how to train it; the user's ``build(config)`` returns one.

    Args:
        model: the ``torch.nn.Module`` to train.
        optimizer: an optimizer over ``model``'s parameters.
        loss: ``loss(outputs, targets)`` -> the mean loss of a batch, as a scalar tensor.
        batch_size: rows per mini-batch.
        metrics: name -> ``metric(outputs, targets)``, a batch's mean (``cb.metrics``; the
            epoch's value is the row-weighted mean of the batches'), or a torchmetrics
            ``Metric`` object (``MulticlassF1Score(10, average="macro")``, ``BinaryAUROC()``):
            updated batch by batch, its state merged over every partition, computed once per
            epoch, exact over the whole set (:mod:`cerebro.worker._exact`). Each is logged per
            epoch for training (``train_<name>``) and validation (``val_<name>``); a metric of
            the model itself (``cb.metrics.params``: its trainable parameter count) once, as
            ``<name>``.
        transform: ``transform(features, rng)`` -> an array or tensor with one row per row of
            ``features``, run on the worker on every training batch (decode, normalise,
            augment) in its prefetch thread. ``features`` is the batch as stored (e.g. uint8
            images, or an object array of ``bytes``); ``rng`` is a ``numpy.random.Generator``
            seeded by the sub-epoch, so augmentation is reproducible: draw from it, never
            from a global generator. Default: the features as float32.
        eval_transform: the same for evaluation batches. Default: none (float32 features),
            so augmentation never touches evaluation; decoding that evaluation needs too
            goes in both.
        lr_scheduler: a ``torch.optim.lr_scheduler`` over ``optimizer``; its state hops with
            the model, so a hop, a resume or a PBT exploit continues the schedule exactly.
            ``ReduceLROnPlateau`` steps on ``lr_scheduler_metric`` of the epoch before (the
            driver holds the trial's next epoch until that epoch's evaluation is in). A
            schedule whose length depends on the data (``OneCycleLR(total_steps=...)``) is
            given as a function ``lambda optimizer, steps_per_epoch: scheduler``, called on
            the worker with the training batches in one epoch over all partitions.
        lr_scheduler_step: ``"epoch"`` (default): it steps once per epoch of the trial (over
            all partitions, as in a plain loop of ``scheduler.step()`` after each epoch);
            ``"batch"``: after every optimizer step.
        lr_scheduler_metric: what ``ReduceLROnPlateau`` steps on: a logged metric such as
            ``"val_loss"`` (default) or ``"train_loss"``.
        clip_grad_norm: clip the gradients' total 2-norm to this before each step
            (``torch.nn.utils.clip_grad_norm_``); default none.
        mixed_precision: on a GPU, run forward passes under ``torch.autocast`` (float16) with
            a ``GradScaler`` whose state hops with the model; on a CPU it changes nothing.
        frozen: layers applied before ``model``, after the transform, in eval mode without
            gradients, never trained (a pretrained backbone; ``backbone[:k]`` with
            ``model=Sequential(backbone[k:], head)`` makes the freeze depth a hyperparameter).
            Their outputs for a partition are computed once on its worker and shared by every
            trial with the same frozen layers (see :mod:`cerebro.worker._frozen`); only
            ``model``'s state hops and is checkpointed. ``model()`` and every export compose
            the two.

    Example:
        >>> def build(config):
        ...     model = torch.nn.Linear(64, 10)
        ...     return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"]),
        ...                              torch.nn.functional.cross_entropy, batch_size=32,
        ...                              metrics={"accuracy": cb.metrics.accuracy})

        Images stored as uint8, flipped at random for training:

        >>> def flip(images, rng):
        ...     images = images.astype(np.float32) / 255
        ...     return np.where(rng.random(len(images))[:, None, None, None] < 0.5, images[..., ::-1], images)
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch_size: int
    metrics: Mapping[str, Metric] = field(default_factory=dict)
    transform: Transform | None = None
    eval_transform: Transform | None = None
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | SchedulerFactory | None = None
    lr_scheduler_step: SchedulerStep | str = SchedulerStep.EPOCH
    lr_scheduler_metric: str = "val_loss"
    clip_grad_norm: float | None = None
    mixed_precision: bool = False
    frozen: torch.nn.Module | None = None

    builds_on_meta_device = True
    checks_a_step_on_the_driver = True
    predicts_after_fork = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module; got {type(self.model).__name__}")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer; got {type(self.optimizer).__name__}")
        if not callable(self.loss):
            raise TypeError(f"loss={self.loss!r} must be callable as loss(outputs, targets)")
        positive_batch_size(self.batch_size)
        try:        # a dict, or what dict() takes: (name, metric) pairs
            self.metrics = dict(self.metrics or {})
        except (TypeError, ValueError):
            raise TypeError(f"metrics must be a dict of name -> metric, e.g. {{'accuracy': cb.metrics.accuracy}} "
                            f"(logged as val_accuracy), not a {type(self.metrics).__name__}") from None
        for name, metric in self.metrics.items():
            if not isinstance(name, str) or not name or name == "loss":
                raise ValueError(f"metric name {name!r} must be a non-empty string other than 'loss', "
                                 f"which is always logged")
            if not callable(metric):
                raise TypeError(f"metric {name!r}={metric!r} must be callable as metric(outputs, targets)")
        self._exact = {name: metric for name, metric in self.metrics.items() if is_metric(metric)}
        for name, metric in self._exact.items():
            merges(name, metric)          # refuses a state that cannot be merged over partitions
        self._model_metrics: dict[str, ModelMetric] = {}
        self._means: dict[str, BatchMetric] = {}
        for name, metric in self.metrics.items():
            if isinstance(metric, ModelMetric):
                self._model_metrics[name] = metric
            elif name not in self._exact:
                self._means[name] = metric
        callable_transforms(self)
        try:
            self.lr_scheduler_step = SchedulerStep(self.lr_scheduler_step)
        except ValueError:
            raise ValueError(f"lr_scheduler_step={self.lr_scheduler_step!r} must be 'epoch' or 'batch'") from None
        self._scheduler_factory = None
        if self.lr_scheduler is not None and not isinstance(self.lr_scheduler, LRScheduler):
            if not callable(self.lr_scheduler):
                raise TypeError(f"lr_scheduler must be a torch.optim.lr_scheduler scheduler, or a function "
                                f"(optimizer, steps_per_epoch) -> one; got {type(self.lr_scheduler).__name__}")
            self._scheduler_factory, self.lr_scheduler = self.lr_scheduler, None   # made by steps_per_epoch()
        self._check_scheduler()
        if self.clip_grad_norm is not None and not (isinstance(self.clip_grad_norm, (int, float))
                                                    and not isinstance(self.clip_grad_norm, bool)
                                                    and self.clip_grad_norm > 0):
            raise ValueError(f"clip_grad_norm={self.clip_grad_norm!r} must be a positive number or None")
        if not isinstance(self.mixed_precision, bool):
            raise TypeError(f"mixed_precision={self.mixed_precision!r} must be True or False")
        self._scaler = torch.amp.GradScaler("cuda", enabled=False)
        # Epoch steps the schedule took: not every scheduler counts them (ChainedScheduler).
        self._stepped_epochs = 0
        self._shapes_checked = False     # the first batch's loss is watched for broadcasting
        self._frozen = None if self.frozen is None else FrozenPart(self.frozen)

    def _check_scheduler(self) -> None:
        check_scheduler(self.lr_scheduler, self.optimizer, self.lr_scheduler_step)

    def steps_per_epoch(self, steps: int) -> None:
        """Make the scheduler given as a function, now that the steps in an epoch are known."""
        if self._scheduler_factory is not None and self.lr_scheduler is None:
            self.lr_scheduler = self._scheduler_factory(self.optimizer, steps)
            self._check_scheduler()

    # --- what the driver checks ---------------------------------------------------------
    def metric_names(self) -> tuple[str, ...]:
        return tuple(name for name in self.metrics if name not in self._model_metrics)

    def model_metrics(self) -> dict[str, float]:
        return {name: metric(self.model) for name, metric in self._model_metrics.items()}

    def exact_metrics(self) -> dict[str, Any]:
        return self._exact

    def epoch_metric(self) -> str | None:
        if isinstance(self.lr_scheduler, ReduceLROnPlateau) and self.lr_scheduler_step is SchedulerStep.EPOCH:
            return self.lr_scheduler_metric
        return None

    def learning_rate(self) -> float | None:
        return float(self.optimizer.param_groups[0]["lr"])

    def check_label(self, label: np.ndarray) -> None:
        check_loss(self.loss, label)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(tensor.shape) for name, tensor in self.model.state_dict().items()}

    def weight_specs(self) -> dict[str, Spec]:
        return {name: (tuple(t.shape), dtype_name(t.dtype)) if isinstance(t, torch.Tensor) else None
                for name, t in self.model.state_dict().items()}

    def check_state(self, state: Any) -> None:
        super().check_state(state)
        check_torch_optimizer(self.optimizer, state.get("optimizer"))

    def place(self, device: torch.device) -> None:
        self.model.to(device)
        if self._frozen is not None:
            self._frozen.module.to(device)
        for metric in self._exact.values():
            metric.to(device)
        self._scaler = torch.amp.GradScaler("cuda", enabled=self.mixed_precision and device.type == "cuda")

    def nbytes(self) -> int:
        # weights + optimizer moments, roughly
        return 3 * sum(t.numel() * t.element_size() for t in self.model.state_dict().values())

    # --- the state that hops ------------------------------------------------------------
    def state(self) -> dict:
        state: dict[str, Any] = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if isinstance(self.lr_scheduler, LRScheduler):     # a factory's is made by steps_per_epoch
            state["lr_scheduler"] = self.lr_scheduler.state_dict()
            state["lr_scheduler_epochs"] = self._stepped_epochs
        if self._scaler.is_enabled():
            state["grad_scaler"] = self._scaler.state_dict()
        if self._frozen is not None:      # which frozen layers the head trained on (see _frozen_weights)
            state["frozen"] = self._frozen.digests()[-1]
        return state

    def load_state(self, state: Mapping, *, keep_hyperparameters: bool = False) -> None:
        built = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if isinstance(self.lr_scheduler, LRScheduler) and "lr_scheduler" in state:
            base_lrs = getattr(self.lr_scheduler, "base_lrs", None)     # ReduceLROnPlateau has none
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
            self._stepped_epochs = int(state.get("lr_scheduler_epochs", getattr(self.lr_scheduler, "last_epoch", 0)))
            if keep_hyperparameters and base_lrs is not None:   # the schedule goes on, from the built rates
                self.lr_scheduler.base_lrs = list(base_lrs)
        if self._scaler.is_enabled() and state.get("grad_scaler"):
            self._scaler.load_state_dict(state["grad_scaler"])
        if keep_hyperparameters:
            for group, hyperparameters in zip(self.optimizer.param_groups, built):
                group.update(hyperparameters)
            if isinstance(self.lr_scheduler, LRScheduler):
                self.lr_scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(weights)

    def trained_model(self) -> torch.nn.Module:
        if self._frozen is None:
            return self.model.eval()
        return torch.nn.Sequential(self._frozen.module, self.model).eval()

    def frozen_part(self) -> FrozenPart | None:
        return self._frozen

    def module_inputs(self, features: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
        """``features`` as :meth:`trained_model` takes them, on the CPU: through the
        ``eval_transform``, before the frozen layers (which the trained model holds)."""
        no_label = np.zeros(len(features), np.int64)
        return Trainable.batch(self, features, no_label, rng, train=False, device=torch.device("cpu"))[0]

    def trained_weights(self) -> dict[str, torch.Tensor]:
        """The weights of :meth:`trained_model`, frozen layers too, by its own names."""
        return {name: tensor.detach().cpu() for name, tensor in self.trained_model().state_dict().items()}

    def batch(self, features: np.ndarray, label: np.ndarray, rng: np.random.Generator, *, train: bool,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = super().batch(features, label, rng, train=train, device=device)
        return (inputs if self._frozen is None else self._frozen(inputs)), targets

    # --- sub-epochs ---------------------------------------------------------------------
    def _to_batch(self, inputs: Any, label: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = inputs if isinstance(inputs, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(inputs))
        targets = torch.from_numpy(label)
        if device.type == "cuda":      # pinned, so the copy overlaps the previous batch's compute
            return (inputs.pin_memory().to(device, non_blocking=True),
                    targets.pin_memory().to(device, non_blocking=True))
        return inputs.to(device), targets.to(device)

    def train_batches(self, batches: Batches, seed: int, epoch: int, deadline: float | None = None,
                      metrics: Mapping[str, float] | None = None) -> Sums:
        """Plain mini-batch SGD over ``batches``; see :meth:`Trainable.train_batches`."""
        seed_torch(seed)
        self._schedule_epoch(epoch, metrics)
        sums = Sums.empty(self._means)
        self._reset_exact()
        self.model.train()
        for inputs, targets in batches:
            self.optimizer.zero_grad(set_to_none=True)
            outputs, loss = self._forward(inputs, targets)
            self._scaler.scale(loss).backward()
            if self.clip_grad_norm is not None:
                self._scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
            self._scaler.step(self.optimizer)
            self._scaler.update()
            if isinstance(self.lr_scheduler, LRScheduler) and self.lr_scheduler_step is SchedulerStep.BATCH:
                self.lr_scheduler.step()
            sums += self._batch_sums(loss, outputs.detach(), targets)
            if not math.isfinite(sums.loss):
                break
            check_deadline(deadline)
        return self._with_states(sums)

    @torch.no_grad()
    def evaluate_batches(self, batches: Batches, deadline: float | None = None) -> Sums:
        """Loss and metrics over ``batches``."""
        sums = Sums.empty(self._means)
        self._reset_exact()
        self.model.eval()
        for inputs, targets in batches:
            outputs, loss = self._forward(inputs, targets)
            sums += self._batch_sums(loss, outputs, targets)
            check_deadline(deadline)
        return self._with_states(sums)

    @torch.no_grad()
    def _batch_sums(self, loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor) -> Sums:
        for metric in self._exact.values():
            metric.update(outputs, targets)
        return _batch_sums(loss, outputs, targets, self._means)

    def _reset_exact(self) -> None:
        for metric in self._exact.values():
            metric.reset()

    def _with_states(self, sums: Sums) -> Sums:
        if not self._exact:
            return sums
        return dataclasses.replace(sums, states={name: sub_epoch_state(name, m) for name, m in self._exact.items()})

    @torch.no_grad()
    def predict_batches(self, batches: Batches) -> np.ndarray:
        """The model's outputs over ``batches``, in eval mode."""
        self.model.eval()
        return np.concatenate([self.model(inputs).detach().cpu().numpy() for inputs, _ in batches])

    def _schedule_epoch(self, epoch: int, metrics: Mapping[str, float] | None) -> None:
        """Step an epoch-wise schedule to ``epoch``, wherever the trial's last epoch ended; a
        plateau schedule on ``metrics``, the epoch before's."""
        if self.lr_scheduler_step is SchedulerStep.EPOCH:
            self._stepped_epochs = step_epochs(self.lr_scheduler, self._stepped_epochs, epoch, metrics,
                                               self.lr_scheduler_metric)

    def _forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's outputs and the batch's loss; a failure says what the shapes were."""
        outputs = None
        autocast = torch.autocast("cuda", torch.float16) if self._scaler.is_enabled() else contextlib.nullcontext()
        try:
            with autocast, broadcast_refused(not self._shapes_checked):
                outputs = self.model(inputs)
                loss = self.loss(outputs, targets)
        except Exception as error:
            made = "" if outputs is None else f" -> outputs {describe(outputs)}"
            error.add_note(f"on a batch of features {describe(inputs)}{made}, labels {describe(targets)}")
            raise
        self._shapes_checked = True
        if loss.dim() != 0:
            raise ValueError(f"loss(outputs, targets) must return a scalar (the batch's mean loss); it returned "
                             f"a tensor of shape {tuple(loss.shape)} (a loss with reduction='none'?)")
        return outputs, loss


@torch.no_grad()
def _batch_sums(loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor,
                metrics: Mapping[str, BatchMetric]) -> Sums:
    n = len(targets)
    return Sums(n, float(loss.detach()) * n, {name: float(metric(outputs, targets)) * n
                                              for name, metric in metrics.items()})
