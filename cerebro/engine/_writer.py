"""Store writes off the driver's loop: a 12 MB checkpoint takes longer to write than a hop."""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class BackgroundWriter:
    """Runs write calls one at a time, in the order given, on a thread of its own.

    The order is kept, so the journal reads as if written synchronously. The first error
    is raised again by the next :meth:`submit` or by :meth:`close`.
    """

    def __init__(self) -> None:
        # Each item is a write (call, args, kwargs), or None to stop.
        self._calls: queue.Queue[tuple[Callable[..., Any], tuple, dict] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="cerebro-store-writer", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._raise_error()
        self._calls.put((call, args, kwargs))

    def close(self) -> None:
        """Finish every submitted write and stop the thread."""
        self._calls.put(None)
        self._thread.join()
        self._raise_error()

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            if self._error is None:   # after a failure, later writes would leave a torn run
                call, args, kwargs = item
                try:
                    call(*args, **kwargs)
                except BaseException as error:  # surfaced on the driver's thread
                    self._error = error

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"writing to the run directory failed: {self._error!r}") from self._error
