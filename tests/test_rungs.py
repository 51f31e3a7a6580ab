"""ASHA's rungs judge a trial in O(log n) comparisons (two sorted lists a rung) and decide
exactly as the rule they implement: a trial's rank among the trials as old as it or older,
sorted whole (``_ranking.ranked``), whatever the order the trials arrive, end or are told again."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro.engine import Decision
from cerebro.search._ranking import ranked
from cerebro.search._rungs import Rungs


class SortedWhole(Rungs):
    """The rule as written before: every judgement sorts the rung's older trials."""

    def _judge(self, index: int, rung: int) -> Decision | None:
        values = self._values[rung]
        if any(older < index and older not in values for older in self.live):
            return None
        peers = {older: value for older, value in values.items() if older <= index}
        rank = ranked(peers, self.mode).index(index)
        kept = max(1, math.floor(len(peers) / self.reduction_factor)) if self.strict \
            else math.ceil(len(peers) / self.reduction_factor)
        if rank < kept:
            return Decision.CONTINUE
        self._reasons[index] = (f"stopped at rung {rung} (epoch {self.epochs[rung]}): ranked {rank + 1} of "
                                f"{len(peers)}, only the top {kept} go on")
        return Decision.STOP


# Each step: (trial, what it does): report its next rung's value (few distinct values: ties), or end.
steps = st.lists(st.tuples(st.integers(0, 11), st.one_of(st.sampled_from([0.1, 0.2, 0.3, 0.5]),
                                                          st.floats(-5, 5), st.just("end"))), max_size=80)


@settings(max_examples=300, deadline=None)
@given(steps=steps, mode=st.sampled_from(["min", "max"]), strict=st.booleans(), told_again=st.booleans())
def test_each_decision_and_reason_is_the_sorted_rules(steps, mode, strict, told_again):
    made = [Rungs(1, 2, 16, mode, strict), SortedWhole(1, 2, 16, mode, strict)]
    at = [[0] * 12, [0] * 12]          # the rung each trial reports next, in each
    for rungs in made:
        for index in range(12):
            rungs.started(index)
    answers: list[list] = [[], []]
    for index, what in steps:
        for which, rungs in enumerate(made):
            if index not in rungs.live:
                continue
            if what == "end":
                rungs.ended(index)
                answers[which].append(("ended", index))
            elif at[which][index] < len(rungs.epochs):
                rung = at[which][index]
                answers[which].append(rungs.report(index, rungs.epochs[rung], what))
                if told_again and rung == 0:      # an epoch recomputed after a lost state: told again
                    answers[which].append(rungs.report(index, rungs.epochs[rung], -what))
                at[which][index] += 1
            answers[which].append(sorted(rungs.decide().items()))
    assert answers[0] == answers[1]
    assert [made[0].reason(i) for i in range(12)] == [made[1].reason(i) for i in range(12)]
