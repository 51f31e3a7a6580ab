"""``cb.predict`` on local processes: the reverse of MOP. The model (build, config, weights)
goes to every worker once and the rows are cut once, at multiples of the batch size, into
chunks that the workers take as they become free (work stealing).

Why chunks and not one share per worker: a worker process takes a second or two to start
(importing torch, building the model), on the same cores that predict. This process is
worker 0 and starts predicting at once; the other workers join when they are ready and take
what is left, so their start-up costs what it costs and no more. Every chunk starts at a
multiple of the batch size, so its batches are the ones one process would make, and with the
same threads its outputs are that process's bits.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import warnings

import numpy as np
import torch

from ..report import Result, TrialResult
from ..worker import inference_device, predict_rows
from ..worker._serve import write_rows

CHUNKS_PER_WORKER = 8           # enough that the last chunk taken leaves little to wait for
MIN_CHUNK_BATCHES = 8           # a chunk worth a message to a worker process


def predict_over_workers(result: Result, trial: TrialResult, epoch: int | str, features: np.ndarray,
                         count: int, batch_size: int | None) -> np.ndarray:
    """The outputs for ``features`` over ``count`` workers: this process and ``count - 1``
    processes of :mod:`cerebro.worker._serve`."""
    trainable = trial.trainable(epoch)
    size = batch_size or trainable.batch_size
    chunks = _chunks(len(features), count, size)
    if count <= 1 or len(chunks) == 1:
        return predict_rows(trainable, features, size)
    threads = max(1, (os.cpu_count() or 1) // count)
    with tempfile.TemporaryDirectory(prefix="cerebro-predict-") as job_dir:
        _write_job(job_dir, result, trial, epoch, size, threads)
        workers = [_start(job_dir, index) for index in range(1, min(count, len(chunks)))]
        write_rows(job_dir, features)          # while the workers import torch
        todo: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        for chunk in chunks:
            todo.put(chunk)
        outputs: dict[int, np.ndarray] = {}
        feeders = [threading.Thread(target=_feed, args=(worker, job_dir, todo, outputs), daemon=True)
                   for worker in workers]
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
                worker.kill() if worker.poll() is None else None
                worker.wait()
        return np.concatenate([outputs[start] for start, _ in chunks])


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


def _start(job_dir: str, index: int) -> subprocess.Popen:
    with open(os.path.join(job_dir, f"stderr-{index}.txt"), "w") as stderr:
        return subprocess.Popen([sys.executable, "-m", "cerebro.worker._serve", job_dir, str(index)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)


def _work(trainable: object, features: np.ndarray, batch_size: int, todo: queue.SimpleQueue,
          outputs: dict[int, np.ndarray]) -> None:
    """This process's share: chunks until none is left."""
    while True:
        try:
            start, stop = todo.get_nowait()
        except queue.Empty:
            return
        outputs[start] = predict_rows(trainable, features[start:stop], batch_size, inference_device(0))


def _feed(worker: subprocess.Popen, job_dir: str, todo: queue.SimpleQueue, outputs: dict[int, np.ndarray]) -> None:
    """Hands ``worker`` one chunk at a time until none is left. A worker that dies gives its
    chunk back, for this process to predict, and is named in a warning."""
    index = worker.args[-1]
    try:
        while True:
            try:
                start, stop = todo.get_nowait()
            except queue.Empty:
                return
            try:
                worker.stdin.write(f"{start} {stop}\n")
                worker.stdin.flush()
                done = worker.stdout.readline()
            except OSError:
                done = ""
            if done.strip() != str(start):
                todo.put((start, stop))
                with open(os.path.join(job_dir, f"stderr-{index}.txt")) as f:
                    last = (f.read().strip().splitlines() or [f"exit status {worker.wait()}"])[-1]
                warnings.warn(f"prediction worker {index} failed ({last}); the other workers predict its rows",
                              RuntimeWarning, stacklevel=2)
                return
            outputs[start] = np.load(os.path.join(job_dir, f"outputs-{start}.npy"), allow_pickle=False)
    finally:
        if worker.stdin is not None:
            try:
                worker.stdin.close()
            except OSError:
                pass          # the worker is gone already
