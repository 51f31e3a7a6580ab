"""The worker loop: load my partitions once, then run sub-epochs until told to stop."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import socket
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import cloudpickle
import torch

from ..data import PartitionFileError, PartitionSource, StreamedPartition, transform_rng
from ..store import StateFormatError, TaskKind, frames, pack_tensors, unpack_tensors, write_state_file
from ._data import WorkerData
from ._frozen import Materialized
from ._frozen_weights import frozen_dir, store_weights
from ._keras import prepare_keras
from ._outbox import Outbox
from ._peers import StateServer, fetch
from ._prefetch import Prefetched
from ._protocol import (
    Forget,
    HandedBack,
    Heartbeat,
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
from ._state_check import StateMismatchError
from ._trainable import SubEpochTimeout, Trainable, not_a_trainable, seed_build
from ._wire import Channel, connect


class _Flag:
    """A flag without a lock. The SIGTERM handler sets it too, and runs in the main thread
    wherever that was interrupted: inside a ``threading.Event``'s own ``set()`` it would wait
    for the lock the interrupted frame holds, forever."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


# Set once the worker loop is ending: a SIGTERM then must not cut its clean-up short.
EXITING = _Flag()

# Built trainables kept per worker, so a trial that comes back is not built again: building
# initialises every weight, which costs more than the hop itself for large models.
TRAINABLE_CACHE_BYTES = 1 << 30
# States kept in memory for the peers that train them next (direct hops); past it, on local disk.
OUTBOX_BYTES = 1 << 30


class _Progress:
    """The sub-epoch this worker runs and the batches its trainer has taken from it of all it
    has, for the heartbeats (written by the loop, read by the heartbeat thread: plain values)."""

    task_id: int | None = None
    batches: int = 0
    total: int = 0
    begun = threading.Event()           # a sub-epoch began: beat now, so its total shows at once

    def counted(self, task_id: int, batches: Any, total: int) -> Any:
        self.batches, self.total = 0, total
        self.task_id = task_id          # last: a heartbeat that reads it reads its task's total
        self.begun.set()
        for batch in batches:
            self.batches += 1
            yield batch


PROGRESS = _Progress()


def _device(worker: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", worker % torch.cuda.device_count())
    return torch.device("cpu")


class _Trainables:
    """Trials this worker has built, with the state version each holds, least recently used
    first, within a byte budget. A trial that comes back is neither built nor sent again."""

    def __init__(self, build: Callable[[dict], Any], device: torch.device, budget: int,
                 train_rows: list[int], authkey: bytes = b"", frozen_dir: str | None = None) -> None:
        self.build, self.device, self.budget = build, device, budget
        self.train_rows = train_rows      # every partition's, for a schedule that needs an epoch's steps
        self.authkey = authkey            # proves the run's token to the peers it fetches from
        self._cache: OrderedDict[str, tuple[Trainable, int, int, dict]] = OrderedDict()
        self._bytes = 0                      # the cached trainables' nbytes, summed
        self.outbox: Outbox | None = None    # direct hops: the states it trained, for its peers
        self.fetched = 0                     # bytes the last take fetched from a peer
        self._unfilled: tuple[str, int, list] | None = None    # reserved in the outbox, to copy there
        self.materialized = Materialized()   # frozen layers' outputs, shared by the trials that have them
        self.frozen_dir = frozen_dir          # where the run keeps frozen weights, once each
        self._frozen_stored: set[str] = set()

    def take(self, task: RunSubEpoch) -> Trainable | StateMissing:
        """``task``'s trainable at the task's state version, or why that state is not here."""
        # Out of the cache until keep puts it back: a sub-epoch that fails ends its trial.
        cached, self.fetched = self._drop(task.trial_id), 0
        if cached is not None and cached[3] != task.config:    # PBT changed the config
            cached = None
        if task.version == 0:
            seed_build(task.init_seed)
            return self._build(task.config)
        if task.state is None and task.fetch is None:
            return cached[0] if cached is not None and cached[1] == task.version else StateMissing(task.task_id)
        trainable = cached[0] if cached is not None and not task.retune else self._build(task.config)
        state = task.state
        if state is None:
            assert task.fetch is not None       # a task with neither its state nor a peer returned above
            try:
                state, self.fetched = fetch(task.fetch, self.authkey, task.trial_id, task.version)
            except (OSError, EOFError, StateFormatError) as error:
                return StateMissing(task.task_id, f"{task.fetch[0]}:{task.fetch[1]}: {type(error).__name__}: {error}")
            if state is None:
                return StateMissing(task.task_id)
        state = unpack_tensors(state)
        try:
            trainable.check_state(state)
        except StateMismatchError as error:
            if task.state is not None:     # the driver's copy: the trial fails, saying what differs
                raise
            # A peer's well-formed state that is not the model's: the peer's fault, not the trial's.
            return StateMissing(task.task_id, refused=str(error))
        trainable.load_state(state, keep_hyperparameters=task.retune)
        return trainable

    def _build(self, config: dict) -> Trainable:
        trainable = self.build(config)
        if not isinstance(trainable, Trainable):
            raise not_a_trainable(trainable)
        self.materialized.share(trainable)
        if self.frozen_dir is not None:
            store_weights(trainable, self.frozen_dir, self._frozen_stored)
        trainable.place(self.device)
        trainable.steps_per_epoch(sum(-(-rows // trainable.batch_size) for rows in self.train_rows))
        return trainable

    def reserve(self, trial_id: str, version: int, state: Any) -> tuple[HandedBack, ...]:
        """Room in the outbox for the packed ``state`` just trained; :meth:`fill` copies it
        there once the driver has the answer (the trainable must not change before)."""
        assert self.outbox is not None, "only direct hops reserve, and they keep an outbox"
        self._unfilled = (trial_id, version, frames(state))
        return self.outbox.reserve(trial_id, version)

    def fill(self, answered: bool) -> None:
        """Copy the state :meth:`reserve` made room for, now the driver has the answer; where
        the answer failed instead, the driver knows no such state: drop it."""
        if self._unfilled is not None and self.outbox is not None:     # an outbox: reserve made it
            trial_id, version, parts = self._unfilled
            if answered:
                self.outbox.fill(trial_id, version, parts)
            else:
                self.outbox.forget(trial_id, version)
            self._unfilled = None

    def _drop(self, trial_id: str) -> tuple[Trainable, int, int, dict] | None:
        cached = self._cache.pop(trial_id, None)
        if cached is not None:
            self._bytes -= cached[2]
        return cached

    def keep(self, task: RunSubEpoch, trainable: Trainable, version: int) -> tuple[str, ...]:
        """Hold ``task``'s trainable at ``version``; returns the other trials evicted to stay
        within the budget: their next task here must carry the state again."""
        self._drop(task.trial_id)         # take did, unless the sub-epoch built it anew
        self._cache[task.trial_id] = (trainable, version, trainable.nbytes(), task.config)
        self._bytes += self._cache[task.trial_id][2]
        evicted = []
        while self._bytes > self.budget and len(self._cache) > 1:
            evicted.append(next(iter(self._cache)))
            self._drop(evicted[-1])
        return tuple(evicted)


def run_worker(address: tuple[str, int], authkey: bytes, worker: int, launched_by: str = "local process") -> None:
    """Connect to the driver at ``address`` and serve it until ``Shutdown`` or disconnect."""
    channel = connect(address, authkey)
    channel.send(Hello(worker, os.getpid(), socket.gethostname(), launched_by))
    try:
        setup: Setup = channel.recv()
    except (EOFError, OSError):
        return      # the driver gave up on this worker before it set up
    data = server = outbox = materialized = None
    stop = threading.Event()
    try:    # one try: a SIGTERM's SystemExit anywhere after the handshake leaves no copy behind
        try:
            data = WorkerData(setup.data_dir, setup.in_memory, setup.cache_dir, worker)
            trainables, device = _set_up(setup, worker, data, authkey)
            if setup.direct_hops:    # served where the driver reaches this worker
                trainables.outbox = outbox = Outbox(OUTBOX_BYTES)
                server = StateServer(channel.sock.getsockname()[0], authkey, outbox)
        except Exception:
            channel.send(SetupFailed(worker, traceback.format_exc()))
            return
        ready = functools.partial(_ready, worker, device, data, server.address if server is not None else None)
        channel.send(ready())
        materialized = trainables.materialized
        threading.Thread(target=_beat, args=(channel, worker, setup.heartbeat_interval, stop,
                                             lambda: _close(data, server, outbox, materialized)), daemon=True).start()
        _serve(channel, trainables, data, device, ready)
        # Set inside the try: a SIGTERM just before it raises here, and the finally runs whole.
        EXITING.set()
    finally:
        EXITING.set()
        stop.set()
        channel.close()
        _close(data, server, outbox, materialized)


def _close(*resources: WorkerData | StateServer | Outbox | Materialized | None) -> None:
    """Remove this worker's copy of the partitions and its outbox's files, and stop serving."""
    for resource in resources:
        if resource is not None:
            resource.close()


def _serve(channel: Channel, trainables: _Trainables, data: WorkerData, device: torch.device,
           ready: Callable[[], Ready]) -> None:
    """Answer the driver's messages until ``Shutdown`` or the driver is gone."""
    while True:
        try:
            message = channel.recv()
        except (EOFError, OSError):
            return  # the driver is gone: nothing left to do
        if isinstance(message, Shutdown):
            return
        if isinstance(message, Release):
            data.release(message.partitions)
        elif isinstance(message, Forget):
            if trainables.outbox is not None:     # sent with direct hops only, where the worker keeps one
                trainables.outbox.forget(message.trial_id, message.version)
        elif isinstance(message, TakeOver):
            try:
                data.load(message.partitions)
                channel.send(ready())
            except Exception:
                channel.send(SetupFailed(ready().worker, traceback.format_exc()))
        else:
            try:
                sent = reply(channel, message.task_id, _run(message, trainables, data.sources, device))
            except OSError:
                return      # the driver is gone
            trainables.fill(sent)


def _set_up(setup: Setup, worker: int, data: WorkerData, authkey: bytes) -> tuple[_Trainables, torch.device]:
    """Open this worker's partitions, once, and unpickle the user's build."""
    torch.set_num_threads(setup.threads)
    if setup.keras_backend is not None:     # before the build's unpickling imports keras
        prepare_keras(setup.keras_backend, setup.threads)
    else:
        # torch.optim imports torch._dynamo when the first optimizer is built (seconds): pay
        # that at start-up rather than inside some trial's first sub-epoch.
        importlib.import_module("torch._dynamo")
    device = _device(worker)
    data.load(setup.partitions)
    return _Trainables(cloudpickle.loads(setup.build), device, TRAINABLE_CACHE_BYTES, list(data.layout.rows["train"]),
                       authkey, frozen_dir(setup.data_dir)), device


def _ready(worker: int, device: torch.device, data: WorkerData, peer: tuple[str, int] | None) -> Ready:
    return Ready(worker, str(device), data.rows(), data.note, peer)


def reply(channel: Channel, task_id: int, result: SubEpochDone | SubEpochFailed | StateMissing) -> bool:
    """Send a task's result; one the wire cannot carry (a trainer's sums holding something
    other than data) fails the task with why, instead of the worker: returns False then."""
    try:
        channel.send(result)
        return True
    except (TypeError, ValueError):        # raised while encoding, before any byte went out
        channel.send(SubEpochFailed(task_id, traceback.format_exc()))
        return False


def _beat(channel: Channel, worker: int, interval: float, stop: threading.Event,
          clean_up: Callable[[], None]) -> None:
    """A heartbeat every ``interval`` seconds, and one as each sub-epoch begins; where the
    driver is gone, ``clean_up`` and end the process."""
    while not stop.is_set():
        PROGRESS.begun.wait(interval)
        PROGRESS.begun.clear()
        if stop.is_set():
            return
        try:
            channel.send(Heartbeat(worker, PROGRESS.task_id, PROGRESS.batches, PROGRESS.total))
        except OSError:
            if stop.is_set():     # the loop is closing the channel itself
                return
            # The driver is gone (even killed with SIGKILL): end now, not after the sub-epoch,
            # which the main thread may never finish. Nothing else will remove the copy:
            # files it reads stay readable once unlinked, until the process is gone.
            EXITING.set()
            clean_up()
            os._exit(0)


def _run(task: RunSubEpoch, trainables: _Trainables, sources: dict[int, dict[str, PartitionSource]],
         device: torch.device) -> SubEpochDone | SubEpochFailed | StateMissing:
    try:
        trainable = trainables.take(task)
        if isinstance(trainable, StateMissing):
            return trainable
        train = task.kind is TaskKind.TRAIN
        source = sources[task.partition]["train" if train else "val"]
        # Its frozen layers' outputs, computed once per partition (see _frozen), where it has some.
        frozen = trainables.materialized.for_trial(trainable, task.partition, "train" if train else "val",
                                                   source, device)
        source = frozen or source
        rng = transform_rng(task.seed, train)
        read = source.train_batches(task.seed, trainable.batch_size) if train else \
            source.eval_batches(trainable.batch_size)
        batches = (trainable.stored_batch(features, label, device) if frozen is not None else
                   trainable.batch(features, label, rng, train=train, device=device) for features, label in read)
        started = time.perf_counter()
        deadline = None if task.timeout is None else time.monotonic() + task.timeout
        # A thread makes batches ahead where that costs more than a few microseconds.
        ahead = isinstance(source, StreamedPartition) or (trainable.transform if train else trainable.eval_transform)
        with Prefetched(batches) if ahead else contextlib.nullcontext(batches) as made:
            counted = PROGRESS.counted(task.task_id, made, -(-source.rows // trainable.batch_size))
            if train:
                sums = trainable.train_batches(counted, task.seed, task.epoch, deadline, task.metrics)
            else:
                sums = trainable.evaluate_batches(counted, deadline)
        compute = time.perf_counter() - started
        model = trainable.model_metrics()
        if model:               # of the model as the sub-epoch left it (cb.metrics.params)
            sums = dataclasses.replace(sums, model=model)
        state = pack_tensors(trainable.state()) if train else None
        handed_back = () if state is None or trainables.outbox is None else \
            trainables.reserve(task.trial_id, task.version + 1, state)
        evicted = trainables.keep(task, trainable, task.version + train)
        sent, stored, store_error = _hand_over(task, state)
        return SubEpochDone(task.task_id, sums, compute, sent, evicted, trainable.learning_rate() if train else None,
                            trainable.epoch_metric(), handed_back, trainables.fetched, stored, store_error)
    except SubEpochTimeout:
        return SubEpochFailed(task.task_id, traceback.format_exc(), timed_out=True)
    except PartitionFileError as error:     # not the trial's fault: the run stops
        return SubEpochFailed(task.task_id, traceback.format_exc(), data_error=str(error))
    except Exception:
        return SubEpochFailed(task.task_id, traceback.format_exc())


def _hand_over(task: RunSubEpoch, state: Any) -> tuple[Any, bool, str | None]:
    """Where a train task's ``state`` goes besides the outbox: (sent back to the driver,
    written to the store where the task says, why it could not be). Written there, the
    driver takes the file as the epoch's checkpoint and never holds the state; a store this
    worker cannot write to sends it back instead."""
    if state is None or not task.return_state:
        return None, False, None
    if task.store_state is None:
        return state, False, None
    try:
        write_state_file(task.store_state, task.trial_id, task.epoch, state)
        return None, True, None
    except Exception as error:      # OSError, or a remote file system's own (gcsfs, adlfs): send it instead
        # Without the file's name (each task's differs), so the driver's warning says it once per cause.
        why = error.strerror if isinstance(error, OSError) and error.strerror else error
        return state, False, f"{type(error).__name__}: {why}"
