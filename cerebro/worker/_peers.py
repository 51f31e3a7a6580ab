"""Direct hops: a worker keeps the states it trained and serves them to the other workers.

With MOP a trial's state goes from the worker that trained its last sub-epoch to the one that
trains its next. Through the driver, every hop crosses the driver's link twice, which bounds a
large cluster's speed by that one link (``benchmarks/scale.py --network``). Here the state stays
in the :class:`~._outbox.Outbox` of the worker that trained it, a copy the trainer cannot
change, and the next worker fetches it from that worker's :class:`StateServer`. The server answers only a peer
that proves the run's token (the HMAC handshake of :mod:`._wire`, with roles of its own) and
sends nothing but a state it holds: it reads one small :class:`Fetch` and runs no code.

Example:
    >>> import torch
    >>> from cerebro.store import pack_tensors
    >>> from cerebro.worker._outbox import Outbox
    >>> outbox = Outbox(budget=1 << 20)
    >>> outbox.put("t0000", 3, pack_tensors({"w": torch.zeros(4)}))
    ()
    >>> server = StateServer("127.0.0.1", b"k" * 32, outbox)
    >>> state, size = fetch(server.address, b"k" * 32, "t0000", 3)
    >>> state["w"].tensor().tolist(), fetch(server.address, b"k" * 32, "t0000", 2)[0]
    ([0.0, 0.0, 0.0, 0.0], None)
    >>> server.close()
"""
from __future__ import annotations

import socket
import threading
from typing import Any

from ._outbox import Outbox
from ._protocol import Fetch, NotHere
from ._wire import HANDSHAKE_SECONDS, authenticate, connect_peer

MAX_FETCHES = 64          # connections served at once; more are closed unread (a flood)
IDLE_SECONDS = 60.0       # a fetch whose bytes stop flowing this long has failed


class StateServer:
    """Serves an :class:`Outbox` to authenticated peers on ``host``, a port of its own."""

    def __init__(self, host: str, authkey: bytes, outbox: Outbox) -> None:
        self._server = socket.create_server((host, 0))
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._authkey, self._outbox = authkey, outbox
        self._slots = threading.BoundedSemaphore(MAX_FETCHES)
        threading.Thread(target=self._accept, name="cerebro-states", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except ConnectionAbortedError:
                continue
            except OSError:        # closed
                return
            if not self._slots.acquire(blocking=False):
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), name="cerebro-state", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            channel = authenticate(sock, self._authkey, HANDSHAKE_SECONDS, peer=True)
        except (OSError, EOFError):      # a stranger, or a peer too slow
            self._slots.release()
            return
        try:
            channel.sock.settimeout(IDLE_SECONDS)
            request = channel.recv()
            if isinstance(request, Fetch):
                blob = self._outbox.get(request.trial_id, request.version)
                if blob is None:
                    channel.send(NotHere())
                else:
                    channel.sock.sendall(blob)
        except Exception:        # noqa: BLE001 - a peer that leaves or sends garbage costs only its connection
            pass
        finally:
            channel.close()
            self._slots.release()

    def close(self) -> None:
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()


def fetch(address: tuple[str, int], authkey: bytes, trial_id: str, version: int,
          timeout: float = IDLE_SECONDS) -> tuple[Any, int]:
    """``trial_id``'s packed state ``version`` from the peer at ``address`` (None where the peer
    does not hold it), and the bytes that came. Raises ``OSError`` or ``EOFError`` where the peer cannot be reached or
    stops sending, :class:`cerebro.store.StateFormatError` where it sends garbage."""
    channel = connect_peer((address[0], address[1]), authkey, timeout)
    try:
        channel.send(Fetch(trial_id, version))
        answer = channel.recv()
    finally:
        channel.close()
    return (None if isinstance(answer, NotHere) else answer), channel.bytes_received
