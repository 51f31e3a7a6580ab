"""Cerebro's optional parts (the extras of ``pyproject.toml``) and the one error for a missing
one: it names the package and the ``pip install`` that brings it, so the command line says it
in one line (exit 2) and a program can catch it as the ``ImportError`` it is.

>>> from cerebro._extras import Extra, MissingExtraError
>>> print(MissingExtraError("pyspark", "cb.SparkBackend"))
cb.SparkBackend needs pyspark, which is not installed: pip install "cerebro[spark]"
"""
from __future__ import annotations

import enum
import importlib.util


class Extra(enum.Enum):
    """An extra of ``pyproject.toml``: ``pip install "cerebro[<value>]"``."""

    SPARK = "spark"
    RAY = "ray"
    DASK = "dask"
    SQL = "sql"
    MLFLOW = "mlflow"
    ONNX = "onnx"
    KERAS = "keras"


# Each package an extra brings that Cerebro imports (by its top-level module), and that extra.
PROVIDED_BY = {
    "pyspark": Extra.SPARK, "py4j": Extra.SPARK,
    "ray": Extra.RAY,
    "dask": Extra.DASK, "distributed": Extra.DASK,
    "adbc_driver_postgresql": Extra.SQL, "adbc_driver_manager": Extra.SQL,
    "mlflow": Extra.MLFLOW,
    "onnx": Extra.ONNX, "onnxruntime": Extra.ONNX, "onnxscript": Extra.ONNX,
    "keras": Extra.KERAS, "tensorflow": Extra.KERAS, "jax": Extra.KERAS, "jaxlib": Extra.KERAS,
}


class MissingExtraError(ImportError):
    """``feature`` needs ``module``, which an extra of Cerebro installs and this Python lacks."""

    def __init__(self, module: str, feature: str | None = None) -> None:
        self.extra = PROVIDED_BY[module.partition(".")[0]]
        needs = f"{feature} needs {module}, which is not installed" if feature else f"{module} is not installed"
        super().__init__(f'{needs}: pip install "cerebro[{self.extra.value}]"', name=module)


def require(feature: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` for the first of ``modules`` this Python cannot import,
    before any work starts; found, none is imported (Ray's or MLflow's import alone takes
    seconds). A package that is there but fails to import says why when it is imported."""
    for module in modules:
        if not _installed(module):
            raise MissingExtraError(module, feature)


def missing_extra(error: ModuleNotFoundError) -> MissingExtraError | None:
    """The :class:`MissingExtraError` for ``error`` where the missing module is a package an
    extra brings (not a module missing inside one that is installed)."""
    module = (error.name or "").partition(".")[0]
    return MissingExtraError(module) if module in PROVIDED_BY and not _installed(module) else None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):      # a parent package that is not there either
        return False
