"""The front end's ``fit``: a searcher says WHAT to search, ``fit``'s keywords say HOW to run it.

:meth:`cerebro.Searcher.fit` hands itself to :func:`fit` here, so the searchers import only
narrow waist 1 (``cerebro.engine._interface``) and the seeds, never the run machinery.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .engine import SearchPolicy, execute
from .engine._how import check_how
from .engine._rerun import go_on
from .search._space import sample_config

if TYPE_CHECKING:
    from .data import Dataset
    from .engine._settings import RunOptions
    from .results import Result


class Search(SearchPolicy, Protocol):
    """What ``fit`` asks of the searcher that hands itself over (a :class:`cerebro.Searcher`
    is one): narrow waist 1, and the WHAT. A protocol: the searchers import this module, so it
    imports none of theirs but the space's sampling."""

    build: Callable[[dict], Any]
    space: Mapping[str, Any]
    metric: str | list[str]
    mode: str | list[str]

    def _validate(self) -> None: ...
    def _settings(self) -> dict[str, Any]: ...


def fit(searcher: Search, data: Dataset, options: RunOptions) -> Result:
    """Check ``searcher``'s arguments and the HOW, then run it with MOP, or, with
    ``options.resume``, go on with the run of this same search that ``options.store`` holds
    (see :meth:`cerebro.Searcher.fit`)."""
    searcher._validate()
    how = check_how(data, options)
    settings = searcher._settings()
    if options.resume:
        found = go_on(how, settings, data, searcher.build)
        if found is not None:
            return found
    return execute(searcher, how, build=searcher.build,
                   example_configs=[sample_config(searcher.space, np.random.default_rng(i)) for i in range(4)],
                   metric=searcher.metric, mode=searcher.mode, settings=settings, data=data)
