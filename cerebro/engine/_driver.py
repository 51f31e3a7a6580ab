"""The driver loop: says which sub-epoch runs where, and where its state comes from.

It starts the workers (:class:`WorkerPool`), then repeats: ask the scheduler what runs
next, send those sub-epochs to idle workers (each naming where its trial's state is: the
worker itself, a peer's outbox with direct hops, or the state the driver sends along), take
back results and hand them to the trial book (:class:`TrialBook`: epoch ends, the
searcher's decisions), and act on the workers the pool lost or regained. Every event goes to
the journal as it happens.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from ..backends import Backend, Hops
from ..data import PartitionFileError
from ..observe import Progress
from ..store import (
    PartitionsMoved,
    RunFailed,
    RunFinished,
    RunInterrupted,
    RunResumed,
    RunStarted,
    RunStore,
    StopCause,
    SubEpoch,
    SubEpochAborted,
    SubEpochStarted,
    Traffic,
    TrialStatus,
    WorkerProgress,
    WorkerReplaced,
    WorkersRestarted,
)
from ..worker._exact import ExactMetrics
from ..worker._protocol import Heartbeat, RunSubEpoch, SetupFailed, StateMissing, SubEpochDone, SubEpochFailed
from ._control import answer, obey, stop_asked, take_commands
from ._errors import InterruptedRun, WorkerLostError
from ._hangs import HangWatch, Running
from ._interface import SearchPolicy
from ._interrupts import raise_if_interrupted
from ._outboxes import DirectHops, Outboxes
from ._pool import Joined, Lost, Worker, WorkerPool
from ._scheduler import TRAIN, MOPScheduler, Task
from ._seeds import init_seed, subepoch_seed
from ._settings import RunSettings
from ._shelf import StateShelf
from ._trial import Trial
from ._trials import TrialBook
from ._writer import StoreRecorder

RESIDENT_STATES_PER_WORKER = 1     # the driver's states in memory: the rest wait on local disk
COMMANDS_EVERY = 0.05              # seconds between looks at the run directory for commands and stop
QUEUED_CHECKPOINTS_PER_WORKER = 2  # then the driver waits for a slow store (back-pressure)


class Driver(DirectHops):
    """Runs one model selection with MOP; see :func:`cerebro.engine.execute` for its setup.

    ``take_up(book)``, given on resume, adds the trials of the run before its crash.
    """

    def __init__(self, policy: SearchPolicy, store: RunStore, backend: Backend, settings: RunSettings, *,
                 build_blob: bytes, progress: Progress, take_up: Callable[[TrialBook], None] | None = None,
                 time_offset: float = 0.0) -> None:
        """Nothing starts yet (:meth:`run` does); ``progress`` observes every event of the run."""
        self.store, self.backend, self.settings, self.progress = store, backend, settings, progress
        self._take_up, self._time_offset = take_up, time_offset
        self._t0 = time.monotonic()
        self.recorder = StoreRecorder(store, self._now, progress,
                                      max_checkpoints_queued=QUEUED_CHECKPOINTS_PER_WORKER * backend.workers)
        self.pool = WorkerPool(backend, settings, store, build_blob, self.recorder.emit, self._now)
        self.scheduler = MOPScheduler({w: self.pool.partitions_of(w) for w in range(backend.workers)},
                                      evaluate=settings.evaluate)
        # A few states per worker in memory, the rest on local disk: the driver's memory
        # stays flat in the number of trials.
        self.book = TrialBook(policy, self.scheduler, settings, self.recorder, ExactMetrics(build_blob),
                              StateShelf(resident=RESIDENT_STATES_PER_WORKER * backend.workers))
        self._restarts = 0
        self._next_task_id = 0
        self._traffic = (0, 0, 0)
        self.hangs = HangWatch(settings.limits.hang_after)
        self.outboxes = Outboxes()
        self._refused: set[str] = set()    # entries of commands/ (and stop) not Cerebro's, warned of once
        self._commands_due = 0.0           # when _check_stop looks at the run directory next
        self.direct = backend.hops is Hops.DIRECT      # until the workers turn out not to reach each other
        self._stop_cause: StopCause | None = None     # what drained the run, journaled as it stops

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def run(self) -> None:
        """Drive the run to its end; on any error stop the workers and leave it resumable."""
        try:
            self.store.clear_staged(recreate=True)   # what a worker wrote before a crash: its epoch runs again
            self.pool.open()
            self._t0 = time.monotonic() - self._time_offset
            started = RunStarted if self._take_up is None else RunResumed
            self.recorder.emit(started(self.pool.info(), self._now(), self._t0))
            self.progress.start(self.store.path, self.backend.workers)
            if self._take_up is not None:
                self._take_up(self.book)
            self.book.apply_decisions()
            self.book.add_trials()
            while (self.book.live or self._busy()) and not (self.book.drained() and not self._busy()):
                self._step()
                if not self.book.live and not self._busy():
                    self._check_stop(now=True)           # a trial added at the very end still runs
            stopped = bool(self.book.live)      # drained: at epoch boundaries, resumable
            self.book.write_search_state(now=True)
            self.recorder.emit(RunInterrupted(self._now(), self._stop_cause) if stopped
                               else RunFinished(self._now(), *self.pool.traffic()))
        except BaseException as error:
            interrupted = isinstance(error, KeyboardInterrupt)
            if interrupted:    # Ctrl-C or SIGTERM: leave it resumable
                self.recorder.emit(RunInterrupted(self._now(), StopCause.INTERRUPT))
            else:              # journaled for `cerebro status`, also before the first trial
                with contextlib.suppress(Exception):     # a store that fails: the error on its way says so
                    self.recorder.emit(RunFailed(f"{type(error).__name__}: {error}", self._now()))
            self.pool.close("interrupted" if interrupted else "failed", self.progress.finish)
            self._close_writes(failed=True)
            if interrupted and not isinstance(error, InterruptedRun):
                raise InterruptedRun(self.recorder.path) from error
            raise
        self.pool.close("interrupted" if stopped else "finished", self.progress.finish)
        self._close_writes()

    def _close_writes(self, failed: bool = False) -> None:
        """Finish the store's writes, raising the first one's error (unless the run ``failed``:
        the error on its way is the one to report); drop the states shelved or staged."""
        try:
            self.recorder.close()
        except RuntimeError:
            if not failed:
                raise
        finally:
            self.book.shelf.close()
            # Checkpoints are other names of those files. A bad store may be why the run ends:
            with contextlib.suppress(Exception):     # its error is the one to see
                self.store.clear_staged()

    def _busy(self) -> bool:
        return any(w.running for w in self.pool.workers.values())

    def _step(self) -> None:
        """One turn of the loop: start what can start, take what the workers answered (for
        up to a heartbeat interval), act on lost and regained workers, then let the searcher
        decide and add trials."""
        self._check_stop()
        self._dispatch()
        self.book.check_not_stuck(self._busy())
        for worker, message in self.pool.poll(self.settings.heartbeat_interval):
            self._handle_pool_events()
            if self.pool.workers.get(worker.index) is not worker:
                continue                               # lost meanwhile
            if isinstance(message, StateMissing):
                self._resend_with_state(worker, message)
            elif isinstance(message, (SubEpochDone, SubEpochFailed)):
                self._finish_task(worker, message)
            elif isinstance(message, Heartbeat):
                if worker.running is not None and message.task_id == worker.running.task_id:
                    self.hangs.heard(worker.running, message.batches, self._now())
                    self.recorder.emit(WorkerProgress(worker.index, worker.running.task.trial_id, message.batches,
                                                      message.total))
            elif isinstance(message, SetupFailed):      # it could not load partitions it took over
                self.pool.lose(worker, f"could not load the partitions it took over: "
                                       f"{message.error.strip().splitlines()[-1]}")
        self._handle_pool_events()
        if self.pool.traffic() != self._traffic:     # told to the observers as it changes
            self._traffic = self.pool.traffic()
            self.recorder.emit(Traffic(*self._traffic))
        self._check_health()
        self.pool.admit()
        self._handle_pool_events()
        self.book.apply_decisions()
        self.book.add_trials()
        self._forget_unneeded()

    def _check_stop(self, now: bool = False) -> None:
        """Past ``time_budget``, or asked by ``cb.stop`` (a ``stop`` file), the run stops at its
        trials' next epoch boundaries; waiting commands (``cb.stop(run_dir, trial=...)``,
        ``cb.add_trial``) are carried out; a swallowed Ctrl-C or SIGTERM is raised. The run
        directory is read every :data:`COMMANDS_EVERY` s (``now``: at once, as the run ends):
        read on every turn, it cost a run of thousands of short trials ~2 ms a trial."""
        raise_if_interrupted()
        if not now and time.monotonic() < self._commands_due:
            self._check_budget()
            return
        self._commands_due = time.monotonic() + COMMANDS_EVERY
        for name, command in take_commands(self.store, self._refused):
            reply = obey(self.book, command)
            if reply is not None:       # answered once what it did is journaled: never told of what is lost
                self.recorder.then(answer, self.store, name, reply)
        if not self._check_budget() and stop_asked(self.store, self._refused):
            self._drain("cerebro stop asked it to", StopCause.STOP)

    def _check_budget(self) -> bool:
        """Past ``time_budget`` (this driver's time: a resume's own), drain; whether draining."""
        budget = self.settings.time_budget
        if not self.book.draining and budget is not None and self._now() - self._time_offset >= budget:
            self._drain(f"its time_budget of {budget:g} s has passed", StopCause.BUDGET)
        return self.book.draining

    def _drain(self, why: str, cause: StopCause) -> None:
        self._stop_cause, self.book.draining = cause, True
        logging.getLogger("cerebro").warning("the run stops at its trials' next epoch boundaries (%s); "
                                             "cerebro resume %s goes on", why, self.store.path)

    # --- sub-epochs ---------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Send every sub-epoch the scheduler assigns to the idle workers."""
        idle = [w.index for w in self.pool.workers.values() if w.running is None]
        tasks = self.scheduler.assign(idle)
        for task in tasks:   # all marked running first: a failed send then aborts every one
            task_id, self._next_task_id = self._next_task_id, self._next_task_id + 1
            self.pool.workers[task.worker].running = Running(task_id, task, self._now())
            self.recorder.emit(task.told(SubEpochStarted))
        for task in tasks:
            worker = self.pool.workers.get(task.worker)
            if worker is not None and worker.running is not None:     # not lost, nor aborted, meanwhile
                self._send_task(worker, worker.running.task_id, task, self.book.live[task.trial_id])
        if not tasks and idle and not self._busy() and (waiting := self.scheduler.unfinished()):
            # Every partition's holder is idle, so any waiting sub-epoch could start: a
            # lost step, which would leave the run waiting forever. Stop, resumable, instead.
            raise RuntimeError(f"the sub-epochs of {waiting} can start on none of the idle workers "
                               f"{sorted(idle)}: the scheduler lost track of them (a bug); the run stopped "
                               f"and can be resumed from {self.store.path}")
        self._handle_pool_events()

    def _send_task(self, worker: Worker, task_id: int, task: Task, trial: Trial) -> None:
        """Send ``task`` with where its state is: nothing where the worker already holds this
        version (an eval visit of an earlier epoch takes the state that epoch's training left),
        else the peer whose outbox holds it (direct hops), else the driver's copy."""
        source, running = trial.evaluations.get(task.epoch, trial), worker.running
        assert running is not None, f"{worker.describe()} was sent a task it does not run (a bug)"
        state = fetch = running.fetch_from = None
        if worker.index not in source.holders and source.version > 0:
            peer = self.outboxes.where(trial.trial_id, source.version) if self.direct else None
            if peer is not None and peer in self.pool.workers:
                fetch, running.fetch_from = self.pool.workers[peer].peer, peer
            else:
                shelved = source.held_state()
                assert shelved is not None, f"{trial.trial_id}'s state {source.version} is nowhere (a bug)"
                state = shelved.get()
        seed, last = self.settings.seed, self.direct and self.scheduler.last_visit(task)
        sent = self.pool.send(worker, RunSubEpoch(
            task_id, trial.trial_id, trial.config, task.kind, task.epoch, task.partition,
            init_seed(seed, trial.trial_id), subepoch_seed(seed, trial.trial_id, task.epoch, task.partition),
            source.version, state, trial.retune and task.kind == TRAIN,
            self.settings.limits.trial_timeout, trial.metrics_before(task.epoch) if task.kind == TRAIN else None, fetch,
            # Direct hops: at its epoch's end the worker writes the state to the store, for the
            # checkpoint; the driver holds the file's name (see _outboxes.DirectHops._state_of).
            not self.direct or last,
            self.recorder.staged_state(trial.trial_id, task_id) if last and task.kind == TRAIN else None))
        if sent:     # a worker holds one version of a trial: this one
            for holding in trial.holdings():
                if holding.version == source.version:
                    holding.holders.add(worker.index)
                else:
                    holding.holders.discard(worker.index)

    def _finish_task(self, worker: Worker, message: SubEpochDone | SubEpochFailed) -> None:
        """Journal ``worker``'s finished sub-epoch and hand its result to the trial book; a
        failed one ends its trial (failed, or timeout)."""
        running = worker.running
        assert running is not None, f"{worker.describe()} finished a task it was not running (a bug)"
        task_id, task, start = running.task_id, running.task, running.started
        assert message.task_id == task_id, f"{worker.describe()} answered task {message.task_id}, not {task_id}"
        worker.running = None
        self.recorder.emit(SubEpoch(task.trial_id, task.epoch, task.partition, worker.index, task.kind, start,
                                    self._now(), getattr(message, "compute_seconds", None)))
        # Their next task on this worker carries the state again.
        self.book.forget_holders(worker.index, getattr(message, "evicted", ()))
        trial = self.book.live.get(task.trial_id)
        if trial is None:      # an eval visit of a trial that ended meanwhile
            return
        if isinstance(message, SubEpochDone):
            self._take_outbox(worker, task, trial, message)
            self.book.sub_epoch_done(task, worker.index, message.sums, self._state_of(worker, task_id, task, message),
                                     message.learning_rate, message.epoch_metric)
            if not self.direct and message.state is None and task.kind == TRAIN:
                # Sent before the run fell back to hops through the driver: its state is where
                # the others cannot fetch it.
                self._recover_states(f"{worker.describe()} sent its state before the run fell back to hops "
                                     f"through the driver")
        elif message.data_error is not None:
            raise PartitionFileError(f"{worker.describe()}: {message.data_error}")
        elif message.timed_out:
            self.book.end(trial, TrialStatus.TIMEOUT, f"its {task.kind} sub-epoch of epoch {task.epoch} on "
                                                      f"partition {task.partition} took more than trial_timeout="
                                                      f"{self.settings.limits.trial_timeout} s", task.epoch)
        else:
            self.book.end(trial, TrialStatus.FAILED, message.error, task.epoch)

    # --- workers lost and regained ------------------------------------------------------
    def _check_health(self) -> None:
        """Act on workers that exited, went silent, or are stuck in a sub-epoch: past
        ``trial_timeout`` (the worker checks it between batches; one still running
        ``heartbeat_timeout`` seconds past it is inside a batch that does not end), or with
        no new batch for longer than :mod:`._hangs` allows."""
        self.pool.check_health()
        timeout, now = self.settings.limits.trial_timeout, self._now()
        for worker in list(self.pool.workers.values()):
            running = worker.running
            if running is None:
                continue
            if timeout is not None and now - running.started > timeout + self.pool.heartbeat_timeout:
                task = running.task
                self._stuck(worker, f"its {task.kind} sub-epoch of epoch {task.epoch} on partition "
                                    f"{task.partition} ran past trial_timeout={timeout} s and "
                                    f"{self.pool.heartbeat_timeout:.0f} s more inside one batch; its worker "
                                    f"was given up")
            elif (why := self.hangs.hangs(running, now)) is not None:
                self._stuck(worker, why)

    def _stuck(self, worker: Worker, why: str) -> None:
        """``worker`` is inside a batch that does not end: its trial ends as ``timeout``
        (``why``) and the worker, which cannot be interrupted, is given up."""
        assert worker.running is not None, f"{worker.describe()} is stuck running nothing (a bug)"
        task = worker.running.task
        trial = self.book.live.get(task.trial_id)
        if trial is not None:
            self.book.end(trial, TrialStatus.TIMEOUT, why, task.epoch)
        self.pool.lose(worker, f"was stuck in a batch of {task.trial_id}")

    def _handle_pool_events(self) -> None:
        while events := self.pool.events():
            # Every lost worker's sub-epoch is to run again, also where a restart makes the
            # events after it moot: workers lost together (a stalled driver, a dead machine)
            # arrive in one batch.
            lost = [event for event in events if isinstance(event, Lost)]
            cause_removed = any([self._abort_running(event) for event in lost])
            for event in events:
                if isinstance(event, Joined):
                    self._rejoined(event)
                elif self._hand_over(event, cause_removed):
                    break     # every worker is new: the other events are about the old ones
            if lost:
                self._recover_states("; ".join(f"{e.worker.describe()} {e.reason}" for e in lost))

    def _abort_running(self, lost: Lost) -> bool:
        """The sub-epoch ``lost.worker`` was running is to run again; True where that loss
        failed the trial (see :meth:`TrialBook.worker_lost`)."""
        worker, cause_removed = lost.worker, False
        if worker.running is not None:
            task = worker.running.task
            self.recorder.emit(task.told(SubEpochAborted))
            cause_removed = self.book.worker_lost(task, f"{worker.describe()} {lost.reason}")
            worker.running = None
        self.book.forget_holders(worker.index)
        self.outboxes.lose(worker.index)
        return cause_removed

    def _hand_over(self, lost: Lost, cause_removed: bool) -> bool:
        """The surviving workers load a lost worker's partitions from the store (its aborted
        sub-epoch runs again from the state it started from, with the same seeds, so the
        results do not change: invariant 2). Where no worker is left, every worker starts
        anew instead: returns True. ``cause_removed``: see :meth:`_no_worker_left`."""
        worker = lost.worker
        if not self.pool.workers:
            self._no_worker_left(f"{worker.describe()} {lost.reason}", cause_removed)
            return True
        moved = self.pool.spread(self.scheduler.partitions_of(worker.index))
        for target, partitions in moved.items():
            for partition in partitions:
                self.scheduler.move(partition, target)
        self.recorder.emit(PartitionsMoved(worker.index, lost.reason, {str(t): p for t, p in moved.items()},
                                           self._now()))
        self.pool.hand_over(worker, moved)
        return False

    def _rejoined(self, joined: Joined) -> None:
        for partition in joined.worker.partitions:
            self.scheduler.move(partition, joined.worker.index)
        self.recorder.emit(WorkerReplaced(joined.worker.index, self.pool.info(), self._now()))

    def _no_worker_left(self, last: str, cause_removed: bool) -> None:
        """Start every worker anew if allowed. A restart after the trial that took the workers
        down has failed (``cause_removed``) does not count against ``max_restarts``: that
        budget is for losses the run cannot blame on a trial."""
        if not cause_removed and self._restarts >= self.backend.max_restarts:
            raise WorkerLostError(f"{last}; no worker is left and the backend may not start more "
                                  f"(max_restarts={self.backend.max_restarts}). "
                                  f"Its journal and checkpoints are in {self.store.path}")
        # Running sub-epochs run again from the states they started from, with the same
        # seeds, so the results do not change (invariant 2).
        self._restarts += not cause_removed
        self.book.forget_holders()
        self.outboxes.lose()
        for task in self.pool.restart():
            self.recorder.emit(task.told(SubEpochAborted))
            self.scheduler.abort(task)
        for index in range(self.backend.workers):     # a new launch holds them as at the start
            for partition in self.pool.partitions_of(index):
                self.scheduler.move(partition, index)
        self.recorder.emit(WorkersRestarted(last, self._restarts, self.pool.info(), self._now()))

