"""The frozen layers' weights, stored once per run: ``RUN/frozen/<digest>.safetensors``.

A trial with ``TorchTrainable(frozen=...)`` checkpoints its head alone, and the digest of the
frozen layers it trained on (see :mod:`._frozen`). The first worker to build frozen layers
with a digest writes their weights beside the checkpoints, once for every trial that shares
them. ``model()``, predict and export build the trial again; where the frozen layers the
build makes now are not those it trained on (the pretrained file was replaced since), the
stored ones are loaded into them, and where the run holds none, that is an error, never a
model composed of other weights.
"""
from __future__ import annotations

import os
import re
from typing import Any

import torch

from .._checks import shortened
from ..store import _files as files

FROZEN_DIR = "frozen"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")      # a checkpoint names it: never a path
_HEADER_ROOM = 16 << 20       # a safetensors file's JSON header, beyond its tensors' bytes


def frozen_dir(data_dir: str) -> str:
    """Where a run keeps frozen weights, from where it keeps its partitions (``RUN/data``)."""
    parent = data_dir.rstrip("/").rsplit("/", 1)[0]
    return files.join(parent, FROZEN_DIR)


def store_weights(trainable: Any, directory: str, stored: set[str]) -> None:
    """Write ``trainable``'s frozen weights under ``directory`` once (``stored``: the digests
    this worker wrote or found). A store the worker cannot write costs only this copy: the
    build can still make them, as it did here."""
    frozen = trainable.frozen_part()
    if frozen is None or not isinstance(frozen.module, torch.nn.Module):
        return
    digest = frozen.digests()[-1]
    if digest in stored:
        return
    stored.add(digest)
    from safetensors.torch import save
    try:
        path = files.refuse_links(os.path.dirname(os.path.normpath(directory)),
                                  files.join(directory, f"{digest}.safetensors"))
        if not files.exists(path):
            weights = {k: v.detach().cpu().contiguous().clone() for k, v in frozen.module.state_dict().items()}
            files.write_atomic(path, save(weights))
    except (OSError, ValueError):
        pass


def _read_weights(path: str, expected: int) -> dict[str, torch.Tensor]:
    """The weights in ``path``, read only up to the size the frozen layers built now have (and
    a header's room): a file of another size, or one safetensors cannot read, is damage
    naming the file, never gigabytes read into memory."""
    from safetensors.torch import load
    try:
        blob = files.read_regular(path, expected + _HEADER_ROOM)
        return load(blob)
    except ValueError as error:
        raise ValueError(f"{path} cannot hold the frozen layers ({expected} bytes of weights): {error}") from None
    except Exception as error:           # safetensors' own SafetensorError: truncated, a bad header
        raise ValueError(f"{path} is damaged: {type(error).__name__}: {error}") from None


def restore_frozen(trainable: Any, trained_on: str | None, store: Any, trial_id: str) -> None:
    """Make ``trainable``'s frozen layers those with the digest ``trained_on`` (what its
    checkpoint says): as built where they are, else from the run's stored copy."""
    frozen = trainable.frozen_part()
    if frozen is None or trained_on is None or frozen.digests()[-1] == trained_on:
        return
    if not _DIGEST.match(trained_on):
        raise ValueError(f"{trial_id}'s checkpoint names frozen layers {trained_on!r}, which is no digest")
    path = store.file(FROZEN_DIR, f"{trained_on}.safetensors")
    if not files.exists(path):
        raise ValueError(f"{trial_id} trained on frozen layers {trained_on[:12]}, but build(config) makes others now "
                         f"({frozen.digests()[-1][:12]}: were the pretrained weights it loads replaced?), and the run "
                         f"holds no copy of those it trained on ({path})")
    try:
        frozen.module.load_state_dict(_read_weights(path, frozen.nbytes()))
    except RuntimeError as error:      # other names or shapes: torch's message names neither file nor bound
        raise ValueError(f"{path} does not hold the frozen layers {trial_id} trained on: "
                         f"{shortened(str(error))}") from None
    frozen.forget_digests()
    if frozen.digests()[-1] != trained_on:
        raise ValueError(f"{path} does not hold the frozen layers {trial_id} trained on (their digest differs)")
