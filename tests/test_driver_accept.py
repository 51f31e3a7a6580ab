"""The driver's port under attack: the acceptor runs each handshake on its own thread with a
deadline, so silent or slow peers never delay a real worker; every hostile handshake
(garbage, a huge length prefix, a pickle without the token, a replayed answer, a reflected
nonce, a proof made for the other direction) is refused with nothing read beyond the 32-byte
answer; a flood beyond the handshake slots is closed unread; resets never stop the acceptor,
and it ends when asked."""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import pickle
import queue
import socket
import struct
import threading
import time

import pytest

from cerebro.engine import _acceptor
from cerebro.worker._wire import connect

KEY = b"run-token"
WAIT = 30.0      # bounds every blocking call of the tests; the handshakes' own deadline is shorter


class Acceptor:
    """The pool's acceptor thread on a loopback port, as the driver runs it."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = self.server.getsockname()
        self.accepted: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=_acceptor.accept_workers,
                                       args=(self.server, self.accepted, self.stopping, lambda: KEY, 5.0))
        self.thread.start()

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(timeout=WAIT)
        assert not self.thread.is_alive()
        while not self.accepted.empty():
            self.accepted.get()[1].close()


@pytest.fixture
def acceptor():
    running = Acceptor()
    yield running
    running.stop()


def peer(address) -> socket.socket:
    sock = socket.create_connection(address, timeout=WAIT)
    return sock


def receive_all(sock: socket.socket) -> bytes:
    """Everything the driver sends until it hangs up."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(64):
            received += chunk
    return received


def read_nonce(sock: socket.socket) -> bytes:
    nonce = b""
    while len(nonce) < 32:
        nonce += sock.recv(32 - len(nonce))
    return nonce


def proof(role: bytes, nonce: bytes, key: bytes = KEY) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


def test_acceptor_survives_a_reset_and_a_stranger_then_stops(acceptor):
    reset = socket.create_connection(acceptor.address)
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.close()                                             # a connection reset mid-handshake
    stranger = peer(acceptor.address)
    stranger.sendall(b"x" * 32)                               # a wrong HMAC answer
    received = receive_all(stranger)
    assert len(received) == 34 and received.endswith(b"no")  # the challenge, then "no", never "ok"
    worker = connect(acceptor.address, KEY)                   # a real worker still gets in
    key, channel = acceptor.accepted.get(timeout=WAIT)
    assert key == KEY
    worker.send("hello")
    assert channel.recv() == "hello"
    assert acceptor.accepted.empty()
    for s in (stranger, worker, channel):
        s.close()


def test_silent_peers_never_delay_a_real_worker(acceptor, monkeypatch):
    """50 peers that connect and say nothing hold their handshakes open (a deadline of 30 s
    here): a real worker gets in while every one of them is still waiting."""
    monkeypatch.setattr(_acceptor, "HANDSHAKE_SECONDS", WAIT)
    silent = [peer(acceptor.address) for _ in range(50)]
    nonces = [read_nonce(s) for s in silent]                  # each got its own challenge at once
    assert len(set(nonces)) == 50
    worker = connect(acceptor.address, KEY, timeout=WAIT)
    key, channel = acceptor.accepted.get(timeout=WAIT)
    for sock in silent:                                       # none was closed or answered meanwhile
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(1)
    worker.close()
    channel.close()
    for sock in silent:
        sock.close()


def test_a_peer_that_says_nothing_is_cut_off_at_the_deadline(acceptor, monkeypatch):
    monkeypatch.setattr(_acceptor, "HANDSHAKE_SECONDS", 0.2)
    silent = peer(acceptor.address)
    assert len(read_nonce(silent)) == 32
    assert receive_all(silent) == b""                         # hung up, without a word
    trickle = peer(acceptor.address)                          # the deadline is for the whole handshake
    read_nonce(trickle)
    with contextlib.suppress(OSError):
        for byte in proof(b"worker", b"\0" * 32):
            trickle.sendall(bytes([byte]))
            time.sleep(0.05)                                  # the attacker's pace: 1.6 s for 32 bytes
    assert receive_all(trickle) == b""
    assert acceptor.accepted.empty()


UNPICKLED: list = []


class Trap:
    def __reduce__(self):
        return UNPICKLED.append, ("trap sprung",)


def hostile(kind: str, address) -> bytes:
    """One hostile handshake; returns what the driver answered until it hung up."""
    with peer(address) as sock:
        nonce = read_nonce(sock)
        if kind == "garbage":
            sock.sendall(b"\xff" * 4096)
        elif kind == "a huge length prefix":
            sock.sendall(struct.pack("<QI", 1 << 60, 1 << 30) + b"\0" * 20)
        elif kind == "a pickle without the token":
            sock.sendall(pickle.dumps(Trap()).ljust(64, b"\0"))
        elif kind == "a reflected nonce":
            sock.sendall(nonce)
        elif kind == "a proof for the other direction":
            sock.sendall(proof(b"driver", nonce))             # what the driver would answer to this nonce
        elif kind == "a wrong token":
            sock.sendall(proof(b"worker", nonce, key=b"another run's token"))
        return receive_all(sock)


@pytest.mark.parametrize("kind", ["garbage", "a huge length prefix", "a pickle without the token",
                                  "a reflected nonce", "a proof for the other direction", "a wrong token"])
def test_a_hostile_handshake_is_refused_and_nothing_is_read(acceptor, kind):
    UNPICKLED.clear()
    assert hostile(kind, acceptor.address) == b"no"
    assert acceptor.accepted.empty() and UNPICKLED == []


def test_a_replayed_answer_is_refused(acceptor):
    """A recorded handshake of a real worker is worth nothing on a new connection."""
    with peer(acceptor.address) as sock:                      # the genuine exchange, recorded
        answer = proof(b"worker", read_nonce(sock))
        sock.sendall(answer)
        assert sock.recv(2) == b"ok"
    with peer(acceptor.address) as sock:
        read_nonce(sock)                                      # a fresh challenge
        sock.sendall(answer)
        assert receive_all(sock) == b"no"


def test_a_flood_beyond_the_handshake_slots_is_closed_unread(acceptor, monkeypatch):
    monkeypatch.setattr(_acceptor, "HANDSHAKE_SECONDS", WAIT)
    monkeypatch.setattr(_acceptor, "MAX_HANDSHAKES", 4)
    acceptor.stop()                                           # a new acceptor reads the smaller limit
    flooded = Acceptor()
    try:
        holding = [peer(flooded.address) for _ in range(4)]
        for sock in holding:
            read_nonce(sock)
        extra = peer(flooded.address)
        assert receive_all(extra) == b""                      # closed at once: no challenge, nothing read
        for sock in holding:
            sock.close()
        worker = connect(flooded.address, KEY, timeout=WAIT)  # slots free again: a real worker gets in
        flooded.accepted.get(timeout=WAIT)[1].close()
        worker.close()
        extra.close()
    finally:
        flooded.stop()
