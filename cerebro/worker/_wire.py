"""The wire under the worker protocol: authenticated, framed messages on a TCP socket.

Messages are written by :mod:`cerebro.store._state_codec`: data only, so reading one can run
no code, and tensors travel without copies.

Both ends prove they hold the run's auth token with an HMAC challenge (a fresh nonce per
connection, the answer bound to the answering side's role) before a message is read, so only
the driver's own workers can talk to it. The driver gives a peer :data:`HANDSHAKE_SECONDS` for
the whole handshake and reads exactly the 32-byte answer from it; nothing else is buffered.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import socket
import threading
import time
from collections.abc import Iterable
from multiprocessing.connection import wait
from typing import Any

from ..store import frames, parse, read_exactly
from ._protocol import WIRE_TYPES


class Channel:
    """One end of a driver-worker connection; ``send`` is safe from several threads.

    It counts the bytes of the messages it sends and receives: what MOP communicates.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.bytes_received = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Any) -> None:
        parts = frames(message)
        with self._lock:
            for frame in parts:
                self.sock.sendall(frame)
                self.bytes_sent += memoryview(frame).nbytes

    def recv(self) -> Any:
        def read_into(buffer: memoryview) -> int:
            count = self.sock.recv_into(buffer)
            self.bytes_received += count
            return count
        return parse(read_into, WIRE_TYPES)

    def close(self) -> None:
        self.sock.close()

    @staticmethod
    def readable(channels: Iterable[Channel], timeout: float | None) -> list[Channel]:
        """The ``channels`` with a message waiting (or closed) within ``timeout`` seconds."""
        # wait() takes any object with fileno(); typeshed's annotation names only its own kinds.
        return wait(list(channels), timeout)  # type: ignore[arg-type, return-value]

    # --- authentication: an HMAC challenge each way -----------------------------------
    def _challenge(self, authkey: bytes, peer: bytes, deadline: float) -> None:
        """Send a fresh nonce; the peer must answer with its HMAC under ``authkey``, bound to
        the peer's role, so an answer is never valid for the other direction or another nonce."""
        nonce = os.urandom(NONCE_BYTES)
        self.sock.sendall(nonce)
        answer = self._read(NONCE_BYTES, deadline)
        if not hmac.compare_digest(answer, _proof(authkey, peer, nonce)):
            with contextlib.suppress(OSError):
                self.sock.sendall(b"no")    # refused, not cut short: a worker must not retry
            raise PermissionError("peer failed authentication")
        self.sock.sendall(b"ok")

    def _answer(self, authkey: bytes, me: bytes, deadline: float) -> None:
        nonce = self._read(NONCE_BYTES, deadline)
        self.sock.sendall(_proof(authkey, me, nonce))
        if self._read(2, deadline) != b"ok":
            raise PermissionError("the peer refused this side's proof of the token")

    def _read(self, n: int, deadline: float) -> bytes:
        """``n`` bytes before ``deadline`` (time.monotonic), however slowly they trickle in."""
        def read_into(buffer: memoryview) -> int:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the handshake ran past its deadline")
            self.sock.settimeout(left)
            return self.sock.recv_into(buffer)
        return bytes(read_exactly(read_into, n))      # a nonce or an answer: a few bytes


NONCE_BYTES = 32
HANDSHAKE_SECONDS = 1.0     # the driver's deadline for a peer's whole handshake
_DRIVER, _WORKER = b"driver", b"worker"
# A direct hop: the worker that needs a state fetches it from the one holding it. Roles of
# their own, so no proof made for the driver's port is ever valid between workers.
_FETCHER, _HOLDER = b"peer-fetcher", b"peer-holder"


def _proof(authkey: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(authkey, role + nonce, hashlib.sha256).digest()


class HandshakeError(ConnectionError):
    """A worker could not complete its handshake with the driver: refused, or out of time."""


def connect(address: tuple[str, int], authkey: bytes, timeout: float = 60.0) -> Channel:
    """A worker's channel to the driver at ``address``, both sides authenticated.

    A handshake the driver cut short (it was busy, or this process was slow) is tried again
    until ``timeout``; a driver that refuses the token, proves a wrong one, or no longer
    listens (it died: its workers must end too) is not.
    Raises :class:`HandshakeError` naming the driver and why.
    """
    give_up, why = time.monotonic() + timeout, "no attempt"
    while time.monotonic() < give_up:
        try:
            sock = socket.create_connection(address, timeout=max(0.1, give_up - time.monotonic()))
        except ConnectionRefusedError as error:    # the driver listens before any worker starts:
            raise HandshakeError(f"the driver at {address[0]}:{address[1]} is gone ({error})") from None
        except OSError as error:
            why = f"cannot connect ({error})"
            time.sleep(0.2)          # a network hiccup or an overwhelmed driver: back off
            continue
        channel = Channel(sock)
        try:
            deadline = min(give_up, time.monotonic() + max(timeout / 4, HANDSHAKE_SECONDS))
            channel._answer(authkey, _WORKER, deadline)
            channel._challenge(authkey, _DRIVER, deadline)
        except PermissionError as error:
            channel.close()
            raise HandshakeError(f"the driver at {address[0]}:{address[1]} refused this worker's token, or "
                                 f"could not prove it holds the same one ({error})") from None
        except (OSError, EOFError) as error:
            channel.close()
            why = f"the handshake was cut short ({type(error).__name__}: {error})"
            time.sleep(0.1)
            continue
        channel.sock.settimeout(None)
        return channel
    raise HandshakeError(f"could not complete a handshake with the driver at {address[0]}:{address[1]} "
                         f"within {timeout:.0f} s: {why}")


def authenticate(sock: socket.socket, authkey: bytes, timeout: float = HANDSHAKE_SECONDS, *,
                 peer: bool = False) -> Channel:
    """The listening side of the handshake on a freshly accepted ``sock``: the driver's
    (``peer=False``), or a worker's serving its states to other workers (``peer=True``). The
    other end must prove the token within ``timeout`` seconds, whatever it sends; closes
    ``sock`` on failure."""
    channel = _shake(sock, authkey, time.monotonic() + timeout, (_FETCHER, _HOLDER) if peer else (_WORKER, _DRIVER),
                     listening=True)
    sock.settimeout(None)
    return channel


def connect_peer(address: tuple[str, int], authkey: bytes, timeout: float) -> Channel:
    """A channel to another worker's state server at ``address``, both sides authenticated;
    one attempt (the driver decides what a failed fetch means). Raises ``OSError`` (or
    ``PermissionError``) on failure, with the sock closed."""
    sock = socket.create_connection(address, timeout=timeout)
    channel = _shake(sock, authkey, time.monotonic() + timeout, (_HOLDER, _FETCHER), listening=False)
    sock.settimeout(timeout)      # a holder that stops answering mid-state fails the fetch
    return channel


def _shake(sock: socket.socket, authkey: bytes, deadline: float, roles: tuple[bytes, bytes], *,
           listening: bool) -> Channel:
    """Both proofs on ``sock`` (``roles``: the other side's and this side's); the listening
    side challenges first. Closes ``sock`` where either fails."""
    channel, (them, me) = Channel(sock), roles
    try:
        if listening:
            channel._challenge(authkey, them, deadline)
            channel._answer(authkey, me, deadline)
        else:
            channel._answer(authkey, me, deadline)
            channel._challenge(authkey, them, deadline)
    except (OSError, EOFError, PermissionError):
        sock.close()
        raise
    return channel
