"""A trial's state as a file: one header line (its trial, epoch, size, CRC-32 and format),
then the state in the data-only format of :mod:`._state_codec`.

Checkpoints are such files, and so are the states a worker writes into the run directory
at an epoch's end (``staged/``): the driver then makes the checkpoint a second name of the
worker's file, so the state never passes through the driver (DESIGN: "Control plane and
data plane"; issue 34).
"""
from __future__ import annotations

import io
import json
import os
import zlib
from typing import Any

from .._checks import quoted
from . import _files as files
from ._state_codec import frames, read_message

STATE_FORMAT = "data/1"     # run.json and every checkpoint header name it; older runs pickled


def write_state_file(location: str, trial_id: str, epoch: int, state: Any, exploit: bool = False) -> None:
    """Write the packed ``state`` (see :func:`pack_tensors`) to ``location``, whole or not at
    all (see :func:`._files.write_atomic`)."""
    parts, crc, size = frames(state), 0, 0      # encoded once: checked, then written
    for frame in parts:
        crc, size = zlib.crc32(frame, crc), size + memoryview(frame).nbytes
    header = json.dumps({"trial_id": trial_id, "epoch": epoch, "exploit": exploit, "size": size,
                         "crc": crc, "format": STATE_FORMAT}).encode() + b"\n"
    parent = os.path.dirname(location)
    if "://" not in location and os.path.islink(parent):     # staged/ or trials/<id>/: the run's own
        raise files.UnsafeFileError(f"{parent} is a symbolic link, where Cerebro keeps a directory of its own; "
                                    f"no state is written through it (remove it)")
    files.write_atomic(location, writer=lambda f: [f.write(part) for part in (header, *parts)])


def remove_state_file(location: str) -> None:
    """Remove the state file at ``location`` where it is (a checkpoint linked to it stays)."""
    if files.exists(location):
        files.remove(location)


def split_state_file(content: bytes) -> tuple[dict[str, Any], bytes]:
    """The header and the body of a state file's ``content``; raises ``ValueError`` where the
    body is not the size and CRC-32 its header says (a torn or changed file)."""
    head, _, body = content.partition(b"\n")
    try:
        header = json.loads(head)
    except RecursionError:
        raise ValueError("its header is nested deeper than any state file's") from None
    if not isinstance(header, dict):
        raise ValueError(f"its header is {type(header).__name__}, not an object")
    if len(body) != header["size"] or zlib.crc32(body) != header["crc"]:
        raise ValueError(f"{len(body)} bytes with CRC {zlib.crc32(body)}; its header says "
                         f"{header['size']} bytes with CRC {header['crc']}")
    return header, body


def read_state_content(location: str) -> bytes:
    """A state file's bytes, where it is a regular file whose size is the one its header
    says: the header is read first, so a file that is no state file, or one far longer than
    its header says (a link to /dev/zero, a giant), is refused before its body is read."""
    with files.open_regular(location) as f:
        head = f.readline(_MAX_HEADER)
        try:
            size = json.loads(head)["size"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ValueError("its first line is not a state file's header") from None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"its header's size {quoted(size)} is not a number of bytes")
        total = _size_of(f)
        if total != len(head) + size:
            raise ValueError(f"it is {total} bytes; its header says {len(head) + size}")
        return head + f.read(size)


def _size_of(file: Any) -> int:
    size = getattr(file, "size", None)       # fsspec's files know theirs
    return int(size) if isinstance(size, int) else os.fstat(file.fileno()).st_size


def read_state_file(location: str, trial_id: str, epoch: int) -> Any:
    """The packed state of ``trial_id`` after ``epoch`` in the data-only state file at
    ``location``; raises ``ValueError`` (naming the file) where it is missing, torn, changed,
    of another format, or another trial's or epoch's."""
    try:
        header, body = split_state_file(read_state_content(location))
        expected = {"trial_id": trial_id, "epoch": epoch, "format": STATE_FORMAT}
        if {key: header.get(key) for key in expected} != expected:
            raise ValueError(f"its header says {header}, not {expected}")
        return read_message(io.BytesIO(body))
    except (OSError, ValueError, KeyError, TypeError, EOFError) as error:
        raise ValueError(f"the state file {location} cannot be read: {type(error).__name__}: {error}") from None


def check_state_header(location: str, trial_id: str, epoch: int) -> None:
    """Check, without reading the state, that the file at ``location`` holds ``trial_id``'s
    state after ``epoch`` whole (its header's size against the file's); raises ``ValueError``
    naming the file. Its CRC-32 is checked where it is read (resume, ``cb.load``)."""
    try:
        with files.open_regular(location) as f:
            head = f.readline(_MAX_HEADER)
            total = _size_of(f)
        header = json.loads(head)
        expected = {"trial_id": trial_id, "epoch": epoch, "format": STATE_FORMAT}
        if {key: header.get(key) for key in expected} != expected:
            raise ValueError(f"its header says {header}, not {expected}")
        if total != len(head) + header["size"]:
            raise ValueError(f"it is {total} bytes; its header says {len(head) + header['size']}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise ValueError(f"the state file {location} is not the one written: {error}") from None


_MAX_HEADER = 4096     # a header line is ~120 bytes: a longer one is no header
