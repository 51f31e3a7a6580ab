"""The searcher's state in the journal, kept small: a full snapshot now and then, deltas between.

A searcher's state grows with its trials (rung values, TPE's observations), and it is
written at every decision; written whole each time, the journal would grow with the square
of the trial count. So an entry is whole only now and then (:class:`SearchStateLog`); the
others hold what changed since the entry before (:func:`delta`), and :func:`apply_delta`
rebuilds it.
"""
from __future__ import annotations

import json
from typing import Any


def delta(old: Any, new: Any) -> dict[str, Any]:
    """What turns ``old`` into ``new``: ``{"set": new}``; for two dicts ``{"keys": {key:
    delta}, "drop": [key, ...]}``; for two lists of one length ``{"items": [[index, delta],
    ...]}``; for a list that holds ``old``'s items in order with others between,
    ``{"insert": [[index in new, item], ...]}``."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = {k: delta(old[k], v) if k in old else {"set": v} for k, v in new.items()
                if k not in old or old[k] != v}
        drop = [k for k in old if k not in new]
        return {"keys": keys, **({"drop": drop} if drop else {})}
    if isinstance(old, list) and isinstance(new, list) and len(new) == len(old):
        return {"items": [[i, delta(a, b)] for i, (a, b) in enumerate(zip(old, new)) if a != b]}
    if isinstance(old, list) and isinstance(new, list) and len(new) > len(old):
        inserted, kept = [], 0
        for index, item in enumerate(new):
            if kept < len(old) and item == old[kept]:
                kept += 1
            else:
                inserted.append([index, item])
        if kept == len(old):
            return {"insert": inserted}
    return {"set": new}


def apply_delta(old: Any, change: dict[str, Any]) -> Any:
    """``old`` changed as :func:`delta` describes."""
    if "set" in change:
        return change["set"]
    if "items" in change:
        changed = dict((index, sub) for index, sub in change["items"])
        return [apply_delta(item, changed[i]) if i in changed else item for i, item in enumerate(old)]
    if "insert" in change:
        inserted, kept = dict((index, item) for index, item in change["insert"]), iter(old)
        return [inserted[i] if i in inserted else next(kept) for i in range(len(old) + len(inserted))]
    new = {k: v for k, v in old.items() if k not in change.get("drop", ())}
    for key, sub in change["keys"].items():
        new[key] = apply_delta(old.get(key), sub)
    return new


class SearchStateLog:
    """Turns each state the searcher reports into what the journal gets (None: unchanged).

    A new snapshot is written once the deltas since the last one add up to its size, so
    snapshots never take more of the journal than deltas do, and the journal stays linear
    in the number of decisions.

    The state is asked for (:meth:`due`) at every decision of a run of fewer than
    :attr:`SHARE` trials, then once every ``trials / SHARE`` decisions, and at the run's end.
    A state and its delta cost time in the number of trials: asked at every decision, they
    made each of a 10,000-trial ASHA run's decisions cost O(n). This way a decision costs
    O(SHARE) amortized; every decision is journaled as its own event all the same.
    """

    SHARE = 64

    def __init__(self) -> None:
        self._last: dict[str, Any] | None = None
        self._snapshot_bytes = 0
        self._delta_bytes = 0
        self._decisions = 0       # since the state was last asked for

    def due(self, trials: int) -> bool:
        """Whether to ask for the state at this decision, in a run of ``trials`` trials."""
        self._decisions += 1
        if self._decisions * self.SHARE < trials:
            return False
        self._decisions = 0
        return True

    def entry(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """``{"state": state}`` (a snapshot) or ``{"delta": ...}`` against the last entry."""
        if not state or state == self._last:
            return None
        if self._last is not None and self._delta_bytes < self._snapshot_bytes:
            change = delta(self._last, state)
            self._last, self._delta_bytes = state, self._delta_bytes + len(json.dumps(change, default=float))
            return {"delta": change}
        self._last, self._delta_bytes = state, 0
        self._snapshot_bytes = len(json.dumps(state, default=float))
        return {"state": state}
