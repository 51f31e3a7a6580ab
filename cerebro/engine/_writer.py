"""Store writes off the driver's loop: a 12 MB checkpoint takes longer to write than a hop."""
from __future__ import annotations

import queue
import secrets
import threading
from collections.abc import Callable
from typing import Any

from ..observe import Progress
from ..store import Event, RunStore
from ._errors import StoreWriteError
from ._shelf import Shelved, Stored


class BackgroundWriter:
    """Runs write calls one at a time, in the order given, on a thread of its own.

    The order is kept, so the journal reads as if written synchronously. The first error
    stops every later write (they would leave a torn run) and is raised again, as a
    :class:`StoreWriteError` naming ``store``, by the next :meth:`submit` or by :meth:`close`.
    Writes marked ``heavy`` (checkpoints) wait while ``max_heavy`` of them are queued: a store
    slower than the run slows the run, rather than the queue growing without bound.
    """

    def __init__(self, store: str, max_heavy: int | None = None) -> None:
        self.store, self.max_heavy = store, max_heavy
        # Each item is a write (call, args, kwargs, heavy), or None to stop.
        self._calls: queue.Queue[tuple[Callable[..., Any], tuple, dict, bool] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._heavy = 0                       # heavy writes queued or running
        self._done = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="cerebro-store-writer", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any, heavy: bool = False, **kwargs: Any) -> None:
        """Queue ``call(*args, **kwargs)``; raises the error of an earlier write, if one failed.
        A ``heavy`` write first waits for room (see the class)."""
        self._raise_error()
        if heavy:
            with self._done:
                self._done.wait_for(lambda: self.max_heavy is None or self._heavy < self.max_heavy
                                    or self._error is not None)
                self._heavy += 1
            self._raise_error()
        self._calls.put((call, args, kwargs, heavy))

    def close(self) -> None:
        """Finish every submitted write and stop the thread."""
        self._calls.put(None)
        self._thread.join()
        self._raise_error()

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            call, args, kwargs, heavy = item
            if self._error is None:   # after a failure, later writes would leave a torn run
                try:
                    call(*args, **kwargs)
                except BaseException as error:  # surfaced on the driver's thread
                    self._error = error
            with self._done:
                self._heavy -= heavy
                self._done.notify_all()

    def _raise_error(self) -> None:
        if self._error is None:
            return
        if isinstance(self._error, OSError):
            raise StoreWriteError(self._error.errno, f"writing to the store {self.store!r} failed: "
                                  f"{self._error}; the run stopped. What it journaled before is kept: "
                                  f"make the store writable (or free space), then cb.resume({self.store!r})"
                                  ) from self._error
        raise RuntimeError(f"writing to the store {self.store!r} failed: {self._error!r}") from self._error


class StoreRecorder:
    """Where the run's events go: the journal (written in order off the driver's loop, with
    the trial files) and the observers (told at once, on the driver's thread)."""

    def __init__(self, store: RunStore, now: Callable[[], float], observer: Progress,
                 max_checkpoints_queued: int | None = None) -> None:
        self.store, self.now, self.path, self.observer = store, now, store.path, observer
        self._writer = BackgroundWriter(store.path, max_checkpoints_queued)
        # In the staged names: a handle of an earlier driver in this process (freed whenever
        # the garbage collector gets to it) never removes a file of this one's.
        self._launch = secrets.token_hex(4)

    def staged_state(self, trial_id: str, task_id: int) -> str:
        """Where the worker running task ``task_id`` writes ``trial_id``'s state at its epoch's
        end (see :meth:`RunStore.promote_checkpoint`)."""
        return self.store.staged_state(f"{trial_id}.{task_id}.{self._launch}")

    def emit(self, event: Event) -> None:
        """Journal ``event`` (if the journal keeps its kind) and tell the observers."""
        if event.journaled:
            self._writer.submit(self.store.emit, event)
        self.observer.notify(event)

    def write_checkpoint(self, trial_id: str, state: Shelved | Stored, epoch: int, exploit: bool = False,
                         best: bool = False) -> None:
        """Write ``state`` (read from the shelf on the writer's thread) as ``epoch``'s checkpoint;
        one a worker wrote to the store (:class:`Stored`) becomes it under a second name."""
        if isinstance(state, Stored) and not exploit:    # PBT's copy is rewritten: its header says so
            # The call holds ``state``: its file stays until the checkpoint names it.
            self._writer.submit(lambda: self.store.promote_checkpoint(trial_id, state.path, epoch, best))
            return
        self._writer.submit(lambda: self.store.write_checkpoint(trial_id, state.get(), epoch, exploit, best),
                            heavy=True)

    def remove_checkpoints(self, trial_id: str, keep: tuple[str, ...] = ()) -> None:
        self._writer.submit(self.store.remove_checkpoints, trial_id, keep)

    def write_config(self, trial_id: str, config: dict[str, Any]) -> None:
        self._writer.submit(self.store.write_config, trial_id, config)

    def write_error(self, trial_id: str, error: str) -> None:
        self._writer.submit(self.store.write_error, trial_id, error)

    def then(self, call: Callable[..., Any], *args: Any) -> None:
        """``call(*args)`` once everything emitted and written before it is in the store."""
        self._writer.submit(call, *args)

    def close(self) -> None:
        """Finish every write; raises the first write's error, if one failed."""
        self._writer.close()
