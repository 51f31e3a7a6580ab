"""One driver per run directory: the operating system's lock on local stores, a lease on
every other file system.

A local lock (``flock``) is dropped by the kernel however its process ends. Remote file
systems (HDFS, S3, ...) have no such lock, so there the driver writes a lease file naming
itself and when it expires, renews it from a thread well before then, and removes it when it
ends. A driver that dies leaves a lease that expires after ``lease_seconds``; until then a
second driver is refused. Object stores have no exclusive create, so two drivers starting
within the same instant could both write a lease: each reads it back after ``settle_seconds``
and only the one whose lease is there goes on.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable
from typing import IO

from . import _files as files

LEASE_SECONDS = 60.0
SETTLE_SECONDS = 1.0


class StoreInUseError(RuntimeError):
    """Another driver holds the run directory."""


def holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def held_locally(path: str) -> bool:
    """Whether a live driver holds the local lock file ``path`` (a shared lock is refused
    while it holds its exclusive one); nothing is written."""
    import fcntl
    try:
        with files.open_regular(path) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
    except (OSError, files.UnsafeFileError):
        return False


def lock_local(store: str, path: str) -> IO:
    """Hold ``store`` until the returned file is closed or this process ends."""
    import fcntl
    try:
        handle = _open_lock_file(path)
    except OSError as error:
        raise OSError(error.errno, f"store {store!r} cannot be written ({error.strerror}: {path}); "
                                   f"choose a writable directory") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise StoreInUseError(f"store {store!r} is in use by another driver ({owner}); wait for it "
                              f"to end or stop it, then resume") from None
    handle.seek(0)
    handle.truncate()
    handle.write(holder())
    handle.flush()
    return handle


def _open_lock_file(path: str) -> IO:
    """The lock file, made if need be, never through a symbolic link and only where it is a
    regular file with one name: it is truncated and written once locked, which must not reach
    a file someone pointed it to (DESIGN invariant 10)."""
    try:
        handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise files.UnsafeFileError(f"{path} is a symbolic link, not the lock file Cerebro makes; it is not "
                                        f"followed (remove it)") from None
        if error.errno in (errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP):     # a directory, a socket
            raise files.UnsafeFileError(f"{path} is not the lock file Cerebro makes (a regular file with one "
                                        f"name); it is not written (remove it)") from None
        raise
    found = os.fstat(handle)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
        os.close(handle)
        raise files.UnsafeFileError(f"{path} is not the lock file Cerebro makes (a regular file with one name); it "
                                    f"is not written (remove it)")
    return os.fdopen(handle, "a+")


class Lease:
    """A lease on ``path`` for this driver, renewed until :meth:`close`.

    Example:
        >>> lease = Lease("memory://runs/exp1", "memory://runs/exp1/.lock", settle_seconds=0)
        >>> lease.close()
    """

    def __init__(self, store: str, path: str, lease_seconds: float = LEASE_SECONDS,
                 settle_seconds: float = SETTLE_SECONDS, clock: Callable[[], float] = time.time) -> None:
        self.path, self.lease_seconds, self.clock = path, lease_seconds, clock
        self.owner = uuid.uuid4().hex
        current = self._read()
        if current is not None and current["expires"] > clock():
            raise StoreInUseError(self._in_use(store, current))
        self._write()
        time.sleep(settle_seconds)     # a second driver's lease, written meanwhile, shows now
        current = self._read()
        if current is None or current["owner"] != self.owner:
            raise StoreInUseError(self._in_use(store, current))
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="cerebro-store-lease", daemon=True)
        self._renewer.start()

    def close(self) -> None:
        """Stop renewing and give the lease up (if it is still this driver's)."""
        self._stop.set()
        self._renewer.join()
        current = self._read()
        if current is not None and current["owner"] == self.owner:
            files.remove(self.path)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            self._write()

    def _write(self) -> None:
        record = {"owner": self.owner, "holder": holder(), "expires": self.clock() + self.lease_seconds}
        files.write_atomic(self.path, json.dumps(record).encode())

    def _read(self) -> dict | None:
        try:
            with files.open_file(self.path) as f:
                record = json.loads(f.read())
            return record if isinstance(record, dict) and {"owner", "expires"} <= set(record) else None
        except (FileNotFoundError, ValueError):
            return None

    def _in_use(self, store: str, current: dict | None) -> str:
        who = "unknown" if current is None else current.get("holder", "unknown")
        until = "" if current is None else \
            f", its lease ends {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(current['expires']))}"
        return (f"store {store!r} is in use by another driver ({who}{until}); wait for it to end or "
                f"for its lease to run out, then resume")
