"""Resume: finish a run whose driver died, from its journal and checkpoints.

The searcher is rebuilt by replaying the journal (:mod:`._replay`). Each live trial then
continues from the checkpoint of its last journaled epoch; the sub-epochs that were running
when the driver died run again with the same seeds, so the run ends bitwise as it would
have without the crash (invariant 3).
"""
from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import cloudpickle

from .._checks import quoted
from ..backends import Backend
from ..data import read_layout
from ..results import Result
from ..store import (
    DamagedLine,
    DecidedPaused,
    Exploited,
    JournalRepaired,
    Ledger,
    RunExtended,
    RunFinished,
    RunInfoError,
    RunResumed,
    RunStarted,
    RunStore,
    TrialCreated,
    TrialRetried,
    TrialRolledBack,
    TrialStatus,
    UntrustedStateError,
    parse_event,
)
from ..store import _files as files
from ._driver import Driver
from ._execute import finished, observers, pickle_build, reproducibility_caveat
from ._extend import extension
from ._how import check_metrics_port, check_time_budget, resolve_backend
from ._interface import Decision, SearchPolicy
from ._interrupts import interrupts_stop_the_run
from ._preflight import build_cheaply, check_metric
from ._replay import Recovered, RecoveredTrial, ResumeError, replay, replayable, typed_events
from ._settings import RunSettings, counts_trusted
from ._trials import Trial, TrialBook


@dataclass
class _Plan:
    """What :func:`resume` found, checked, before it writes anything."""

    info: dict[str, Any]
    policy: SearchPolicy
    settings: RunSettings
    recovered: Recovered
    retry: dict[str, dict[str, Any]]
    build_blob: bytes
    cut: DamagedLine | None
    extended: RunExtended | None


def resume(run_dir: str | os.PathLike, build: Callable[[dict], Any] | None = None, *,
           backend: str | Backend = "local", workers: int | None = None, verbose: int = 1,
           trust: bool = False, retry_failed: bool = False, epochs: int | None = None,
           metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
           time_budget: float | None = None) -> Result:
    """Finish the run in ``run_dir`` whose driver died, and return its :class:`Result`.

    The result is the one the run would have had without the crash, bitwise. A finished run
    is returned as it is. ``build`` replaces the stored, cloudpickled one (e.g. when its
    module moved, or to fix a bug); it must make the model the run trained. ``backend``/
    ``workers`` may differ from the first driver's: results do not depend on them.
    ``retry_failed=True`` runs the trials that failed (status ``failed``, e.g. because of a
    bug in ``build``) again from their last good epoch, also in a finished run, where the
    searcher's later decisions did not depend on their failure. ``epochs=N`` extends a
    grid, random or PBT run, finished or not, to ``N`` epochs: its completed trials go on
    from their last checkpoints, and the result is bitwise that of the run with ``epochs=N``
    from the start (see :mod:`._extend`; ASHA, Hyperband and TPE runs are refused, saying
    why). ``trust=True`` reads the pickled states of a run written by an older version,
    which could run code: only for run directories you trust. ``metrics_port``: serve the
    resumed run's Prometheus ``/metrics`` on that port and ``metrics_host``, as
    ``fit(metrics_port=, metrics_host=)`` does. ``time_budget``: seconds this resume may
    run, then it stops as ``fit(time_budget=)`` does, resumable again.

    Everything is checked before anything is written: a ``build`` that cannot make the
    run's model, a damaged journal line that resume cannot do without (the run goes on from
    the line before it, with a warning), a searcher that answers otherwise than the journal.

    Example:
        >>> result = cb.resume("runs/exp1")          # or: cerebro resume runs/exp1  # doctest: +SKIP
        >>> result = cb.resume("runs/exp1", fixed_build, retry_failed=True)  # doctest: +SKIP
        >>> result = cb.resume("runs/exp1", epochs=20)     # or: cerebro resume runs/exp1 --epochs 20  # doctest: +SKIP
    """
    if verbose not in (0, 1):
        raise ValueError(f"verbose={verbose!r} must be 0 (silent) or 1 (progress)")
    check_metrics_port(metrics_port, metrics_host)
    check_time_budget(time_budget)
    store = RunStore.open(run_dir, trust)
    lock = store.lock()
    try:
        plan = _plan(store, build, trust, retry_failed, epochs)
        if plan is None:
            return Result(store, build)
        backend = resolve_backend(backend, workers if workers is not None or isinstance(backend, Backend)
                                  else _recorded_workers(store, plan.info, counts_trusted(plan.info, trust)))
        reproducibility_caveat(backend)
        backend.expect_keras(plan.settings.keras_backend)
        _record(store, plan)
        settings = replace(plan.settings, metrics_port=metrics_port, metrics_host=metrics_host,
                           time_budget=time_budget)
        if time_budget is not None:
            logging.getLogger("cerebro").warning("%s", settings.budget_note())
        progress, mlflow_log = observers(store, settings, verbose, resumed=True)
        driver = Driver(plan.policy, store, backend, settings, build_blob=plan.build_blob, progress=progress,
                        take_up=lambda book: take_up(book, store, plan.recovered, plan.retry),
                        time_offset=plan.recovered.last_time)
        with interrupts_stop_the_run():
            driver.run()
    finally:
        lock.close()
    return finished(store, build, mlflow_log)


def _record(store: RunStore, plan: _Plan) -> None:
    """Write what the plan changes before the run goes on: the journal cut at a damaged line
    resume needs, the run's new epoch budget (``epochs=N``)."""
    if plan.cut is not None:
        store.emit(JournalRepaired(store.truncate_journal(plan.cut.offset), 0.0))
    if plan.extended is not None:
        store.emit(replace(plan.extended, time=plan.recovered.last_time))
        plan.info["searcher"]["epochs"] = plan.extended.epochs
        store.write_run_info(plan.info)


def _plan(store: RunStore, build: Callable[[dict], Any] | None, trust: bool, retry_failed: bool,
          epochs: int | None) -> _Plan | None:
    """Read and check everything resume needs, and replay the journal; None where the run
    finished and there is nothing to retry or extend (with a warning)."""
    info = store.read_run_info()
    events, damaged = store.read_journal()
    retry = failed_trials(events) if retry_failed else {}
    kept, cut = replayable(events, damaged)
    extended = None if epochs is None else extension(cloudpickle.loads(store.read_searcher()), typed_events(kept),
                                                     epochs)
    if has_finished(events) and not retry and extended is None:
        warnings.warn(f"run {store.path!r} has finished{' and no trial failed' if retry_failed else ''}"
                      f"{f' with epochs={epochs} already' if epochs is not None else ''}; there is nothing to "
                      f"resume, so its Result is returned as it is", stacklevel=3)
        return None
    if store.pickled_states and not trust:
        raise UntrustedStateError(store.path)
    if not store.has("build.pkl"):
        raise ResumeError(f"{store.path!r} has no build.pkl: it was not started by fit, so it cannot resume")
    _check_partitions(store, info)
    policy = cloudpickle.loads(store.read_searcher())
    if build is not None:
        check_fits_checkpoints(build, store, kept, info)
    if retry:
        retry_build = build or cloudpickle.loads(store.read_build())
        for trial_id, config in retry.items():
            check_build(retry_build, trial_id, config, info)
    policy.start(info["seed"])
    settings = RunSettings.from_run_info(info, trusted=trust)
    added = [{"event": TrialRetried.name, "trial_id": t} for t in retry]
    added += [] if extended is None else [{"event": RunExtended.name, **extended.record()}]
    try:
        recovered = replay(policy, kept + added, settings)
    except ResumeError as error:
        if not retry:
            raise
        raise ResumeError(f"cannot retry {sorted(retry)}: the searcher's later decisions depended on their "
                          f"failure ({error}); nothing was resumed") from error
    if extended is not None:
        check_extendable(store, kept, recovered, extended)
    build_blob = pickle_build(build) if build is not None else store.read_build()
    return _Plan(info, policy, settings, recovered, retry, build_blob, cut, extended)


def _check_partitions(store: RunStore, info: dict[str, Any]) -> None:
    """run.json's and data/meta.json's partition counts against the partition files the run
    wrote: anyone may have edited both files (together), and resume starts up to that many
    workers over that many partitions."""
    try:
        described = read_layout(store.data_dir).num_partitions
    except FileNotFoundError:      # deleted, so that run.json's count goes unchecked?
        raise RunInfoError(f"{files.join(store.data_dir, 'meta.json')} is missing: the run's partitions cannot be "
                           f"read, so it cannot resume") from None
    written = _partition_files(store)
    if info["data"]["partitions"] != written or described != written:
        raise RunInfoError(f"{store.file('run.json')} is damaged: its data.partitions is {info['data']['partitions']} "
                           f"and data/meta.json's {described}, but the run wrote {written} training partition files "
                           f"({files.join(store.data_dir, 'train')})")


def _partition_files(store: RunStore) -> int:
    """How many training partitions the run wrote: its files ``part-00000.parquet`` on,
    counted up to the first one missing."""
    names = set(files.listdir(files.join(store.data_dir, "train")))
    count = 0
    while f"part-{count:05d}.parquet" in names:
        count += 1
    return count


def _recorded_workers(store: RunStore, info: dict[str, Any], trusted: bool = False) -> int:
    """The workers the run had, as run.json says, where that is a number a run can have: one
    per partition at most (an edited run.json must not start a million processes), and, unless
    its count is ``trusted`` (the user's word, or the user's key signed it as the run started),
    one per core at most, as a fit starts by default: whoever can edit run.json can also plant
    as many partition files as the count needs."""
    workers, partitions = info["workers"], info["data"]["partitions"]
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= partitions:
        raise RunInfoError(f"{store.file('run.json')} is damaged: its workers={quoted(workers)} must be between 1 and "
                           f"the run's {partitions} partitions; pass workers= to resume to choose")
    cores = os.cpu_count() or 1
    if workers > cores and not trusted:
        raise RunInfoError(f"{store.file('run.json')}'s workers={workers} is more than this machine's {cores} cores, "
                           f"the most a resume starts from what a run directory says (anyone who can write it may "
                           f"have edited it); pass workers= to resume (--workers) to choose, or trust=True (--trust) "
                           f"if you made this run")
    return workers


def check_extendable(store: RunStore, events: list[dict[str, Any]], recovered: Recovered,
                     extended: RunExtended) -> None:
    """Refuse, before anything is written, to extend a run whose searcher pauses trials (PBT)
    where a reopened trial's weights of its last epoch are gone (``keep_checkpoints``): it
    could be trained again from the start only without the exploits and decisions it had."""
    pauses = any(e["event"] in (DecidedPaused.name, Exploited.name) for e in events)
    for trial_id in extended.trials:
        rt = recovered.trials[trial_id]
        kept = any(c["epoch"] == rt.epoch and not c["exploit"] for c in store.checkpoints(trial_id) if "state" in c)
        if not kept and (pauses or rt.decision is Decision.PAUSE):
            raise ResumeError(f"cannot extend: {trial_id}'s weights of epoch {rt.epoch} are gone (the run kept only "
                              f"some trials' weights, keep_checkpoints), and this searcher's trials cannot be "
                              f"trained again from the start with the same decisions; nothing was written")

def has_finished(events: list[dict[str, Any]]) -> bool:
    """Whether the run's last driver finished it."""
    ends = [e["event"] for e in events
            if e["event"] in (RunStarted.name, RunResumed.name, RunFinished.name, RunExtended.name)]
    return bool(ends) and ends[-1] == RunFinished.name


def failed_trials(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The trials whose last end is ``failed`` (not retried since), with their configs."""
    facts = Ledger().fold(map(parse_event, events)).trials
    return {trial_id: trial.config for trial_id, trial in facts.items() if trial.status is TrialStatus.FAILED}


def take_up(book: TrialBook, store: RunStore, recovered: Recovered, retry: dict[str, dict[str, Any]]) -> None:
    """Put the live trials of the crashed run into ``book``: each continues from the
    checkpoint of its last journaled epoch, or, where that checkpoint is damaged, from an
    earlier one, redoing the epochs in between silently (``Trial.catch_up``). The failed
    trials in ``retry`` are live again: the journal says so, and their error is gone."""
    for trial_id in retry:
        store.remove_error(trial_id)
        book.recorder.emit(TrialRetried(trial_id, recovered.trials[trial_id].epoch, book.recorder.now()))
    book.created = len(recovered.trials)
    book.decide_due = True
    book.retention.restore([(rt.trial_id, rt.best[1] if rt.best and not rt.status.is_failure else None)
                            for rt in recovered.trials.values() if rt.status is not None])
    actions: list[tuple[Trial, RecoveredTrial | None]] = []     # None: start its next epoch
    for rt in recovered.trials.values():
        if rt.status is not None:
            continue
        trial = Trial(rt.trial_id, rt.config, rt.max_epochs, epoch=rt.epoch, best=rt.best,
                      improved_at=rt.improved_at, stop_epoch=rt.stop_epoch)
        book.adopt(trial)
        if rt.epoch == 0:            # a warm start's state is its epoch-0 checkpoint
            warm = [c for c in store.checkpoints(trial.trial_id) if "state" in c and c["epoch"] == 0]
            trial.hold(*((book.shelf.put(warm[0]["state"]), 1) if warm else (None, 0)))
            actions.append((trial, None))
            continue
        exploited = rt.exploited_at == rt.epoch
        found = [c for c in store.checkpoints(trial.trial_id) if "state" in c]
        exact = [c for c in found if c["epoch"] == rt.epoch and c["exploit"] == exploited]
        earlier = [c for c in found if c["epoch"] < rt.epoch and not c["exploit"]]
        if exact:
            trial.hold(book.shelf.put(exact[0]["state"]), 1)
            actions.append((trial, rt))
            continue
        if exploited or rt.exploited_at is not None:
            raise ResumeError(f"the checkpoint of {trial.trial_id} after its PBT exploit at epoch "
                              f"{rt.exploited_at} is damaged or missing: {store.checkpoints(trial.trial_id)}")
        # Roll back to an earlier good checkpoint (or the start) and redo the journaled epochs.
        if earlier:
            trial.hold(book.shelf.put(earlier[0]["state"]), 1)
            trial.epoch = earlier[0]["epoch"]
        else:
            trial.hold(None, 0)
            trial.epoch = 0
        trial.catch_up, trial.recovered = rt.epoch, rt
        checkpoints = [f"{c['path']}: {c['problem']}" if "problem" in c else c["epoch"]
                       for c in store.checkpoints(trial.trial_id)]
        book.recorder.emit(TrialRolledBack(trial.trial_id, rt.epoch, trial.epoch, checkpoints, book.recorder.now()))
        actions.append((trial, None))
    for trial, _ in actions:      # a schedule on a metric steps on the epoch before's (see Trial)
        metrics = recovered.trials[trial.trial_id].epoch_metrics.get(trial.epoch)
        trial.last_metrics = None if metrics is None else (trial.epoch, metrics)
    for trial, journaled in actions:
        if journaled is None:
            book.start_epoch(trial)
        else:
            book.carry_on(trial, journaled)
    book.carry_out({rt.trial_id: rt.pending for rt in recovered.trials.values()
                    if rt.status is None and rt.pending is not None})
    for request in recovered.unstarted:
        book.create(request)


def check_fits_checkpoints(build: Callable[[dict], Any], store: RunStore, events: list[dict[str, Any]],
                           info: dict[str, Any]) -> None:
    """Refuse, before any work, a ``build`` whose model cannot load the run's checkpoints
    (another architecture) or does not log the run's metric: every trial would fail, or
    the run could not rank them, and the run would be lost."""
    for event in map(parse_event, events):
        if not isinstance(event, TrialCreated):
            continue
        saved = next((c["state"]["model"] for c in store.checkpoints(event.trial_id) if "state" in c), None)
        if saved is None:
            continue
        trainable = check_build(build, event.trial_id, event.config, info)
        made = trainable.weight_shapes()
        kept = {name: tuple(tensor.shape) for name, tensor in saved.items()}
        if made != kept:
            name = next(n for n in sorted({*made, *kept}) if made.get(n) != kept.get(n))
            raise ResumeError(f"build does not make the model this run trained: {event.trial_id}'s checkpoint "
                              f"has {name} of shape {kept.get(name, 'none')}, build(config) makes "
                              f"{made.get(name, 'none')}; resume with the run's own build (or none: the stored "
                              f"one); nothing was resumed")
        return


def check_build(build: Callable[[dict], Any], trial_id: str, config: dict[str, Any], info: dict[str, Any]) -> Any:
    """``build(config)``'s trainable, made without memory where it can be (torch's meta device), once it
    is known to log the run's metric; else a :class:`ResumeError`."""
    try:
        trainable = build_cheaply(build, config)
        check_metric(trainable, info["searcher"]["metric"], sum(info["data"]["val_rows"]) > 0)
    except Exception as error:
        raise ResumeError(f"build does not fit this run: for {trial_id}'s config {config}, "
                          f"{type(error).__name__}: {error}; nothing was resumed") from error
    return trainable
