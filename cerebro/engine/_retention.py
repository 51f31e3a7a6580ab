"""Which finished trials keep their weights on disk (``fit(keep_checkpoints=k)``)."""
from __future__ import annotations

from typing import Any

from ._settings import RunSettings


class Retention:
    """A trial that ends keeps its best and last epoch's checkpoints (its ``prev`` copy goes);
    with ``keep_checkpoints=k``, only the k best finished trials keep theirs (by the best
    epoch's metric; failed ones last). A trial dropped never comes back, as later ones only
    raise the bar, so the kept set ends as the k best whatever the order trials ended in."""

    def __init__(self, settings: RunSettings, recorder: Any) -> None:
        self.settings, self.recorder = settings, recorder
        self.kept: list[tuple[str, float | None]] = []     # (trial, its best metric), best first

    def ended(self, trial_id: str, best: float | None) -> None:
        self.recorder.remove_checkpoints(trial_id, keep=("best", "last"))
        self.restore([*self.kept, (trial_id, best)])

    def restore(self, kept: list[tuple[str, float | None]]) -> None:
        """Keep the best of ``kept`` and delete the others' weights (again, on resume: the
        crash may have come before the writer deleted them)."""
        self.kept = kept
        limit = self.settings.limits.keep_checkpoints
        if limit is None:
            return
        sign = 1 if self.settings.mode == "min" else -1
        self.kept.sort(key=lambda entry: (entry[1] is None, 0.0 if entry[1] is None else sign * entry[1], entry[0]))
        for dropped, _ in self.kept[limit:]:
            self.recorder.remove_checkpoints(dropped)
        del self.kept[limit:]
