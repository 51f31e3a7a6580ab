"""Warm start: a new run's trial whose config equals a finished trial of an earlier run starts
from that trial's weights and optimizer state (its best epoch's, or its last), not from
``build``'s. With ``cb.resume(run_dir, epochs=N)`` this is MADlib's workflow: run wide, keep
the best, narrow the space, run those longer.

The state is written as the new trial's epoch-0 checkpoint, so a resume of the new run
needs the earlier run no more.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from ..results import load
from ..store import BEST, RunStore, TrialStatus
from ._settings import WarmStartFrom

log = logging.getLogger(__name__)

_EPOCH_FILES = {"best": BEST, "last": "checkpoint.state"}


def check_warm_start(source: WarmStartFrom, data_info: dict[str, Any]) -> None:
    """Raises unless ``source`` is a run whose data had the feature layout of ``data_info``
    (run.json's ``data``): its weights would not fit, or would mean something else."""
    if source.epoch not in _EPOCH_FILES:
        raise ValueError(f"warm_start_epoch={source.epoch!r} must be 'best' or 'last'")
    earlier = RunStore(source.run_dir).read_run_info()["data"]
    then = (tuple(earlier.get("feature_shape") or ()), earlier.get("feature_dtype"))
    now = (tuple(data_info.get("feature_shape") or ()), data_info.get("feature_dtype"))
    if then != now:
        raise ValueError(f"warm_start={source.run_dir!r} trained on features of shape {then[0]} and dtype {then[1]}; "
                         f"this run's data has shape {now[0]} and dtype {now[1]}: its weights would not fit")


class WarmStarts:
    """The completed and stopped trials of the run to start from, by config."""

    def __init__(self, source: WarmStartFrom) -> None:
        result = load(source.run_dir)
        self.source, self.store = source, result.store
        self._by_config: dict[str, str] = {}
        for trial in result.trials:
            if trial.status in (TrialStatus.COMPLETED, TrialStatus.STOPPED):
                self._by_config.setdefault(_key(trial.config), trial.trial_id)

    def take(self, config: dict[str, Any]) -> tuple[Any, str] | None:
        """(the packed state, where it came from as ``RUN_DIR:TRIAL@EPOCH``) for a trial of
        ``config``, or None where no finished trial had it."""
        trial_id = self._by_config.get(_key(config))
        if trial_id is None:
            return None
        found = [c for c in self.store.checkpoints(trial_id, (_EPOCH_FILES[self.source.epoch],)) if "state" in c]
        if not found:
            log.warning("warm start: %s of %s has no readable %s checkpoint; the trial of %s starts from build",
                        trial_id, self.source.run_dir, self.source.epoch, config)
            return None
        return found[0]["state"], f"{self.source.run_dir}:{trial_id}@{found[0]['epoch']}"


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)
