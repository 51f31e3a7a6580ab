"""A model selection table's rows as a search: one trial per ``mst_key``, each trained for
the call's iterations times its own ``fit_params`` ``epochs``.

MADlib's iteration runs ``epochs`` passes over each segment's data before the model moves
on; Cerebro keeps sequential SGD, so a row with ``epochs=k`` trains ``k`` epochs (k passes
over every partition, hopping between them) per iteration: the same passes over the same
data, and the same weights ``madlib_keras_fit`` gives that row for as many iterations.
"""
from __future__ import annotations

from typing import ClassVar

from ..engine import TrialRequest
from ..search import GridSearch
from ._keras_model import SelectionBuild


class SelectionSearch(GridSearch):
    """:class:`cerebro.GridSearch` over ``{"mst_key": cb.choice(keys)}`` whose ``epochs`` are
    iterations: each trial trains ``epochs`` times its row's ``epochs`` (``build`` is a
    :class:`._keras_model.SelectionBuild`, which knows them)."""

    cannot_extend: ClassVar[str] = "its trials' epochs are iterations times each row's fit_params epochs"
    build: SelectionBuild

    def suggest(self) -> list[TrialRequest]:
        return [TrialRequest(request.config, request.max_epochs * self.build.epochs(request.config))
                for request in super().suggest()]
