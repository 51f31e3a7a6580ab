"""A journal line: one event's JSON with the CRC-32 of that JSON, so a line damaged or torn
by a crash is told from a good one (and named) rather than taken for an event."""
from __future__ import annotations

import enum
import functools
import json
import re
import reprlib
import types
import typing
import zlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ._events import EVENTS


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
    why: str = "it fails its CRC-32"

    def __str__(self) -> str:
        return f"{self.path} line {self.number} is damaged ({self.why}) and was skipped"


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
        return _loads(body)
    except (ValueError, RecursionError):     # not JSON, or nested past any reader's depth
        return None


_DECODER = json.JSONDecoder()       # json.loads's own, without its look for a UTF-16 or -32 text


def _loads(body: bytes) -> Any:
    """``json.loads(body)``, with less work per line for a body that begins ``{"`` (every
    line Cerebro writes): that is UTF-8 by JSON's rule, and a whole value once the value read
    ends where the body does (it ends with ``}``: no whitespace can follow)."""
    if body.startswith(b'{"'):
        text = body.decode("utf-8", "surrogatepass")
        value, end = _DECODER.raw_decode(text)
        if end == len(text):
            return value
    return json.loads(body)       # anything else, as JSON reads it (more after the value: an error)


TRIAL_ID = re.compile(r"t[0-9]{4,9}")
_TRIAL_ID_FIELDS = ("trial_id", "source")
# Fields every version wrote and a reader cannot do without: a line that lacks one (or holds
# null), CRC and all, is damage; cb.load failed on it with an AttributeError or a TypeError.
_NEEDED = {"trial_created": ("trial_id", "config"), "sub_epoch": ("trial_id", "kind"), "decide": ("decisions",),
           "trial_ended": ("trial_id", "status"), "run_extended": ("trials",),
           "epoch_end": ("trial_id", "epoch", "metrics")}


def malformed(record: dict[str, Any]) -> str | None:
    """Why a line whose CRC-32 holds is still no event Cerebro wrote: a field of another type
    than its event's (a line anyone may have written, with its CRC); None where it is fine.
    A field a line lacks is fine: older versions wrote fewer."""
    if not isinstance(record, dict):
        return f"it holds a JSON {type(record).__name__}, not an object"
    event = record.get("event", "")
    if not isinstance(event, str):        # unhashable, it would fail the look-up below
        return f"its event name is {reprlib.repr(event)}, not a string"
    if event not in EVENTS:
        return None
    for name, hint, surely, fits, names_trial in _checks(event):
        value = record.get(name)
        if value is None:
            continue
        if type(value) not in surely and not fits(value):
            return f"its {event} field {name!r} is {reprlib.repr(value)}, not {hint}"
        # A trial id names files (trials/<id>/...): never a path
        if names_trial and not TRIAL_ID.fullmatch(str(value)):
            return f"its {event} field {name!r} is {reprlib.repr(value)}, not a trial id such as 't0003'"
    decisions = record.get("decisions")
    if isinstance(decisions, dict) and not all(TRIAL_ID.fullmatch(str(key)) for key in decisions):
        return f"its {event} decisions name {reprlib.repr(list(decisions))}, not only trial ids"
    lacking = [name for name in _NEEDED.get(event, ()) if record.get(name) is None]
    return f"its {event} lacks {lacking[0]!r}, which every {event} has" if lacking else None


@functools.cache
def _checks(event: str) -> tuple[tuple[str, Any, frozenset[type], Callable[[Any], bool], bool], ...]:
    """Each field of ``event``: its name, type hint, the types that fit it at a glance, its
    checker and whether it names a trial, worked out once per event (a 10,000-trial journal
    has hundreds of thousands of lines)."""
    # Cached by the event's name: a class object is hashable, but mypy's Hashable check of type[Event] says not.
    cls = EVENTS[event]
    resolved = typing.get_type_hints(cls)
    return tuple((f.name, resolved[f.name], _surely(resolved[f.name]), _checker(resolved[f.name]),
                  f.name in _TRIAL_ID_FIELDS) for f in fields(cls))


_JSON_TYPES = frozenset({dict, list, str, int, float, bool})


def _surely(hint: Any) -> frozenset[type]:
    """The exact types of the values that fit ``hint`` whatever they hold: a value of one is
    let through with no call of its checker (the others are checked); as :func:`_checker`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return frozenset().union(*(_surely(arg) for arg in args if arg is not type(None)))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return frozenset()                 # only its members' values fit
    if hint in (int, str, bool):
        return frozenset({hint})           # exactly: a bool is no int here
    if hint is float:
        return frozenset({int, float})
    if origin is dict:
        return frozenset() if args[1:] == (float,) else frozenset({dict})
    if origin is list:
        return frozenset({list})
    return _JSON_TYPES                     # Any, or a hint not checked


@functools.cache
def _checker(hint: Any) -> Callable[[Any], bool]:
    """Whether a value fits ``hint``, as a function made once per hint: a journal of a
    10,000-trial run has hundreds of thousands of lines to check."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_checker(arg) for arg in args if arg is not type(None)]
        return lambda value: any(fits(value) for fits in options)
    if hint is Any:
        return lambda value: True
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = frozenset(member.value for member in hint)
        return lambda value: isinstance(value, (str, int, float)) and value in values
    if hint in (int, float):
        kinds = (int, float) if hint is float else int
        return lambda value: isinstance(value, kinds) and not isinstance(value, bool)
    if hint in (str, bool):
        return lambda value: isinstance(value, hint)
    if origin is dict:
        if args[1:] != (float,):
            return lambda value: isinstance(value, dict)
        return lambda value: isinstance(value, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
    if origin is list:
        return lambda value: isinstance(value, list)
    return lambda value: True
