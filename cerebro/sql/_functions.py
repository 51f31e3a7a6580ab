"""What the installed SQL functions call: one entry per function, each given the session's
database. The function bodies (see :mod:`._install`) only put this installation's packages
on PL/Python's path and call :func:`call` with the settings the DBA installed them with."""
from __future__ import annotations

import contextlib
import sys
from typing import Any

from .._version import __version__
from ._byom import predict_byom
from ._database import Database, Installation
from ._fit_multiple import automl, fit_multiple_model
from ._fit_one import fit
from ._model_tables import (
    delete_model_arch,
    generate_model_configs,
    hyperband_schedule,
    load_model_arch,
    load_model_selection_table,
)
from ._predict import evaluate, predict
from ._preprocess import train_test_split, training_preprocessor_dl, validation_preprocessor_dl


def version(db: Database) -> str:
    """Cerebro's version and the Python that runs it in the server."""
    return f"cerebro {__version__} on Python {sys.version.split()[0]} ({sys.executable})"


def load_keras_model(db: Database, keras_model_arch_table: str, **arguments: Any) -> int:
    """MADlib's ``load_keras_model``: :func:`load_model_arch` under MADlib's argument names."""
    return load_model_arch(db, keras_model_arch_table, **arguments)


def delete_keras_model(db: Database, keras_model_arch_table: str, model_id: int) -> None:
    """MADlib's ``delete_keras_model``."""
    delete_model_arch(db, keras_model_arch_table, model_id)


ENTRIES = {function.__name__: function for function in (
    version, load_model_arch, load_keras_model, delete_keras_model, load_model_selection_table,
    generate_model_configs, hyperband_schedule, fit, fit_multiple_model, automl, predict, predict_byom, evaluate,
    training_preprocessor_dl, validation_preprocessor_dl, train_test_split)}


def call(entry: str, installation: dict[str, Any], /, **arguments: Any) -> Any:
    """Run the entry of a SQL function with its SQL arguments (one is ``name``, hence ``/``)
    under the DBA's ``installation`` (see :class:`Installation`)."""
    db = Database(Installation(**installation))
    try:
        return ENTRIES[entry](db, **arguments)
    finally:
        # After an error the transaction may be aborted: it ends, and the path with it.
        with contextlib.suppress(Exception):
            db.close()
