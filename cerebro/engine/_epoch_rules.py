"""What an epoch's end means for a trial, from its metrics alone (so a resume replays it
exactly): the epoch's metrics as row-weighted means of its sub-epochs', whether it diverged,
and whether early stopping ends it (``patience``, ``min_delta``)."""
from __future__ import annotations

import math

from ..worker import Sums
from ._interface import Decision
from ._settings import RunSettings

USER_STOP = "stopped by the user"      # the reason of a trial cb.stop(run_dir, trial=...) ended
# history()'s column of the learning rate each epoch ended with ("lr" and "learning_rate"
# are the space keys users give it: they stay theirs).
LEARNING_RATE = "train_lr"


def plateau(improved_at: tuple[int, float] | None, epoch: int, max_epochs: int, metrics: dict[str, float],
            decision: Decision, settings: RunSettings) -> tuple[tuple[int, float] | None, Decision, str | None]:
    """Early stopping after ``epoch``: (the trial's last improvement of ``settings.metric`` by
    more than ``min_delta``, as (epoch, value); the decision; why it stops, where it does).
    A trial the searcher lets go on stops once ``patience`` epochs passed without such an
    improvement. It reads the trial's metrics only, so a resume replays it exactly."""
    value = metrics.get(settings.metric)
    if isinstance(value, (int, float)) and math.isfinite(value) and (
            improved_at is None or (improved_at[1] - value if settings.mode == "min" else value - improved_at[1])
            > settings.min_delta):
        improved_at = (epoch, float(value))
    if settings.patience is None or improved_at is None or decision is not Decision.CONTINUE \
            or epoch >= max_epochs or epoch - improved_at[0] < settings.patience:
        return improved_at, decision, None
    return improved_at, Decision.STOP, (f"no improvement of {settings.metric} by more than {settings.min_delta:g} "
                                        f"for {epoch - improved_at[0]} epochs (best {improved_at[1]:.4g} at epoch "
                                        f"{improved_at[0]})")


def diverged(metrics: dict[str, float]) -> str | None:
    """The first loss in ``metrics`` that is not finite: the trial diverged."""
    return next((name for name in ("train_loss", "val_loss") if name in metrics and not math.isfinite(metrics[name])),
                None)


def merged_states(sums: dict[int, Sums]) -> dict:
    """The exact metrics' states over every partition, merged in partition order."""
    ordered = [sums[p] for p in sorted(sums)]
    return sum(ordered, Sums.empty(ordered[0].metrics)).states if ordered else {}


def mean_metrics(prefix: str, sums: dict[int, Sums]) -> dict[str, float]:
    """Row-weighted means over partitions, added in partition order so results are bitwise
    stable, and the model's own metrics (``params``), unprefixed."""
    if not sums:
        return {}
    ordered = [sums[p] for p in sorted(sums)]
    total = sum(ordered, Sums.empty(ordered[0].metrics))
    if total.rows == 0:
        return {}
    return {f"{prefix}_loss": total.loss / total.rows,
            **{f"{prefix}_{name}": value / total.rows for name, value in total.metrics.items()}, **total.model}

