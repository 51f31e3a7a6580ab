"""``fit(..., resume=True)``: a script run again goes on with the run its store holds, where
that is the same search (space, searcher settings, data and seed, as run.json records them),
as :func:`cerebro.resume` goes on, bitwise, or returns it where it finished; a store that
holds another search is refused, as a fit refuses any store that holds a run. (Keras Tuner
resumes a tuner's directory by default; Optuna's ``create_study`` has ``load_if_exists``.)
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..data import Dataset
from ..results import Result
from ..store import RunStore
from ._how import How
from ._resume import has_finished, resume

_NONE = object()      # an entry one side lacks


def go_on(how: How, settings: dict[str, Any], data: Dataset, build: Callable[[dict], Any]) -> Result | None:
    """The run in ``how.options.store`` gone on with, or as it is where it finished; None where
    the store holds no run (a fit starts one). ``settings`` are the searcher's, as run.json
    records them; ``build`` replaces the stored one (it must make the run's models)."""
    options = how.options
    if options.store is None or not RunStore(options.store).has("run.json"):
        return None            # no store, nothing there, or what a fit stopped before its run began left
    store = RunStore.open(options.store)
    info = store.read_run_info()
    difference = _difference(info, json.loads(json.dumps(settings, default=str)), data, options.seed)
    if difference is not None:
        raise FileExistsError(
            f"store {store.path!r} holds another search ({info['searcher']['class']}, created "
            f"{info.get('created', '?')}): {difference}. fit(..., resume=True) goes on only with the same search "
            f"(space, searcher settings, data and seed); to go on with that run: cb.resume({store.path!r}); for "
            f"this search, choose another store or delete that one")
    partitions = info["data"]["partitions"]
    if how.backend.workers > partitions:
        raise ValueError(f"the run in {store.path!r} has {partitions} partitions, fewer than the "
                         f"{how.backend.workers} workers; every worker needs a partition, so use fewer workers")
    if has_finished(list(store.events())):
        return Result(store, build)
    return resume(options.store, build, backend=how.backend, verbose=options.verbose, metrics_port=options.metrics_port,
                  metrics_host=options.metrics_host, time_budget=options.time_budget)


def _difference(info: dict[str, Any], settings: dict[str, Any], data: Dataset, seed: int | None) -> str | None:
    """The first way the run that ``info`` (run.json) records is not this search, in words
    ("its epochs is 3, this search's 5"); None where it is the same search."""
    theirs = info["searcher"]
    for key in dict.fromkeys([*settings, *theirs]):
        if key == "space":
            space = _space_difference(theirs.get("space", {}), settings["space"])
            if space is not None:
                return space
        elif theirs.get(key, _NONE) != settings.get(key, _NONE):
            return f"its {key} is {_shown(theirs.get(key, _NONE))}, this search's {_shown(settings.get(key, _NONE))}"
    recorded = info["data"]
    if data.partitions is not None and data.partitions != recorded["partitions"]:
        return f"its data has {recorded['partitions']} partitions, this data {data.partitions}"
    if recorded.get("fingerprint") != data.fingerprint():
        return (f"its data's fingerprint is {recorded.get('fingerprint')}, this data's {data.fingerprint()} "
                f"(other rows, labels or split)")
    if seed is not None and seed != info["seed"]:
        return f"its seed is {info['seed']}, this fit's {seed}"
    return None


def _space_difference(theirs: dict[str, Any], ours: dict[str, Any]) -> str | None:
    for name in dict.fromkeys([*ours, *theirs]):
        if theirs.get(name, _NONE) != ours.get(name, _NONE):
            return (f"its space's {name!r} is {theirs.get(name, 'absent')}, this search's "
                    f"{ours.get(name, 'absent')}")
    return None


def _shown(value: Any) -> str:
    return "absent" if value is _NONE else repr(value)
