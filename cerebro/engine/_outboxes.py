"""Direct hops, the driver's side: which worker's outbox holds which trial's state.

A worker set up for direct hops keeps each state it trains in its outbox (one version per
trial, :mod:`cerebro.worker._peers`) until the driver says it is needed no more; the driver
learns what each outbox holds from the workers' answers, so a task can name the worker to
fetch its state from, and the outboxes never keep a state no trial will use.

Example:
    >>> boxes = Outboxes()
    >>> boxes.put(worker=1, trial_id="t0000", version=3)
    >>> boxes.where("t0000", 3), boxes.where("t0000", 2)
    (1, None)
    >>> boxes.unneeded({"t0000": {4}})
    [(1, 't0000', 3)]
"""
from __future__ import annotations

from collections.abc import Mapping


class Outboxes:
    """What each worker's outbox holds, as the driver knows it."""

    def __init__(self) -> None:
        self._held: dict[str, dict[int, int]] = {}     # trial -> {worker: version}

    def put(self, worker: int, trial_id: str, version: int) -> None:
        """``worker`` trained ``trial_id`` to ``version``: its outbox holds that one now."""
        self._held.setdefault(trial_id, {})[worker] = version

    def drop(self, worker: int, trial_id: str) -> None:
        """``worker``'s outbox no longer holds ``trial_id``'s state (handed back, or missing)."""
        held = self._held.get(trial_id, {})
        held.pop(worker, None)
        if not held:
            self._held.pop(trial_id, None)

    def lose(self, worker: int | None = None) -> None:
        """``worker`` (None: every worker) was lost, with its outbox."""
        for trial_id in list(self._held):
            if worker is None:
                del self._held[trial_id]
            else:
                self.drop(worker, trial_id)

    def where(self, trial_id: str, version: int) -> int | None:
        """A worker whose outbox holds ``trial_id``'s state ``version``, if any."""
        return next((w for w, v in sorted(self._held.get(trial_id, {}).items()) if v == version), None)

    def unneeded(self, needed: Mapping[str, set[int]]) -> list[tuple[int, str, int]]:
        """The states held that no live trial needs (``needed``: trial -> the versions it may
        still use), as (worker, trial, version); forgotten here, for the driver to tell them."""
        gone = [(worker, trial_id, version) for trial_id, held in self._held.items()
                for worker, version in held.items() if version not in needed.get(trial_id, ())]
        for worker, trial_id, _ in gone:
            self.drop(worker, trial_id)
        return sorted(gone)
