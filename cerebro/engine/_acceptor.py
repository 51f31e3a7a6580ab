"""The driver's port: accepting worker connections that prove the run's token.

Each connection's handshake runs on a thread of its own, at most :data:`MAX_HANDSHAKES` at
once (more are closed unread), each cut off after :data:`HANDSHAKE_SECONDS`, so silent, slow
or hostile peers cannot delay real workers (see :mod:`cerebro.worker._wire` for the
handshake itself).
"""
from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable

from ..worker._wire import HANDSHAKE_SECONDS, Channel, authenticate

MAX_HANDSHAKES = 128


def accept_workers(server: socket.socket, accepted: queue.Queue[tuple[bytes, Channel]], stopping: threading.Event,
                   authkey: Callable[[], bytes], heartbeat_timeout: float) -> None:
    """The acceptor thread's loop, until ``stopping`` or the server closes: each connection
    that authenticates with the token ``authkey()`` gives at its arrival is queued with it."""
    slots = threading.BoundedSemaphore(MAX_HANDSHAKES)
    while not stopping.is_set():
        try:
            sock, _ = server.accept()
        except ConnectionAbortedError:
            continue
        except OSError:            # the server closed
            return
        if not slots.acquire(blocking=False):
            sock.close()           # a flood: real workers retry
            continue
        threading.Thread(target=_handshake, args=(sock, authkey(), heartbeat_timeout, accepted, slots),
                         name="cerebro-handshake", daemon=True).start()


def _handshake(sock: socket.socket, authkey: bytes, heartbeat_timeout: float,
               accepted: queue.Queue[tuple[bytes, Channel]], slots: threading.BoundedSemaphore) -> None:
    try:
        channel = authenticate(sock, authkey, HANDSHAKE_SECONDS)
    except (OSError, EOFError, PermissionError):   # a stranger, a peer too slow, or one that left
        return
    finally:
        slots.release()
    channel.sock.settimeout(heartbeat_timeout)      # no send or receive may block forever
    accepted.put((authkey, channel))
