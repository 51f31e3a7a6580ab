"""What labels must be for a loss that takes class indices, said alike for torch and Keras
trials, on the driver before any worker starts: integers (not floats), one a row (not one-hot
rows), each with an output of the model (0..C-1, none negative). Each message names the
labels as they are and how to make them what the loss takes."""
from __future__ import annotations

import numpy as np

# How to make labels class indices, from numpy or from Spark ML.
CLASS_INDEX_FIX = ("y.astype(int), or for Spark ML's double labels (StringIndexer's), "
                   "df.withColumn('label', df['label'].cast('int')) before from_spark")


def refuse_float_classes(label: np.ndarray, loss: str) -> None:
    """Float labels, one a row, where ``loss`` takes class indices."""
    one_a_row = label.ndim == 1 or (label.ndim == 2 and label.shape[1] == 1)
    if one_a_row and np.issubdtype(label.dtype, np.floating):
        raise ValueError(f"the label is {label.dtype} but loss={loss} takes class indices; encode the classes as "
                         f"integers 0..K-1: {CLASS_INDEX_FIX}")


def refuse_rows_of_classes(label: np.ndarray, loss: str, instead: str) -> None:
    """Labels of several values a row (one-hot, say) where ``loss`` takes one class index a row;
    ``instead``: what else the user may do, after "give y.argmax(1)"."""
    if label.ndim != 2 or label.shape[1] < 2:
        return
    one_hot = bool(np.isin(label, (0, 1)).all() and (label.sum(axis=1) == 1).all())
    kind = "one-hot" if one_hot else f"{label.shape[1]} values a row"
    raise ValueError(f"the labels are {kind} ({label.dtype}, shape (rows, {label.shape[1]})) but loss={loss} takes "
                     f"one class index a row, shape (rows,): give y.argmax(1){instead}")


def check_class_range(label_range: tuple[int, int], classes: int, ignored: int | None) -> None:
    """Class indices ``label_range`` (the smallest and largest over every row) must each have one
    of the model's ``classes`` outputs; a negative one is no class, but for ``ignored`` (the
    index the loss skips: -100 for torch's ``cross_entropy``)."""
    low, high = label_range
    if high >= classes:
        raise ValueError(f"the labels hold class indices {low}..{high} but the model outputs {classes} values per "
                         f"row, one per class 0..{classes - 1}; give its last layer {high + 1} outputs, or encode "
                         f"the classes as 0..{classes - 1}")
    if low < 0 and low != ignored:
        raise ValueError(f"the labels hold class indices {low}..{high} but a class index cannot be negative: the "
                         f"model outputs {classes} values per row, one per class 0..{classes - 1}; encode the "
                         f"classes as 0..{classes - 1} (e.g. y - y.min())")
