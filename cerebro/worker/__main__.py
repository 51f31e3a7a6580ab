"""``python -m cerebro.worker HOST PORT WORKER``: a worker process, as every backend starts it.

The auth token comes in the environment (never on the command line, where ``ps`` shows it).
"""
import os
import sys

from ._loop import run_worker
from ._protocol import AUTHKEY_ENV

if __name__ == "__main__":
    host, port, worker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    run_worker((host, port), bytes.fromhex(os.environ.pop(AUTHKEY_ENV)), worker)
