"""Debian packages the tests install where they are missing (PostgreSQL, PL/Python, Chromium),
one install at a time across the pytest-xdist workers: two apt-get runs at once fail on
dpkg's lock, and the loser's tests would be skipped, proving nothing."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def one_install_at_a_time() -> Iterator[None]:
    """Held while a test checks for a package and installs it: the next one waits, then finds
    it installed."""
    path = os.path.join(tempfile.gettempdir(), f"cerebro-tests-apt-{os.geteuid()}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)         # closing the descriptor releases the lock
