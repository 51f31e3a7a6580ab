"""``predict_byom``: MADlib's ``madlib_keras_predict_byom``, inference with a model these
functions did not train ("bring your own model"): the architecture and ``model_weights`` of
a row of a model architecture table, with the class values and normalizing constant the
caller gives, since no summary table says them. The output is ``predict``'s."""
from __future__ import annotations

import math
from typing import Any

from ._database import Database
from ._limits import cut, quoted
from ._model_tables import require_model_ids
from ._predict import predict_rows, rows_kept


def predict_byom(db: Database, model_arch_table: str, model_id: int, test_table: str, id_col: str,
                 independent_varname: str, output_table: str, pred_type: str | int | float = "prob",
                 use_gpus: bool | None = None, class_values: list[Any] | None = None,
                 normalizing_const: float | None = None, dependent_count: int = 1) -> None:
    """Predict ``test_table`` with the model ``model_id`` of ``model_arch_table``: its
    ``model_weights`` (MADlib's format) in its architecture. ``class_values`` names the
    classes in the order of the model's outputs (MADlib's one list, or its list of one list
    per output; NULL: the class ids 0, 1, ...); features are divided by ``normalizing_const``
    (NULL: 1). ``class_name`` is ``dependent_var``, as in MADlib."""
    rows_kept(pred_type)
    if use_gpus:
        raise ValueError("use_gpus is true; predict_byom runs on the CPU: use_gpus => false")
    if dependent_count != 1:
        raise ValueError(f"dependent_count={quoted(dependent_count)}: models with several outputs are not supported; "
                         f"give 1")
    classes = byom_class_values(class_values)
    constant = 1.0 if normalizing_const is None else normalizing_const
    if isinstance(constant, bool) or not isinstance(constant, (int, float)) or not math.isfinite(constant) \
            or constant <= 0:
        raise ValueError(f"normalizing_const={quoted(normalizing_const)} must be a positive number (NULL: 1)")
    if model_id is None:
        raise ValueError(f"model_id is NULL; give the model_id of the row of model_arch_table "
                         f"{quoted(model_arch_table)} that holds the model")
    model_arch, weights = require_model_ids(db, model_arch_table, [model_id])[model_id]
    if weights is None:
        raise ValueError(f"model_arch_table {quoted(model_arch_table)}, model_id {model_id}: model_weights is NULL; "
                         f"load the weights with load_model_arch(..., model_weights => ...) or UPDATE "
                         f"{cut(model_arch_table)} SET model_weights = ... WHERE model_id = {model_id}")
    trained = {"class_values": classes, "dependent_varname": "dependent_var", "normalizing_const": float(constant)}
    predict_rows(db, {"model_arch": model_arch, "model_weights": weights}, test_table, id_col, independent_varname,
                 output_table, pred_type, trained,
                 (f"model_arch_table {quoted(model_arch_table)}, model_id {model_id}", "class_values has"))


def byom_class_values(class_values: list[Any] | None) -> list[str] | None:
    """``class_values`` as one list of names: MADlib 1.x's ``ARRAY['a', 'b']`` or 2.x's
    ``ARRAY[ARRAY['a', 'b']]`` (one list per output: here, one output)."""
    if class_values is None:
        return None
    if class_values and all(isinstance(v, list) for v in class_values):
        if len(class_values) != 1:
            raise ValueError(f"class_values={quoted(class_values)} holds {len(class_values)} lists, one per output; "
                             f"models with several outputs are not supported: give one list")
        class_values = class_values[0]
    if not class_values or any(not isinstance(v, str) for v in class_values):
        raise ValueError(f"class_values={quoted(class_values)} must be a non-empty list of class names without NULLs, "
                         f"in the order of the model's outputs, e.g. ARRAY['cat', 'dog']")
    return list(class_values)
