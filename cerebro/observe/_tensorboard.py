"""TensorBoard logs of a run: per trial, every epoch's losses and metrics as scalars, and its
configuration with its final metrics through the HParams plugin, under ``RUN_DIR/tensorboard``
so that ``tensorboard --logdir RUN_DIR/tensorboard`` compares the trials.

Each trial is one TensorBoard run named by its id (``t0003``), holding both its scalars and
its HParams session, whose metrics are those scalars' last values. Integer hyperparameters
are given to HParams as text, so that its table shows ``64``, not ``64.000``."""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import types
from typing import Any

from ..results import flat_config
from ..store import Event
from ..store import _files as files
from ._progress import Progress


class TensorBoardLog(Progress):
    """Writes ``RUN_DIR/tensorboard/<trial_id>/`` event files as the run goes (local stores)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir, self.directory = run_dir, os.path.join(run_dir, "tensorboard")
        self.refused: str | None = None      # why nothing is written: a linked directory in the way
        self._writers: dict[str, Any] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self._last: dict[str, dict[str, float]] = {}

    def _writer(self, trial_id: str) -> Any:
        """The trial's writer; None where its directory is a link someone put in the run
        directory (said once: TensorBoard's files are not worth a write elsewhere, nor the run)."""
        if self.refused is not None:
            return None
        if trial_id not in self._writers:
            try:
                files.refuse_links(self.run_dir, os.path.join(self.directory, trial_id, "events"))
            except files.UnsafeFileError as error:
                self.refused = str(error)
                logging.getLogger("cerebro").warning("no TensorBoard logs are written: %s", error)
                return None
            _without_tensorflow()
            from torch.utils.tensorboard import SummaryWriter
            self._writers[trial_id] = SummaryWriter(os.path.join(self.directory, trial_id))
        return self._writers[trial_id]

    def start(self, run_dir: str, workers: int) -> None:
        # Imported before the first epoch, not at its end: a Ctrl-C that lands while the
        # driver's main thread imports can be swallowed by the import machinery's clean-up
        # ("Exception ignored in ... _get_module_lock"), and the run would not stop.
        _without_tensorflow()
        import torch.utils.tensorboard  # noqa: F401
        from torch.utils.tensorboard.summary import hparams  # noqa: F401

    def trial_created(self, trial_id: str, config: dict[str, Any], max_epochs: int) -> None:
        self._configs[trial_id] = config

    def epoch_end(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> None:
        writer = self._writer(trial_id)
        if writer is None:
            return
        for name, value in metrics.items():
            writer.add_scalar(name, value, epoch)
        self._last[trial_id] = metrics

    def trial_ended(self, trial_id: str, status: str, reason: str | None) -> None:
        writer = self._writer(trial_id)
        if writer is None:
            return
        _without_tensorflow()       # a trial may end before any epoch: this is the first import then
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        shown = {key: _shown(value) for key, value in flat_config(self._configs.get(trial_id, {})).items()}
        final = {name: value for name, value in self._last.get(trial_id, {}).items() if math.isfinite(value)}
        for summary in hparams_summaries({**shown, "status": status}, final):
            writer.file_writer.add_summary(summary)
        writer.close()
        del self._writers[trial_id]

    def finish(self, outcome: str) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers = {}


def _shown(value: Any) -> bool | float | str:
    """A hyperparameter as HParams takes it: integers and structures as text."""
    if isinstance(value, (bool, float, str)):
        return value
    return str(value) if isinstance(value, int) else json.dumps(value)


def _without_tensorflow() -> None:
    """Make tensorboard write with its own stub of TensorFlow's file API. Where TensorFlow is
    installed (the [keras] extra) but not loaded, tensorboard would import all of it into the
    driver (seconds and hundreds of MB) to write the same event files; its marker module
    ``tensorboard.compat.notf`` says not to."""
    if "tensorflow" not in sys.modules:
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class Fanout(Progress):
    """Tells every one of ``observers`` what happens in the run."""

    def __init__(self, *observers: Progress) -> None:
        self.observers = observers

    def start(self, run_dir: str, workers: int) -> None:
        for observer in self.observers:
            observer.start(run_dir, workers)

    def notify(self, event: Event) -> None:
        for observer in self.observers:
            observer.notify(event)

    def finish(self, outcome: str) -> None:
        for observer in self.observers:
            observer.finish(outcome)
