"""``python -m cerebro.worker HOST PORT WORKER [LAUNCHED_BY]``: a worker process, as the Dask
backend starts it (``LAUNCHED_BY``: how, for the journal; default "local process"); the local
backend forks its workers from :mod:`cerebro.worker._forkserver` where it can, this otherwise.

The auth token comes on stdin, one line of hex: never on the command line, where ``ps``
shows it, nor in the environment, which ``/proc/PID/environ`` keeps.
"""
import sys

from ._entry import serve_driver

if __name__ == "__main__":
    host, port, worker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    serve_driver((host, port), bytes.fromhex(sys.stdin.readline().strip()), worker,
                 sys.argv[4] if len(sys.argv) > 4 else "local process")
