"""A journal line: one event's JSON with the CRC-32 of that JSON, so a line damaged or torn
by a crash is told from a good one (and named) rather than taken for an event."""
from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Any


def record(body: bytes) -> bytes:
    """The journal line of the event whose JSON object is ``body``."""
    return body[:-1] + b', "crc": "%08x"}\n' % zlib.crc32(body)


@dataclass(frozen=True)
class DamagedLine:
    """A journal line that fails its check."""

    path: str
    number: int              # from 1
    offset: int              # bytes before it
    events_before: int       # good events before it
    seems: str | None        # the event name it seems to hold: a guess, since the line is damaged
    torn: bool               # the last line, cut short by a crash while it was written

    def __str__(self) -> str:
        return f"{self.path} line {self.number} is damaged (it fails its CRC-32) and was skipped"


SEEMS = re.compile(rb'^\{"event": "([a-z_]+)", ')


def parse_record(line: bytes) -> dict[str, Any] | None:
    """One journal line, or None if it is torn or fails its CRC-32."""
    cut = line.rfind(b', "crc": "')
    if not line.endswith(b'"}\n') or cut < 0 or len(line) - cut != len(b', "crc": "00000000"}\n'):
        return None
    body = line[:cut] + b"}"
    try:
        if zlib.crc32(body) != int(line[cut + 10:cut + 18], 16):
            return None
        return json.loads(body)
    except ValueError:
        return None
