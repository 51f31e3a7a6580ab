"""Which Python Spark's executors run, and what to do where it cannot run Cerebro.

PySpark starts its executors' Python workers with ``SparkContext.pythonExec``: the
``PYSPARK_PYTHON`` environment variable when the session was made, else ``python3`` from the
executor's ``PATH``. On a laptop with a local master that is rarely the virtual environment
Cerebro was installed in, and the job fails with a page of Java stack around one
``ModuleNotFoundError``. So, for a local master (the executors are this machine's
processes), Cerebro runs them on the driver's own interpreter unless the user chose one:
wherever Cerebro is handed a SparkSession (``from_spark``, ``SparkBackend``, ``spark_udf``,
``cb.predict(..., backend="spark")``), as the choice belongs to the session, not to one
call. On a cluster it turns that failure into one message naming the Python and how to set it.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from typing import Any

from .._python import drivers_path

# Said by the driver (``explained``) and by an executor's Python itself (``importer``), which
# knows where it runs: "{where}" is that, or nothing.
_CANNOT_IMPORT = ("Spark's executors run the Python {python!r}{where}, which cannot import what Cerebro needs "
                  "({missing}). Install Cerebro with its dependencies into that Python on every node, or point "
                  "Spark to a Python that has them before the session starts: the environment variable "
                  "PYSPARK_PYTHON=/path/to/python (or spark-submit --conf spark.pyspark.python=/path/to/python). "
                  "The driver runs {driver!r}.")
_SAID = re.compile(r"Spark's executors run the Python [^\n]*")


def use_the_drivers_python_locally(context: Any) -> None:
    """For a ``local`` master with no Python chosen (``PYSPARK_PYTHON`` or
    ``spark.pyspark.python``), the executors run this interpreter, which has Cerebro. With
    any local master, they keep the working directory off their path."""
    chosen = os.environ.get("PYSPARK_PYTHON") or context.getConf().get("spark.pyspark.python", None)
    if not context.master.startswith("local"):
        return
    if not chosen:
        context.pythonExec = sys.executable
    # Its workers start as ``python -m pyspark.daemon`` in the driver's working directory:
    # keep that off their path (see cerebro._python), the driver's own path on it.
    context.environment["PYTHONSAFEPATH"] = "1"
    context.environment.setdefault("PYTHONPATH", drivers_path())


class ExecutorPythonError(RuntimeError):
    """Spark's executors run a Python that cannot import Cerebro or one of its dependencies."""


def explained(error: BaseException, context: Any) -> BaseException:
    """``error`` of a Spark job, or, where the executors' Python could not import a module,
    an :class:`ExecutorPythonError` that names that Python and how to choose another."""
    said = _SAID.search(str(error))
    if said is not None:              # an executor named its own Python already (see ``importer``)
        return ExecutorPythonError(said.group(0))
    missing = re.search(r"(ModuleNotFoundError|ImportError): [^\n]*", str(error))
    if missing is None:
        return error
    return ExecutorPythonError(_CANNOT_IMPORT.format(python=context.pythonExec, where="", missing=missing.group(0),
                                                     driver=sys.executable))


def importer(context: Any, module: str, name: str) -> Callable[[], Any]:
    """A function that returns ``module``'s ``name`` where it runs, for a function that a Spark
    job runs on the executors: it travels by value (a nested function that refers to nothing
    of Cerebro's), so an executor whose Python lacks Cerebro unpickles it and raises the error
    that names that Python, its path and its host, not a bare ``No module named 'cerebro'``."""
    python, template, driver = context.pythonExec, _CANNOT_IMPORT, sys.executable

    def load() -> Any:
        import importlib
        import socket
        import sys
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError as error:
            where = f" ({sys.executable} on {socket.gethostname()})"
            raise ModuleNotFoundError(template.format(python=python, where=where, driver=driver,
                                                      missing=f"{type(error).__name__}: {error}")) from None
    return load
