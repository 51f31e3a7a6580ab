"""Worker processes forked by the fork server (:mod:`cerebro.worker._forkserver`), as the
local backend starts them: each starts with torch and the worker's code already imported,
where ``python -m cerebro.worker`` spends about two seconds of CPU importing them, and, for a
Keras run, with Keras on the run's backend too (TensorFlow's import alone takes about eight).

One fork server per driver process and kind (torch only, or Keras on one backend), started
with the first worker that needs it and shared by every run the process makes after it (a
notebook's, a test suite's, a benchmark's); it ends when the driver does. :class:`ForkedWorker`
answers what the backend asks of a process (``pid``, ``poll``, ``wait``, ``kill``,
``terminate``, ``send_signal``) as :class:`subprocess.Popen` does.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import IO

from .._python import python_module

# Where fork is not Linux's (macOS forks badly after torch's import; Windows has none), the
# local backend starts each worker with ``python -m cerebro.worker``.
AVAILABLE = sys.platform.startswith("linux")


class ForkServerGone(RuntimeError):
    """The fork server ended (killed from outside): the caller starts a new one."""


class ForkServer:
    """A running fork server and the exit codes of the workers it forked."""

    def __init__(self, env: dict[str, str], keras: str | None = None) -> None:
        read_fd, write_fd = os.pipe()
        self.owner = os.getpid()        # a driver forked from this process starts its own
        self._process = subprocess.Popen(python_module("cerebro.worker._forkserver", str(write_fd),
                                                        *([keras] if keras else [])),
                                         env=env, stdin=subprocess.PIPE, pass_fds=(write_fd,))
        os.close(write_fd)
        self._replies: IO[bytes] = os.fdopen(read_fd, "rb")
        self._lock = threading.Lock()          # one request and its answer at a time
        self._changed = threading.Condition()
        # A worker is its pid and the how-manieth worker with that pid it is: the kernel
        # reuses pids (32,768 of them), and a long-lived server outlives many workers. Keyed
        # by pid alone, a new worker was taken for an old one that had exited ("worker 0
        # exited with code 3 while starting").
        self._pids: list[tuple[int, int]] = []          # answers to spawn requests, in order
        self._spawned: dict[int, int] = {}              # pid -> workers forked with it so far
        self._codes: dict[tuple[int, int], int] = {}    # reaped workers' exit codes
        self._live: set[int] = set()
        self.gone = False
        threading.Thread(target=self._read, daemon=True, name="cerebro-forkserver-replies").start()

    def _read(self) -> None:
        for line in self._replies:
            self._take(json.loads(line))
        self._process.wait()        # its pipe closed as it exited: reaped, no zombie left
        self._lost()

    def _take(self, event: dict) -> None:
        """One reply of the server's: a spawned worker's pid, or a worker's exit code."""
        with self._changed:
            if "pid" in event:      # its exit, if the pid had one before, came first
                pid = event["pid"]
                self._spawned[pid] = self._spawned.get(pid, 0) + 1
                self._pids.append((pid, self._spawned[pid]))
                self._live.add(pid)
            else:
                pid = event["exited"]
                self._codes[pid, self._spawned.get(pid, 0)] = event["code"]
                self._live.discard(pid)
            self._changed.notify_all()

    def _lost(self) -> None:
        """The server ended: its workers, whose exits it can no longer tell, are killed (not
        left running unwatched) and count as killed."""
        with self._changed:
            self.gone = True
            for pid in self._live:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._codes[pid, self._spawned.get(pid, 0)] = -signal.SIGKILL
            self._live.clear()
            self._changed.notify_all()

    def _send(self, request: dict) -> None:
        assert self._process.stdin is not None         # stdin=PIPE
        try:
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError) as error:
            # Gone now, whether or not the reader has seen its replies end yet: the next
            # spawn starts a new server rather than asking this one again.
            self.gone = True
            raise ForkServerGone(f"the local backend's fork server exited with code {self._process.wait()}") from error

    def spawn(self, worker: int, address: tuple[str, int], authkey: bytes, env: dict[str, str],
              launched_by: str = "local process") -> ForkedWorker:
        with self._lock:
            self._send({"spawn": worker, "host": address[0], "port": address[1], "authkey": authkey.hex(),
                        "launched_by": launched_by, "env": env, "path": sys.path, "cwd": os.getcwd()})
            with self._changed:
                self._changed.wait_for(lambda: self._pids or self.gone)
                if not self._pids:
                    raise ForkServerGone(f"the local backend's fork server (python -m cerebro.worker._forkserver) "
                                         f"exited with code {self._process.wait()} before it forked worker {worker}; "
                                         f"what it printed is above")
                return ForkedWorker(self, *self._pids.pop(0))

    def signal_worker(self, pid: int, number: int) -> None:
        with self._lock:
            self._send({"signal": number, "pid": pid})

    def code(self, pid: int, serial: int, timeout: float | None) -> int | None:
        """The exit code of the ``serial``-th worker forked with ``pid`` (None: not exited
        within ``timeout`` seconds)."""
        with self._changed:
            self._changed.wait_for(lambda: (pid, serial) in self._codes, timeout)
            return self._codes.get((pid, serial))


class ForkedWorker:
    """A worker the fork server forked, seen as :class:`subprocess.Popen` shows a process."""

    def __init__(self, server: ForkServer, pid: int, serial: int) -> None:
        self.server, self.pid, self.serial = server, pid, serial
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.code(self.pid, self.serial, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.code(self.pid, self.serial, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"cerebro worker {self.pid}", timeout or 0)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            try:
                self.server.signal_worker(self.pid, number)
            except ForkServerGone:
                pass          # its workers were killed with it (ForkServer._lost)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


_SERVERS: dict[str | None, ForkServer] = {}     # by the Keras backend it imported (None: none)
_SERVERS_LOCK = threading.Lock()


def server(env: dict[str, str], keras: str | None = None) -> ForkServer:
    """This process's fork server that imported Keras on ``keras`` (None: torch only),
    started where it has none or its own was killed; it imports while the caller goes on."""
    with _SERVERS_LOCK:
        running = _SERVERS.get(keras)
        if running is None or running.gone or running.owner != os.getpid():
            running = _SERVERS[keras] = ForkServer(env, keras)
        return running


def fork_worker(worker: int, address: tuple[str, int], authkey: bytes, env: dict[str, str],
                keras: str | None = None) -> ForkedWorker:
    """Fork worker ``worker`` for the driver at ``address`` from :func:`server`."""
    try:
        return server(env, keras).spawn(worker, address, authkey, env)
    except ForkServerGone:        # killed since its last worker: a new one, once
        return server(env, keras).spawn(worker, address, authkey, env)
