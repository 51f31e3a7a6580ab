"""How a trial's state is written: to a socket between driver and workers, or to a checkpoint.

A message is any picklable object. Tensors inside it become :class:`TensorBytes`, whose
byte buffers pickle protocol 5 hands out of band: they are written as they lie in memory
and read straight into buffers of their own, so a 12 MB state costs no extra copies.
"""
from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np
import torch

_HEADER = struct.Struct("<QI")     # pickle length, number of out-of-band buffers
_LENGTH = struct.Struct("<Q")


class TensorBytes:
    """A tensor as raw bytes, so any dtype (bfloat16 too) travels as a plain byte buffer."""

    def __init__(self, tensor: torch.Tensor) -> None:
        tensor = tensor.detach().to("cpu").contiguous()
        self.dtype, self.shape = tensor.dtype, tuple(tensor.shape)
        self.data: np.ndarray = tensor.reshape(-1).view(torch.uint8).numpy()

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.data).view(self.dtype).reshape(self.shape)


def pack_tensors(value: Any) -> Any:
    """``value`` with every tensor replaced by :class:`TensorBytes` (dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        return TensorBytes(value)
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


def frames(message: Any) -> list[memoryview | bytes]:
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    return [_HEADER.pack(len(body), len(raws)), *(_LENGTH.pack(r.nbytes) for r in raws), body, *raws]


def read_exactly(read_into: Callable[[memoryview], int], n: int) -> bytearray:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        count = read_into(view[got:])
        if not count:
            raise EOFError("connection closed")
        got += count
    return buffer


def parse(read_into: Callable[[memoryview], int]) -> Any:
    length, count = _HEADER.unpack(read_exactly(read_into, _HEADER.size))
    sizes = [_LENGTH.unpack(read_exactly(read_into, _LENGTH.size))[0] for _ in range(count)]
    body = read_exactly(read_into, length)
    return pickle.loads(body, buffers=[read_exactly(read_into, size) for size in sizes])


def write_message(file: BinaryIO, message: Any) -> None:
    for frame in frames(message):
        file.write(frame)


def read_message(file: BinaryIO) -> Any:
    return parse(file.readinto)
