"""Frozen layers, computed once per partition: ``TorchTrainable(frozen=backbone)``.

A frozen module never trains (eval mode, no gradients), so its outputs for a partition's rows
are the same in every epoch and for every trial whose frozen module is the same. A worker
computes them once, the first time a trial needs them (*materialization*), keeps them with
the partition, and every later sub-epoch of every such trial trains its head on them: the
same batches, in the same sample order, without running the backbone again. This is the
materialization of Nautilus (Nakandala & Kumar, "Nautilus: An Optimized System for Deep
Transfer Learning over Evolving Training Datasets", SIGMOD 2022), which measured 2.9-4.2x.

*The same frozen module* is told by a digest of everything that computes it: class and code,
every attribute, hooks, tensors and buffers (:mod:`._fingerprint`). A ``Sequential`` has one
per prefix (``backbone[:k]``), chained, so freeze depth can be a hyperparameter: a deeper
prefix is computed from the longest shallower one a worker keeps, not from the input. A
frozen module holding something that cannot be digested faithfully (an object of a compiled
class, TorchScript, a function closing over one) is *unfaithful*: it is shared with no other
trial and not materialized (it runs on every batch, as in the plain model), and the run says
so once.

*What is kept*: a worker keeps the outputs for partitions it holds in memory in memory, within
:data:`MATERIALIZED_BYTES` (``CEREBRO_MATERIALIZED_BYTES``), and those of streamed partitions
in files on its local disk, mapped (the page cache holds what is read, as for the partition),
within :data:`MATERIALIZED_DISK_BYTES` (``CEREBRO_MATERIALIZED_DISK_BYTES``). Past a budget,
the greedy rule of :meth:`Materialized.keep` keeps what saves the most compute per byte;
outputs not kept are computed again where they are needed (never a different result: only
slower).

*When not*: a training ``transform`` that draws from its ``rng`` (augmentation) makes the
frozen outputs differ every epoch, so training then runs the frozen module on every batch
(evaluation, with a deterministic ``eval_transform``, stays materialized). Whether a
transform draws is tested on the partition's first rows with two generators. Frozen layers
that draw random numbers themselves (noise, a ``Dropout`` a module keeps in training mode)
run on every batch, training and evaluation: run twice on those rows after other seeds,
their outputs differ (:func:`frozen_draws`).

*Switched off*: ``CEREBRO_MATERIALIZE=0`` in a worker's environment makes every trial run its
frozen layers on every batch, as the plain model would (to compare the two, or to rule this
out when hunting a difference): the results are the same, only slower.
"""
from __future__ import annotations

import hashlib
import os
import random
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np
import torch

from ..data import InMemoryPartition, PartitionSource, StreamedPartition
from ..store._scratch import remove_scratch, scratch_directory
from ._fingerprint import Unfaithful, fingerprint, tensor_bytes

MATERIALIZED_BYTES = 2 << 30     # per worker, in memory; CEREBRO_MATERIALIZED_BYTES sets another
MATERIALIZED_DISK_BYTES = 32 << 30   # per worker, mapped from local disk; CEREBRO_MATERIALIZED_DISK_BYTES
_CHUNK_ROWS = 256                # rows the frozen module runs on at once while materializing
DRAWS_ROWS = 8                   # rows the frozen layers run on, twice, to tell whether they draw


class FrozenPart:
    """A frozen module as a trial holds it: in eval mode, without gradients, never trained."""

    def __init__(self, module: Any) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"frozen must be a torch.nn.Module (the layers to keep frozen), or None; got "
                            f"{type(module).__name__}")
        self.module = module.eval().requires_grad_(False)
        self._digests: list[str] | None = None
        self._unfaithful: str | None = None

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.module.eval()(inputs)

    @property
    def layers(self) -> list[torch.nn.Module]:
        """The prefix steps: a plain ``Sequential``'s layers (whose forward is their chain
        alone), else the module as one (a subclass's forward, or hooks on it, are its own)."""
        module = self.module
        hooked = module._forward_hooks or module._forward_pre_hooks
        return list(module) if type(module) is torch.nn.Sequential and not hooked else [module]

    def digests(self) -> list[str]:
        """One digest per prefix (``layers[:k + 1]``), each chained on the one before: equal
        where everything that computes the prefixes is. An unfaithful layer is digested by its
        class and weights alone (what tells the run's stored copy of them), and
        :attr:`unfaithful` says why it is not shared."""
        if self._digests is None:
            digested = []
            for index, layer in enumerate(self.layers):
                try:
                    digested.append(fingerprint(layer, where=f"frozen layer {index} ({type(layer).__name__})"))
                except Unfaithful as why:
                    self._unfaithful = self._unfaithful or str(why)
                    digested.append(b"weights:" + _weights_digest(layer))
            self._digests = chained_digests(b"cerebro-frozen/2", digested)
        return self._digests

    @property
    def unfaithful(self) -> str | None:
        """Why these frozen layers are shared with no other trial and not materialized (what in
        them cannot be digested faithfully), or None."""
        self.digests()
        return self._unfaithful

    def forget_digests(self) -> None:
        """The weights changed (loaded from the run's copy): digest them again when asked."""
        self._digests, self._unfaithful = None, None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.module.state_dict().values())

    def run_from(self, depth: int, inputs: Any, device: torch.device) -> np.ndarray:
        """``layers[depth:]`` applied to ``inputs`` (a batch of the transformed features, or
        of prefix ``depth``'s outputs) in eval mode without gradients, on the CPU after."""
        x = inputs if isinstance(inputs, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(inputs))
        with torch.no_grad():
            x = x.to(device)
            for layer in self.layers[depth:]:
                x = layer.eval()(x)
        return x.cpu().numpy()


def chained_digests(tag: bytes, layers: Iterable[bytes]) -> list[str]:
    """One digest per prefix of ``layers`` (each layer's own digest), chained on the one before."""
    chained, found = hashlib.sha256(tag), []
    for layer in layers:
        chained = hashlib.sha256(chained.digest() + layer)
        found.append(chained.hexdigest())
    return found


def _weights_digest(layer: torch.nn.Module) -> bytes:
    """An unfaithful layer's class and weights: which stored weights are its."""
    described = hashlib.sha256(f"{type(layer).__module__}.{type(layer).__qualname__}\n".encode())
    for name, tensor in layer.state_dict().items():
        described.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        if tensor.numel() and not tensor.is_meta:
            try:
                described.update(tensor_bytes(tensor, name))
            except Unfaithful as why:       # not even its weights can be read: it cannot be stored either
                raise ValueError(f"frozen layer {type(layer).__name__}: {why}") from None
    return described.digest()


def draws(transform: Callable | None, features: np.ndarray) -> bool:
    """Whether ``transform`` gives ``features`` different outputs for different generators
    (augmentation): then its outputs, and the frozen module's, cannot be computed once."""
    if transform is None or len(features) == 0:
        return False
    first = transform(features, np.random.default_rng(1))
    second = transform(features, np.random.default_rng(2))
    first, second = (t.cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in (first, second))
    return first.shape != second.shape or not np.array_equal(first, second, equal_nan=True)


def frozen_draws(frozen: Any, features: np.ndarray, transform: Callable | None, device: torch.device) -> bool:
    """Whether the frozen layers give ``features`` (made inputs by the deterministic
    ``transform``) different outputs when run twice, each time
    after seeding torch's, numpy's and Python's generators with another seed (noise, or a
    ``Dropout`` a module keeps in training mode): then their outputs cannot be computed once.
    Those generators are left as they were."""
    inputs, outputs, states = _inputs(features, transform), [], (random.getstate(), np.random.get_state())
    try:
        for seed in (1, 2):
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.default_generator.manual_seed(seed)
                if device.type == "cuda":
                    torch.cuda.manual_seed_all(seed)
                random.seed(seed)
                np.random.seed(seed)
                outputs.append(frozen.run_from(0, inputs, device))
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
    first, second = outputs
    return first.shape != second.shape or not np.array_equal(first, second, equal_nan=True)


def transform_key(transform: Callable | None) -> str:
    """Which transform made the inputs: equal functions (by their pickled code) share outputs."""
    return "" if transform is None else hashlib.sha256(cloudpickle.dumps(transform)).hexdigest()


@dataclass
class _Kept:
    outputs: np.ndarray
    label: np.ndarray
    seconds: float           # what computing them cost: what keeping them saves, each time used
    path: str | None = None  # the file they are mapped from (a streamed partition's), or in memory

    @property
    def nbytes(self) -> int:
        return self.outputs.nbytes + self.label.nbytes


class Materialized:
    """A worker's frozen outputs: by (prefix digest, transform, partition, split)."""

    def __init__(self, budget: int | None = None, disk_budget: int | None = None) -> None:
        self.budget = _budget("CEREBRO_MATERIALIZED_BYTES", MATERIALIZED_BYTES) if budget is None else budget
        self.disk_budget = _budget("CEREBRO_MATERIALIZED_DISK_BYTES", MATERIALIZED_DISK_BYTES) \
            if disk_budget is None else disk_budget
        self._directory: str | None = None     # scratch for a streamed partition's outputs, made when needed
        self._kept: OrderedDict[tuple[str, str, int, str], _Kept] = OrderedDict()
        self.computed = 0            # materializations done (for tests and the benchmark)
        self._draws: dict[str, bool] = {}     # transform key -> whether it draws from its rng
        self._drawing: dict[str, bool] = {}   # frozen layers' digest -> whether they draw random numbers
        self._modules: dict[str, torch.nn.Module] = {}     # digest -> the one copy of those frozen layers
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # transform -> its key

    def source(self, frozen: FrozenPart, transform: Callable | None, partition: int, split: str,
               stored: PartitionSource, device: torch.device) -> PartitionSource:
        """The partition split ``stored`` with the frozen module's outputs for features, rows
        in the stored order (so every sample order is the one of ``stored``)."""
        digests, made_by = frozen.digests(), self._key_of(transform)
        key = (digests[-1], made_by, partition, split)
        kept = self._kept.get(key)
        if kept is None:
            started = time.perf_counter()
            depth, start = self._deepest_kept(digests, made_by, partition, split)
            outputs, label = _compute(frozen, depth, start, stored, transform, device)
            kept = _Kept(outputs, label, time.perf_counter() - started)
            if isinstance(stored, StreamedPartition):     # it was streamed for its size: so are they
                kept = self._mapped(kept)
            self.computed += 1
            if not self.keep(key, kept) and kept.path is not None:
                os.remove(kept.path)          # mapped, it is read from the file until dropped
        else:
            self._kept.move_to_end(key)
        return InMemoryPartition(stored.layout, kept.outputs, kept.label)

    def _deepest_kept(self, digests: list[str], made_by: str, partition: int,
                      split: str) -> tuple[int, tuple[np.ndarray, np.ndarray] | None]:
        """How many layers the longest kept prefix covers, and its outputs (None: none kept)."""
        for depth in range(len(digests) - 1, 0, -1):
            kept = self._kept.get((digests[depth - 1], made_by, partition, split))
            if kept is not None:
                return depth, (kept.outputs, kept.label)
        return 0, None

    def keep(self, key: tuple[str, str, int, str], kept: _Kept) -> bool:
        """Keep ``kept`` within the budget, greedily by compute saved per byte: the entries
        that save less per byte than it are dropped, cheapest first, until it fits; where it
        still does not fit, it is not kept (computed again when needed). Nautilus chooses with
        an MILP; per byte saved is its greedy relaxation."""
        worth, budget = kept.seconds / max(kept.nbytes, 1), self.budget if kept.path is None else self.disk_budget
        alike = [k for k, v in self._kept.items() if (v.path is None) == (kept.path is None)]
        held = sum(self._kept[k].nbytes for k in alike)
        cheaper = sorted(alike, key=lambda k: self._kept[k].seconds / max(self._kept[k].nbytes, 1))
        dropped = []
        for other in cheaper:
            if held + kept.nbytes <= budget:
                break
            entry = self._kept[other]
            if entry.seconds / max(entry.nbytes, 1) >= worth:
                break
            dropped.append(other)
            held -= entry.nbytes
        if held + kept.nbytes > budget:
            return False
        for other in dropped:
            gone = self._kept.pop(other)
            if gone.path is not None:
                os.remove(gone.path)
        self._kept[key] = kept
        return True

    def nbytes(self) -> int:
        return sum(k.nbytes for k in self._kept.values())

    def _frozen_draws(self, frozen: Any, transform: Callable | None, stored: PartitionSource,
                      device: torch.device) -> bool:
        """:func:`frozen_draws` on the first rows of the first partition that asks, once per
        frozen layers' digest: layers that draw run on every batch, as in the plain model."""
        digest = frozen.digests()[-1]
        if digest not in self._drawing:
            first = next(iter(stored.eval_batches(DRAWS_ROWS)), None)
            self._drawing[digest] = first is not None and frozen_draws(frozen, first[0], transform, device)
        return self._drawing[digest]

    def _key_of(self, transform: Callable | None) -> str:
        """:func:`transform_key`, pickled once per transform object (not once per sub-epoch)."""
        if transform is None:
            return ""
        try:
            key = self._keys.get(transform)
            if key is None:
                key = self._keys[transform] = transform_key(transform)
            return key
        except TypeError:          # no weak reference to it: pickled each time
            return transform_key(transform)

    def _mapped(self, kept: _Kept) -> _Kept:
        """``kept`` with its outputs written to this worker's scratch directory and mapped
        from there: the page cache holds what is read, as it does for the partition."""
        if self._directory is None:
            self._directory = scratch_directory("cerebro-frozen")
        path = os.path.join(self._directory, f"{self.computed}.npy")
        np.save(path, kept.outputs)
        return _Kept(np.load(path, mmap_mode="r"), kept.label, kept.seconds, path)

    def close(self) -> None:
        """Remove the mapped outputs' files (a worker ends)."""
        self._kept.clear()
        if self._directory is not None:
            remove_scratch(self._directory)
            self._directory = None

    def share(self, trainable: Any) -> None:
        """One copy of each frozen module on this worker: a trial built with frozen layers
        equal to ones here (by digest) uses those, and its own copy is freed (a backbone per
        trial would fill the worker's memory, or its GPU's)."""
        frozen = trainable.frozen_part()
        if frozen is None or not isinstance(getattr(trainable, "frozen", None), torch.nn.Module) \
                or frozen.unfaithful is not None:
            return
        known = self._modules.setdefault(frozen.digests()[-1], frozen.module)
        frozen.module = trainable.frozen = known

    def for_trial(self, trainable: Any, partition: int, split: str, stored: PartitionSource,
                  device: torch.device) -> PartitionSource | None:
        """The source a sub-epoch of ``trainable`` reads ``stored`` through: its frozen
        outputs, or None where it has no frozen module or its transform for ``split`` draws
        (then the frozen module runs on each batch)."""
        frozen = trainable.frozen_part()
        if frozen is None or os.environ.get("CEREBRO_MATERIALIZE") == "0" or frozen.unfaithful is not None:
            return None
        transform = trainable.transform if split == "train" else trainable.eval_transform
        made_by = self._key_of(transform)
        if made_by not in self._draws:      # the first rows of the first partition that asks
            first = next(iter(stored.eval_batches(32)), None)
            self._draws[made_by] = first is not None and draws(transform, first[0])
        if self._draws[made_by] or self._frozen_draws(frozen, transform, stored, device):
            return None
        return self.source(frozen, transform, partition, split, stored, device)


def _compute(frozen: FrozenPart, depth: int, start: tuple[np.ndarray, np.ndarray] | None, stored: PartitionSource,
             transform: Callable | None, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """The frozen layers from ``depth`` on, applied to every row of ``stored`` in its stored
    order: to ``start``'s outputs where a prefix is kept, else to the (transformed) features."""
    chunks = _chunks(start) if start is not None else \
        ((_inputs(features, transform), label) for features, label in stored.eval_batches(_CHUNK_ROWS))
    outputs, labels = [], []
    for inputs, label in chunks:
        outputs.append(frozen.run_from(depth, inputs, device))
        labels.append(label)
    if not outputs:
        return np.zeros((0,), np.float32), np.zeros((0,), stored.layout.label_dtype)
    return np.concatenate(outputs), np.concatenate(labels)


def _chunks(start: tuple[np.ndarray, np.ndarray]) -> Any:
    outputs, label = start
    for begin in range(0, len(label), _CHUNK_ROWS):
        yield outputs[begin:begin + _CHUNK_ROWS], label[begin:begin + _CHUNK_ROWS]


def _inputs(features: np.ndarray, transform: Callable | None) -> Any:
    if transform is None:
        return features.astype(np.float32, copy=False)
    return transform(features, np.random.default_rng(0))       # deterministic: checked by draws()


def _budget(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if not value else int(value)
