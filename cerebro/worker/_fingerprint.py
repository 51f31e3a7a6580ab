"""What computes a module, as one digest: everything that makes its function (DESIGN invariant 11).

Two frozen modules share one copy and their computed outputs (:mod:`._frozen`) only where
their fingerprints are equal, so a fingerprint covers everything a module's outputs can
depend on: its class and the code of every method in its class hierarchy; every attribute
(numbers, strings, tuples, lists, dicts, enums, dtypes, nested modules, user objects of
plain Python classes, functions with their code, defaults and closures); its hooks (by
code and order, not by the handle numbers, which differ per build); its parameters and
buffers, registered or not, persistent or not, with their values; ``training``.

What it leaves out on purpose: a module's *globals* (a constant its ``forward`` reads from
its file) are one value per process, the same for every trial built there, so they cannot
tell two trials' modules apart; and the processes' global hooks, likewise.

Where a module holds something whose behaviour cannot be read off it faithfully (an object
of a compiled class, a TorchScript module, a lambda closing over one), :class:`Unfaithful`
names it: such a module is not shared with any other trial, and not materialized.

>>> import torch
>>> class Scale(torch.nn.Module):
...     def __init__(self, factor): super().__init__(); self.factor = factor
...     def forward(self, x): return x * self.factor
>>> fingerprint(Scale(0.01)) == fingerprint(Scale(10.0)), fingerprint(Scale(0.5)) == fingerprint(Scale(0.5))
(False, True)
"""
from __future__ import annotations

import enum
import functools
import hashlib
import struct
import sys
import types
import weakref
from typing import Any

import numpy as np
import torch

from .._checks import quoted

_HEAP_TYPE = 1 << 9         # Py_TPFLAGS_HEAPTYPE: a class defined in Python, whose code can be read
# A class's own entries that say nothing of what its objects compute.
_CLASS_NOISE = frozenset({"__doc__", "__module__", "__qualname__", "__dict__", "__weakref__", "__annotations__",
                          "__firstlineno__", "__static_attributes__", "__type_params__", "__parameters__",
                          "__orig_bases__", "_abc_impl", "__slots__", "__annotate_func__", "__annotations_cache__"})
_NAMED_KINDS = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.qscheme)
# torch's own hook dicts, keyed by a handle's number (a process-wide counter): renumbered by order
_HOOK_DICTS = frozenset({"_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                         "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
                         "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                         "_load_state_dict_post_hooks"})
_BUILTIN_KINDS = (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType,
                  types.MethodWrapperType, types.ClassMethodDescriptorType, types.GetSetDescriptorType,
                  types.MemberDescriptorType)


# A module's classes (one per process, like its globals) digested once: a class made in a
# function (per build) is digested in each fingerprint, as its code and attributes may differ.
_MODULES_CLASSES: weakref.WeakKeyDictionary[type, bytes | None] = weakref.WeakKeyDictionary()


class Unfaithful(Exception):
    """The module holds something whose behaviour a fingerprint cannot cover; the message
    says what and where (``layer.attribute[2]``)."""


def fingerprint(value: Any, *, read_tensors: bool = True, where: str = "the module") -> bytes:
    """The digest of everything ``value`` (a module, usually) computes with; raises
    :class:`Unfaithful` where it holds something that cannot be digested faithfully.
    ``read_tensors=False`` digests tensors by kind and shape alone (a meta build's)."""
    walk = _Walk(read_tensors)
    try:
        walk.value(value, where)
    except RecursionError:
        raise Unfaithful(f"{where} nests deeper than Python's recursion limit") from None
    return walk.hash.digest()


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


class _Walk:
    """One fingerprint being made: the hash, and the objects already digested (an object
    met again, or in a loop, is digested by its place in the walk, not again)."""

    def __init__(self, read_tensors: bool, classes: dict[type, bytes | None] | None = None) -> None:
        self.hash = hashlib.sha256()
        self.read_tensors = read_tensors
        # The classes digested in this fingerprint (None: being digested, met again in a loop).
        self.classes: dict[type, bytes | None] = {} if classes is None else classes
        self._seen: dict[int, int] = {}
        self._held: list[Any] = []      # kept alive to the end of the walk, so no id is reused in it

    def put(self, *parts: str) -> None:
        self.hash.update(("\x1f".join(parts) + "\x1e").encode("utf-8", "surrogatepass"))

    def value(self, value: Any, where: str) -> None:
        kind = type(value)
        if value is None or kind in (bool, int, float, complex, str):
            self.put(kind.__name__, _exactly(value))
        elif kind in (bytes, bytearray):
            self.put(kind.__name__, str(len(value)))
            self.hash.update(value)
        elif isinstance(value, enum.Enum):
            self.put("enum", value.name)
            self.klass(kind, f"{where}'s class")
            self.value(value.value, f"{where}.value")
        elif isinstance(value, types.ModuleType):
            if sys.modules.get(value.__name__) is not value:     # made by hand: its contents are its state
                raise Unfaithful(f"{where} is a module object {value.__name__!r} that is not the imported one")
            self.put("module", value.__name__)
        elif isinstance(value, _NAMED_KINDS):
            self.put(kind.__name__, str(value))
        elif id(value) in self._seen:
            self.put("again", str(self._seen[id(value)]))
        else:
            self._seen[id(value)] = len(self._seen)
            self._held.append(value)
            self._referring(value, kind, where)

    def _referring(self, value: Any, kind: type, where: str) -> None:
        """An object that may refer to others (met once in the walk)."""
        if isinstance(value, torch.Tensor):
            self.tensor(value, where)
        elif isinstance(value, (np.ndarray, np.generic)):
            self.array(value, where)
        elif isinstance(value, torch.nn.Module):
            self.obj(value, where)
        elif kind in (tuple, list, torch.Size) or (isinstance(value, tuple) and hasattr(value, "_fields")):
            self.put(_qualified(kind), str(len(value)))
            for index, item in enumerate(value):
                self.value(item, f"{where}[{index}]")
        elif isinstance(value, (set, frozenset)):
            self.put(_qualified(kind), str(len(value)))
            for item in sorted(value, key=lambda item: (type(item).__name__, repr(item))):
                if type(item) not in (bool, int, float, str, bytes, type(None)):
                    raise Unfaithful(f"{where} is a set holding a {_qualified(type(item))}, whose order cannot be told")
                self.value(item, where)
        elif isinstance(value, dict) and kind.__module__ in ("builtins", "collections"):
            self.put(_qualified(kind), str(len(value)))
            self.value(getattr(value, "default_factory", None), f"{where}.default_factory")
            for key, item in value.items():
                self.value(key, f"{where} key")
                self.value(item, f"{where}[{quoted(key, 80)}]")
        else:
            self._callable(value, kind, where)

    def _callable(self, value: Any, kind: type, where: str) -> None:
        if isinstance(value, weakref.ref):
            self.put("weakref")
            self.value(value(), where)
        elif isinstance(value, functools.partial):
            self.put("partial")
            for part, name in ((value.func, "func"), (value.args, "args"), (value.keywords, "keywords"),
                               (vars(value), "__dict__")):
                self.value(part, f"{where}.{name}")
        elif isinstance(value, types.MethodType):
            self.put("method")
            self.value(value.__self__, f"{where}.__self__")
            self.value(value.__func__, where)
        elif isinstance(value, types.FunctionType):
            self.function(value, where)
        elif isinstance(value, _BUILTIN_KINDS):
            owner = getattr(value, "__self__", None)
            self.put("builtin", str(getattr(value, "__module__", None)), getattr(value, "__qualname__", repr(value)))
            if owner is not None and not isinstance(owner, (types.ModuleType, type)):
                self.value(owner, f"{where}.__self__")
        elif isinstance(value, type):
            self.klass(value, where)
        elif isinstance(value, (staticmethod, classmethod)):
            self.put(kind.__name__)
            self.value(value.__func__, where)
        elif isinstance(value, property):
            self.put("property")
            for accessor in (value.fget, value.fset, value.fdel):
                self.value(accessor, where)
        else:
            self.obj(value, where)

    def tensor(self, tensor: torch.Tensor, where: str) -> None:
        """Its kind, shape and values (a quantized one's integers, scales and zero points), and
        what is set on it (a ``Parameter``'s own attributes)."""
        self.put(_qualified(type(tensor)), str(tensor.dtype), str(tuple(tensor.shape)), str(tensor.layout),
                 str(tensor.requires_grad))
        self.value(dict(vars(tensor)), f"{where}.__dict__")
        if not self.read_tensors or tensor.is_meta or not tensor.numel():
            return
        if tensor.is_quantized:
            self.value(tensor.qscheme(), f"{where}'s scheme")
            per_channel = tensor.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric)
            self.value((tensor.q_per_channel_scales(), tensor.q_per_channel_zero_points(), tensor.q_per_channel_axis())
                       if per_channel else (tensor.q_scale(), tensor.q_zero_point()), f"{where}'s quantization")
            tensor = tensor.int_repr()
        self.hash.update(tensor_bytes(tensor, where))

    def array(self, array: np.ndarray | np.generic, where: str) -> None:
        """Its class (a matrix, a masked array), dtype (fields too), shape and values."""
        if array.dtype.hasobject:
            raise Unfaithful(f"{where} is a numpy array of Python objects")
        self.put(_qualified(type(array)), repr(array.dtype.descr if array.dtype.fields else array.dtype.str),
                 str(np.shape(array)))
        self.hash.update(np.ascontiguousarray(array).tobytes())
        if isinstance(array, np.ma.MaskedArray):
            self.array(np.ma.getmaskarray(array), f"{where}'s mask")

    def function(self, function: types.FunctionType, where: str) -> None:
        """Its code, defaults and what it closes over (not its globals: see the module)."""
        self.put("function", str(function.__module__), function.__qualname__)
        self.code(function.__code__, where)
        self.value(dict(vars(function)), f"{where}.__dict__")
        self.value(function.__defaults__, f"{where}'s defaults")
        self.value(function.__kwdefaults__, f"{where}'s keyword defaults")
        for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:          # not yet assigned
                self.put("empty cell")
                continue
            self.value(contents, f"{where}'s closure {name}")

    def code(self, code: types.CodeType, where: str) -> None:
        self.put("code", code.co_name, str(code.co_argcount), str(code.co_posonlyargcount),
                 str(code.co_kwonlyargcount), str(code.co_flags), *code.co_names, "|", *code.co_varnames, "|",
                 *code.co_freevars, "|", *code.co_cellvars)
        self.hash.update(code.co_code)
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                self.code(constant, where)
            else:
                self.value(constant, f"{where}'s constant")

    def klass(self, kind: type, where: str) -> None:
        """A class by name and by the code of everything defined in it and its bases."""
        if kind not in self.classes and kind in _MODULES_CLASSES:
            self.classes[kind] = _MODULES_CLASSES[kind]
        if kind not in self.classes:
            self.classes[kind] = None
            self.classes[kind] = _class_digest(kind, self)
            if "<locals>" not in kind.__qualname__:
                _MODULES_CLASSES[kind] = self.classes[kind]
        digest = self.classes[kind]
        self.put("class", _qualified(kind), "loop" if digest is None else digest.hex())

    def obj(self, value: Any, where: str) -> None:
        """An object of a Python class (a module, a user's own object): its class and its
        attributes; hooks by their order (a handle's number differs per build)."""
        kind = type(value)
        if isinstance(value, torch.jit.ScriptModule):
            raise Unfaithful(f"{where} is TorchScript ({_qualified(kind)}), whose code cannot be compared")
        if not _state_in_python(kind):
            raise Unfaithful(f"{where} is a {_qualified(kind)}, whose state is held by compiled code and cannot be "
                             f"compared")
        self.value(kind, f"{where}'s class")
        state = getattr(value, "__dict__", None)
        slots = [name for name in _slots(kind) if hasattr(value, name)]
        if state is None and not slots:
            raise Unfaithful(f"{where} is a {_qualified(kind)}, whose state cannot be read")
        attributes = dict(state or {})
        attributes.update({name: getattr(value, name) for name in slots})
        numbers = _hook_numbers(attributes) if isinstance(value, torch.nn.Module) else {}
        for name in sorted(attributes):
            self.put("attribute", name)
            item = attributes[name]
            if numbers and name in _HOOK_DICTS and isinstance(item, dict):
                item = {numbers.get(key, key): hook for key, hook in item.items()}
            self.value(item, f"{where}.{name}")


def _state_in_python(kind: type) -> bool:
    """Whether an object of ``kind`` holds its state in its ``__dict__`` and slots alone: its
    memory is an object's header and those pointers, nothing a compiled base keeps."""
    inline = (kind.__dictoffset__ > 0) + (kind.__weakrefoffset__ > 0) + len(_slots(kind))
    return kind.__basicsize__ == object.__basicsize__ + struct.calcsize("P") * inline


def _slots(kind: type) -> list[str]:
    """The names of the slots ``kind`` and its bases declare (not ``__dict__``, ``__weakref__``)."""
    names = []
    for base in kind.__mro__:
        declared = base.__dict__.get("__slots__", ())
        for name in [declared] if isinstance(declared, str) else list(declared):
            private = name.startswith("__") and not name.endswith("__")     # stored under its mangled name
            names.append(f"_{base.__name__.lstrip('_')}{name}" if private else name)
    return [name for name in dict.fromkeys(names) if name not in ("__dict__", "__weakref__")]


def tensor_bytes(tensor: torch.Tensor, where: str) -> bytes:
    """A tensor's values as bytes, in a dense, contiguous layout on the CPU (a sparse tensor,
    a conjugate or negative view read as the values they stand for)."""
    try:
        dense = tensor.detach().cpu()
        dense = dense.to_dense() if dense.layout != torch.strided else dense
        flat = dense.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
    except (RuntimeError, TypeError) as error:
        raise Unfaithful(f"{where} is a {tensor.layout} {tensor.dtype} tensor whose values cannot be read as "
                         f"bytes ({error})") from None
    return flat.numpy().tobytes()


def _exactly(value: Any) -> str:
    """A plain value exactly: a float's bits (-0.0, NaN payloads), an int in hex (any size)."""
    if isinstance(value, float):
        return struct.pack("<d", value).hex()
    if isinstance(value, complex):
        return struct.pack("<dd", value.real, value.imag).hex()
    if isinstance(value, int) and not isinstance(value, bool):
        return hex(value)
    return repr(value)


def _class_digest(kind: type, within: _Walk) -> bytes:
    """What a class's own code and constants are, the classes they name digested likewise
    (a helper class made in ``build`` with other code is another class). A class attribute
    of another kind (a ``TypeVar``, a compiled object) counts by its kind alone, where the
    class is one of a module's (one class per process); a class made in a function is
    unfaithful with such an attribute."""
    walk = _Walk(within.read_tensors, within.classes)
    for base in kind.__mro__[:-1]:
        walk.put("base", _qualified(base))
        for name in sorted(set(base.__dict__) - _CLASS_NOISE if base.__flags__ & _HEAP_TYPE else ()):
            walk.put(name)
            try:
                walk.value(base.__dict__[name], f"{_qualified(base)}.{name}")
            except Unfaithful:
                if "<locals>" in base.__qualname__:     # made per build: its attributes may differ per build
                    raise
                walk.put("opaque", _qualified(type(base.__dict__[name])))
    return walk.hash.digest()


def _hook_numbers(attributes: dict[str, Any]) -> dict[Any, int]:
    """A module's hook handles (a process-wide counter) by their order among its hooks."""
    handles = {key for name, item in attributes.items() if name in _HOOK_DICTS and isinstance(item, dict)
               for key in item if isinstance(key, int)}
    return {handle: index for index, handle in enumerate(sorted(handles))}
