"""Batches made ahead on a thread of their own: reading row groups, the user's transform
and the copy to the device overlap the training of the batch before (they release the GIL
in pyarrow, numpy and torch)."""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

_DONE = object()


class Prefetched:
    """Iterates over ``items`` made by a thread at most ``depth`` ahead; an error of the
    thread is raised where the consumer reached it. Use it as a context manager: leaving the
    block early (a diverged loss, a timeout) stops the thread."""

    def __init__(self, items: Iterator[Any], depth: int = 2) -> None:
        self._items = items
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="cerebro-prefetch", daemon=True)

    def __enter__(self) -> Iterator[Any]:
        self._thread.start()
        return self._consume()

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _produce(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as error:   # raised again by the consumer, with its traceback
            self._put(error)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _consume(self) -> Iterator[Any]:
        while (item := self._queue.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
