"""Private scratch directories on local disk that do not outlive their process for long.

The driver spills states to one (its shelf), each worker keeps its outbox and its local copy
of the partitions in others. A process ends by removing its own, but one killed with SIGKILL
cannot, and its states (gigabytes with large models) would stay in ``TMPDIR`` for good. So
each directory holds an ``owner`` file its process keeps locked (``flock``) while it lives,
and making a new directory of a kind first removes those of that kind whose lock nobody
holds. A lock, not a process id, says who is alive: it also holds between containers that
share ``/tmp`` but not their process ids. A directory is made under a hidden name and given
its real one once locked, so no sweep ever sees it unlocked.

Example:
    >>> path = scratch_directory("cerebro-doc", tag="w0-")
    >>> os.path.basename(path).startswith("cerebro-doc-w0-"), os.stat(path).st_mode & 0o777 == 0o700
    (True, True)
    >>> remove_scratch(path)
    >>> os.path.exists(path)
    False
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile

OWNER = "owner"
_held: dict[str, int] = {}     # directory -> the descriptor that holds its owner lock


def scratch_directory(kind: str, under: str | None = None, tag: str = "") -> str:
    """A new directory ``under`` (default: ``TMPDIR``) named ``{kind}-{tag}...``, mode 0700,
    locked as this process's for as long as it lives or until :func:`remove_scratch`; first,
    the directories of ``kind`` there that their processes left behind are removed."""
    under = under or tempfile.gettempdir()
    sweep(f"{kind}-", under)
    hidden = tempfile.mkdtemp(prefix=f".{kind}-{tag}", dir=under)
    owner = os.open(os.path.join(hidden, OWNER), os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    # A file system without locks fails every sweeper's lock too, and no sweep removes it.
    with contextlib.suppress(OSError):
        fcntl.flock(owner, fcntl.LOCK_EX)
    path = os.path.join(under, os.path.basename(hidden)[1:])
    os.rename(hidden, path)
    _held[path] = owner
    return path


def remove_scratch(path: str) -> None:
    """Remove a directory made by :func:`scratch_directory` and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    owner = _held.pop(path, None)
    if owner is not None:
        os.close(owner)


def sweep(prefix: str, under: str) -> list[str]:
    """Remove the directories ``prefix...`` in ``under`` of this user whose owner lock no
    process holds; returns them. Those of other users, or not made here, are left alone."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(under) as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False) \
                    and entry.stat(follow_symlinks=False).st_uid == os.getuid() and _abandoned(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def _abandoned(path: str) -> bool:
    """Whether no process holds ``path``'s owner lock (taking it, to remove the directory)."""
    try:
        owner = os.open(os.path.join(path, OWNER), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False       # no owner file: not a scratch directory of ours
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:        # held (BlockingIOError), or a file system without locks
        return False
    finally:
        os.close(owner)
