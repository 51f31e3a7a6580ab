"""The wire under the worker protocol: authenticated, framed messages on a TCP socket.

Messages are written by :mod:`cerebro.store._state_codec`: data only, so reading one can run
no code, and tensors travel without copies.

Both ends prove they hold the run's auth token with an HMAC challenge before a message is
read, so only the driver's own workers can talk to it.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
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

    # --- authentication: an HMAC challenge each way -----------------------------------
    def _challenge(self, authkey: bytes) -> None:
        nonce = os.urandom(32)
        self.sock.sendall(nonce)
        answer = read_exactly(self.sock.recv_into, 32)
        if not hmac.compare_digest(answer, hmac.new(authkey, nonce, hashlib.sha256).digest()):
            raise PermissionError("peer failed authentication")
        self.sock.sendall(b"ok")

    def _answer(self, authkey: bytes) -> None:
        nonce = read_exactly(self.sock.recv_into, 32)
        self.sock.sendall(hmac.new(authkey, bytes(nonce), hashlib.sha256).digest())
        if bytes(read_exactly(self.sock.recv_into, 2)) != b"ok":
            raise PermissionError("peer failed authentication")


def connect(address: tuple[str, int], authkey: bytes, timeout: float = 60.0) -> Channel:
    """A worker's channel to the driver at ``address``, both sides authenticated."""
    channel = Channel(socket.create_connection(address, timeout=timeout))
    try:
        channel._answer(authkey)
        channel._challenge(authkey)
    except (OSError, EOFError, PermissionError):
        channel.close()
        raise
    channel.sock.settimeout(None)
    return channel


def authenticate(sock: socket.socket, authkey: bytes, timeout: float = 10.0) -> Channel:
    """The driver's side of the handshake on a freshly accepted ``sock``; closes it on failure."""
    sock.settimeout(timeout)
    channel = Channel(sock)
    try:
        channel._challenge(authkey)
        channel._answer(authkey)
    except (OSError, EOFError, PermissionError):
        sock.close()
        raise
    sock.settimeout(None)
    return channel
