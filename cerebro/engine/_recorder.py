"""Where the trial book's events and files go: a protocol, so that the book's parts
(:mod:`._trials`, :mod:`._decisions`) name it without importing each other, and the tests
record into a list where the driver writes the journal (:class:`._writer.StoreRecorder`)."""
from __future__ import annotations

from typing import Any, Protocol

from ..store import Event


class Recorder(Protocol):
    """Where the book's events go (the journal and the observers) and a trial's files (the
    run directory), in order."""

    path: str     # the run directory, for error messages

    def emit(self, event: Event) -> None: ...
    def write_checkpoint(self, trial_id: str, state: Any, epoch: int, exploit: bool = False,
                         best: bool = False) -> None: ...
    def remove_checkpoints(self, trial_id: str, keep: tuple[str, ...] = ()) -> None: ...
    def write_config(self, trial_id: str, config: dict[str, Any]) -> None: ...
    def write_error(self, trial_id: str, error: str) -> None: ...
    def now(self) -> float: ...
