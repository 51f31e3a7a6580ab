"""Narrow waist 2: the messages between the driver and a worker, for every backend.

A backend starts a worker process anywhere and gives it the driver's address, an auth
token and its worker index. The worker connects back over an authenticated channel
(:mod:`cerebro.worker._wire`: an HMAC challenge on the token each way) and then::

    worker -> Hello          driver -> Setup (its partitions, the pickled build)
    worker -> Ready          (partitions loaded into memory, once, for the whole run)
              | SetupFailed  (it could not load them or unpickle the build: the run stops)
    driver -> RunSubEpoch    worker -> SubEpochDone | SubEpochFailed     (repeated)
                             worker -> StateMissing: it no longer holds the state version the
                                       driver left out; the driver sends the task again with it
    driver -> TakeOver       a lost worker's partitions: load them from the store too
                             worker -> Ready (all its partitions) | SetupFailed
    driver -> Release        partitions a replacement of a lost worker took back: free them
    driver -> Forget         a state this worker keeps for its peers is needed no more
    worker -> Heartbeat      (every heartbeat_interval seconds, from a side thread)
    driver -> Shutdown

A worker keeps the trials it built, each at one state version, within a byte budget, and the
driver leaves the state out of a task whose version the worker holds. ``SubEpochDone`` carries
the sub-epoch's ``Sums``, the new state after a train sub-epoch, and the trials the worker
evicted from that cache, so the driver knows what each worker holds rather than guessing;
``StateMissing`` is only the safety net should the two ever disagree.

Direct hops (``Setup.direct_hops``): a worker keeps a copy of each state it trains in its
outbox (:mod:`._peers`) and serves it to the other workers on a port of its own (``Ready.peer``),
behind the same HMAC handshake as the driver's. A task whose state another worker holds names
that worker (``RunSubEpoch.fetch``) and the worker fetches it from there; only the last train
sub-epoch of an epoch sends the state back to the driver too (``return_state``), for the
epoch's checkpoint. A worker's outbox keeps its oldest states on local disk when its memory
budget is spent, and hands them back to the driver only where that disk fails.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..store import TaskKind
from ._exact import merge_states

HANDSHAKE_FAILED = 77    # a worker process's exit status when it could not authenticate with the driver (EX_NOPERM)


@dataclass
class Hello:
    worker: int
    pid: int
    host: str
    launched_by: str             # e.g. "local process", "spark task 3 of stage 0, attempt 0"


@dataclass
class Setup:
    partitions: list[int]
    data_dir: str
    build: bytes                 # cloudpickle of the user's build(config)
    threads: int                 # torch intra-op threads
    heartbeat_interval: float
    in_memory: bool | str = "auto"     # hold partitions in memory, stream them, or decide (see cerebro.data.Storage)
    cache_dir: str | None = None       # where to copy the partitions of a remote store
    keras_backend: str | None = None   # the driver's Keras backend, where the build uses Keras
    direct_hops: bool = False          # keep trained states in an outbox and serve them to peers


@dataclass
class Ready:
    worker: int
    device: str
    rows: dict[int, tuple[int, int]]     # partition -> (train rows, validation rows)
    data: str = ""                       # how it holds them: in memory or streamed, and why
    peer: tuple[str, int] | None = None  # where it serves its outbox to other workers (direct hops)


@dataclass
class SetupFailed:
    worker: int
    error: str                   # the formatted traceback


@dataclass
class RunSubEpoch:
    task_id: int
    trial_id: str
    config: dict[str, Any]
    kind: TaskKind
    epoch: int
    partition: int
    init_seed: int               # builds the model the first time (version 0)
    seed: int                    # the sub-epoch's batch order and randomness
    version: int                 # train sub-epochs the state has seen; 0: build the model anew
    state: Any                   # the packed state; None when version is 0 or the worker holds it
    retune: bool = False         # config changed since the state was saved: keep build(config)'s
                                 # optimizer hyperparameters (PBT)
    timeout: float | None = None   # seconds the sub-epoch may take (trial_timeout)
    metrics: dict[str, float] | None = None   # a train task's: the epoch before's, where the driver has them
    fetch: tuple[str, int] | None = None   # the peer whose outbox holds the state (direct hops)
    return_state: bool = True    # send the trained state back to the driver (else it stays in the outbox)
    store_state: str | None = None   # with return_state: write it there instead (the run's store), for the checkpoint


@dataclass(frozen=True)
class Sums:
    """Row-weighted sums of a sub-epoch's loss and metrics, the states of its exact
    (torchmetrics) metrics (:mod:`._exact`), and the model's own metrics as they are after it
    (``model``: :meth:`Trainable.model_metrics`, not summed: the later partition's stand);
    added up per epoch in partition order."""

    rows: int
    loss: float
    metrics: dict[str, float]
    states: dict[str, Any] = field(default_factory=dict)
    model: dict[str, float] = field(default_factory=dict)

    @classmethod
    def empty(cls, metrics: Iterable[str]) -> Sums:
        return cls(0, 0.0, dict.fromkeys(metrics, 0.0))

    def __add__(self, other: Sums) -> Sums:
        return Sums(self.rows + other.rows, self.loss + other.loss,
                    {name: total + other.metrics[name] for name, total in self.metrics.items()},
                    merge_states(self.states, other.states) if other.states else self.states,
                    {**self.model, **other.model})


@dataclass(frozen=True)
class HandedBack:
    """A state a worker's outbox let go of to stay within its budget: the driver keeps it."""

    trial_id: str
    version: int
    state: Any


@dataclass
class SubEpochDone:
    task_id: int
    sums: Sums
    compute_seconds: float       # time spent in the training or evaluation loop
    state: Any = None            # the new packed state after a train sub-epoch
    evicted: tuple[str, ...] = ()  # trials this worker no longer holds, dropped to make room
    learning_rate: float | None = None   # after a train sub-epoch, where the trainer has one
    epoch_metric: str | None = None      # what its schedule steps on: the driver then sends each epoch's metrics
    handed_back: tuple[HandedBack, ...] = ()   # states its outbox let go of (direct hops)
    fetched_bytes: int = 0               # what it fetched from a peer for this task (direct hops)
    stored: bool = False                 # the state is in the file the task named (store_state), not here
    store_error: str | None = None       # why it could not be written there (then it is here)


@dataclass
class StateMissing:
    task_id: int
    unreachable: str | None = None   # the peer to fetch it from could not be reached: why
    refused: str | None = None       # the peer sent a state that is not the model's: what differs


@dataclass
class SubEpochFailed:
    task_id: int
    error: str                   # the formatted traceback
    timed_out: bool = False      # it took longer than its timeout
    data_error: str | None = None    # a partition file is not the one the run wrote: the run stops


@dataclass
class TakeOver:
    partitions: list[int]


@dataclass
class Release:
    partitions: list[int]


@dataclass(frozen=True)
class Forget:
    """The driver needs ``trial_id``'s state ``version`` from this worker's outbox no more."""

    trial_id: str
    version: int


@dataclass(frozen=True)
class Fetch:
    """Worker to worker: send me ``trial_id``'s state ``version`` from your outbox."""

    trial_id: str
    version: int


@dataclass(frozen=True)
class NotHere:
    """The answer to a :class:`Fetch` for a state the outbox does not hold (any more)."""


@dataclass
class Heartbeat:
    worker: int
    task_id: int | None = None   # the sub-epoch it runs, and the batches it has begun in it: the
    batches: int = 0             # driver tells a slow sub-epoch from one that hangs
    total: int = 0               # the sub-epoch's batches in all (its progress, for the dashboard)


@dataclass
class Shutdown:
    reason: str = field(default="run finished")


# What a message on the wire may hold besides plain data and tensors: nothing else can be
# constructed when one is read (see cerebro.store._state_codec).
WIRE_TYPES: tuple[type, ...] = (Hello, Setup, Ready, SetupFailed, RunSubEpoch, Sums, SubEpochDone, StateMissing,
                                SubEpochFailed, TakeOver, Release, Heartbeat, Shutdown, TaskKind, HandedBack,
                                Forget, Fetch, NotHere)
