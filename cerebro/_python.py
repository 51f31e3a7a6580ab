"""How Cerebro starts a Python interpreter: never with the working directory on its path.

``python -m module`` puts the working directory first on ``sys.path``, so a ``json.py``
planted in a shared working directory (a scratch place of mode 1777, say) would run, as the
user, in the fork server, a worker or a SQL call's child. Every interpreter Cerebro starts
runs with Python 3.11's ``-P`` instead, which leaves it out (and Spark's local workers with
``PYTHONSAFEPATH``, its equivalent). A user's own modules still load as they do for the
user's script: the driver hands its own ``sys.path`` on (``PYTHONPATH``, or the fork
server's request), which holds the script's directory, and the working directory only where
the user's own interpreter put it there.
"""
from __future__ import annotations

import os
import sys


def python_module(module: str, *arguments: str) -> list[str]:
    """The command line that runs ``python -m module arguments`` in this interpreter, with
    the working directory off its path."""
    return [sys.executable, "-P", "-m", module, *arguments]


def drivers_path() -> str:
    """This process's ``sys.path`` as a ``PYTHONPATH``: what a child needs to import what the
    driver imports (a cloudpickled build's modules), and nothing the child's start adds.

    A directory whose name holds ``os.pathsep`` is left out: ``PYTHONPATH`` would split it,
    and read the pieces as an empty entry (the working directory) or relative ones (from it),
    which is how a script in ``exp 10:30`` would have put a shared working directory back on
    the path. The build's own modules travel by value, so such a directory is not needed."""
    return os.pathsep.join(p for p in sys.path if p and os.pathsep not in p and os.path.isdir(p))
