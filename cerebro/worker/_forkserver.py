"""``python -m cerebro.worker._forkserver REPLY_FD [KERAS_BACKEND]``: the local backend's fork server.

A worker process spends about two seconds of CPU importing torch and what it uses before it
trains anything; a run pays that for each of its workers, and a run after it pays it again.
This process pays it once: it imports what every worker imports, then forks a worker for
each request, which starts at once with all of it loaded (the idea of multiprocessing's
forkserver, without re-running the user's ``__main__`` in each worker). Given a Keras backend
it imports Keras on it too, for the workers of Keras runs: TensorFlow's import is about eight
seconds of CPU. Importing is all it does with them: TensorFlow's and XLA's thread pools and
their settings (threads per op, read from the environment) are made in each worker, at its
first op.

It reads requests, one JSON object a line, on stdin from the driver that started it, and
writes events, one JSON object a line, to ``REPLY_FD``:

- ``{"spawn": worker, "host": ..., "port": ..., "authkey": hex, "launched_by": ...,
  "env": {...}, "path": [...], "cwd": ...}`` forks a worker; the event ``{"pid": pid}``
  answers it;
- ``{"signal": number, "pid": pid}`` sends a signal to one of its workers that has not
  been reaped yet (so never to another process that got its pid since);
- each worker it reaps is the event ``{"exited": pid, "code": code}``, with code ``-N`` for
  a worker that signal N ended, as :class:`subprocess.Popen` says it.

When stdin ends (its driver exited or died) it exits; its workers notice their driver's
end on their own, as they always do. Nothing in a request is run: it is data, from the one
process that holds the pipe. Nothing here may start a thread pool a worker uses (torch's
intra-op pool, an OpenMP pool, TensorFlow's): a fork keeps only the thread that forked, and a
pool's threads would be missing in the worker. The imports leave idle threads of their own
(torch one, TensorFlow two: its allocator's and a waiting one), which workers never need.
"""
from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import sys
import traceback

from ._entry import name_process, serve_driver
from ._keras import prepare_keras

# Imported once here, where every worker would import them at its start: torch and the
# worker's modules with it, and torch._dynamo, which torch.optim imports on first use.
PRELOADED = ("torch", "torch._dynamo", "cerebro.worker._loop")


def main(reply_fd: int, keras: str | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the driver handles Ctrl-C; stdin's end ends this
    for module in PRELOADED:
        importlib.import_module(module)
    if keras is not None:
        prepare_keras(keras, threads=1)      # a worker sets its own threads again, before its first op
    name_process(b"cerebro-forksrv")
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)         # SIGCHLD wakes the loop below: one thread only
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: set[int] = set()
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fd == wake_read:
                os.read(wake_read, 4096)
                _reap(children, reply_fd)
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                _handle(json.loads(line), children, reply_fd, (wake_read, wake_write, selector.fileno()))


def _reply(reply_fd: int, event: dict) -> None:
    os.write(reply_fd, json.dumps(event).encode() + b"\n")


def _reap(children: set[int], reply_fd: int) -> None:
    for pid in list(children):
        ended, status = os.waitpid(pid, os.WNOHANG)
        if ended:
            children.discard(pid)
            _reply(reply_fd, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _handle(request: dict, children: set[int], reply_fd: int, servers: tuple[int, ...]) -> None:
    if "signal" in request:
        if request["pid"] in children:        # not reaped: still this process's child
            os.kill(request["pid"], request["signal"])
        return
    pid = os.fork()
    if pid == 0:
        _become_worker(request, reply_fd, servers)
    children.add(pid)
    _reply(reply_fd, {"pid": pid})


def _become_worker(request: dict, reply_fd: int, servers: tuple[int, ...]) -> None:
    """In the forked child: drop the server's pipes and handlers, take the driver's
    environment, path and directory as they are now, and serve the driver; never return."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (reply_fd, *servers):      # the server's pipes and its epoll: none of a worker's
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        os.chdir(request["cwd"])
        # What ``python -m cerebro.worker HOST PORT WORKER`` would see: the same for a build either way.
        sys.argv = [os.path.join(os.path.dirname(__file__), "__main__.py"), request["host"], str(request["port"]),
                    str(request["spawn"])]
        name_process(b"cerebro-worker")
        serve_driver((request["host"], request["port"]), bytes.fromhex(request["authkey"]), request["spawn"],
                     request["launched_by"])
    except SystemExit as exited:
        os._exit(exited.code if isinstance(exited.code, int) else 1)
    except BaseException:       # whatever happens, this child never returns into the server's loop
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main(int(sys.argv[1]), *sys.argv[2:3])
    # Its driver gone, it skips the interpreter's teardown, which with TensorFlow and torch
    # loaded takes seconds: its workers end on their own, and nothing here needs cleaning.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
