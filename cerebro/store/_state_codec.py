"""How a trial's state and the worker protocol's messages are written: data only.

A message is a tree of plain data (None, bool, int, float, str, bytes, lists, tuples, dicts
with str or int keys), packed tensors (:class:`TensorBytes`) and the dataclasses and enums
that the reader names in its ``types``. It is written as one JSON document describing the
tree, followed by each tensor's (and bytes value's) raw bytes as they lie in memory, so a
12 MB state costs no extra copies. Unlike a pickle, reading it can construct nothing but
that data: a crafted or damaged message fails with :class:`StateFormatError`, it never runs
code (invariant 3 of DESIGN.md).

Layout: ``CBS1``, the JSON's length and the number of buffers, each buffer's length, the
JSON, the buffers. Inside the JSON a dict whose keys are not all plain strings is
``{"$dict": [[key, value], ...]}``; other values that JSON lacks are ``{"$tuple": [...]}``,
``{"$float": "nan"}``, ``{"$bytes": index}``, ``{"$tensor": index, "dtype": ..., "shape":
...}``, ``{"$object": name, "fields": {...}}`` and ``{"$enum": name, "value": ...}``.
"""
from __future__ import annotations

import dataclasses
import enum
import io
import json
import math
import mmap
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from .._checks import quoted

# torch is imported where a tensor is packed or made: what reads a run's journal alone
# (cb.load, cerebro status) imports this module, and importing torch takes a second or more.
if TYPE_CHECKING:
    import torch

MAGIC = b"CBS1"
_HEADER = struct.Struct("<4sQI")    # magic, JSON length, number of buffers
_LENGTH = struct.Struct("<Q")
MAX_JSON_BYTES = 64 << 20           # a state's description; its tensors are buffers, not JSON
MAX_BUFFERS = 1 << 20
MAX_DEPTH = 64
_CHUNK = 64 << 20              # read larger buffers piecewise (see read_exactly)
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# What a read hands back: a buffer of its own (mmap for a large one) or a slice of a mapped file.
Chunk = bytearray | memoryview | mmap.mmap


class StateFormatError(ValueError):
    """A message or state file that is not a well-formed data-only message."""


@dataclasses.dataclass(frozen=True)
class TensorBytes:
    """A tensor as raw bytes, so any dtype (bfloat16 too) travels as a plain byte buffer."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    data: np.ndarray                 # uint8, one dimension

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorBytes:
        import torch
        tensor = tensor.detach().to("cpu").contiguous()
        return cls(tensor.dtype, tuple(tensor.shape), tensor.reshape(-1).view(torch.uint8).numpy())

    def tensor(self) -> torch.Tensor:
        import torch
        if self.data.size == 0:
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.from_numpy(self.data).view(self.dtype).reshape(self.shape)


def pack_tensors(value: Any) -> Any:
    """``value`` with every tensor replaced by :class:`TensorBytes` (dicts, lists, tuples)."""
    import torch
    if isinstance(value, torch.Tensor):
        return TensorBytes.of(value)
    if isinstance(value, dict):
        return {k: pack_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return _same_sequence(value, [pack_tensors(v) for v in value])
    return value


def unpack_tensors(value: Any) -> Any:
    """The inverse of :func:`pack_tensors`; tensors share memory with the received buffers."""
    if isinstance(value, TensorBytes):
        return value.tensor()
    if isinstance(value, dict):
        return {k: unpack_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return _same_sequence(value, [unpack_tensors(v) for v in value])
    return value


def _same_sequence(like: list | tuple, items: list) -> list | tuple:
    """``items`` as the type of ``like``: list, tuple or namedtuple."""
    if hasattr(like, "_fields"):
        return type(like)(*items)
    return type(like)(items)


# --- writing ----------------------------------------------------------------------------
def frames(message: Any) -> list[memoryview | bytes]:
    """``message`` as the byte strings to write one after the other."""
    buffers: list[memoryview] = []
    body = json.dumps(_describe(message, buffers), separators=(",", ":"), allow_nan=False).encode()
    return [_HEADER.pack(MAGIC, len(body), len(buffers)), *(_LENGTH.pack(b.nbytes) for b in buffers),
            body, *buffers]


def _describe(value: Any, buffers: list[memoryview]) -> Any:
    if value is None or isinstance(value, (bool, int, str)) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, TensorBytes):
        buffers.append(value.data.data.cast("B"))     # the array's own memoryview: no copy
        return {"$tensor": len(buffers) - 1, "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape)}
    if isinstance(value, (bytes, bytearray)):
        buffers.append(memoryview(value))
        return {"$bytes": len(buffers) - 1}
    if isinstance(value, list):
        return [_describe(v, buffers) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [_describe(v, buffers) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _describe(v, buffers) for k, v in value.items()}
        return {"$dict": [[_describe(k, buffers), _describe(v, buffers)] for k, v in value.items()]}
    if isinstance(value, enum.Enum):
        return {"$enum": type(value).__name__, "value": value.value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"$object": type(value).__name__,
                "fields": {f.name: _describe(getattr(value, f.name), buffers) for f in dataclasses.fields(value)}}
    if isinstance(value, np.generic):
        return _describe(value.item(), buffers)
    raise TypeError(f"{type(value).__name__} cannot be written as data: {value!r:.80}")


def write_message(file: BinaryIO, message: Any) -> None:
    for frame in frames(message):
        file.write(frame)


# --- reading ----------------------------------------------------------------------------
def read_exactly(read_into: Callable[[memoryview], int], n: int) -> bytearray | mmap.mmap:
    """``n`` bytes; memory grows with the bytes that arrive, not with the ``n`` announced, so a
    damaged or lying length ends in ``EOFError``, not in an allocation of terabytes."""
    if n <= _CHUNK:
        return _fill(read_into, bytearray(n))
    try:
        # Anonymous memory is committed page by page as the bytes arrive, and a large state
        # is read into it in place (growing a bytearray piecewise would copy it again).
        buffer = mmap.mmap(-1, n)
    except (OSError, OverflowError, ValueError) as error:
        raise StateFormatError(f"a buffer of {n} bytes cannot be held: {error}") from None
    return _fill(read_into, buffer)


def _fill(read_into: Callable[[memoryview], int], buffer: bytearray | mmap.mmap) -> bytearray | mmap.mmap:
    view, got = memoryview(buffer), 0
    while got < len(buffer):
        count = read_into(view[got:])
        if not count:
            raise EOFError("connection closed")
        got += count
    return buffer


def parse(read_into: Callable[[memoryview], int], types: Iterable[type] = ()) -> Any:
    """One message from ``read_into``; ``types`` are the dataclasses and enums it may hold.

    Raises :class:`StateFormatError` for anything but a well-formed message, ``EOFError``
    if the stream ends inside one.
    """
    return _parse(lambda n: read_exactly(read_into, n), types)


def parse_view(view: memoryview, types: Iterable[type] = ()) -> Any:
    """The message that fills ``view`` (a memory-mapped file, say), its tensors slices of
    ``view``: nothing is copied. Raises as :func:`parse` does, and where bytes are left over."""
    offset = 0

    def take(n: int) -> memoryview:
        nonlocal offset
        if offset + n > len(view):
            raise EOFError(f"the message needs more than the {len(view)} bytes there are")
        offset += n
        return view[offset - n:offset]

    message = _parse(take, types)
    if offset != len(view):
        raise StateFormatError(f"{len(view) - offset} bytes follow the message")
    return message


def _parse(take: Callable[[int], Chunk], types: Iterable[type]) -> Any:
    magic, length, count = _HEADER.unpack(take(_HEADER.size))
    if magic != MAGIC:
        raise StateFormatError(f"not a Cerebro data message: it starts with {bytes(magic)!r}, "
                               f"not {MAGIC!r}")
    if length > MAX_JSON_BYTES or count > MAX_BUFFERS:
        raise StateFormatError(f"a description of {length} bytes with {count} buffers is over the limits "
                               f"({MAX_JSON_BYTES} bytes, {MAX_BUFFERS} buffers)")
    sizes = [_LENGTH.unpack(take(_LENGTH.size))[0] for _ in range(count)]
    body = take(length)
    buffers = [take(size) for size in sizes]
    try:
        tree = json.loads(body if isinstance(body, bytearray) else bytes(body))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise StateFormatError(f"its description is not JSON: {type(error).__name__}: {error}") from None
    return _Reader(buffers, {t.__name__: t for t in types}).build(tree, 0)


def read_message(file: io.BufferedIOBase, types: Iterable[type] = ()) -> Any:
    return parse(file.readinto, types)


class _Reader:
    """Turns a parsed description back into values; only ``types`` may be constructed."""

    def __init__(self, buffers: list[Chunk], types: Mapping[str, type]) -> None:
        self.buffers, self.types = buffers, types

    def build(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise StateFormatError(f"nested deeper than {MAX_DEPTH} levels")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.build(v, depth + 1) for v in node]
        if not isinstance(node, dict):
            raise StateFormatError(f"unexpected JSON value {node!r:.80}")
        tag = next((k for k in node if k.startswith("$")), None)
        if tag is None:
            return {k: self.build(v, depth + 1) for k, v in node.items()}
        match tag, node:
            case "$tuple", {"$tuple": list(items)}:
                return tuple(self.build(v, depth + 1) for v in items)
            case "$dict", {"$dict": list(items)} if all(isinstance(i, list) and len(i) == 2 for i in items):
                return {self._key(k, depth): self.build(v, depth + 1) for k, v in items}
            case "$float", {"$float": str(text)} if text in _FLOATS:
                return _FLOATS[text]
            case "$bytes", {"$bytes": int(index)}:
                return bytes(self._buffer(index))
            case "$tensor", {"$tensor": int(index), "dtype": str(dtype), "shape": list(shape)}:
                return self._tensor(self._buffer(index), dtype, shape)
            case "$enum", {"$enum": str(name), "value": value}:
                kind = self._type(name, enum.Enum)
                try:
                    return kind(value)
                except ValueError:
                    raise StateFormatError(f"{value!r:.80} is not a {name}") from None
            case "$object", {"$object": str(name), "fields": dict(fields)}:
                return self._object(name, fields, depth)
        raise StateFormatError(f"malformed {tag} entry: {json.dumps(node)[:120]}")

    def _key(self, node: Any, depth: int) -> Any:
        key = self.build(node, depth + 1)
        if not isinstance(key, (str, int, float, bool, tuple)) and key is not None:
            raise StateFormatError(f"a dict key must be plain data, not {type(key).__name__}")
        return key

    def _buffer(self, index: int) -> Chunk:
        if not 0 <= index < len(self.buffers):
            raise StateFormatError(f"buffer {index} does not exist: the message has {len(self.buffers)}")
        return self.buffers[index]

    def _tensor(self, buffer: Chunk, name: str, shape: list) -> TensorBytes:
        import torch
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise StateFormatError(f"{quoted(name)} is not a torch dtype")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise StateFormatError(f"tensor shape {shape!r:.80} must be a list of non-negative integers")
        expected = math.prod(shape) * dtype.itemsize
        if len(buffer) != expected:
            raise StateFormatError(f"a {name} tensor of shape {tuple(shape)} needs {expected} bytes; "
                                   f"its buffer has {len(buffer)}")
        return TensorBytes(dtype, tuple(shape), np.frombuffer(buffer, dtype=np.uint8))

    def _type(self, name: str, base: type) -> type:
        kind = self.types.get(name)
        if kind is None or not issubclass(kind, base):
            allowed = sorted(n for n, t in self.types.items() if issubclass(t, base)) or "none"
            raise StateFormatError(f"{name!r:.80} is not a type this message may hold (allowed: {allowed})")
        return kind

    def _object(self, name: str, fields: dict, depth: int) -> Any:
        kind = self._type(name, object)
        if not dataclasses.is_dataclass(kind):
            raise StateFormatError(f"{quoted(name)} is not a dataclass")
        names = {f.name for f in dataclasses.fields(kind) if f.init}
        if set(fields) - names or {f.name for f in dataclasses.fields(kind)
                                   if f.default is dataclasses.MISSING
                                   and f.default_factory is dataclasses.MISSING} - set(fields):
            raise StateFormatError(f"{name} has the fields {sorted(names)}; the message gives {sorted(fields)}")
        return kind(**{k: self.build(v, depth + 1) for k, v in fields.items()})
