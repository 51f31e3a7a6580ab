"""The driver loop: owns every trial's latest state and moves it from worker to worker.

It starts the workers through a backend, hands each its partitions, then repeats: ask the
scheduler what runs next, send those sub-epochs (with the trial's state) to idle workers,
take back results, and at each trial's epoch end write metrics and a checkpoint and ask the
searcher whether the trial goes on. Every event goes to the journal as it happens.
"""
from __future__ import annotations

import math
import queue
import secrets
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

from ..backends import Backend
from ..report import Progress
from ..store import RunStore
from ..worker import Sums
from ..worker._protocol import (
    Hello,
    Ready,
    Release,
    RunSubEpoch,
    Setup,
    SetupFailed,
    Shutdown,
    StateMissing,
    SubEpochDone,
    SubEpochFailed,
    TakeOver,
)
from ..worker._wire import Channel, authenticate
from ._interface import Decision, Exploit, SearchPolicy, TrialRequest
from ._scheduler import TRAIN, MOPScheduler, Task
from ._seeds import init_seed, subepoch_seed, trial_name
from ._visit_order import VisitScheme, visit_order
from ._writer import BackgroundWriter

if TYPE_CHECKING:
    from ._resume import Recovered, RecoveredTrial

MAX_WORKERS_LOST_PER_TRIAL = 2


@dataclass(frozen=True)
class Limits:
    """How long a sub-epoch may take, and how many trials may fail before the run stops."""

    trial_timeout: float | None = None
    max_failures: int | None = None

    def __post_init__(self) -> None:
        timeout = self.trial_timeout
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 < timeout < math.inf):
            raise ValueError(f"trial_timeout={timeout!r} must be a positive number of seconds or None")
        failures = self.max_failures
        if failures is not None and (isinstance(failures, bool) or not isinstance(failures, int) or failures < 0):
            raise ValueError(f"max_failures={failures!r} must be an integer >= 0 or None")


class TooManyFailuresError(RuntimeError):
    """More trials failed than ``max_failures`` allows; the run stopped."""


class WorkerLostError(RuntimeError):
    """A worker process ended or stopped answering; the run cannot go on without it."""


class _Restart(Exception):
    """Workers were lost and the backend may start them again (``Backend.max_restarts``)."""


class _WorkerGone(Exception):
    """One worker is lost while others live: they take over its partitions."""

    def __init__(self, worker: _Worker, reason: str) -> None:
        super().__init__(reason)
        self.worker, self.reason = worker, reason


@dataclass
class _Trial:
    trial_id: str
    config: dict
    max_epochs: int
    epoch: int = 0
    state: object = None          # packed, as it came from the worker
    version: int = 0              # train sub-epochs the state has seen
    holders: set[int] = field(default_factory=set)         # workers holding this version
    paused: bool = False          # waits for the searcher's decide()
    retune: bool = False          # config changed (PBT): optimizer hyperparameters from build(config)
    lost_with: list[str] = field(default_factory=list)      # workers lost while running it
    catch_up: int = 0             # resume: epochs up to this one ran before the crash; redo them silently
    then: Callable[[], None] | None = None    # resume: what to do once caught up
    train_sums: dict[int, Sums] = field(default_factory=dict)   # this epoch's, by partition
    eval_sums: dict[int, Sums] = field(default_factory=dict)


@dataclass
class _Worker:
    index: int
    channel: Channel
    pid: int
    host: str
    partitions: list[int]
    last_seen: float
    launched_by: str = ""
    device: str = "?"
    running: tuple[int, Task, float] | None = None   # (task id, task, start)

    def describe(self) -> str:
        return f"worker {self.index} (pid {self.pid} on {self.host})"


class Driver:
    """Runs one model selection with MOP; see :func:`cerebro.engine.execute` for its setup."""

    def __init__(self, policy: SearchPolicy, store: RunStore, backend: Backend, *, seed: int,
                 num_partitions: int, evaluate: bool, build_blob: bytes, progress: Progress,
                 limits: Limits = Limits(), visit_scheme: VisitScheme = VisitScheme.LATIN,
                 heartbeat_interval: float = 1.0, startup_timeout: float = 300.0) -> None:
        self.policy, self.store, self.backend = policy, store, backend
        self.seed, self.num_partitions, self.evaluate = seed, num_partitions, evaluate
        self.build_blob, self.progress = build_blob, progress
        self.heartbeat_interval, self.heartbeat_timeout = heartbeat_interval, backend.heartbeat_timeout
        self.startup_timeout = startup_timeout
        self.limits, self.visit_scheme = limits, visit_scheme
        self._failed: list[str] = []
        self._workers: dict[int, _Worker] = {}
        self._trials: dict[str, _Trial] = {}       # live trials
        self._created = 0
        self._restarts = 0
        self._cause_removed = False      # the last loss failed the trial that caused it
        self._replaced: dict[int, int] = {}        # worker index -> times started anew
        self._joining: dict[int, float] = {}       # replacement started -> deadline to be ready
        self._arriving: dict[int, _Worker] = {}    # replacement connected, loading its partitions
        self._accepted: queue.Queue[tuple[bytes, Channel]] = queue.Queue()
        self._bytes_sent = self._bytes_received = 0   # of the channels of workers since replaced
        self._training = False        # workers lost while training may be relaunched; at start-up not
        self._authkey = b""
        self._suggest_due = True
        self._decide_due = False
        self._next_task_id = 0
        self._t0 = time.monotonic()
        self._writer = BackgroundWriter()
        self._resumed = False
        self._t0_offset = 0.0
        self._restore: Callable[[], None] = lambda: None
        self.scheduler = MOPScheduler({w: self._partitions_of(w) for w in range(backend.workers)},
                                      evaluate=evaluate)

    def _partitions_of(self, worker: int) -> list[int]:
        return [p for p in range(self.num_partitions) if p % self.backend.workers == worker]

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _write(self, method: str, *args: object, **kwargs: object) -> None:
        """A RunStore call, done in order on the writer thread so the loop never waits on disk."""
        self._writer.submit(getattr(self.store, method), *args, **kwargs)

    # --- the run ------------------------------------------------------------------------
    def run(self) -> None:
        server = socket.create_server(self.backend.driver_address())
        stopping = threading.Event()
        accepted = self._accepted
        acceptor = threading.Thread(target=self._accept_workers, args=(server, accepted, stopping),
                                    name="cerebro-accept", daemon=True)
        try:
            acceptor.start()
            self._start_workers(server.getsockname()[:2], accepted)
            self._t0 = time.monotonic() - self._t0_offset
            self._write("append", "run_resumed" if self._resumed else "run_started", workers=self._worker_info(),
                        time=self._now(), clock=self._t0)   # clock: time.monotonic() at time 0
            self.progress.start(self.store.path, self.backend.workers)
            self._restore()
            while True:
                try:
                    self._training = True
                    self._loop()
                    break
                except _Restart as lost:
                    self._training = False
                    self._restart(str(lost), server.getsockname()[:2], accepted)
            self._write("append", "run_finished", time=self._now(), bytes_sent=self._bytes_sent + sum(
                w.channel.bytes_sent for w in self._workers.values()), bytes_received=self._bytes_received + sum(
                w.channel.bytes_received for w in self._workers.values()))
        except BaseException as error:
            interrupted = isinstance(error, KeyboardInterrupt)
            if interrupted:    # Ctrl-C or SIGTERM: leave it resumable
                self._write("append", "run_interrupted", time=self._now())
            self._tear_down(server, acceptor, accepted, stopping, "interrupted" if interrupted else "failed")
            try:
                self._writer.close()
            except RuntimeError:
                pass    # the error already on its way is the one to report
            raise
        self._tear_down(server, acceptor, accepted, stopping, "finished")
        self._writer.close()

    def _tear_down(self, server: socket.socket, acceptor: threading.Thread,
                   accepted: queue.Queue[tuple[bytes, Channel]], stopping: threading.Event, outcome: str) -> None:
        """Stop the workers and close every socket; each step runs even if one before fails."""
        for worker in self._workers.values():
            try:
                worker.channel.send(Shutdown())
            except OSError:
                pass
        try:
            self.backend.stop()
        finally:
            stopping.set()
            try:
                server.shutdown(socket.SHUT_RDWR)   # wakes the acceptor blocked in accept()
            except OSError:
                pass
            server.close()
            acceptor.join(timeout=10)
            for worker in [*self._workers.values(), *self._arriving.values()]:
                worker.channel.close()
            while not accepted.empty():
                accepted.get()[1].close()
            try:
                self.progress.finish(outcome)
            except Exception as error:   # e.g. an MLflow server gone: the run's own outcome stands
                warnings.warn(f"could not finish logging the run: {type(error).__name__}: {error}", stacklevel=2)

    def _start_workers(self, address: tuple[str, int], accepted: queue.Queue[tuple[bytes, Channel]]) -> None:
        # A fresh token each time: tasks of an abandoned launch can never join a new one.
        self._authkey = secrets.token_bytes(32)
        self.backend.start(address, self._authkey)
        self._connect(accepted)

    def _worker_info(self) -> dict[int, dict]:
        return {w.index: {"pid": w.pid, "host": w.host, "launched_by": w.launched_by, "device": w.device,
                          "partitions": w.partitions}
                for w in sorted(self._workers.values(), key=lambda w: w.index)}

    def _restart(self, reason: str, address: tuple[str, int], accepted: queue.Queue[tuple[bytes, Channel]]) -> None:
        """Start every worker anew; running sub-epochs run again from the states the driver
        holds, with the same seeds, so the results do not change (invariant 2)."""
        self._restarts += not self._cause_removed
        self._cause_removed = False
        self._authkey = secrets.token_bytes(32)   # what the old launch still starts cannot join
        for worker in self._workers.values():
            if worker.running is not None:
                self.scheduler.abort(worker.running[1])
            self._bytes_sent += worker.channel.bytes_sent
            self._bytes_received += worker.channel.bytes_received
            worker.channel.close()
        self._workers = {}
        for worker in self._arriving.values():
            worker.channel.close()
        self._joining, self._arriving = {}, {}
        for trial in self._trials.values():
            trial.holders.clear()
        for partition in range(self.num_partitions):     # a new launch holds the partitions as at the start
            self.scheduler.move(partition, partition % self.backend.workers)
        self.backend.stop()
        while not accepted.empty():
            accepted.get()[1].close()
        self._start_workers(address, accepted)
        self._write("append", "workers_restarted", reason=reason, restart=self._restarts,
                    workers=self._worker_info(), time=self._now())

    def _accept_workers(self, server: socket.socket, accepted: queue.Queue[tuple[bytes, Channel]],
                        stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                sock, _ = server.accept()
            except ConnectionAbortedError:
                continue
            except OSError:            # the server closed
                return
            authkey = self._authkey
            try:
                channel = authenticate(sock, authkey)
            except (OSError, EOFError, PermissionError):   # a stranger, or a peer that left
                continue
            channel.sock.settimeout(self.heartbeat_timeout)   # no send or receive may block forever
            accepted.put((authkey, channel))

    def _connect(self, accepted: queue.Queue[tuple[bytes, Channel]]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        pending: dict[int, _Worker] = {}
        while len(self._workers) < self.backend.workers:
            self._check_startup(deadline)
            try:
                authkey, channel = accepted.get(timeout=0.1)
            except queue.Empty:
                channel = None
            if channel is not None and authkey != self._authkey:   # a task of an abandoned launch
                channel.close()
            elif channel is not None:
                try:
                    hello: Hello = channel.recv()
                    if hello.worker in pending or hello.worker in self._workers:
                        raise WorkerLostError(f"two workers announced index {hello.worker}")
                    worker = _Worker(hello.worker, channel, hello.pid, hello.host,
                                     self._partitions_of(hello.worker), time.monotonic(), hello.launched_by)
                    channel.send(Setup(worker.partitions, self.store.data_dir, self.build_blob,
                                       self.backend.threads_per_worker, self.heartbeat_interval))
                    pending[worker.index] = worker
                except (EOFError, OSError):
                    channel.close()   # it died right after connecting; _check_startup names it
            for ready in wait([w.channel for w in pending.values()], timeout=0):
                worker = next(w for w in pending.values() if w.channel is ready)
                message = self._receive(worker)
                if isinstance(message, SetupFailed):
                    raise WorkerLostError(f"{worker.describe()} could not start: "
                                          f"{message.error.strip().splitlines()[-1]}\n{message.error}")
                if isinstance(message, Ready):
                    if sorted(message.rows) != worker.partitions:
                        raise WorkerLostError(f"{worker.describe()} announced partitions {sorted(message.rows)}; "
                                              f"it was given {worker.partitions}")
                    worker.device, worker.last_seen = message.device, time.monotonic()
                    self._workers[worker.index] = pending.pop(worker.index)

    def _check_startup(self, deadline: float) -> None:
        for index, what in self.backend.exited().items():
            raise WorkerLostError(f"worker {index} {what} while starting; see its output above")
        if time.monotonic() > deadline:
            missing = sorted(set(range(self.backend.workers)) - set(self._workers))
            raise WorkerLostError(f"workers {missing} did not become ready within "
                                  f"{self.startup_timeout:.0f} s")

    def _loop(self) -> None:
        self._apply_decisions()
        self._add_trials()
        while self._trials or any(w.running for w in self._workers.values()):
            try:
                self._step()
            except _WorkerGone as gone:
                self._hand_over(gone)

    def _step(self) -> None:
        self._dispatch()
        self._check_not_stuck()
        channels = [w.channel for w in [*self._workers.values(), *self._arriving.values()]]
        for ready in wait(channels, timeout=self.heartbeat_interval):
            arriving = next((w for w in self._arriving.values() if w.channel is ready), None)
            if arriving is not None:
                self._arrived(arriving)
                continue
            worker = next(w for w in self._workers.values() if w.channel is ready)
            message = self._receive(worker)
            if isinstance(message, StateMissing):
                self._resend_with_state(worker)
            elif isinstance(message, (SubEpochDone, SubEpochFailed)):
                self._finish_task(worker, message)
            elif isinstance(message, SetupFailed):      # it could not load partitions it took over
                self._lost(worker, f"could not load the partitions it took over: "
                                   f"{message.error.strip().splitlines()[-1]}")
        self._check_health()
        self._admit()
        self._apply_decisions()
        self._add_trials()

    def _hand_over(self, gone: _WorkerGone) -> None:
        """The surviving workers load a lost worker's partitions from the store and its
        sub-epoch runs again, from the state the driver holds and with the same seeds, so
        the results do not change (invariant 2). The backend starts the lost worker anew
        where it can (see ``_admit``). Where the backend's workers fail together (Spark),
        every worker starts anew instead."""
        self._cause_removed = False
        pending = [gone]
        while pending:
            gone = pending.pop()
            worker = self._workers.pop(gone.worker.index)
            if worker.running is not None:
                self._abort(worker.running[1], f"{worker.describe()} {gone.reason}")
            self._bytes_sent += worker.channel.bytes_sent
            self._bytes_received += worker.channel.bytes_received
            worker.channel.close()
            self.backend.release(worker.index)
            for trial in self._trials.values():
                trial.holders.discard(worker.index)
            if not self._workers or self.backend.workers_fail_together:
                self._no_worker_left(f"{worker.describe()} {gone.reason}")
            survivors = sorted(self._workers)
            moved: dict[int, list[int]] = {}
            for i, partition in enumerate(self.scheduler.partitions_of(worker.index)):
                target = survivors[i % len(survivors)]
                self.scheduler.move(partition, target)
                moved.setdefault(target, []).append(partition)
            self._write("append", "partitions_moved", lost=worker.index, reason=gone.reason,
                        moved={str(target): partitions for target, partitions in moved.items()}, time=self._now())
            if self._replaced.get(worker.index, 0) < self.backend.max_restarts and \
                    self.backend.replace(worker.index):
                self._replaced[worker.index] = self._replaced.get(worker.index, 0) + 1
                self._joining[worker.index] = time.monotonic() + self.startup_timeout
            for target, partitions in moved.items():
                self._workers[target].partitions += partitions
                try:
                    self._send(self._workers[target], TakeOver(partitions))
                except _WorkerGone as also:
                    pending.append(also)

    # --- replacements: a lost worker started anew takes its partitions back -------------
    def _admit(self) -> None:
        """Replacements that connected get their own partitions to load (``_arrived``
        follows); one not ready in time, or that exited, is given up: the run goes on."""
        while True:
            try:
                authkey, channel = self._accepted.get_nowait()
            except queue.Empty:
                break
            try:     # only a replacement is expected now: read nothing from anyone else
                hello = channel.recv() if authkey == self._authkey and self._joining else None
            except (EOFError, OSError):
                hello = None
            if not isinstance(hello, Hello) or hello.worker not in self._joining:
                channel.close()         # a task of an abandoned launch, or a replacement given up
                continue
            del self._joining[hello.worker]
            worker = _Worker(hello.worker, channel, hello.pid, hello.host, self._partitions_of(hello.worker),
                             time.monotonic(), hello.launched_by)
            self._arriving[worker.index] = worker
            try:
                channel.send(Setup(worker.partitions, self.store.data_dir, self.build_blob,
                                   self.backend.threads_per_worker, self.heartbeat_interval))
            except OSError as error:
                self._give_up(worker, f"could not be reached ({error})")
        exited, now = self.backend.exited(), time.monotonic()
        for index, deadline in list(self._joining.items()):
            if index in exited or now > deadline:
                del self._joining[index]
                self.backend.release(index)
                self._write("append", "worker_not_replaced", worker=index, time=self._now(),
                            reason=exited.get(index, f"did not connect within {self.startup_timeout:.0f} s"))
        for worker in [w for w in self._arriving.values()
                       if w.index in exited or now > w.last_seen + self.startup_timeout]:
            self._give_up(worker, f"exited or was not ready within {self.startup_timeout:.0f} s")

    def _arrived(self, worker: _Worker) -> None:
        """A replacement loaded its partitions: it takes them back from the workers that
        held them meanwhile, which free them."""
        try:
            message = worker.channel.recv()
        except (EOFError, OSError):
            message = None
        if isinstance(message, SetupFailed):
            self._give_up(worker, f"could not start: {message.error.strip().splitlines()[-1]}")
            return
        if not isinstance(message, Ready) or sorted(message.rows) != worker.partitions:
            self._give_up(worker, "did not load its partitions")
            return
        del self._arriving[worker.index]
        worker.device, worker.last_seen = message.device, time.monotonic()
        self._workers[worker.index] = worker
        released: dict[int, list[int]] = {}
        for partition in worker.partitions:
            self.scheduler.move(partition, worker.index)
        for other in [w for w in self._workers.values() if w is not worker]:
            taken = [p for p in other.partitions if p in worker.partitions]
            if taken:
                other.partitions = [p for p in other.partitions if p not in taken]
                released[other.index] = taken
        self._write("append", "worker_replaced", worker=worker.index, workers=self._worker_info(), time=self._now())
        gone = None
        for index, taken in released.items():
            try:
                self._send(self._workers[index], Release(taken))
            except _WorkerGone as error:   # the others are told all the same
                gone = gone or error
        if gone is not None:
            raise gone

    def _give_up(self, worker: _Worker, why: str) -> None:
        del self._arriving[worker.index]
        worker.channel.close()
        self.backend.release(worker.index)
        self._write("append", "worker_not_replaced", worker=worker.index, reason=why, time=self._now())

    def _abort(self, task: Task, reason: str) -> None:
        """``task`` will not finish. A trial whose sub-epochs were on two lost workers is
        taken for their cause (it crashes or hangs its worker) and fails, not the run."""
        self.scheduler.abort(task)
        trial = self._trials.get(task.trial_id)
        if trial is None:
            return
        trial.lost_with.append(reason)
        if len(trial.lost_with) >= MAX_WORKERS_LOST_PER_TRIAL:
            self._end(trial, "failed", f"lost the {len(trial.lost_with)} workers that ran it: "
                                       + "; ".join(trial.lost_with))
            self._cause_removed = True

    def _no_worker_left(self, last: str) -> None:
        """Start every worker anew if allowed. A restart after the trial that took the workers
        down has failed does not count against ``max_restarts``: that budget is for losses
        the run cannot blame on a trial."""
        if self._cause_removed or self._restarts < self.backend.max_restarts:
            raise _Restart(last)
        together = " (a lost task fails its whole barrier stage)" if self.backend.workers_fail_together else ""
        raise WorkerLostError(f"{last}; no worker is left{together} and the backend may not start more "
                              f"(max_restarts={self.backend.max_restarts}). "
                              f"Its journal and checkpoints are in {self.store.path}")

    def _receive(self, worker: _Worker) -> object:
        try:
            message = worker.channel.recv()
        except TimeoutError:
            self._lost(worker, f"stopped in the middle of a message for {self.heartbeat_timeout:.0f} s")
        except (EOFError, OSError):
            self._lost(worker, "closed its connection")
        worker.last_seen = time.monotonic()
        return message

    def _send(self, worker: _Worker, message: object) -> None:
        try:
            worker.channel.send(message)
        except TimeoutError:
            self._lost(worker, f"took no data for {self.heartbeat_timeout:.0f} s")
        except OSError as error:
            self._lost(worker, f"could not be reached ({error})")

    def _check_health(self) -> None:
        for index, what in self.backend.exited().items():
            if index in self._workers and self.backend.workers_fail_together:
                # The whole launch ended (Spark's job) before a lost connection named the
                # task that failed first: start anew, blaming no trial.
                self._cause_removed = False
                self._no_worker_left(f"the workers {what}")
            if index in self._workers:
                self._lost(self._workers[index], what)
        now = time.monotonic()
        for worker in self._workers.values():
            if now - worker.last_seen > self.heartbeat_timeout:
                self._lost(worker, f"sent no heartbeat for {now - worker.last_seen:.0f} s")
        if self.limits.trial_timeout is not None:
            for worker in self._workers.values():
                if worker.running is not None and \
                        self._now() - worker.running[2] > self.limits.trial_timeout + self.heartbeat_timeout:
                    self._stuck(worker)

    def _stuck(self, worker: _Worker) -> None:
        """The worker checks ``trial_timeout`` between batches; a sub-epoch still running
        ``heartbeat_timeout`` seconds past it is inside a batch that does not end. Its trial
        ends as ``timeout`` and the worker, which cannot be interrupted, is given up."""
        _, task, _ = worker.running
        trial = self._trials.get(task.trial_id)
        if trial is not None:
            self._end(trial, "timeout", f"its {task.kind} sub-epoch of epoch {task.epoch} on partition "
                                        f"{task.partition} ran past trial_timeout={self.limits.trial_timeout} s "
                                        f"and {self.heartbeat_timeout:.0f} s more inside one batch; its worker "
                                        f"was given up")
        self._lost(worker, f"was stuck in a batch of {task.trial_id}")

    def _lost(self, worker: _Worker, what: str) -> None:
        doing = ""
        if worker.running is not None:
            task = worker.running[1]
            doing = f" while running {task.trial_id} {task.kind} epoch {task.epoch} partition {task.partition}"
        running = None if worker.running is None else {
            "trial_id": worker.running[1].trial_id, "kind": worker.running[1].kind,
            "epoch": worker.running[1].epoch, "partition": worker.running[1].partition}
        self._write("append", "worker_lost", worker=worker.index, reason=what, running=running, time=self._now())
        if self._training:
            raise _WorkerGone(worker, f"{what}{doing}")
        raise WorkerLostError(f"{worker.describe()} {what}{doing}; the run stopped. "
                              f"Its journal and checkpoints are in {self.store.path}")

    # --- trials -------------------------------------------------------------------------
    def _add_trials(self) -> None:
        """Ask the searcher for trials at the start and after an epoch or a trial ended."""
        if not self._suggest_due:
            return
        self._suggest_due = False
        requests = self.policy.suggest()
        if requests:
            self._write_search_state()
        for request in requests:
            self._create(request)

    def _create(self, request: TrialRequest) -> None:
        trial = _Trial(trial_name(self._created), dict(request.config), request.max_epochs)
        self._created += 1
        self._trials[trial.trial_id] = trial
        self._write("write_config", trial.trial_id, trial.config)
        self._write("append", "trial_created", trial_id=trial.trial_id, config=trial.config,
                    max_epochs=trial.max_epochs, time=self._now())
        self.progress.trial_created(trial.trial_id, trial.config, trial.max_epochs)
        self._start_epoch(trial)

    def _start_epoch(self, trial: _Trial) -> None:
        trial.epoch += 1
        trial.train_sums, trial.eval_sums = {}, {}
        self.scheduler.start_epoch(trial.trial_id, trial.epoch,
                                   visit_order(self.seed, trial.trial_id, trial.epoch, self.num_partitions,
                                               self.visit_scheme))

    def _check_not_stuck(self) -> None:
        """Every live trial paused with nothing running: the searcher will never decide them."""
        if self._trials and all(t.paused for t in self._trials.values()) and not any(
                w.running for w in self._workers.values()):
            raise RuntimeError(f"{type(self.policy).__name__} paused trials {sorted(self._trials)} "
                               f"and decided none of them; the run cannot go on")

    def _dispatch(self) -> None:
        idle = [w.index for w in self._workers.values() if w.running is None]
        tasks = self.scheduler.assign(idle)
        for task in tasks:   # all marked running first: a failed send then aborts every one
            task_id, self._next_task_id = self._next_task_id, self._next_task_id + 1
            self._workers[task.worker].running = (task_id, task, self._now())
            self.progress.sub_epoch_started(task.worker, task.trial_id, task.kind, task.epoch, task.partition)
        gone = None
        for task in tasks:
            worker = self._workers[task.worker]
            try:
                self._send_task(worker, worker.running[0], task, self._trials[task.trial_id])
            except _WorkerGone as error:    # the others' tasks are sent all the same
                gone = gone or error
        if gone is not None:
            raise gone

    def _send_task(self, worker: _Worker, task_id: int, task: Task, trial: _Trial) -> None:
        """Send ``task``, leaving the state out where the worker already holds this version."""
        held = worker.index in trial.holders
        self._send(worker, RunSubEpoch(
            task_id, trial.trial_id, trial.config, task.kind, task.epoch, task.partition,
            init_seed(self.seed, trial.trial_id),
            subepoch_seed(self.seed, trial.trial_id, task.epoch, task.partition),
            trial.version, None if held else trial.state, trial.retune and task.kind == TRAIN,
            self.limits.trial_timeout))
        trial.holders.add(worker.index)

    def _resend_with_state(self, worker: _Worker) -> None:
        _, task, _ = worker.running
        trial = self._trials.get(task.trial_id)
        if trial is None:      # it ended meanwhile: nothing left to run
            worker.running = None
            return
        if task.partition not in self.scheduler.partitions_of(worker.index):
            # A replacement took the partition back meanwhile: it runs there instead.
            self.scheduler.abort(task)
            worker.running = None
            self.progress.sub_epoch_finished(worker.index)
            return
        trial.holders.discard(worker.index)
        self._send_task(worker, worker.running[0], task, trial)

    def _finish_task(self, worker: _Worker, message: SubEpochDone | SubEpochFailed) -> None:
        task_id, task, start = worker.running
        assert message.task_id == task_id, f"{worker.describe()} answered task {message.task_id}, not {task_id}"
        worker.running = None
        self.progress.sub_epoch_finished(worker.index)
        self._write("append", "sub_epoch", trial_id=task.trial_id, epoch=task.epoch, partition=task.partition,
                    worker=worker.index, kind=task.kind, start=start, end=self._now(),
                    compute=getattr(message, "compute_seconds", None))
        trial = self._trials.get(task.trial_id)
        if trial is None:      # an eval visit of a trial that ended meanwhile
            return
        if isinstance(message, SubEpochFailed):
            if message.timed_out:
                self._end(trial, "timeout", f"its {task.kind} sub-epoch of epoch {task.epoch} on partition "
                                            f"{task.partition} took more than trial_timeout="
                                            f"{self.limits.trial_timeout} s")
            else:
                self._end(trial, "failed", message.error)
            return
        sums = Sums(message.rows, message.loss, message.metrics)
        if task.kind == TRAIN:
            trial.state, trial.version, trial.holders = message.state, trial.version + 1, {worker.index}
            trial.retune = False
            trial.train_sums[task.partition] = sums
            if not math.isfinite(message.loss):
                self._end(trial, "diverged", f"train loss became {message.loss / max(message.rows, 1)} "
                                             f"in epoch {task.epoch} on partition {task.partition}")
                return
        else:
            trial.eval_sums[task.partition] = sums
        if self.scheduler.complete(task):
            self._end_epoch(trial)

    # --- resume -------------------------------------------------------------------------
    def restore(self, recovered: Recovered) -> None:
        """Take up the trials as the journal of a crashed run leaves them (see ``_resume``)."""
        self._resumed, self._t0_offset = True, recovered.last_time
        self._restore = lambda: self._take_up(recovered)
        self._decide_due = True

    def _take_up(self, recovered: Recovered) -> None:
        from ._resume import ResumeError
        self._created = len(recovered.trials)
        actions: list[Callable[[], None]] = []
        for rt in recovered.trials.values():
            if rt.status is not None:
                continue
            trial = _Trial(rt.trial_id, rt.config, rt.max_epochs, epoch=rt.epoch)
            self._trials[trial.trial_id] = trial
            self.progress.trial_created(trial.trial_id, trial.config, trial.max_epochs)
            if rt.epoch == 0:
                actions.append(lambda trial=trial: self._start_epoch(trial))
                continue
            exploited = rt.exploited_at == rt.epoch
            found = [c for c in self.store.checkpoints(trial.trial_id) if "state" in c]
            exact = [c for c in found if c["epoch"] == rt.epoch and c["exploit"] == exploited]
            earlier = [c for c in found if c["epoch"] < rt.epoch and not c["exploit"]]
            if exact:
                trial.state, trial.version = exact[0]["state"], 1
                actions.append(lambda trial=trial, rt=rt: self._carry_on(trial, rt))
                continue
            if exploited or rt.exploited_at is not None:
                raise ResumeError(f"the checkpoint of {trial.trial_id} after its PBT exploit at epoch "
                                  f"{rt.exploited_at} is damaged or missing: {self.store.checkpoints(trial.trial_id)}")
            # Roll back to an earlier good checkpoint (or the start) and redo the journaled epochs.
            if earlier:
                trial.state, trial.version, trial.epoch = earlier[0]["state"], 1, earlier[0]["epoch"]
            else:
                trial.state, trial.version, trial.epoch = None, 0, 0
            trial.catch_up, trial.then = rt.epoch, (lambda trial=trial, rt=rt: self._carry_on(trial, rt))
            self._write("append", "trial_rolled_back", trial_id=trial.trial_id, from_epoch=rt.epoch,
                        to_epoch=trial.epoch, checkpoints=[c.get("problem", c.get("epoch"))
                                                           for c in self.store.checkpoints(trial.trial_id)],
                        time=self._now())
            actions.append(lambda trial=trial: self._start_epoch(trial))
        for action in actions:
            action()
        pending = {rt.trial_id: rt.pending for rt in recovered.trials.values()
                   if rt.status is None and rt.pending is not None}
        self._carry_out(pending)
        for request in recovered.unstarted:
            self._create(request)

    def _carry_on(self, trial: _Trial, rt: RecoveredTrial) -> None:
        """Do for ``trial`` what the crashed driver had decided, or was deciding, after ``rt.epoch``."""
        bad = diverged(rt.metrics)
        if bad:
            self._end(trial, "diverged", f"{bad} is {rt.metrics[bad]} after epoch {trial.epoch}")
            return
        if rt.pending is not None or rt.decision is Decision.PAUSE:
            trial.paused = True          # decided below by _carry_out, or later by decide()
            if not rt.decision_journaled:
                self._write("append", "decision", trial_id=trial.trial_id, epoch=trial.epoch, decision="pause")
            return
        if not rt.decision_journaled:
            self._write("append", "decision", trial_id=trial.trial_id, epoch=trial.epoch,
                        decision=rt.decision.value)
        self._go_on(trial, rt.decision)

    def _end_epoch(self, trial: _Trial) -> None:
        if trial.epoch <= trial.catch_up:      # resume: journaled and reported before the crash
            self._write("write_checkpoint", trial.trial_id, trial.state, trial.epoch)
            if trial.epoch < trial.catch_up:
                self._start_epoch(trial)
            else:
                trial.catch_up, then = 0, trial.then
                then()
            return
        metrics = {**_mean("train", trial.train_sums), **_mean("val", trial.eval_sums)}
        self._write("write_checkpoint", trial.trial_id, trial.state, trial.epoch)
        self._write("append", "epoch_end", trial_id=trial.trial_id, epoch=trial.epoch, metrics=metrics,
                    time=self._now())
        self._suggest_due = True
        self.progress.epoch_end(trial.trial_id, trial.epoch, metrics)
        bad = diverged(metrics)
        if bad:
            self._end(trial, "diverged", f"{bad} is {metrics[bad]} after epoch {trial.epoch}")
            return
        decision = self.policy.report(trial.trial_id, trial.epoch, metrics)
        self._write("append", "decision", trial_id=trial.trial_id, epoch=trial.epoch, decision=decision.value)
        self._decide_due = True
        if decision is Decision.PAUSE:
            trial.paused = True
        else:
            self._go_on(trial, decision)

    def _go_on(self, trial: _Trial, decision: Decision) -> None:
        """Carry out CONTINUE or STOP for a trial at the end of an epoch."""
        if decision is Decision.STOP and trial.epoch < trial.max_epochs:
            self._end(trial, "stopped", self.policy.stop_reason(trial.trial_id))
        elif decision in (Decision.STOP, Decision.CONTINUE) and trial.epoch >= trial.max_epochs:
            self._end(trial, "completed", None)
        elif decision is Decision.CONTINUE:
            self._start_epoch(trial)
        else:
            raise RuntimeError(f"{type(self.policy).__name__} answered {decision!r} for {trial.trial_id}; "
                               f"expected CONTINUE, STOP or PAUSE")

    def _apply_decisions(self) -> None:
        """Carry out what the searcher decided for paused trials; exploits first, so every
        source still holds the state of the epoch it paused at."""
        if not self._decide_due:
            return
        self._decide_due = False
        decisions = self.policy.decide()
        if not decisions:
            return
        self._write_search_state()
        self._write("append", "decide", decisions={t: describe(d) for t, d in decisions.items()}, time=self._now())
        self._carry_out(decisions)

    def _carry_out(self, decisions: dict[str, Decision | Exploit]) -> None:
        for trial_id, decision in sorted(decisions.items(), key=lambda item: not isinstance(item[1], Exploit)):
            trial = self._trials.get(trial_id)
            if trial is None or not trial.paused:
                raise RuntimeError(f"{type(self.policy).__name__} decided {decision!r} for {trial_id}, "
                                   f"which is not a paused trial")
            self._decide_due = True    # what ends or goes on may unblock other decisions
            if isinstance(decision, Exploit):
                self._exploit(trial, decision)
                decision = Decision.CONTINUE
            trial.paused = False
            self._go_on(trial, decision)

    def _write_search_state(self) -> None:
        state = self.policy.state()
        if state:
            self._write("append", "search_state", time=self._now(), state=state)

    def _exploit(self, trial: _Trial, exploit: Exploit) -> None:
        source = self._trials.get(exploit.source)
        if source is None or not source.paused or source.epoch != trial.epoch:
            raise RuntimeError(f"{trial.trial_id} cannot exploit {exploit.source}: the source must be a trial "
                               f"paused at the same epoch ({trial.epoch})")
        self._write("append", "exploit", trial_id=trial.trial_id, epoch=trial.epoch, source=source.trial_id,
                    previous_config=trial.config, config=dict(exploit.config), time=self._now())
        trial.config, trial.state = dict(exploit.config), source.state
        # A new version no worker holds: the state is sent again, and the trainable rebuilt.
        trial.version, trial.holders, trial.retune = trial.version + 1, set(), True
        self._write("write_config", trial.trial_id, trial.config)
        self._write("write_checkpoint", trial.trial_id, trial.state, trial.epoch, True)

    def _end(self, trial: _Trial, status: str, reason: str | None) -> None:
        del self._trials[trial.trial_id]
        self.scheduler.remove(trial.trial_id)
        self._suggest_due = self._decide_due = True
        if reason and status == "failed":
            self._write("write_error", trial.trial_id, reason)
        self._write("append", "trial_ended", trial_id=trial.trial_id, status=status, reason=reason,
                    time=self._now())
        self.progress.trial_ended(trial.trial_id, status, reason)
        self.policy.trial_ended(trial.trial_id, status)
        if status in ("failed", "diverged", "timeout"):
            self._failed.append(f"{trial.trial_id} {status} ({(reason or '').strip().splitlines()[-1][:200]})")
            if self.limits.max_failures is not None and len(self._failed) > self.limits.max_failures:
                raise TooManyFailuresError(
                    f"{len(self._failed)} trials ended failed, diverged or timeout, more than max_failures="
                    f"{self.limits.max_failures}: {'; '.join(self._failed)}. The run stopped; its journal and "
                    f"checkpoints are in {self.store.path}")


def describe(decision: Decision | Exploit) -> str | dict:
    """A decision as journal data."""
    if isinstance(decision, Exploit):
        return {"exploit": decision.source, "config": decision.config}
    return decision.value


def diverged(metrics: dict[str, float]) -> str | None:
    """The first loss in ``metrics`` that is not finite: the trial diverged."""
    return next((name for name in ("train_loss", "val_loss") if name in metrics and not math.isfinite(metrics[name])),
                None)


def _mean(prefix: str, sums: dict[int, Sums]) -> dict[str, float]:
    """Row-weighted means over partitions, added in partition order so results are bitwise stable."""
    if not sums:
        return {}
    ordered = [sums[p] for p in sorted(sums)]
    rows = sum(s.rows for s in ordered)
    if rows == 0:
        return {}
    loss = 0.0
    for s in ordered:
        loss += s.loss
    means = {f"{prefix}_loss": loss / rows}
    for name in ordered[0].metrics:
        total = 0.0
        for s in ordered:
            total += s.metrics[name]
        means[f"{prefix}_{name}"] = total / rows
    return means
