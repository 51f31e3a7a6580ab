"""Direct hops, the driver's side: which worker's outbox holds which trial's state.

A worker set up for direct hops keeps each state it trains in its outbox
(:mod:`cerebro.worker._peers`) until the driver says it is needed no more; the driver
learns what each outbox holds from the workers' answers, so a task can name the worker to
fetch its state from, and the outboxes never keep a state no trial will use. A state stays
as long as some task may still need it (an epoch's evals may read it while the trial trains
on), so a fetch never races its holder's next sub-epoch.

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
        self._held: dict[tuple[str, int], set[int]] = {}     # (trial, version) -> workers

    def put(self, worker: int, trial_id: str, version: int) -> None:
        """``worker`` trained ``trial_id`` to ``version``: its outbox holds it now."""
        self._held.setdefault((trial_id, version), set()).add(worker)

    def drop(self, worker: int, trial_id: str, version: int) -> None:
        """``worker``'s outbox no longer holds that state (handed back, or found missing)."""
        workers = self._held.get((trial_id, version), set())
        workers.discard(worker)
        if not workers:
            self._held.pop((trial_id, version), None)

    def lose(self, worker: int | None = None) -> None:
        """``worker`` (None: every worker) was lost, with its outbox."""
        for trial_id, version in list(self._held):
            if worker is None:
                del self._held[trial_id, version]
            else:
                self.drop(worker, trial_id, version)

    def where(self, trial_id: str, version: int) -> int | None:
        """A worker whose outbox holds ``trial_id``'s state ``version``, if any."""
        return min(self._held.get((trial_id, version), ()), default=None)

    def unneeded(self, needed: Mapping[str, set[int]]) -> list[tuple[int, str, int]]:
        """The states held that no live trial needs (``needed``: trial -> the versions it may
        still use), as (worker, trial, version); forgotten here, for the driver to tell them."""
        gone = sorted((worker, trial_id, version) for (trial_id, version), workers in self._held.items()
                      if version not in needed.get(trial_id, ()) for worker in workers)
        for worker, trial_id, version in gone:
            self.drop(worker, trial_id, version)
        return gone
