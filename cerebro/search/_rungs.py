"""Asynchronous successive-halving rungs, judged reproducibly: ASHA's rule, shared with
TPE's optional pruning."""
from __future__ import annotations

import bisect
import math
from typing import Any

from ..engine._interface import Decision
from ..engine._seeds import trial_name


class Rungs:
    """Rungs at ``grace_period * reduction_factor**k`` epochs below ``max_epochs``. A trial
    reaching a rung goes on only if it ranks in the top ``1/reduction_factor`` of the trials
    that reached it (Li et al., MLSys 2020).

    A trial is compared with the older trials (smaller index) at its rung, never with
    whichever happened to arrive first: it waits (``PAUSE``) until every older trial has
    reached the rung or ended, so the decisions equal those of trials arriving in index
    order, whatever the timing.
    """

    def __init__(self, grace_period: int, reduction_factor: float, max_epochs: int, mode: str,
                 strict: bool = False) -> None:
        """``strict``: the top ``floor(n / reduction_factor)`` of the ``n`` trials at a rung go
        on (at least one), as Li et al.'s successive halving and Optuna's pruner keep them;
        else the top ``ceil(n / reduction_factor)``, ASHA's and TPE's rule since their first
        release (kept, so their runs resume and reproduce as they were)."""
        self.reduction_factor, self.mode, self.strict = reduction_factor, mode, strict
        self.epochs: list[int] = []
        epoch = grace_period
        while epoch < max_epochs:
            self.epochs.append(epoch)
            epoch = math.ceil(epoch * reduction_factor)
        self._values: list[dict[int, float]] = [{} for _ in self.epochs]   # rung -> trial -> value
        # Each rung's trials sorted two ways, so a judgement costs O(log n) comparisons, not a
        # sort of the rung (a run of 10,000 trials judges each): best first, as ranked() orders
        # them (value, then the older trial), and by index.
        self._by_rank: list[list[tuple[float, int]]] = [[] for _ in self.epochs]
        self._by_index: list[list[int]] = [[] for _ in self.epochs]
        self.live: set[int] = set()              # started, not ended
        self._waiting: dict[int, int] = {}          # paused trial -> its rung
        self._reasons: dict[int, str] = {}

    def started(self, index: int) -> None:
        """Trial ``index`` started: younger trials wait for it at every rung."""
        self.live.add(index)

    def ended(self, index: int) -> None:
        """Trial ``index`` ended: younger trials no longer wait for it."""
        self.live.discard(index)

    def report(self, index: int, epoch: int, value: float) -> Decision:
        """Trial ``index`` finished ``epoch`` with ``value``: continue, stop, or wait."""
        if epoch not in self.epochs:
            return Decision.CONTINUE
        rung = self.epochs.index(epoch)
        self._record(rung, index, value)
        decision = self._judge(index, rung)
        if decision is None:
            self._waiting[index] = rung
            return Decision.PAUSE
        return decision

    def decide(self) -> dict[str, Decision]:
        """Decisions for waiting trials whose older peers have all reached the rung or ended."""
        decisions = {}
        for index, rung in sorted(self._waiting.items()):
            decision = self._judge(index, rung)
            if decision is not None:
                del self._waiting[index]
                decisions[trial_name(index)] = decision
        return decisions

    def _key(self, rung: int, index: int) -> tuple[float, int]:
        """Where trial ``index`` ranks at ``rung``, as ``_ranking.ranked`` orders them."""
        return (1.0 if self.mode == "min" else -1.0) * self._values[rung][index], index

    def _record(self, rung: int, index: int, value: float) -> None:
        if index in self._values[rung]:       # told again (an epoch recomputed): the new value holds
            by_rank = self._by_rank[rung]
            del by_rank[next(i for i, (_, told) in enumerate(by_rank) if told == index)]
            self._by_index[rung].remove(index)
        self._values[rung][index] = value
        bisect.insort(self._by_rank[rung], self._key(rung, index))
        bisect.insort(self._by_index[rung], index)

    def _judge(self, index: int, rung: int) -> Decision | None:
        """Go on or stop at ``rung``; None while an older trial may still reach it."""
        values = self._values[rung]
        if any(older < index and older not in values for older in self.live):      # live: max_concurrent at most
            return None
        # Its rank among the trials as old as it or older: its place among all the rung's,
        # less the younger ones ahead of it (those that got there first: a few at most).
        key, by_index = self._key(rung, index), self._by_index[rung]
        younger = by_index[bisect.bisect_right(by_index, index):]
        rank = bisect.bisect_left(self._by_rank[rung], key) - sum(self._key(rung, y) < key for y in younger)
        peers = len(by_index) - len(younger)
        kept = max(1, math.floor(peers / self.reduction_factor)) if self.strict \
            else math.ceil(peers / self.reduction_factor)
        if rank < kept:
            return Decision.CONTINUE
        self._reasons[index] = (f"stopped at rung {rung} (epoch {self.epochs[rung]}): ranked {rank + 1} of "
                                f"{peers}, only the top {kept} go on")
        return Decision.STOP

    def reason(self, index: int) -> str | None:
        """Why trial ``index`` was stopped, or None if it was not."""
        return self._reasons.get(index)

    def state(self) -> dict[str, Any]:
        """The waiting trials with their rung, and every rung's epoch and values, as JSON-safe data."""
        return {"waiting": {trial_name(i): r for i, r in sorted(self._waiting.items())},
                "rungs": [{"epoch": epoch, "values": {trial_name(i): v for i, v in sorted(values.items())}}
                          for epoch, values in zip(self.epochs, self._values)]}
