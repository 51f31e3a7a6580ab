"""Crafted run-directory files and messages for the tests of invariant 3: a pickle whose payload
would write a marker file, a hand-written data message, a checkpoint with a valid header."""
from __future__ import annotations

import json
import os
import pickle
import struct
import zlib


class Payload:
    """Unpickling this runs ``touch marker``: proof that a pickle was read."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def pickled_payload(marker: str) -> bytes:
    """A pickle framed as states were before they became data only."""
    body = pickle.dumps(Payload(marker), protocol=5)
    return struct.pack("<QI", len(body), 0) + body


def data_message(description: dict, buffers: list[bytes] = ()) -> bytes:
    """A hand-written message: ``description`` as its JSON, then ``buffers``."""
    body = json.dumps(description).encode()
    return (struct.pack("<4sQI", b"CBS1", len(body), len(buffers)) + b"".join(struct.pack("<Q", len(b))
            for b in buffers) + body + b"".join(buffers))


def craft_checkpoint(path: str, body: bytes, epoch: int, **header) -> None:
    """A checkpoint file with a valid header and CRC-32 around ``body``."""
    fields = {"trial_id": "t0000", "epoch": epoch, "exploit": False, "size": len(body), "crc": zlib.crc32(body),
              **header}
    with open(path, "wb") as f:
        f.write(json.dumps(fields).encode() + b"\n" + body)
