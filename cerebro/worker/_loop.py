"""The worker loop: load my partitions once, then run sub-epochs until told to stop."""
from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from multiprocessing.connection import Client, Connection

import cloudpickle
import torch

from ..data import read_layout, read_partition
from ._protocol import (Heartbeat, Hello, Ready, RunSubEpoch, Setup, Shutdown, SubEpochDone,
                        SubEpochFailed)
from ._torch import TorchTrainable, state_from_bytes, state_to_bytes


class _Channel:
    """A connection that the loop and the heartbeat thread both send on."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()

    def send(self, message: object) -> None:
        with self._lock:
            self.connection.send(message)


def _device(worker: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", worker % torch.cuda.device_count())
    return torch.device("cpu")


def run_worker(address: tuple[str, int], authkey: bytes, worker: int) -> None:
    """Connect to the driver at ``address`` and serve it until ``Shutdown`` or disconnect."""
    channel = _Channel(Client(address, authkey=authkey))
    channel.send(Hello(worker, os.getpid(), socket.gethostname()))
    setup: Setup = channel.connection.recv()
    torch.set_num_threads(setup.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = _device(worker)
    build = cloudpickle.loads(setup.build)
    layout = read_layout(setup.data_dir)
    data = {}
    for partition in setup.partitions:
        data[partition] = {split: tuple(torch.from_numpy(a).to(device)
                                        for a in read_partition(setup.data_dir, split, partition, layout))
                           for split in ("train", "val")}
    channel.send(Ready(worker, str(device), {p: (len(d["train"][0]), len(d["val"][0]))
                                              for p, d in data.items()}))
    stop = threading.Event()
    threading.Thread(target=_beat, args=(channel, worker, setup.heartbeat_interval, stop),
                     daemon=True).start()
    try:
        while True:
            try:
                message = channel.connection.recv()
            except (EOFError, OSError):
                return  # the driver is gone: nothing left to do
            if isinstance(message, Shutdown):
                return
            channel.send(_run(message, build, data, device))
    finally:
        stop.set()


def _beat(channel: _Channel, worker: int, interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        try:
            channel.send(Heartbeat(worker))
        except OSError:
            return


def _run(task: RunSubEpoch, build, data: dict, device: torch.device) -> SubEpochDone | SubEpochFailed:
    try:
        torch.manual_seed(task.init_seed)
        trainable = build(task.config)
        if not isinstance(trainable, TorchTrainable):
            raise TypeError(f"build(config) must return a cerebro.TorchTrainable; "
                            f"got {type(trainable).__name__}")
        trainable.model.to(device)
        if task.state is not None:
            trainable.load_state(state_from_bytes(task.state, device))
        split = "train" if task.kind == "train" else "val"
        features, label = data[task.partition][split]
        started = time.perf_counter()
        if task.kind == "train":
            sums = trainable.train_partition(features, label, task.seed)
        else:
            sums = trainable.evaluate_partition(features, label)
        compute = time.perf_counter() - started
        state = state_to_bytes(trainable.state()) if task.kind == "train" else None
        return SubEpochDone(task.task_id, sums.rows, sums.loss, sums.metrics, compute, state)
    except Exception:
        return SubEpochFailed(task.task_id, traceback.format_exc())
