"""Work that loads Keras runs in a child process of the session's backend, never in it.

Two reasons. TensorFlow loads its own LLVM with ``RTLD_GLOBAL``; once it is in a backend,
that backend's next JIT-compiled query binds PostgreSQL's JIT to TensorFlow's LLVM and
segfaults, and the postmaster restarts every session on the server. And a backend only
answers a cancel, a terminate or a shutdown where PostgreSQL checks for interrupts, which a
driver loop in PL/Python never does. So the session hands the child a job directory (a
``job.json`` and ``.npy`` arrays: data, never code) and waits in ``pg_sleep``, which answers
them at once:

- a cancel raises in the session: the child gets SIGTERM (the driver stops its workers and
  leaves the run resumable), and SIGKILL with its whole process group 3 s later;
- a terminate or a shutdown ends the backend: the child, which watches its parent, stops
  itself the same way.

The child runs in a session of its own, so the postmaster's signals to the backend's process
group never reach its workers.
"""
from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .._python import drivers_path, python_module
from ._database import Database

POLL_SECONDS = 0.2
STOP_SECONDS = 3.0


@contextlib.contextmanager
def job_directory(arrays: Mapping[str, np.ndarray], blobs: Mapping[str, bytes],
                  under: str | None = None) -> Iterator[str]:
    """A new directory (in ``under``, else the temporary directory) holding a job's data:
    ``<name>.npy`` arrays, never pickled, and ``<name>.weights`` blobs; removed after."""
    job_dir = tempfile.mkdtemp(prefix=".job-", dir=under)
    try:
        for name, array in arrays.items():
            np.save(os.path.join(job_dir, f"{name}.npy"), array, allow_pickle=False)
        for name, blob in blobs.items():
            with open(os.path.join(job_dir, f"{name}.weights"), "wb") as f:
                f.write(blob)
        yield job_dir
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def run_job(db: Database, job_dir: str, job: dict[str, Any], *, keras_backend: str | None,
            use_gpus: bool) -> dict[str, Any]:
    """Run ``job`` (see :mod:`._child`) in a child process; its answer, or its error raised
    here with the same type and message."""
    with open(os.path.join(job_dir, "job.json"), "w") as f:
        json.dump(job, f)
    # The session's sys.path: the child imports Cerebro from where this function did.
    env = {**os.environ, "PYTHONPATH": drivers_path()}
    if keras_backend is not None:
        env["KERAS_BACKEND"] = keras_backend
    if not use_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    with open(os.path.join(job_dir, "child.log"), "wb") as log:
        process = subprocess.Popen(python_module("cerebro.sql._child", job_dir, str(os.getpid())),
                                   env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   start_new_session=True, cwd=job_dir)    # not the backend's: PGDATA
    try:
        while process.poll() is None:
            db.sleep(POLL_SECONDS)
    except BaseException:
        stop(process)
        raise
    return _answer(job_dir, process.returncode)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the child (its driver stops cleanly); SIGKILL to its process group, the
    workers too, if it has not ended within :data:`STOP_SECONDS`."""
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _answer(job_dir: str, returncode: int) -> dict[str, Any]:
    try:
        with open(os.path.join(job_dir, "answer.json")) as f:
            answer = json.load(f)
    except (FileNotFoundError, ValueError):
        with open(os.path.join(job_dir, "child.log"), "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
        raise RuntimeError(f"Cerebro's child process ended with code {returncode} and no answer:\n{tail}") from None
    if "error" in answer:
        kind = getattr(builtins, answer["error"]["type"], None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise RuntimeError(f"{answer['error']['type']}: {answer['error']['message']}")
        raise kind(answer["error"]["message"])
    return answer["result"]
