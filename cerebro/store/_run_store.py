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
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pandas as pd

from ._state_codec import read_message, write_message


def local_path(store: str) -> str:
    """``store`` as a path on this machine's file system: a path, or a ``file://`` URL.

    Executors on other hosts read the partitions from the store, so on a cluster it must be
    a shared file system (NFS, or HDFS/S3 mounted through FUSE) at the same path everywhere.
    """
    parsed = urllib.parse.urlparse(store)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:   # one letter: a Windows drive
        raise ValueError(f"store={store!r}: only local paths and file:// URLs are supported so far; "
                         f"mount the file system (for example HDFS or S3 through FUSE) and give its path")
    return store


class RunStore:
    """Reads and writes one run directory on the local file system."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.path.abspath(local_path(os.fspath(path)))

    @classmethod
    def create(cls, path: str | os.PathLike) -> RunStore:
        """A new, empty run directory; an existing run is never overwritten."""
        store = cls(path)
        if os.path.exists(os.path.join(store.path, "run.json")):
            raise FileExistsError(f"store {store.path!r} already holds a run; choose another "
                                  f"store, load it with cb.load, or delete it")
        if os.path.isdir(store.path) and os.listdir(store.path):
            raise FileExistsError(f"store {store.path!r} is a directory that is not empty; "
                                  f"choose a new or empty directory")
        os.makedirs(store.path, exist_ok=True)
        return store

    @classmethod
    def open(cls, path: str | os.PathLike) -> RunStore:
        store = cls(path)
        if not os.path.exists(os.path.join(store.path, "run.json")):
            raise FileNotFoundError(f"{store.path!r} is not a Cerebro run directory (no run.json)")
        return store

    def file(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    @property
    def data_dir(self) -> str:
        return self.file("data")

    # --- settings -----------------------------------------------------------------------
    def write_run_info(self, info: dict[str, Any]) -> None:
        self._write_atomic("run.json", json.dumps(info, indent=1, default=str).encode())

    def read_run_info(self) -> dict[str, Any]:
        with open(self.file("run.json")) as f:
            return json.load(f)

    def write_build(self, blob: bytes) -> None:
        self._write_atomic("build.pkl", blob)

    def read_build(self) -> bytes:
        with open(self.file("build.pkl"), "rb") as f:
            return f.read()

    # --- the journal --------------------------------------------------------------------
    def append(self, event: str, **fields: Any) -> None:
        """Add one event to the journal, flushed at once so a crash loses at most this line."""
        with open(self.file("journal.jsonl"), "a") as f:
            f.write(json.dumps({"event": event, **fields}, default=float) + "\n")

    def events(self) -> Iterator[dict[str, Any]]:
        path = self.file("journal.jsonl")
        if not os.path.exists(path):
            return
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):  # a torn last line from a crash is skipped
                    yield json.loads(line)

    # --- trials -------------------------------------------------------------------------
    def write_config(self, trial_id: str, config: dict[str, Any]) -> None:
        self._write_atomic(os.path.join("trials", trial_id, "config.json"),
                           json.dumps(config, indent=1).encode())

    def write_checkpoint(self, trial_id: str, state: Any) -> None:
        """Save a trial's packed state (see :func:`pack_tensors`), replacing the previous one."""
        path = self.file("trials", trial_id, "checkpoint.state")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            write_message(f, state)
        os.replace(path + ".tmp", path)

    def read_checkpoint(self, trial_id: str) -> Any:
        """A trial's latest packed state; :func:`unpack_tensors` turns it into tensors."""
        path = self.file("trials", trial_id, "checkpoint.state")
        if not os.path.exists(path):
            raise FileNotFoundError(f"trial {trial_id} has no checkpoint in {self.path!r}: "
                                    f"it never finished an epoch")
        with open(path, "rb") as f:
            return read_message(f)

    def write_error(self, trial_id: str, error: str) -> None:
        self._write_atomic(os.path.join("trials", trial_id, "error.txt"), error.encode())

    def write_table(self, name: str, table: pd.DataFrame) -> None:
        table.to_csv(self.file(f"{name}.csv"), index=False)

    def _write_atomic(self, relative: str, blob: bytes) -> None:
        path = self.file(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(blob)
        os.replace(path + ".tmp", path)
