"""Direct hops: a worker keeps the states it trained and serves them to the other workers.

With MOP a trial's state goes from the worker that trained its last sub-epoch to the one that
trains its next. Through the driver, every hop crosses the driver's link twice, which bounds a
large cluster's speed by that one link (``benchmarks/scale.py --network``). Here the state stays
in the :class:`Outbox` of the worker that trained it, a copy the trainer cannot change, and the
next worker fetches it from that worker's :class:`StateServer`. The server answers only a peer
that proves the run's token (the HMAC handshake of :mod:`._wire`, with roles of its own) and
sends nothing but a state it holds: it reads one small :class:`Fetch` and runs no code.

Example:
    >>> import torch
    >>> from cerebro.store import pack_tensors
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
from collections import OrderedDict
from typing import Any

from ..store import frames, parse_view
from ._protocol import Fetch, HandedBack, NotHere
from ._wire import HANDSHAKE_SECONDS, authenticate, connect_peer

MAX_FETCHES = 64          # connections served at once; more are closed unread (a flood)
IDLE_SECONDS = 60.0       # a fetch whose bytes stop flowing this long has failed


class Outbox:
    """The states a worker trained, each kept for the workers that need it next until the
    driver says it is needed no more (:meth:`forget`), within ``budget`` bytes: past it, the
    oldest go back to the driver.

    A state is reserved before the worker answers its sub-epoch and filled (copied) right
    after, so the copy is off the hop's path; a peer that asks in between waits for it."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._filled = threading.Condition()    # the worker loop puts, the server's threads get
        # (trial, version) -> (bytes, the state as one message; None while reserved)
        self._entries: OrderedDict[tuple[str, int], tuple[int, bytes | None]] = OrderedDict()
        self._bytes = 0

    def reserve(self, trial_id: str, version: int, size: int) -> tuple[HandedBack, ...]:
        """Room for ``trial_id``'s ``version`` of ``size`` bytes; returns the states let go of."""
        handed_back = []
        with self._filled:
            self._entries[trial_id, version] = (size, None)
            self._bytes += size
            for key in [k for k, (_, blob) in self._entries.items() if blob is not None]:
                if self._bytes <= self.budget:
                    break
                held, blob = self._entries.pop(key)
                self._bytes -= held
                # A copy the reader may change (it rarely comes to this: the budget is large).
                handed_back.append(HandedBack(*key, parse_view(memoryview(bytearray(blob)))))
        return tuple(handed_back)

    def fill(self, trial_id: str, version: int, parts: list[memoryview | bytes]) -> None:
        """Keep the reserved state, as one message (``parts``: its frames); a copy, as the
        trainer goes on changing its tensors in place."""
        blob = b"".join(parts)
        with self._filled:
            if (trial_id, version) in self._entries:    # else forgotten meanwhile
                self._entries[trial_id, version] = (len(blob), blob)
            self._filled.notify_all()

    def put(self, trial_id: str, version: int, state: Any) -> tuple[HandedBack, ...]:
        """:meth:`reserve` and :meth:`fill` at once: keep ``state`` (packed)."""
        parts = frames(state)
        handed_back = self.reserve(trial_id, version, sum(memoryview(p).nbytes for p in parts))
        self.fill(trial_id, version, parts)
        return handed_back

    def get(self, trial_id: str, version: int, timeout: float = IDLE_SECONDS) -> bytes | None:
        """``trial_id``'s state ``version`` as one message, if held (waiting while reserved)."""
        def settled() -> bool:
            return self._entries.get((trial_id, version), (0, b""))[1] is not None
        with self._filled:
            self._filled.wait_for(settled, timeout)
            return self._entries.get((trial_id, version), (0, None))[1]

    def forget(self, trial_id: str, version: int) -> None:
        with self._filled:
            entry = self._entries.pop((trial_id, version), None)
            if entry is not None:
                self._bytes -= entry[0]
            self._filled.notify_all()


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
    channel = connect_peer(tuple(address), authkey, timeout)
    try:
        channel.send(Fetch(trial_id, version))
        answer = channel.recv()
    finally:
        channel.close()
    return (None if isinstance(answer, NotHere) else answer), channel.bytes_received
