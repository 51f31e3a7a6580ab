"""Reading a long journal in bulk: a 10,000-trial run's journal is hundreds of thousands of
lines, each a dict (and an event, a history row, ...) that lives on; none of them is in a
reference cycle. Python's cyclic collector, which runs every few hundred new objects and
walks all those that piled up since its last full pass, spent a third of ``cb.load``'s time
on them. :func:`collector_paused` turns it off while such a read runs.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off in this block (reference counting still frees what
    is dropped), then as it was: on again unless something else had turned it off.

    Example:
        >>> import gc
        >>> with collector_paused():
        ...     gc.isenabled()
        False
        >>> gc.isenabled()
        True
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
