"""What the driver checks of a Keras trial before any worker starts, as a torch trial's
preflight step does, without a training step (Keras would trace and compile a function for
it): labels its loss cannot take (:mod:`._label_checks`), rows of another shape than the
model's input, class indices without an output. Each is refused naming the value and the fix,
where it would otherwise fail every trial on every worker with TensorFlow's "Graph execution
error" (or JAX's) at the first batch."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._label_checks import check_class_range, refuse_float_classes, refuse_rows_of_classes


class LossKind(enum.Enum):
    SPARSE = "sparse"              # one class index a row
    CATEGORICAL = "categorical"    # one-hot rows
    OTHER = "other"


@dataclass(frozen=True)
class KerasLoss:
    """A compiled model's loss as the checks see it: its kind, its name, and the class index
    it skips (``ignore_class``), if any."""

    kind: LossKind
    name: str
    ignored: int | None = None

    @classmethod
    def of(cls, loss: Any) -> KerasLoss:
        """``loss`` as ``compile`` took it: a name, a function or a ``keras.losses.Loss``."""
        name = loss if isinstance(loss, str) else getattr(loss, "name", None) or \
            getattr(loss, "__name__", type(loss).__name__)
        config = loss.get_config() if hasattr(loss, "get_config") else {}
        kinds = {"sparsecategoricalcrossentropy": LossKind.SPARSE, "categoricalcrossentropy": LossKind.CATEGORICAL}
        return cls(kinds.get(str(name).lower().replace("_", ""), LossKind.OTHER), str(name), config.get("ignore_class"))


def check_keras_label(loss: KerasLoss, label: np.ndarray) -> None:
    """Labels (a sample) of a kind ``loss`` cannot take."""
    if loss.kind is LossKind.SPARSE:
        refuse_float_classes(label, loss.name)
        refuse_rows_of_classes(label, loss.name, ", or compile the model with loss='categorical_crossentropy'")
    elif loss.kind is LossKind.CATEGORICAL and label.ndim == 1:
        raise ValueError(f"loss={loss.name} takes one-hot labels, shape (rows, classes), but the labels are "
                         f"{label.dtype} class indices, shape (rows,): compile the model with "
                         f"loss='sparse_categorical_crossentropy', or give keras.utils.to_categorical(y)")


def check_keras_rows(model: Any, inputs: Any, label: np.ndarray, label_range: tuple[int, int] | None,
                     transformed: bool) -> None:
    """``inputs`` (a few rows as a worker gives them to ``model``: through the transform where
    ``transformed``) must fit the model's input, and the class indices its outputs."""
    given = tuple(inputs.shape[1:])
    taken = _input_shape(model)
    if taken is not None and (len(taken) != len(given) or any(t not in (None, g) for t, g in zip(taken, given))):
        after = " after the transform" if transformed else ""
        raise ValueError(f"the model takes rows of shape {taken} (its keras.Input) but the features{after} "
                         f"have rows of shape {given}: build it with keras.Input({given}), or give it rows of shape "
                         f"{taken}")
    loss = KerasLoss.of(model.loss)
    if loss.kind is LossKind.OTHER:
        return
    width = _output_width(model, inputs)
    if width is None:
        return
    if loss.kind is LossKind.SPARSE and label_range is not None:
        check_class_range(label_range, width, loss.ignored)
    elif loss.kind is LossKind.CATEGORICAL and label.ndim == 2 and label.shape[1] != width:
        raise ValueError(f"the labels have {label.shape[1]} values a row, one per class, but the model outputs "
                         f"{width}; give its last layer {label.shape[1]} outputs")


def _input_shape(model: Any) -> tuple[int | None, ...] | None:
    """The shape of a row the model takes, where it has one input that says (a subclassed
    model's says nothing)."""
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1:
        return None
    return tuple(inputs[0].shape[1:])


def _output_width(model: Any, inputs: Any) -> int | None:
    """Values per row of the model's one output: its declared shape, else (a subclassed
    model) from a forward pass on ``inputs`` in inference mode."""
    outputs = getattr(model, "outputs", None)
    if outputs:
        shape = tuple(outputs[0].shape) if len(outputs) == 1 else ()
    else:
        try:
            shape = tuple(model(inputs, training=False).shape)
        except Exception as error:
            raise ValueError(f"the model cannot take the features as a worker gives them (shape "
                             f"{tuple(inputs.shape)}): {type(error).__name__}: {error}") from error
    return int(shape[-1]) if len(shape) == 2 and shape[-1] is not None else None
