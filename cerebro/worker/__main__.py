"""``python -m cerebro.worker HOST PORT WORKER [LAUNCHED_BY]``: a worker process, as the local
and Dask backends start it (``LAUNCHED_BY``: how, for the journal; default "local process").

The auth token comes on stdin, one line of hex: never on the command line, where ``ps``
shows it, nor in the environment, which ``/proc/PID/environ`` keeps.
A worker that cannot complete its handshake with the driver says why and exits with
:data:`HANDSHAKE_FAILED` (see ``cerebro.backends.LocalBackend.exited``).
"""
import os
import signal
import sys

from ._loop import EXITING, run_worker
from ._protocol import HANDSHAKE_FAILED
from ._wire import HandshakeError


def _terminated(signum: int, frame: object) -> None:
    """The backend stops a worker with SIGTERM: exit through the finally blocks, which remove
    the worker's local copy of its partitions. Once they run (``EXITING``) nothing may cut
    them short, and so this handler marks the exit before raising: a second SIGTERM that
    lands inside the finally blocks is then ignored, not raised where it would skip them."""
    if not EXITING.is_set():
        EXITING.set()
        sys.exit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    # A terminal's Ctrl-C reaches the whole process group: the driver's, which stops its
    # workers itself, and not a traceback from each worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host, port, worker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        run_worker((host, port), bytes.fromhex(sys.stdin.readline().strip()), worker, *sys.argv[4:5])
    except HandshakeError as error:
        print(f"cerebro worker {worker}: {error}", file=sys.stderr)
        sys.exit(HANDSHAKE_FAILED)
    except SystemExit as stopped:       # SIGTERM, once the finally blocks above have run
        if stopped.code not in (0, None):
            raise
    # Its clean-up done, the worker skips the interpreter's teardown: with torch loaded it
    # takes about a second, which every run spent waiting for its workers to exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
