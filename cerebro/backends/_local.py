"""``LocalBackend``: worker processes on this machine, the embedded default."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from .._python import drivers_path, python_module
from ..worker._protocol import HANDSHAKE_FAILED
from . import _forks
from ._base import Backend, Hops, check_heartbeat_timeout, check_hops, check_max_restarts, check_positive

# An idle worker told to shut down exits by itself within milliseconds, having removed its
# scratch directories; one still running after this long (inside a sub-epoch, which it does
# not leave to read messages) is sent SIGTERM, whose handler cleans up as well.
SHUTDOWN_GRACE_S = 2.0


class LocalBackend(Backend):
    """``workers`` worker processes on this machine.

    Args:
        workers: number of worker processes; each holds ``partitions / workers`` partitions.
        threads_per_worker: torch intra-op threads per worker; default 1. CPU kernels
            (matrix products, convolutions) add up in an order that depends on the thread
            count, so one thread everywhere gives the same bits on any worker count and
            backend. More threads run faster where workers are fewer than cores, at the
            price of those bits (the run warns and says so in run.json).
        heartbeat_timeout: seconds without a heartbeat (sent every second) after which a
            worker counts as lost, e.g. when it hangs or its machine stops answering. The
            other workers then load its partitions and run its sub-epoch again.
        max_restarts: how often the driver may start a lost worker anew (each worker index),
            and every worker anew when none is left.
        hops: ``"direct"`` (default): a trial's state goes from worker to worker;
            ``"driver"``: through the driver (see :class:`cerebro.backends.Hops`).

    Example:
        >>> search.fit(data, backend=cb.LocalBackend(workers=4), store="runs/exp1")  # doctest: +SKIP
    """

    def __init__(self, workers: int = 2, threads_per_worker: int | None = None,
                 heartbeat_timeout: float = 60.0, max_restarts: int = 2, hops: str = "direct") -> None:
        self.workers = check_positive("workers", workers)
        self.threads_per_worker = check_positive("threads_per_worker", 1 if threads_per_worker is None
                                                 else threads_per_worker)
        self.heartbeat_timeout = check_heartbeat_timeout(heartbeat_timeout)
        self.max_restarts = check_max_restarts(max_restarts)
        self.hops = check_hops(hops)
        self._processes: list[subprocess.Popen | _forks.ForkedWorker] = []
        # replaced, killed, not yet ended
        self._unreaped: list[subprocess.Popen | _forks.ForkedWorker] = []
        self._keras: str | None = None

    def expect_keras(self, backend: str | None) -> None:
        self._keras = backend
        if _forks.AVAILABLE:      # its imports overlap the driver's work before the workers start
            _forks.server(self._worker_env(), backend)

    def start(self, address: tuple[str, int], authkey: bytes) -> None:
        self._address, self._authkey = address, authkey
        self._processes = [self._spawn(worker) for worker in range(self.workers)]

    def _worker_env(self) -> dict[str, str]:
        threads = str(self.threads_per_worker)
        # The driver's sys.path, so workers import what a cloudpickled build refers to.
        return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": drivers_path()}

    def _spawn(self, worker: int) -> subprocess.Popen | _forks.ForkedWorker:
        env = self._worker_env()
        if _forks.AVAILABLE:        # started in milliseconds, torch already imported
            return _forks.fork_worker(worker, self._address, self._authkey, env, self._keras)
        process = subprocess.Popen(python_module("cerebro.worker", self._address[0], str(self._address[1]),
                                                 str(worker)), env=env, stdin=subprocess.PIPE)
        # On stdin: never on the command line (``ps``) or in the environment (/proc/PID/environ).
        assert process.stdin is not None               # stdin=PIPE
        with contextlib.suppress(BrokenPipeError):     # it died at once: exited() says so
            process.stdin.write(self._authkey.hex().encode() + b"\n")
            process.stdin.close()
        return process

    def replace(self, worker: int) -> bool:
        self.release(worker)
        self._processes[worker] = self._spawn(worker)
        return True

    def exited(self) -> dict[int, str]:
        return {worker: f"exited with code {process.returncode}" + (
                    " (it could not complete its handshake with the driver)"
                    if process.returncode == HANDSHAKE_FAILED else "")
                for worker, process in enumerate(self._processes) if process.poll() is not None}

    def release(self, worker: int) -> None:
        if worker < len(self._processes) and self._processes[worker].poll() is None:
            self._processes[worker].kill()      # SIGKILL ends a stopped (hung) process too
            try:
                self._processes[worker].wait(timeout=5)     # reaped: no zombie left behind
            except subprocess.TimeoutExpired:
                self._unreaped.append(self._processes[worker])   # stop() waits for it

    def stop(self) -> None:
        self._processes += self._unreaped
        self._unreaped = []
        grace = time.monotonic() + SHUTDOWN_GRACE_S
        try:
            for process in self._processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(0.0, grace - time.monotonic()))
        finally:        # a second Ctrl-C while it waits must not leave workers unsignalled
            for process in self._processes:
                if process.poll() is None:
                    process.terminate()
                    process.send_signal(signal.SIGCONT)   # a stopped (hung) worker must see it too
        for process in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes = []

    def __repr__(self) -> str:
        hops = "" if self.hops is Hops.DIRECT else f", hops={self.hops.value!r}"
        return f"LocalBackend(workers={self.workers}, threads_per_worker={self.threads_per_worker}{hops})"
