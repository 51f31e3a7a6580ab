"""The worker pool: which workers are in the run, and talking to them.

It accepts connections (an acceptor thread, :mod:`._acceptor`), sets workers up, watches
their heartbeats and processes, sends and receives messages, and starts anew a lost worker
where the backend can. It never decides what runs where: a worker lost while
the run trains, and a replacement that joined, are reported as events
(:meth:`WorkerPool.events`) for the driver to act on. Only a failure while the workers
start (nothing trained yet, nothing to hand over) raises :class:`WorkerLostError`.
"""
from __future__ import annotations

import contextlib
import queue
import secrets
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from ..backends import Backend, Hops
from ..store import Event, RunStore, StateFormatError, WorkerLost, WorkerNotReplaced
from ..worker._protocol import Hello, Ready, Release, Setup, SetupFailed, Shutdown, TakeOver
from ..worker._wire import Channel
from ._acceptor import accept_workers
from ._errors import WorkerLostError
from ._hangs import Running
from ._scheduler import Task
from ._settings import RunSettings


@dataclass
class Worker:
    """A connected worker: its channel, what it holds and runs, and when it was last heard."""

    index: int
    channel: Channel
    pid: int
    host: str
    partitions: list[int]
    last_seen: float
    launched_by: str = ""
    device: str = "?"
    data: str = ""                 # how it holds its partitions (in memory or streamed, and why)
    running: Running | None = None
    peer: tuple[str, int] | None = None    # where it serves its states to the others (direct hops)

    def describe(self) -> str:
        return f"worker {self.index} (pid {self.pid} on {self.host})"


@dataclass(frozen=True)
class Lost:
    """``worker`` is gone (``reason`` says why and what it ran); the pool no longer counts it."""

    worker: Worker
    reason: str


@dataclass(frozen=True)
class Joined:
    """A replacement of a lost worker loaded its partitions and takes them back."""

    worker: Worker


class WorkerPool:
    """The run's workers, started through ``backend``; see the module docstring."""

    def __init__(self, backend: Backend, settings: RunSettings, store: RunStore, build_blob: bytes,
                 emit: Callable[[Event], None], now: Callable[[], float]) -> None:
        """Nothing starts yet (:meth:`open` does); ``emit`` takes the pool's journal events."""
        self.backend, self.settings, self.store, self.build_blob = backend, settings, store, build_blob
        self.heartbeat_timeout = backend.heartbeat_timeout
        self._emit, self._now = emit, now
        self.workers: dict[int, Worker] = {}
        self._arriving: dict[int, Worker] = {}      # replacement connected, loading its partitions
        self._joining: dict[int, float] = {}        # replacement started -> deadline to connect
        self._replaced: dict[int, int] = {}         # worker index -> times started anew
        self._events: list[Lost | Joined] = []
        self._accepted: queue.Queue[tuple[bytes, Channel]] = queue.Queue()
        self._authkey = b""
        self._starting = True        # a loss while starting stops the run: nothing to hand over
        self.bytes_sent = self.bytes_received = 0   # of the channels of workers since gone
        self.bytes_between_workers = 0              # fetched by workers from their peers (direct hops)
        self._server: socket.socket | None = None
        self._stopping = threading.Event()
        self._acceptor: threading.Thread | None = None

    def partitions_of(self, index: int) -> list[int]:
        """The partitions worker ``index`` holds when every worker is there."""
        return [p for p in range(self.settings.num_partitions) if p % self.backend.workers == index]

    # --- start, restart, stop -----------------------------------------------------------
    def open(self) -> None:
        """Listen, start the backend's workers and wait until each has loaded its partitions."""
        self._server = socket.create_server(self.backend.driver_address())
        self._acceptor = threading.Thread(target=accept_workers, name="cerebro-accept", daemon=True,
                                          args=(self._server, self._accepted, self._stopping,
                                                lambda: self._authkey, self.heartbeat_timeout))
        self._acceptor.start()
        self._launch()

    def restart(self) -> list[Task]:
        """Start every worker anew; returns the sub-epochs that were running, to run again."""
        self._starting = True
        running = [w.running.task for w in self.workers.values() if w.running is not None]
        for worker in [*self.workers.values(), *self._arriving.values()]:
            self._count_bytes(worker)
            worker.channel.close()
        self.workers, self._arriving, self._joining, self._events = {}, {}, {}, []
        self.backend.stop()
        while not self._accepted.empty():
            self._accepted.get()[1].close()
        self._launch()
        return running

    def close(self, outcome: str, finish: Callable[[str], None]) -> None:
        """Stop the workers and close every socket; each step runs even if one before fails.
        ``finish(outcome)`` ends the progress display last."""
        for worker in self.workers.values():
            with contextlib.suppress(OSError):
                worker.channel.send(Shutdown())
        try:
            self.backend.stop()
        finally:
            self._stopping.set()
            if self._server is not None:
                with contextlib.suppress(OSError):
                    self._server.shutdown(socket.SHUT_RDWR)   # wakes the acceptor blocked in accept()
                self._server.close()
            if self._acceptor is not None:
                self._acceptor.join(timeout=10)
            for worker in [*self.workers.values(), *self._arriving.values()]:
                worker.channel.close()
            while not self._accepted.empty():
                self._accepted.get()[1].close()
            try:
                finish(outcome)
            except Exception as error:   # e.g. an MLflow server gone: the run's own outcome stands
                warnings.warn(f"could not finish logging the run: {type(error).__name__}: {error}", stacklevel=2)

    def _launch(self) -> None:
        # A fresh token each time: tasks of an abandoned launch can never join a new one.
        self._authkey = secrets.token_bytes(32)
        assert self._server is not None, "open() listens before the first launch"
        self.backend.start(self._server.getsockname()[:2], self._authkey)
        self._connect()
        self._starting = False

    def _connect(self) -> None:
        """Wait until every worker of the launch is set up; raises if one fails or is late."""
        deadline = time.monotonic() + self.settings.startup_timeout
        pending: dict[int, Worker] = {}
        while len(self.workers) < self.backend.workers:
            self._check_startup(deadline)
            try:
                authkey, channel = self._accepted.get(timeout=0.1)
            except queue.Empty:
                authkey, channel = b"", None
            if channel is not None and authkey != self._authkey:   # a task of an abandoned launch
                channel.close()
            elif channel is not None:
                try:
                    hello: Hello = channel.recv()
                    if hello.worker in pending or hello.worker in self.workers:
                        raise WorkerLostError(f"two workers announced index {hello.worker}")
                    worker = self._new_worker(hello, channel)
                    self._send_setup(worker)
                    pending[worker.index] = worker
                except (EOFError, OSError, StateFormatError):
                    channel.close()   # it died right after connecting; _check_startup names it
            for ready in Channel.readable([w.channel for w in pending.values()], timeout=0):
                worker = next(w for w in pending.values() if w.channel is ready)
                message = self.receive(worker)
                if isinstance(message, SetupFailed):
                    raise WorkerLostError(f"{worker.describe()} could not start: "
                                          f"{message.error.strip().splitlines()[-1]}\n{message.error}")
                if isinstance(message, Ready):
                    if sorted(message.rows) != worker.partitions:
                        raise WorkerLostError(f"{worker.describe()} announced partitions {sorted(message.rows)}; "
                                              f"it was given {worker.partitions}")
                    self._take_ready(worker, message)
                    self.workers[worker.index] = pending.pop(worker.index)

    def _new_worker(self, hello: Hello, channel: Channel) -> Worker:
        return Worker(hello.worker, channel, hello.pid, hello.host, self.partitions_of(hello.worker),
                      time.monotonic(), hello.launched_by)

    def _send_setup(self, worker: Worker) -> None:
        storage = self.settings.storage
        worker.channel.send(Setup(worker.partitions, self.store.data_dir, self.build_blob,
                                  self.backend.threads_per_worker, self.settings.heartbeat_interval,
                                  storage.in_memory, storage.cache_dir, self.settings.keras_backend,
                                  self.backend.hops is Hops.DIRECT))

    @staticmethod
    def _take_ready(worker: Worker, ready: Ready) -> None:
        worker.device, worker.data, worker.last_seen = ready.device, ready.data, time.monotonic()
        worker.peer = None if ready.peer is None else (ready.peer[0], ready.peer[1])

    def _check_startup(self, deadline: float) -> None:
        for index, what in self.backend.exited().items():
            raise WorkerLostError(f"worker {index} {what} while starting; see its output above")
        if time.monotonic() > deadline:
            missing = sorted(set(range(self.backend.workers)) - set(self.workers))
            raise WorkerLostError(f"workers {missing} did not become ready within "
                                  f"{self.settings.startup_timeout:.0f} s")

    # --- messages -----------------------------------------------------------------------
    def events(self) -> list[Lost | Joined]:
        """Workers lost and replacements joined since the last call, in order."""
        events, self._events = self._events, []
        return events

    def send(self, worker: Worker, message: object) -> bool:
        """Send ``message``; False (and a :class:`Lost` event) if the worker is lost."""
        try:
            worker.channel.send(message)
            return True
        except TimeoutError:
            self.lose(worker, f"took no data for {self.heartbeat_timeout:.0f} s")
        except OSError as error:
            self.lose(worker, f"could not be reached ({error})")
        return False

    def receive(self, worker: Worker) -> object | None:
        """The next message of ``worker``; None (and a :class:`Lost` event) if it is lost."""
        try:
            message = worker.channel.recv()
        except TimeoutError:
            self.lose(worker, f"stopped in the middle of a message for {self.heartbeat_timeout:.0f} s")
            return None
        except (EOFError, OSError):
            self.lose(worker, "closed its connection")
            return None
        except StateFormatError as error:
            self.lose(worker, f"sent a malformed message, which was not run: {error}")
            return None
        worker.last_seen = time.monotonic()
        return message

    def poll(self, timeout: float) -> list[tuple[Worker, object]]:
        """Messages from the workers within ``timeout`` seconds; replacements that finished
        loading are taken in on the way (a :class:`Joined` event each)."""
        channels = [w.channel for w in [*self.workers.values(), *self._arriving.values()]]
        messages = []
        for ready in Channel.readable(channels, timeout=timeout):
            arriving = next((w for w in self._arriving.values() if w.channel is ready), None)
            if arriving is not None:
                self._arrived(arriving)
                continue
            worker = next((w for w in self.workers.values() if w.channel is ready), None)
            if worker is None:        # lost meanwhile
                continue
            message = self.receive(worker)
            if message is not None:
                messages.append((worker, message))
        return messages

    def lose(self, worker: Worker, what: str) -> None:
        """``worker`` is lost: out of the pool, its process released, a :class:`Lost` event.
        While the workers start, the run stops instead (:class:`WorkerLostError`)."""
        if not self._starting and self.workers.get(worker.index) is not worker:
            return      # already reported
        task = worker.running.task if worker.running is not None else None
        doing = "" if task is None else \
            f" while running {task.trial_id} {task.kind} epoch {task.epoch} partition {task.partition}"
        running = None if task is None else \
            {"trial_id": task.trial_id, "kind": task.kind, "epoch": task.epoch, "partition": task.partition}
        self._emit(WorkerLost(worker.index, what, running, self._now()))
        if self._starting:
            raise WorkerLostError(f"{worker.describe()} {what}{doing}; the run stopped. "
                                  f"Its journal and checkpoints are in {self.store.path}")
        del self.workers[worker.index]
        self._count_bytes(worker)
        worker.channel.close()
        self.backend.release(worker.index)
        self._events.append(Lost(worker, f"{what}{doing}"))

    def _count_bytes(self, worker: Worker) -> None:
        self.bytes_sent, self.bytes_received = (self.bytes_sent + worker.channel.bytes_sent,
                                                self.bytes_received + worker.channel.bytes_received)

    def traffic(self) -> tuple[int, int, int]:
        """Bytes sent to and received from every worker of the run, and fetched between them."""
        return (self.bytes_sent + sum(w.channel.bytes_sent for w in self.workers.values()),
                self.bytes_received + sum(w.channel.bytes_received for w in self.workers.values()),
                self.bytes_between_workers)

    def info(self) -> dict[int, dict]:
        """Each worker's pid, host, device, partitions and how it holds them, for the journal."""
        return {w.index: {"pid": w.pid, "host": w.host, "launched_by": w.launched_by, "device": w.device,
                          "data": w.data,
                          "partitions": w.partitions}
                for w in sorted(self.workers.values(), key=lambda w: w.index)}

    # --- health -------------------------------------------------------------------------
    def check_health(self) -> None:
        """Workers whose process ended or whose heartbeats stopped are lost."""
        for index, what in self.backend.exited().items():
            if index in self.workers:
                self.lose(self.workers[index], what)
        now = time.monotonic()
        silent = [w for w in self.workers.values() if now - w.last_seen > self.heartbeat_timeout]
        # A worker whose messages wait unread was not silent: the driver was late (a long
        # epoch end, a slow store). Its next poll reads them (a worker that died meanwhile
        # is then found by its closed connection or its exit).
        unread = set(Channel.readable([w.channel for w in silent], timeout=0)) if silent else set()
        for worker in silent:
            if worker.channel not in unread:
                self.lose(worker, f"sent no heartbeat for {now - worker.last_seen:.0f} s")

    # --- hand-over and replacements ---------------------------------------------------------
    def spread(self, partitions: list[int]) -> dict[int, list[int]]:
        """Which surviving worker is to take which of a lost worker's ``partitions``."""
        survivors = sorted(self.workers)
        moved: dict[int, list[int]] = {}
        for i, partition in enumerate(partitions):
            moved.setdefault(survivors[i % len(survivors)], []).append(partition)
        return moved

    def hand_over(self, lost: Worker, moved: dict[int, list[int]]) -> None:
        """The surviving workers load ``lost``'s partitions from the store as ``moved``
        says; the backend starts ``lost`` anew where it can (see :meth:`admit`)."""
        if self._replaced.get(lost.index, 0) < self.backend.max_restarts and self.backend.replace(lost.index):
            self._replaced[lost.index] = self._replaced.get(lost.index, 0) + 1
            self._joining[lost.index] = time.monotonic() + self.settings.startup_timeout
        for target, taken in moved.items():
            if target in self.workers:      # else lost on the way: its Lost event hands these on too
                self.workers[target].partitions += taken
                self.send(self.workers[target], TakeOver(taken))

    def admit(self) -> None:
        """Replacements that connected get their own partitions to load (:meth:`_arrived`
        follows); one not ready in time, or that exited, is given up: the run goes on."""
        while True:
            try:
                authkey, channel = self._accepted.get_nowait()
            except queue.Empty:
                break
            try:     # only a replacement is expected now: read nothing from anyone else
                hello = channel.recv() if authkey == self._authkey and self._joining else None
            except (EOFError, OSError, StateFormatError):
                hello = None
            if not isinstance(hello, Hello) or hello.worker not in self._joining:
                channel.close()         # a task of an abandoned launch, or a replacement given up
                continue
            del self._joining[hello.worker]
            worker = self._arriving[hello.worker] = self._new_worker(hello, channel)
            try:
                self._send_setup(worker)
            except OSError as error:
                self._give_up(worker, f"could not be reached ({error})")
        exited, now = self.backend.exited(), time.monotonic()
        for index, deadline in list(self._joining.items()):
            if index in exited or now > deadline:
                del self._joining[index]
                self.backend.release(index)
                self._emit(WorkerNotReplaced(index, exited.get(
                    index, f"did not connect within {self.settings.startup_timeout:.0f} s"), self._now()))
        for worker in [w for w in self._arriving.values()
                       if w.index in exited or now > w.last_seen + self.settings.startup_timeout]:
            self._give_up(worker, f"exited or was not ready within {self.settings.startup_timeout:.0f} s")

    def _arrived(self, worker: Worker) -> None:
        """A replacement loaded its partitions: it takes them back from the workers that
        held them meanwhile, which free them."""
        try:
            message = worker.channel.recv()
        except (EOFError, OSError, StateFormatError):
            message = None
        if isinstance(message, SetupFailed):
            self._give_up(worker, f"could not start: {message.error.strip().splitlines()[-1]}")
            return
        if not isinstance(message, Ready) or sorted(message.rows) != worker.partitions:
            self._give_up(worker, "did not load its partitions")
            return
        del self._arriving[worker.index]
        self._take_ready(worker, message)
        self.workers[worker.index] = worker
        released: dict[int, list[int]] = {}
        for other in [w for w in self.workers.values() if w is not worker]:
            taken = [p for p in other.partitions if p in worker.partitions]
            if taken:
                other.partitions = [p for p in other.partitions if p not in taken]
                released[other.index] = taken
        self._events.append(Joined(worker))
        for index, taken in released.items():    # a worker lost on the way is reported as such
            if index in self.workers:
                self.send(self.workers[index], Release(taken))

    def _give_up(self, worker: Worker, why: str) -> None:
        del self._arriving[worker.index]
        worker.channel.close()
        self.backend.release(worker.index)
        self._emit(WorkerNotReplaced(worker.index, why, self._now()))
