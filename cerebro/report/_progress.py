"""Live progress of a run on the console."""
from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as _Bar


class Progress:
    """What the driver tells about a run as it goes; this base says nothing."""

    def start(self, run_dir: str, workers: int) -> None: ...

    def trial_created(self, trial_id: str, config: dict[str, Any], max_epochs: int) -> None: ...

    def epoch_end(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> None: ...

    def trial_ended(self, trial_id: str, status: str, reason: str | None) -> None: ...

    def finish(self) -> None: ...


NoProgress = Progress


class ConsoleProgress(Progress):
    """A progress bar of epochs, the best ``metric`` so far, and a line per ended trial."""

    def __init__(self, metric: str, mode: str, console: Console | None = None) -> None:
        self.metric, self.mode = metric, mode
        self.console = console or Console(stderr=True)
        self._bar = _Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                         TextColumn("epochs"), TimeElapsedColumn(), console=self.console)
        self._task = self._bar.add_task("", total=0)
        self._last: dict[str, tuple[int, dict[str, float]]] = {}
        self._planned: dict[str, int] = {}
        self._latest: dict[str, float] = {}

    def start(self, run_dir: str, workers: int) -> None:
        self.console.print(f"[bold]cerebro[/bold] run in {run_dir} on {workers} workers")
        self._bar.start()

    def trial_created(self, trial_id: str, config: dict[str, Any], max_epochs: int) -> None:
        self._planned[trial_id] = max_epochs
        self._bar.update(self._task, total=sum(self._planned.values()))

    def epoch_end(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> None:
        self._last[trial_id] = (epoch, metrics)
        value = metrics.get(self.metric)
        if value is not None and math.isfinite(value):
            self._latest[trial_id] = value
        # Ranked like result.best: by each trial's latest epoch.
        best = (min if self.mode == "min" else max)(self._latest.values(), default=None)
        self._bar.update(self._task, advance=1,
                         description="" if best is None else f"best {self.metric}={best:.4f}")

    def trial_ended(self, trial_id: str, status: str, reason: str | None) -> None:
        epoch, metrics = self._last.get(trial_id, (0, {}))
        # A trial that ends early frees its planned epochs from the bar's total.
        self._planned[trial_id] = epoch
        self._bar.update(self._task, total=sum(self._planned.values()))
        value = metrics.get(self.metric)
        shown = f"{self.metric}={value:.4f}" if value is not None else ""
        why = f" ({reason.strip().splitlines()[-1]})" if reason and status != "completed" else ""
        self.console.print(f"{trial_id} {status} after {epoch} epochs {shown}{why}")

    def finish(self) -> None:
        self._bar.stop()
