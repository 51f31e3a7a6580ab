"""Ctrl-C and SIGTERM stop a run, also when their ``KeyboardInterrupt`` is swallowed.

Python raises a signal handler's exception wherever the main thread is. Where that is a
``weakref.finalize`` callback or a ``__del__`` (the shelf's staged files are removed by
finalizers), Python prints "Exception ignored" and goes on, and a run held at a barrier would
never stop. So the handler also remembers the signal, and the driver's loop raises it at its
next turn (:func:`raise_if_interrupted`).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_pending: list[int] = []       # the signals received in this block and not yet raised by the driver


def _interrupt(signum: int, frame: object) -> None:
    _pending.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def interrupts_stop_the_run() -> Iterator[None]:
    """SIGTERM stops a run as Ctrl-C does (workers stopped, journal closed, run resumable),
    and either one is raised again by :func:`raise_if_interrupted` if it was swallowed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        current = signal.getsignal(signum)
        # A handler set outside Python (None: PostgreSQL's, under PL/Python) could not be put
        # back; a SIGINT handler of the user's own is theirs to keep.
        if current is None or (signum == signal.SIGINT and current is not signal.default_int_handler):
            continue
        previous[signum] = signal.signal(signum, _interrupt)
    _pending.clear()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pending.clear()


def raise_if_interrupted() -> None:
    """Raise the ``KeyboardInterrupt`` of a signal whose first raise was swallowed."""
    if _pending:
        signum = _pending[0]
        _pending.clear()
        raise KeyboardInterrupt(f"signal {signum}")
