"""``cb.predict`` on local processes: the reverse of MOP. The model (build, config, weights)
goes to every worker once and the rows are cut once, at multiples of the batch size, into
chunks that the workers take as they become free (work stealing).

Why chunks and not one share per worker: a worker process that starts afresh takes a second
or two (importing torch, building the model), on the same cores that predict. This process
is worker 0 and starts predicting at once; the other workers join when they are ready and
take what is left, so their start-up costs what it costs and no more. Every chunk starts at a
multiple of the batch size, so its batches are the ones one process would make, and with the
same threads its outputs are that process's bits.

Where each worker predicts on one CPU thread with a torch model, the workers are forked from
this process instead (:class:`_Forked`): they have the model and the rows already, so they
start in milliseconds. A forked child must not use more than one OpenMP thread (libgomp's
pool does not survive a fork: it hangs), nor CUDA or TensorFlow, so every other case starts
fresh processes of :mod:`cerebro.worker._serve` (:class:`_Spawned`).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import queue
import subprocess
import tempfile
import threading
import warnings
from typing import Any

import numpy as np
import torch

from .._python import drivers_path, python_module
from ..results import Result, TrialResult
from ..worker import Trainable, inference_device, predict_rows
from ..worker._serve import write_rows

CHUNKS_PER_WORKER = 8           # enough that the last chunk taken leaves little to wait for
MIN_CHUNK_BATCHES = 8           # a chunk worth a message to a worker process


def predict_over_workers(result: Result, trial: TrialResult, epoch: int | str, features: np.ndarray,
                         count: int, batch_size: int | None) -> np.ndarray:
    """The outputs for ``features`` over ``count`` workers: this process and ``count - 1``
    forked or started processes."""
    trainable = trial.trainable(epoch)
    size = trainable.batch_size if batch_size is None else batch_size
    chunks = _chunks(len(features), count, size)
    if count <= 1 or len(chunks) == 1:
        return predict_rows(trainable, features, size)
    threads = max(1, (os.cpu_count() or 1) // count)
    indices = range(1, min(count, len(chunks)))
    with tempfile.TemporaryDirectory(prefix="cerebro-predict-") as job_dir:
        if _can_fork(trainable, threads):
            workers: list[Any] = [_Forked(index, trainable, features, size) for index in indices]
        else:
            _write_job(job_dir, result, trial, epoch, size, threads)
            workers = [_Spawned(job_dir, index) for index in indices]
            write_rows(job_dir, features)          # while the workers import torch
        todo: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        for chunk in chunks:
            todo.put(chunk)
        outputs: dict[int, np.ndarray] = {}
        feeders = [threading.Thread(target=_feed, args=(worker, todo, outputs), daemon=True) for worker in workers]
        for feeder in feeders:
            feeder.start()
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)         # as each worker process: the same bits
        try:
            _work(trainable, features, size, todo, outputs)
            for feeder in feeders:
                feeder.join()
            _work(trainable, features, size, todo, outputs)      # chunks a failed worker gave back
        finally:
            torch.set_num_threads(previous)
            for worker in workers:
                worker.stop()
        return np.concatenate([outputs[start] for start, _ in chunks])


def _can_fork(trainable: Any, threads: int) -> bool:
    return (threads == 1 and trainable.predicts_after_fork and "fork" in multiprocessing.get_all_start_methods()
            and inference_device(1).type == "cpu" and not torch.cuda.is_initialized())


def _chunks(rows: int, count: int, batch_size: int) -> list[tuple[int, int]]:
    """(start, stop) of each chunk: at least ``MIN_CHUNK_BATCHES`` batches (the last may be
    shorter), about ``CHUNKS_PER_WORKER`` per worker, every start a multiple of the batch size."""
    batches = -(-rows // batch_size)
    per_chunk = max(MIN_CHUNK_BATCHES, -(-batches // (count * CHUNKS_PER_WORKER)))
    step = per_chunk * batch_size
    return [(start, min(rows, start + step)) for start in range(0, rows, step)]


def _write_job(job_dir: str, result: Result, trial: TrialResult, epoch: int | str, batch_size: int,
               threads: int) -> None:
    from safetensors.torch import save_file

    with open(os.path.join(job_dir, "build.pkl"), "wb") as f:
        f.write(result.store.read_build())
    save_file({k: v.contiguous() for k, v in trial.state_dict(epoch).items()},
              os.path.join(job_dir, "weights.safetensors"))
    with open(os.path.join(job_dir, "job.json"), "w") as f:
        json.dump({"config": trial.config, "batch_size": batch_size, "threads": threads}, f)


def _work(trainable: Trainable, features: np.ndarray, batch_size: int, todo: queue.SimpleQueue,
          outputs: dict[int, np.ndarray]) -> None:
    """This process's share: chunks until none is left."""
    while True:
        try:
            start, stop = todo.get_nowait()
        except queue.Empty:
            return
        outputs[start] = predict_rows(trainable, features[start:stop], batch_size, inference_device(0))


def _feed(worker: _Spawned | _Forked, todo: queue.SimpleQueue, outputs: dict[int, np.ndarray]) -> None:
    """Hands ``worker`` one chunk at a time until none is left. A worker that dies gives its
    chunk back, for this process to predict, and is named in a warning."""
    try:
        while True:
            try:
                start, stop = todo.get_nowait()
            except queue.Empty:
                return
            predicted = worker.predict(start, stop)
            if predicted is None:
                todo.put((start, stop))
                warnings.warn(f"prediction worker {worker.index} failed ({worker.why()}); the other workers "
                              f"predict its rows", RuntimeWarning, stacklevel=2)
                return
            outputs[start] = predicted
    finally:
        worker.close()


class _Spawned:
    """A fresh ``python -m cerebro.worker._serve`` process: the job's files, chunks by stdin
    lines, outputs by ``.npy`` files."""

    def __init__(self, job_dir: str, index: int) -> None:
        self.job_dir, self.index = job_dir, index
        with open(self._stderr_path(), "w") as stderr:
            # The driver's path, as the training workers get it: a build that went by reference
            # (a module global that cannot be pickled) imports the user's modules beside their script.
            self.process = subprocess.Popen(python_module("cerebro.worker._serve", job_dir, str(index)),
                                            env={**os.environ, "PYTHONPATH": drivers_path()}, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=stderr, text=True)
        assert self.process.stdin is not None and self.process.stdout is not None    # both PIPE
        self._stdin, self._stdout = self.process.stdin, self.process.stdout

    def _stderr_path(self) -> str:
        return os.path.join(self.job_dir, f"stderr-{self.index}.txt")

    def predict(self, start: int, stop: int) -> np.ndarray | None:
        try:
            self._stdin.write(f"{start} {stop}\n")
            self._stdin.flush()
            done = self._stdout.readline()
        except OSError:
            done = ""
        if done.strip() != str(start):
            return None
        return np.load(os.path.join(self.job_dir, f"outputs-{start}.npy"), allow_pickle=False)

    def why(self) -> str:
        with open(self._stderr_path()) as f:
            return (f.read().strip().splitlines() or [f"exit status {self.process.wait()}"])[-1]

    def close(self) -> None:
        try:
            self._stdin.close()
        except OSError:
            pass          # the worker is gone already

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class _Forked:
    """A child forked from this process, the model and the rows already in it: chunks and
    their outputs through a pipe (pickled between this process and its own child only)."""

    def __init__(self, index: int, trainable: Any, features: np.ndarray, batch_size: int) -> None:
        self.index = index
        self.connection, child = multiprocessing.Pipe()
        self.process = multiprocessing.get_context("fork").Process(
            target=_forked_worker, args=(child, trainable, features, batch_size), daemon=True)
        self.process.start()
        child.close()
        self.error = ""

    def predict(self, start: int, stop: int) -> np.ndarray | None:
        try:
            self.connection.send((start, stop))
            kind, value = self.connection.recv()
        except (OSError, EOFError):
            self.process.join()
            self.error = f"exit status {self.process.exitcode}"
            return None
        if kind == "error":
            self.error = value
            return None
        return value

    def why(self) -> str:
        return self.error

    def close(self) -> None:
        self.connection.close()

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


def _forked_worker(connection: Any, trainable: Any, features: np.ndarray, batch_size: int) -> None:
    torch.set_num_threads(1)         # one OpenMP thread: a forked libgomp pool would hang
    while True:
        try:
            start, stop = connection.recv()
        except EOFError:
            return
        try:
            outputs = predict_rows(trainable, features[start:stop], batch_size, torch.device("cpu"))
        except Exception as error:
            connection.send(("error", f"{type(error).__name__}: {error}"))
            return
        connection.send(("outputs", outputs))
