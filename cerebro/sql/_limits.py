"""How much one SQL call may make its session's backend build, and how its long steps stay
cancellable.

A SQL function runs in the backend of the session that calls it, and PostgreSQL answers a
cancel, a terminate or a shutdown only where the backend checks for interrupts: when the
Python calls into the database, or returns. Pure Python never does. So a grid of
1,000 x 1,000 candidates, expanded in Python, held a backend for ~91 s that neither
``pg_cancel_backend`` nor ``pg_terminate_backend`` could stop, while it grew by 290 MB.
Hence two rules for everything an argument sizes:

- it is counted (arithmetically, from the lengths of what was given) before anything is
  built, and refused above the limits below with a message that names the argument, its
  count and the limit;
- what is left, a loop over at most that much, calls the :data:`Pulse` it is given (the
  session's :meth:`~._database.Database.check_for_interrupts`) as it goes.

docs/sql.md lists the limits; a message quotes at most :data:`cerebro._checks.QUOTE_LIMIT`
characters of a value (:func:`quoted`), never a 100 KB argument back.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._checks import quoted
from .._checks import shortened as cut  # a message's excerpt of a text, as quoted() is of a value

__all__ = ["MAX_ARCH_CHARS", "MAX_CLASSES", "MAX_GRID_CHARS", "MAX_GRID_CONFIGS", "MAX_GRID_PARAMETERS",
           "MAX_PARAMS_CHARS", "Pulse", "check_count", "check_length", "cut", "listed", "no_pulse", "quoted"]

# Configurations one call makes or trains: a grid's rows, random draws (num_configs), the
# rows of a model selection table, an automl run's trials. Each is a model trained: far
# more than anyone trains in one call, and at most ~1 s of Python to write them.
MAX_GRID_CONFIGS = 10_000
# Characters of a grid (compile_params_grid, fit_params_grid): parsed by Python's own
# parser, whose time and memory grow with it (100 KB: ~50 ms).
MAX_GRID_CHARS = 100_000
# Characters of one parameter string (compile_params, fit_params, automl_params, and each
# row a grid makes): 20 times the longest of MADlib's examples (~100). A model selection
# table holds up to MAX_GRID_CONFIGS of them, and the backend holds the table.
MAX_PARAMS_CHARS = 2_000
# Parameters one dict of a grid names (a grid, or one optimizer family of it): each row
# spells them all, and a drawn row is parsed in the backend (~0.4 ms for 32 parameters).
# Keras's optimizers take at most ~16 arguments.
MAX_GRID_PARAMETERS = 32
# Characters of a model architecture's JSON: ~20 times the largest a Keras application
# writes (EfficientNetB7's, ~760 KB); parsed and walked in the backend.
MAX_ARCH_CHARS = 16_000_000
# Classes a preprocessor one-hot encodes (num_classes, or the label's distinct values):
# each packed row holds that many int16 values.
MAX_CLASSES = 10_000

Pulse = Callable[[], None]
"""Called often during a long loop: answers a pending cancel (by raising) or terminate."""


def no_pulse() -> None:
    """The :data:`Pulse` outside a backend (the child process, tests): nothing to answer."""


def check_count(subject: str, count: int, unit: str, limit: int, name: str, advice: str = "") -> None:
    """Refuse ``count`` above ``limit``: "<subject> 1,000,000 <unit>; at most 10,000 are
    allowed (<name>)<advice>", where ``subject`` names the argument and ends in its verb."""
    if count > limit:
        raise ValueError(f"{subject} {count:,} {unit}; at most {limit:,} are allowed ({name}){advice}")


def check_length(text: Any, what: str, limit: int = MAX_PARAMS_CHARS, name: str = "MAX_PARAMS_CHARS") -> None:
    """Refuse a string ``what`` longer than ``limit`` characters before anything parses it,
    quoting only its start."""
    if isinstance(text, str) and len(text) > limit:
        raise ValueError(f"{what} holds {len(text):,} characters (it starts {quoted(text[:80])}); at most "
                         f"{limit:,} are allowed ({name})")


def listed(items: Sequence[Any], *, quote: bool = True, most: int = 20) -> str:
    """``items`` for a message, comma-separated: each as :func:`quoted` (or as its text, shortened
    alike), at most ``most`` of them and how many more; never a million names back."""
    shown = [quoted(item) if quote else cut(str(item)) for item in items[:most]]
    return ", ".join(shown) + (f" and {len(items) - most:,} more" if len(items) > most else "")
