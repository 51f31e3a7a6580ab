"""A model's outputs as a table: one column per output, or the k likeliest classes."""
from __future__ import annotations

import numpy as np
import pandas as pd

# Rows within this of summing to 1, with no negative value, are probabilities already.
_PROBABILITY_TOLERANCE = 1e-3


def as_probabilities(outputs: np.ndarray) -> np.ndarray:
    """``outputs`` (rows, classes) as probabilities, row by row (so how rows are batched
    cannot change the answer): a row that is non-negative and sums to 1 (within 1e-3: a
    softmax layer's output) is kept, any other is taken as logits and softmaxed."""
    values = outputs.astype(np.float64)
    shifted = np.exp(values - values.max(axis=1, keepdims=True))
    softmaxed = shifted / shifted.sum(axis=1, keepdims=True)
    already = (values >= 0).all(axis=1) & (np.abs(values.sum(axis=1) - 1.0) <= _PROBABILITY_TOLERANCE)
    return np.where(already[:, None], values, softmaxed)


def top_k_classes(outputs: np.ndarray, k: int) -> pd.DataFrame:
    """The ``k`` likeliest classes of each row and their probabilities (see
    :func:`as_probabilities`): columns ``class_1, prob_1, ..., class_k, prob_k``, the
    likeliest first; ties go to the lower class index."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k={k!r} must be a positive integer")
    if outputs.ndim != 2 or outputs.shape[1] < k:
        raise ValueError(f"top_k={k} needs outputs of shape (rows, classes) with at least {k} classes; the model "
                         f"outputs {tuple(outputs.shape[1:])} per row")
    probabilities = as_probabilities(outputs)
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    columns: dict[str, np.ndarray] = {}
    for rank in range(k):
        columns[f"class_{rank + 1}"] = order[:, rank]
        columns[f"prob_{rank + 1}"] = np.take_along_axis(probabilities, order[:, rank:rank + 1], axis=1)[:, 0]
    return pd.DataFrame(columns)


def output_frame(outputs: np.ndarray) -> pd.DataFrame:
    """One column per output (``output_0``, ...), or ``output`` where each row is one value."""
    if outputs.ndim == 1 or (outputs.ndim == 2 and outputs.shape[1] == 1):
        return pd.DataFrame({"output": outputs.reshape(len(outputs))})
    flat = outputs.reshape(len(outputs), int(np.prod(outputs.shape[1:])))    # -1 cannot size zero rows
    return pd.DataFrame({f"output_{i}": flat[:, i] for i in range(flat.shape[1])})
