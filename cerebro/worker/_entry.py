"""A worker process's life from its first line to its exit, shared by the two ways one
starts: ``python -m cerebro.worker`` (the Dask backend, and wherever fork is not to be had)
and a fork of the fork server (:mod:`cerebro.worker._forkserver`, the local backend)."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import NoReturn

from ._loop import EXITING, run_worker
from ._protocol import HANDSHAKE_FAILED
from ._wire import HandshakeError

# What ``ps -o comm``, ``top`` and psutil's ``name()`` show for a worker process.
PROCESS_NAME = b"cerebro-worker"


def _terminated(signum: int, frame: object) -> None:
    """The backend stops a worker with SIGTERM: exit through the finally blocks, which remove
    the worker's local copy of its partitions. Once they run (``EXITING``) nothing may cut
    them short, and so this handler marks the exit before raising: a second SIGTERM that
    lands inside the finally blocks is then ignored, not raised where it would skip them."""
    if not EXITING.is_set():
        EXITING.set()
        sys.exit(0)


def name_process(name: bytes) -> None:
    """Set this process's name (Linux's ``comm``; elsewhere nothing): a forked worker keeps
    its fork server's command line, and this name tells it apart."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)   # PR_SET_NAME


def serve_driver(address: tuple[str, int], authkey: bytes, worker: int, launched_by: str) -> NoReturn:
    """Serve the driver at ``address`` until it shuts this worker down or goes, then exit.
    A worker that cannot complete its handshake says why and exits with
    :data:`HANDSHAKE_FAILED` (see ``cerebro.backends.LocalBackend.exited``)."""
    signal.signal(signal.SIGTERM, _terminated)
    # A terminal's Ctrl-C reaches the whole process group: the driver's, which stops its
    # workers itself, and not a traceback from each worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run_worker(address, authkey, worker, launched_by)
    except HandshakeError as error:
        print(f"cerebro worker {worker}: {error}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(HANDSHAKE_FAILED)
    except SystemExit as stopped:       # SIGTERM, once the finally blocks above have run
        if stopped.code not in (0, None):
            raise
    # Its clean-up done, the worker skips the interpreter's teardown: with torch loaded it
    # takes about a second, which every run spent waiting for its workers to exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
