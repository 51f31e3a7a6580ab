"""Inference with a trained trainable: rows in, the model's outputs out, in row order.

The rows go through what evaluation gave the model in training (:meth:`Trainable.batch`
with ``train=False``: the ``eval_transform``, else float32), in batches, on the GPU where
there is one. ``TrialResult.predict`` runs it in the user's process; ``cb.predict`` in each
worker over its share of the rows.
"""
from __future__ import annotations

import numpy as np
import torch

from ._trainable import Trainable, positive_batch_size


def inference_device(index: int = 0) -> torch.device:
    """The device a process predicts on: a GPU where there is one (``index`` spreads
    processes over several), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", index % torch.cuda.device_count())
    return torch.device("cpu")


def predict_rows(trainable: Trainable, features: np.ndarray, batch_size: int | None = None,
                 device: torch.device | None = None) -> np.ndarray:
    """``trainable``'s outputs for ``features`` (rows as the run stored them), ``batch_size``
    rows at a time (default: the trainable's own)."""
    size = trainable.batch_size if batch_size is None else batch_size
    positive_batch_size(size)
    device = inference_device() if device is None else device
    trainable.place(device)
    rng = np.random.default_rng(0)        # an eval_transform that takes one gets the same each time
    if len(features) == 0:
        return _no_rows(trainable, features, rng, device)
    no_label = np.zeros(len(features), dtype=np.int64)
    batches = (trainable.batch(features[i:i + size], no_label[i:i + size], rng, train=False, device=device)
               for i in range(0, len(features), size))
    return trainable.predict_batches(batches)


def _no_rows(trainable: Trainable, features: np.ndarray, rng: np.random.Generator, device: torch.device) -> np.ndarray:
    """The outputs of no rows: of shape (0, outputs...), as many rows would have. The model
    says what one row's outputs are: it runs on a row of zeros (numbers), or on the empty
    batch (encoded bytes, which a row of zeros is not)."""
    one = features[:0] if features.dtype == object else np.zeros((1, *features.shape[1:]), features.dtype)
    batch = trainable.batch(one, np.zeros(len(one), dtype=np.int64), rng, train=False, device=device)
    return trainable.predict_batches([batch])[:0]
