"""Live progress of a run on the console: on a terminal, a view of what every worker is doing,
the overall progress with an ETA and the top trials; elsewhere (CI, files), plain lines."""
from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ..results._trial_result import rounded
from ..store import (
    EpochEnd,
    Event,
    SubEpoch,
    SubEpochAborted,
    SubEpochStarted,
    TrialCreated,
    TrialEnded,
    TrialTakenUp,
    improved,
)


class Progress:
    """An observer of a run: started, then told every event as it happens (:meth:`notify`,
    the journal's events and those only observers see), then finished. :meth:`notify` hands
    each event to the method below that shows it; this base shows nothing."""

    def start(self, run_dir: str, workers: int) -> None: ...

    def notify(self, event: Event) -> None:
        """Hand ``event`` to the method that shows it; events no method shows are ignored."""
        match event:
            case TrialCreated() | TrialTakenUp():
                self.trial_created(event.trial_id, event.config, event.max_epochs)
            case SubEpochAborted() | SubEpoch():      # before SubEpochStarted: Aborted is one
                self.sub_epoch_finished(event.worker)
            case SubEpochStarted():
                self.sub_epoch_started(event.worker, event.trial_id, event.kind, event.epoch, event.partition)
            case EpochEnd():
                self.epoch_end(event.trial_id, event.epoch, event.metrics)
            case TrialEnded():
                self.trial_ended(event.trial_id, event.status, event.reason)

    def trial_created(self, trial_id: str, config: dict[str, Any], max_epochs: int) -> None: ...

    def sub_epoch_started(self, worker: int, trial_id: str, kind: str, epoch: int, partition: int) -> None: ...

    def sub_epoch_finished(self, worker: int) -> None: ...

    def epoch_end(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> None: ...

    def trial_ended(self, trial_id: str, status: str, reason: str | None) -> None: ...

    def finish(self, outcome: str) -> None:
        """The run ended: ``outcome`` is ``finished``, ``interrupted`` (Ctrl-C, SIGTERM) or ``failed``."""


NoProgress = Progress


class ConsoleProgress(Progress):
    """On a terminal, a live view refreshed a few times a second: per worker what it trains
    (trial, epoch, partition) and its utilization; epochs done of planned with an ETA; the
    top 5 trials by their best epoch's ``metric`` (as ``result.best`` ranks them), with the
    last epoch's beside it and their configs rounded to 4 significant digits. On anything
    else, one plain line per epoch end and per ended trial, which says its best epoch too.

    The ETA is the epochs left at the rate measured since the first epoch ended (start-up,
    loading the data and the first hops, is not a rate), and appears once as many epochs
    as there are workers have ended since: before that it would mostly measure start-up.
    """

    def __init__(self, metric: str, mode: str, console: Console | None = None, top: int = 5) -> None:
        self.metric, self.mode, self.top = metric, mode, top
        self.console = console or Console(stderr=True)
        self._live: Live | None = None
        self._planned: dict[str, int] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self._last: dict[str, tuple[int, dict[str, float]]] = {}
        self._best: dict[str, tuple[int, float]] = {}      # trial -> (its best epoch, its metric)
        self._status: dict[str, str] = {}
        self._doing: dict[int, tuple[str, float]] = {}       # worker -> (what, since)
        self._busy: dict[int, float] = {}
        self._started = time.monotonic()
        self._done = 0
        self._first_epoch: float | None = None      # when the first epoch ended
        self._lock = threading.Lock()      # the live view renders on a thread of its own

    def start(self, run_dir: str, workers: int) -> None:
        self._started = time.monotonic()
        self._busy = {w: 0.0 for w in range(workers)}
        plural = "s" if workers != 1 else ""
        self.console.print(f"[bold]cerebro[/bold] run in {run_dir} on {workers} worker{plural}", soft_wrap=True)
        if self.console.is_terminal:
            self._live = Live(self._view(), console=self.console, refresh_per_second=4, get_renderable=self._view)
            self._live.start()

    def trial_created(self, trial_id: str, config: dict[str, Any], max_epochs: int) -> None:
        with self._lock:
            self._planned[trial_id], self._configs[trial_id], self._status[trial_id] = max_epochs, config, "running"

    def sub_epoch_started(self, worker: int, trial_id: str, kind: str, epoch: int, partition: int) -> None:
        with self._lock:
            self._doing[worker] = (f"{trial_id} {kind} epoch {epoch} partition {partition}", time.monotonic())

    def sub_epoch_finished(self, worker: int) -> None:
        with self._lock:
            what = self._doing.pop(worker, None)
            if what is not None:
                self._busy[worker] = self._busy.get(worker, 0.0) + time.monotonic() - what[1]

    def epoch_end(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> None:
        with self._lock:
            self._last[trial_id] = (epoch, metrics)
            best = improved(self._best.get(trial_id), epoch, metrics, self.metric, self.mode)
            if best is not None:        # a first epoch without a finite metric leaves it without a best
                self._best[trial_id] = best
            self._done += 1
            if self._first_epoch is None:
                self._first_epoch = time.monotonic()
        if self._live is None:
            shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())
            self.console.print(f"{trial_id} epoch {epoch}: {shown} ({self._done}/{self._total()} epochs{self._eta()})",
                               highlight=False, soft_wrap=True)

    def trial_ended(self, trial_id: str, status: str, reason: str | None) -> None:
        epoch, metrics = self._last.get(trial_id, (0, {}))
        with self._lock:
            self._planned[trial_id], self._status[trial_id] = epoch, status    # frees its unplanned epochs
        value, best = metrics.get(self.metric), self._best.get(trial_id)
        shown = f"{self.metric}={value:.4f}" if value is not None else ""
        shown += f" (best {best[1]:.4f} at epoch {best[0]})" if best is not None and best[0] != epoch else ""
        why = f" ({reason.strip().splitlines()[-1]})" if reason and status != "completed" else ""
        self.console.print(f"{trial_id} {status} after {epoch} epochs {shown}{why}", highlight=False, soft_wrap=True)

    def finish(self, outcome: str) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # --- what is shown ------------------------------------------------------------------
    def _total(self) -> int:
        return sum(self._planned.values())

    def _eta(self) -> str:
        left, since_first = self._total() - self._done, self._done - 1
        if self._first_epoch is None or left <= 0 or since_first < max(len(self._busy), 1):
            return ""
        return f", ETA {_duration((time.monotonic() - self._first_epoch) / since_first * left)}"

    def ranked(self) -> list[tuple[str, float]]:
        """Trials by their best epoch's ``metric``, best first, as ``result.best`` ranks them."""
        scored = [(t, value) for t, (_, value) in self._best.items()
                  if self._status.get(t) not in ("failed", "diverged", "timeout")]
        return sorted(scored, key=lambda item: (item[1] if self.mode == "min" else -item[1], item[0]))

    def _view(self) -> Group:
        with self._lock:
            return self._render()

    def _render(self) -> Group:
        now, elapsed = time.monotonic(), max(time.monotonic() - self._started, 1e-9)
        workers = Table("worker", "training", "utilization", box=None, pad_edge=False)
        for worker in sorted(self._busy):
            what, since = self._doing.get(worker, ("idle", now))
            busy = self._busy[worker] + (now - since if worker in self._doing else 0.0)
            workers.add_row(f"worker {worker}", what, f"{busy / elapsed:.0%}")
        top = Table("trial", "epochs", f"best {self.metric}", "at epoch", "last", "config", box=None,
                    pad_edge=False, title=f"top {self.top} by {self.metric} ({self.mode})", title_justify="left")
        for trial_id, value in self.ranked()[:self.top]:
            epoch, metrics = self._last[trial_id]
            last = metrics.get(self.metric)
            top.add_row(trial_id, str(epoch), f"{value:.4f}", str(self._best[trial_id][0]),
                        "" if last is None else f"{last:.4f}", rounded(self._configs.get(trial_id, {}))[:80])
        header = (f"{self._done}/{self._total()} epochs · {sum(s == 'running' for s in self._status.values())} "
                  f"trials live · {_duration(elapsed)} elapsed{self._eta()}")
        return Group(header, workers, top)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
