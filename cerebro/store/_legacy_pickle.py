"""Checkpoints of runs written before states were data only: pickles, read only when trusted.

Reading a pickle can run any code its author put in it, so a run directory someone else
wrote (a colleague's ``runs/``, an HDFS path) must not be unpickled unless its reader says
they trust it: ``cb.load(path, trust=True)``, ``cb.resume(path, trust=True)`` or ``--trust``.
"""
from __future__ import annotations

import io
import pickle
import struct

from ._state_codec import read_exactly

_HEADER = struct.Struct("<QI")     # pickle length, number of out-of-band buffers
_LENGTH = struct.Struct("<Q")


class UntrustedStateError(PermissionError):
    """A pickled state of an older version, not read because the run was not trusted."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} holds pickled states written by an older version of Cerebro, and reading a pickle "
            f"can run code; nothing was read. If you trust this run directory, open it with trust=True "
            f"(cb.load(..., trust=True), cb.resume(..., trust=True), or --trust on the command line)")


def read_pickled_state(body: bytes) -> object:
    """The state in ``body``: pickle protocol 5 with its buffers out of band."""
    read_into = io.BytesIO(body).readinto
    length, count = _HEADER.unpack(read_exactly(read_into, _HEADER.size))
    sizes = [_LENGTH.unpack(read_exactly(read_into, _LENGTH.size))[0] for _ in range(count)]
    pickled = read_exactly(read_into, length)
    return pickle.loads(pickled, buffers=[read_exactly(read_into, size) for size in sizes])
