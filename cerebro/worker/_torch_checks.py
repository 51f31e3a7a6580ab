"""What a torch trial's loss and outputs are checked for: what the loss object says of the
labels it takes, and outputs that the loss would broadcast against the labels."""
from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import torch


@contextlib.contextmanager
def broadcast_refused(watch: bool) -> Iterator[None]:
    """Where ``watch``: torch's losses warn, then broadcast, when the outputs' shape is not the
    labels' (a regression model's (B, 1) against labels (B,) becomes (B, B) pairs, and it
    trains on them): that is an error instead. Other warnings are given on as they came."""
    if not watch:
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        if str(warning.message).startswith("Using a target size"):
            raise ValueError(f"the model's outputs and the labels differ in shape ({warning.message}); the loss "
                             f"would pair every output with every label. Make them equal: e.g. return "
                             f"model(x).squeeze(-1) for labels of shape (rows,), or give labels of shape (rows, 1)")
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


# How to make labels class indices, from numpy or from Spark ML (the driver's preflight says it too).
CLASS_INDEX_FIX = ("y.astype(int), or for Spark ML's double labels (StringIndexer's), "
                   "df.withColumn('label', df['label'].cast('int')) before from_spark")


def check_loss(loss: Callable, label: np.ndarray) -> None:
    """What can be told from the loss object itself, without running user code: torch's
    classification losses need integer class indices, and every loss must average the batch."""
    function = loss.func if isinstance(loss, functools.partial) else loss
    reduction = getattr(loss, "reduction", None) or (loss.keywords.get("reduction")
                                                     if isinstance(loss, functools.partial) else None)
    name = getattr(function, "__name__", type(function).__name__)
    if reduction == "none":
        raise ValueError(f"loss={name} with reduction='none' returns one value per row; the loss must return "
                         f"the batch's mean (reduction='mean')")
    classification = function in (torch.nn.functional.cross_entropy, torch.nn.functional.nll_loss) or \
        isinstance(function, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss))
    if classification and np.issubdtype(label.dtype, np.floating) and label.ndim == 1:
        raise ValueError(f"the label is {label.dtype} but loss={name} takes class indices; encode the classes as "
                         f"integers 0..K-1: {CLASS_INDEX_FIX}")
