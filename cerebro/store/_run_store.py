"""The run directory: everything a run writes, and everything ``cb.load`` reads back.

::

    run.json                 settings, seed, versions, data fingerprint
    journal.jsonl            append-only events (trials, sub-epochs, epoch ends, ends)
    build.pkl                the user's build(config), cloudpickled
    data/                    the partitions (see cerebro.data)
    trials/t0000/config.json
    trials/t0000/checkpoint.state  the latest epoch's model and optimizer state
    trials/t0000/error.txt       the traceback of a failed trial
    history.csv, schedule.csv    written when the run finishes
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pandas as pd

from . import _files as files
from ._state_codec import read_message, write_message


class RunStore:
    """Reads and writes one run directory: a local path, a ``file://`` URL, or any URL that
    fsspec reaches (see :mod:`cerebro.store._files`)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = files.normalize(os.fspath(path))

    @classmethod
    def create(cls, path: str | os.PathLike) -> RunStore:
        """A new, empty run directory; an existing run is never overwritten."""
        store = cls(path)
        try:
            holds_run, empty = files.exists(store.file("run.json")), files.is_empty_dir(store.path)
            if not holds_run and empty is not False:
                files.makedirs(store.path)
        except Exception as error:
            raise OSError(f"store {store.path!r} cannot be reached: {type(error).__name__}: "
                          f"{str(error).splitlines()[0]}") from error
        if holds_run:
            raise FileExistsError(f"store {store.path!r} already holds a run; choose another "
                                  f"store, load it with cb.load, or delete it")
        if empty is False:
            raise FileExistsError(f"store {store.path!r} is a directory that is not empty; "
                                  f"choose a new or empty directory")
        return store

    @classmethod
    def open(cls, path: str | os.PathLike) -> RunStore:
        store = cls(path)
        if not files.exists(store.file("run.json")):
            raise FileNotFoundError(f"{store.path!r} is not a Cerebro run directory (no run.json)")
        return store

    def file(self, *parts: str) -> str:
        return files.join(self.path, *parts)

    @property
    def data_dir(self) -> str:
        return self.file("data")

    # --- settings -----------------------------------------------------------------------
    def write_run_info(self, info: dict[str, Any]) -> None:
        files.write_atomic(self.file("run.json"), json.dumps(info, indent=1, default=str).encode())

    def read_run_info(self) -> dict[str, Any]:
        with files.open_file(self.file("run.json")) as f:
            return json.load(f)

    def write_build(self, blob: bytes) -> None:
        files.write_atomic(self.file("build.pkl"), blob)

    def read_build(self) -> bytes:
        with files.open_file(self.file("build.pkl")) as f:
            return f.read()

    # --- the journal --------------------------------------------------------------------
    def append(self, event: str, **fields: Any) -> None:
        """Add one event to the journal, flushed at once so a crash loses at most this line."""
        with files.open_file(self.file("journal.jsonl"), "ab") as f:
            f.write((json.dumps({"event": event, **fields}, default=float) + "\n").encode())

    def events(self) -> Iterator[dict[str, Any]]:
        path = self.file("journal.jsonl")
        if not files.exists(path):
            return
        with files.open_file(path) as f:
            for line in f:
                if line.endswith(b"\n"):  # a torn last line from a crash is skipped
                    yield json.loads(line)

    # --- trials -------------------------------------------------------------------------
    def write_config(self, trial_id: str, config: dict[str, Any]) -> None:
        files.write_atomic(self.file("trials", trial_id, "config.json"), json.dumps(config, indent=1).encode())

    def write_checkpoint(self, trial_id: str, state: Any) -> None:
        """Save a trial's packed state (see :func:`pack_tensors`), replacing the previous one."""
        files.write_atomic(self.file("trials", trial_id, "checkpoint.state"),
                           writer=lambda f: write_message(f, state))

    def read_checkpoint(self, trial_id: str) -> Any:
        """A trial's latest packed state; :func:`unpack_tensors` turns it into tensors."""
        path = self.file("trials", trial_id, "checkpoint.state")
        if not files.exists(path):
            raise FileNotFoundError(f"trial {trial_id} has no checkpoint in {self.path!r}: "
                                    f"it never finished an epoch")
        with files.open_file(path) as f:
            return read_message(f)

    def write_error(self, trial_id: str, error: str) -> None:
        files.write_atomic(self.file("trials", trial_id, "error.txt"), error.encode())

    def write_table(self, name: str, table: pd.DataFrame) -> None:
        files.write_atomic(self.file(f"{name}.csv"), table.to_csv(index=False).encode())
