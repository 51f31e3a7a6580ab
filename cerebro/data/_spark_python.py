"""Which Python Spark's executors run, and what to do where it cannot run Cerebro.

PySpark starts its executors' Python workers with ``SparkContext.pythonExec``: the
``PYSPARK_PYTHON`` environment variable when the session was made, else ``python3`` from the
executor's ``PATH``. On a laptop with a local master that is rarely the virtual environment
Cerebro was installed in, and the job fails with a page of Java stack around one
``ModuleNotFoundError``. So, for a local master (the executors are this machine's
processes), Cerebro runs them on the driver's own interpreter unless the user chose one; on
a cluster it turns that failure into one message naming the Python and how to set it.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any


def use_the_drivers_python_locally(context: Any) -> None:
    """For a ``local`` master with no Python chosen (``PYSPARK_PYTHON`` or
    ``spark.pyspark.python``), the executors run this interpreter, which has Cerebro."""
    chosen = os.environ.get("PYSPARK_PYTHON") or context.getConf().get("spark.pyspark.python", None)
    if context.master.startswith("local") and not chosen:
        context.pythonExec = sys.executable


class ExecutorPythonError(RuntimeError):
    """Spark's executors run a Python that cannot import Cerebro or one of its dependencies."""


def explained(error: BaseException, context: Any) -> BaseException:
    """``error`` of a Spark job, or, where the executors' Python could not import a module,
    an :class:`ExecutorPythonError` that names that Python and how to choose another."""
    missing = re.search(r"(ModuleNotFoundError|ImportError): [^\n]*", str(error))
    if missing is None:
        return error
    return ExecutorPythonError(
        f"Spark's executors run the Python {context.pythonExec!r}, which cannot import what Cerebro needs "
        f"({missing.group(0)}). Install Cerebro with its dependencies into that Python on every node, or "
        f"point Spark to a Python that has them before the session starts: the environment variable "
        f"PYSPARK_PYTHON=/path/to/python (or spark-submit --conf spark.pyspark.python=/path/to/python). "
        f"The driver runs {sys.executable!r}.")
