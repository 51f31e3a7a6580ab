"""Whose code a run directory holds: ``build.pkl`` is the user's ``build`` and searcher,
cloudpickled, so loading it runs code. A run signs it (HMAC-SHA256, ``build.pkl.sig``) with
a key only its user can read (``~/.config/cerebro/trust.key``, made on first use, mode
0600; ``CEREBRO_TRUST_KEY`` names another file), and Cerebro loads a ``build.pkl`` only when
the signature is the reader's own: a run directory someone else wrote (a colleague's, a
download, one crafted to attack) is loaded only when its reader says they trust it
(``trust=True``, ``--trust``). Weights and configs are data and need no trust.

The signature covers the run's id (``run_id`` in run.json) with the content, so a signed
``build.pkl`` copied beside another run's files is not trusted there. The key is 32 random
bytes, a regular file of this user's that no one else may read or write (invariant 10); any
other file where the key should be is refused, for signing and for checking alike: a key
left empty by a full disk, or one another user can read or swap, would let anyone sign.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat

from .._checks import quoted

_KEY_BYTES = 32
# What the MAC covers besides the content, so a signature is never valid for anything else
# (an older version's MAC over the content alone, another file, another run).
_DOMAIN = b"cerebro build.pkl signature v2\0"
_RUN_ID = re.compile(r"[0-9a-f]{32}")


class UntrustedCodeError(PermissionError):
    """A ``build.pkl`` not signed with the reader's key, not loaded because the run was not trusted."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} holds code (build and searcher) that a run of yours on this machine did not sign with your key "
            f"({key_path()}) for this run directory, and loading it runs that code; nothing was loaded. If you "
            f"trust this run directory, open it with trust=True (cb.load(..., trust=True), cb.resume(..., "
            f"trust=True), cb.predict(..., trust=True), or --trust on the command line); runs made before Cerebro "
            f"signed each run's id (no run_id in run.json) need trust=True too. Its weights alone need no trust "
            f"(state_dict, cerebro export -o model.safetensors)")


class TrustKeyError(PermissionError):
    """The file where this user's trust key should be is not a good key: nothing is signed or
    checked with it, since a key that is short, empty, or readable or writable by others
    would let others sign code that Cerebro then runs."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        super().__init__(
            f"the trust key {path} {problem}, so Cerebro neither signs a run's code (build.pkl) with it nor "
            f"trusts code signed with it; nothing was signed or loaded. {fix}, or set CEREBRO_TRUST_KEY to a "
            f"good key (32 bytes, a regular file of yours, mode 0600); a new key does not vouch for runs signed "
            f"with the old one (open those with trust=True)")


def key_path() -> str:
    return os.environ.get("CEREBRO_TRUST_KEY") or _default_path()


def _default_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".config", "cerebro", "trust.key")


def _read_key(path: str) -> bytes | None:
    """The key at ``path``, checked; None where there is none. Opened without following a
    link or blocking (a FIFO put there), and checked on the open file, not the name."""
    delete = f"Delete it (rm {path}) so that the next run makes a new one"
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(path):
            raise TrustKeyError(path, "is a symbolic link (whoever can change the link chooses the key)",
                                delete) from None
        raise TrustKeyError(path, f"cannot be read ({error.strerror})", delete) from None
    with os.fdopen(handle, "rb", buffering=0) as f:
        info = os.fstat(f.fileno())
        _check(path, info, delete)
        key = f.read(_KEY_BYTES + 1)
    if len(key) != _KEY_BYTES:          # it changed since fstat
        raise TrustKeyError(path, f"holds {len(key)} bytes, not {_KEY_BYTES}", delete)
    return key


def _check(path: str, info: os.stat_result, delete: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise TrustKeyError(path, "is not a regular file", delete)
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise TrustKeyError(path, f"is owned by user {info.st_uid}, not by you (user {os.geteuid()}), so its "
                                  f"owner can sign code you would run", delete)
    if info.st_mode & 0o077:
        raise TrustKeyError(path, f"has mode {stat.S_IMODE(info.st_mode):04o}: others may read or change it",
                            f"If no one else can have read it, chmod 600 {path}; otherwise delete it (rm {path}) "
                            f"so that the next run makes a new one")
    if info.st_size != _KEY_BYTES:
        raise TrustKeyError(path, f"holds {info.st_size} bytes, not {_KEY_BYTES} (an empty one is what a full "
                                  f"disk leaves)", delete)


def _make_key(path: str) -> bytes | None:
    """A new key at ``path``, or the one another process made there meanwhile (both agree on
    whichever was linked in first); None where it cannot be made (a home that cannot be
    written, a full disk), with nothing left behind. Written in full and synced under a
    temporary name before it is linked in, so the key is never there half written."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(8)}.tmp")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if path == _default_path():     # Cerebro's own directory: no one else lists or swaps in it
            with contextlib.suppress(OSError):
                os.chmod(directory, 0o700)
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as error:
        _unsigned(path, error)
        return None
    try:
        with os.fdopen(handle, "wb", buffering=0) as f:
            _write_all(f.fileno(), secrets.token_bytes(_KEY_BYTES))
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):      # another process's key is in place: theirs wins
            os.link(temporary, path)                    # never replaces a key, unlike rename
        _sync_directory(directory)
    except OSError as error:
        _unsigned(path, error)
        return None
    finally:
        with contextlib.suppress(OSError):
            os.remove(temporary)
    return _read_key(path)


def _write_all(handle: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        view = view[os.write(handle, view):]


def _sync_directory(directory: str) -> None:
    """Make the new name durable: a crash must not lose the key the runs were signed with."""
    with contextlib.suppress(OSError):
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def _unsigned(path: str, error: OSError) -> None:
    logging.getLogger("cerebro").warning(
        "could not make the trust key %s (%s): this run's code (build.pkl) is not signed, so loading it will "
        "need trust=True", path, error.strerror or error)


def check_key() -> None:
    """Make this user's key where there is none; raise :class:`TrustKeyError` where the file
    there is not a good key. A run calls it before any work, so a bad key stops it at once
    rather than after its partitions are written."""
    _key(create=True)


def _key(create: bool) -> bytes | None:
    """This user's key, checked; made where ``create`` and there is none. None where there is
    none and it cannot be made."""
    path = key_path()
    key = _read_key(path)
    if key is None and create:
        key = _make_key(path)
    return key


def _mac(key: bytes, run_id: str, content: bytes) -> bytes:
    return hmac.new(key, _DOMAIN + run_id.encode("ascii") + b"\0" + content, hashlib.sha256).hexdigest().encode()


def new_run_id() -> str:
    return secrets.token_hex(16)


def signature(content: bytes, run_id: str) -> bytes | None:
    """``content``'s signature for the run ``run_id`` under this user's key (made if need be);
    None where there is no key and none can be made."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run_id {quoted(run_id)} must be 32 hexadecimal digits")
    key = _key(create=True)
    return None if key is None else _mac(key, run_id, content)


def signed_by_me(content: bytes, signed: bytes | None, run_id: object) -> bool:
    """Whether ``signed`` is this user's signature of ``content`` for the run ``run_id`` (as
    its run.json says; anything but a run id, as an older version's run.json has, is not)."""
    key = _key(create=False)            # first: a bad key is said to be bad, whatever the run holds
    if key is None or signed is None or not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        return False
    return hmac.compare_digest(_mac(key, run_id, content), signed.strip())
