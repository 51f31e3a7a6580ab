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
    >>> boxes.unneeded(lambda trial_id: {4})
    [(1, 't0000', 3)]
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from ..store import SubEpochAborted
from ..worker._protocol import Forget, StateMissing, SubEpochDone
from ._scheduler import TRAIN, Task
from ._shelf import Stored
from ._trial import Evaluation, Phase, Trial

if TYPE_CHECKING:     # the driver's parts, which this mixin's methods use through ``self``
    from ..store import RunStore
    from ._pool import Worker, WorkerPool
    from ._scheduler import MOPScheduler
    from ._trials import TrialBook
    from ._writer import StoreRecorder


class Outboxes:
    """What each worker's outbox holds, as the driver knows it."""

    # A run of thousands of live trials holds a state of each: looking at all of them on every
    # turn of the driver made its cost grow with the trials. So :meth:`due` says to look once
    # this many states were put in per state held: each look is paid for by 1/64th of the
    # states, and at most that share more than are needed wait in the outboxes meanwhile.
    LOOK_EVERY = 64

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], set[int]] = {}     # (trial, version) -> workers
        self._put_since_look = 0

    def __len__(self) -> int:
        """States held in any outbox, as the driver knows."""
        return len(self._held)

    def put(self, worker: int, trial_id: str, version: int) -> None:
        """``worker`` trained ``trial_id`` to ``version``: its outbox holds it now."""
        self._held.setdefault((trial_id, version), set()).add(worker)
        self._put_since_look += 1

    def due(self) -> bool:
        """Whether enough states were put in since the last :meth:`unneeded` to look again."""
        return self._put_since_look * self.LOOK_EVERY >= len(self._held)

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

    def unneeded(self, needed: Callable[[str], Collection[int]]) -> list[tuple[int, str, int]]:
        """The states held that no live trial needs (``needed(trial)``: the versions it may
        still use), as (worker, trial, version); forgotten here, for the driver to tell them."""
        self._put_since_look = 0
        versions: dict[str, Collection[int]] = {}       # asked once a trial
        gone: list[tuple[int, str, int]] = []
        for (trial_id, version), workers in self._held.items():
            if trial_id not in versions:
                versions[trial_id] = needed(trial_id)
            if version not in versions[trial_id]:
                gone.extend((worker, trial_id, version) for worker in workers)
        gone.sort()
        for worker, trial_id, version in gone:
            self.drop(worker, trial_id, version)
        return gone


class DirectHops:
    """The driver's part in direct hops (mixed into :class:`._driver.Driver`): what each
    outbox holds after an answer, which states no live trial needs, which trials lost their
    latest state with a worker, where a state a worker could not fetch is now, and the
    fall-back to hops through the driver."""

    pool: WorkerPool
    book: TrialBook
    outboxes: Outboxes
    direct: bool
    store: RunStore
    scheduler: MOPScheduler
    recorder: StoreRecorder
    # The driver's own steps that these call (see :class:`._driver.Driver`).
    _handle_pool_events: Callable[[], None]
    _send_task: Callable[[Worker, int, Task, Trial], None]

    def _unreachable(self, worker: Worker, peer: int, why: str) -> None:
        """``worker`` could not reach ``peer``. Where ``peer`` is alive, the workers cannot
        reach each other: from now on every hop goes through the driver."""
        self.pool.check_health()
        self._handle_pool_events()
        if peer in self.pool.workers and self.direct:
            self.direct = False
            logging.getLogger("cerebro").warning(
                "%s could not fetch a state from worker %d (%s): the workers cannot reach each other, so "
                "every hop goes through the driver from now on (set the backend's hops=\"driver\" to start "
                "so)", worker.describe(), peer, why)

    def _blame_peer(self, worker: Worker, peer: int, trial_id: str, version: int, why: str) -> str:
        """``peer`` sent ``worker`` a state that is not the model's (``why``): a worker with a bug,
        or worse. The trial is not to blame: its state is taken from elsewhere, or recomputed
        from the last checkpoint. No state is fetched from a peer again (as where the workers
        cannot reach each other), so a peer that goes on sending such states cannot make the
        run recompute forever. Returns the reason, naming the peer."""
        blamed = self.pool.workers[peer].describe() if peer in self.pool.workers else f"worker {peer}"
        reason = f"{blamed} sent {trial_id}'s state {version}, which is not its model's: {why}"
        if peer in self.pool.workers:       # that copy is of no use to anyone
            self.pool.send(self.pool.workers[peer], Forget(trial_id, version))
        self.pool.check_health()
        self._handle_pool_events()
        if self.direct:
            self.direct = False
            logging.getLogger("cerebro").warning(
                "%s refused a state: %s. Every hop goes through the driver from now on; that state is taken "
                "from elsewhere or recomputed from the last checkpoint", worker.describe(), reason)
        return reason

    def _available(self, trial: Trial, holding: Trial | Evaluation) -> bool:
        """Whether any worker could get ``holding``'s state: built anew, from the driver, or
        from a live peer's outbox (a worker's own cache serves only that worker)."""
        return (holding.version == 0 or holding.held_state() is not None
                or (self.direct and self.outboxes.where(trial.trial_id, holding.version) is not None))

    def _recover_states(self, reason: str) -> None:
        """Each trial not training now whose latest state is nowhere (its holder was lost)
        goes back to the driver's copy (:meth:`TrialBook.rewind`)."""
        running = {w.running.task.trial_id for w in self.pool.workers.values()
                   if w.running is not None and w.running.task.kind == TRAIN}
        for trial in list(self.book.live.values()):
            if trial.trial_id not in running and trial.phase is Phase.TRAINING and not self._available(trial, trial):
                self.book.rewind(trial, reason)

    def _forget_unneeded(self) -> None:
        """Tell each worker which states in its outbox no live trial needs any more."""
        if not self.outboxes:       # hops through the driver: nothing to look at on each turn
            return
        if not self.outboxes.due():
            return

        def needed(trial_id: str) -> set[int]:
            trial = self.book.live.get(trial_id)
            return set() if trial is None else {holding.version for holding in trial.holdings()}
        for index, trial_id, version in self.outboxes.unneeded(needed):
            if index in self.pool.workers:
                self.pool.send(self.pool.workers[index], Forget(trial_id, version))

    def _take_outbox(self, worker: Worker, task: Task, trial: Trial, done: SubEpochDone) -> None:
        """What ``worker``'s outbox holds after ``done``: the state it trained (a trial trains
        in one place at a time, so from ``trial.version``), and no longer what it handed back."""
        self.pool.bytes_between_workers += done.fetched_bytes
        for back in done.handed_back:
            self.outboxes.drop(worker.index, back.trial_id, back.version)
            self.book.handed_back(back.trial_id, back.version, back.state)
        if task.kind == TRAIN and worker.peer is not None:
            self.outboxes.put(worker.index, trial.trial_id, trial.version + 1)

    def _state_of(self, worker: Worker, task_id: int, task: Task, done: SubEpochDone) -> Any:
        """The state ``done`` hands the driver: none, the one it sent, or (at an epoch's end)
        the file the worker wrote it to in the store, of which the driver keeps the name."""
        if done.store_error is not None:   # it sent the state instead: warned once per worker and cause
            warnings.warn(f"{worker.describe()} could not write a state to the store {self.store.path} "
                          f"({done.store_error}): it sends the states to the driver, which writes the "
                          f"checkpoints. Make the store writable by every worker (docs/spark.md)",
                          RuntimeWarning, stacklevel=2)
        if not done.stored:
            return done.state
        return Stored(self.store, self.recorder.staged_state(task.trial_id, task_id), task.trial_id, task.epoch)

    def _resend_with_state(self, worker: Worker, missing: StateMissing) -> None:
        """``worker`` did not have, or could not fetch, the state its task needs: send the task
        again from where the state is now; where it is nowhere, the trial goes back (see
        :meth:`_recover_states`) and the task is to run again."""
        running = worker.running
        assert running is not None, f"{worker.describe()} answered for a task it was not running (a bug)"
        task = running.task
        trial = self.book.live.get(task.trial_id)
        if trial is None:      # it ended meanwhile: nothing left to run
            worker.running = None
            return
        source, peer = trial.evaluations.get(task.epoch, trial), running.fetch_from
        why = missing.unreachable or "not there"
        if peer is not None:   # it no longer holds that state, sent a wrong one, or cannot be reached
            self.outboxes.drop(peer, trial.trial_id, source.version)
            if missing.refused is not None:
                why = self._blame_peer(worker, peer, trial.trial_id, source.version, missing.refused)
            elif missing.unreachable is not None:
                self._unreachable(worker, peer, missing.unreachable)
            if self.pool.workers.get(worker.index) is not worker or worker.running is None:
                return     # lost meanwhile: its task runs again elsewhere
            if not self.direct:    # the states only outboxes hold are out of reach now: recomputed
                self._recover_states(f"{worker.describe()} could not fetch a state: {why}")
        for holding in trial.holdings():
            holding.holders.discard(worker.index)
        if task.partition not in self.scheduler.partitions_of(worker.index) or not self._available(trial, source):
            # A replacement took the partition back meanwhile, or the state is lost: it runs again.
            self.scheduler.abort(task)
            worker.running = None
            self.recorder.emit(task.told(SubEpochAborted))
            self._recover_states(f"{worker.describe()} could not fetch it: {why}")
            return
        self._send_task(worker, running.task_id, task, trial)
