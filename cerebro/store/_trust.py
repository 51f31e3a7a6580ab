"""Whose code a run directory holds: ``build.pkl`` is the user's ``build`` and searcher,
cloudpickled, so loading it runs code. A run signs it (HMAC-SHA256, ``build.pkl.sig``) with
a key only its user can read (``~/.config/cerebro/trust.key``, made on first use, mode
0600; ``CEREBRO_TRUST_KEY`` names another file), and Cerebro loads a ``build.pkl`` only when
the signature is the reader's own: a run directory someone else wrote (a colleague's, a
download, one crafted to attack) is loaded only when its reader says they trust it
(``trust=True``, ``--trust``). Weights and configs are data and need no trust.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets

_KEY_BYTES = 32


class UntrustedCodeError(PermissionError):
    """A ``build.pkl`` not signed with the reader's key, not loaded because the run was not trusted."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} holds code (build and searcher) that a run of yours on this machine did not sign with your key "
            f"({key_path()}), and loading it runs that code; nothing was loaded. If you trust this run directory, "
            f"open it with trust=True (cb.load(..., trust=True), cb.resume(..., trust=True), cb.predict(..., "
            f"trust=True), or --trust on the command line); its weights alone need no trust (state_dict, "
            f"cerebro export -o model.safetensors)")


def key_path() -> str:
    return os.environ.get("CEREBRO_TRUST_KEY") or os.path.join(os.path.expanduser("~"), ".config", "cerebro",
                                                                "trust.key")


def _key(create: bool) -> bytes | None:
    """This user's key; made (atomically, readable by its owner alone) where ``create``. None
    where there is none and it cannot be made (a home that cannot be written)."""
    path = key_path()
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        if not create:
            return None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:                 # another process made it meanwhile
        return _key(create=False)
    except OSError:
        return None
    key = secrets.token_bytes(_KEY_BYTES)
    with os.fdopen(handle, "wb") as f:
        f.write(key)
    return key


def signature(content: bytes) -> bytes | None:
    """``content``'s signature under this user's key (made if need be); None without a key."""
    key = _key(create=True)
    return None if key is None else hmac.new(key, content, hashlib.sha256).hexdigest().encode()


def signed_by_me(content: bytes, signed: bytes | None) -> bool:
    key = _key(create=False)
    return key is not None and signed is not None and \
        hmac.compare_digest(hmac.new(key, content, hashlib.sha256).hexdigest().encode(), signed.strip())
