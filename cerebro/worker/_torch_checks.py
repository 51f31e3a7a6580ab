"""What a torch trial's loss and outputs are checked for: what the loss object says of the
labels it takes (:mod:`._label_checks`), and outputs that the loss would broadcast against the
labels."""
from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import torch

from ._label_checks import refuse_float_classes, refuse_rows_of_classes


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
    if not classification:
        return
    if label.ndim == 1:
        refuse_float_classes(label, name)
    if not np.issubdtype(label.dtype, np.floating):      # float rows are class probabilities: taken
        refuse_rows_of_classes(label, name, f" (or the rows as float32, which {name} takes as class probabilities)")


def ignored_class(loss: Callable | None) -> int:
    """The class index a torch loss skips: its ``ignore_index``, -100 where it names none (as
    ``cross_entropy`` and ``nll_loss`` default to, and a loss of one's own that calls them)."""
    if isinstance(loss, functools.partial):
        return int(loss.keywords.get("ignore_index", -100))
    return int(getattr(loss, "ignore_index", -100))
