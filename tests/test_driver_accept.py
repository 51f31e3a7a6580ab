"""The driver's acceptor: strangers and resets never stop it, and it ends when asked."""
from __future__ import annotations

import queue
import socket
import struct
import threading
from types import SimpleNamespace

from cerebro.engine._pool import WorkerPool
from cerebro.worker._wire import connect

KEY = b"run-token"


def test_acceptor_survives_a_reset_and_a_stranger_then_stops():
    server = socket.create_server(("127.0.0.1", 0))
    accepted: queue.Queue = queue.Queue()
    stopping = threading.Event()
    driver = SimpleNamespace(heartbeat_timeout=5.0, _authkey=KEY)
    acceptor = threading.Thread(target=WorkerPool._accept_workers, args=(driver, server, accepted, stopping))
    acceptor.start()

    reset = socket.create_connection(server.getsockname())
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.close()                                             # a connection reset mid-handshake
    stranger = socket.create_connection(server.getsockname())
    stranger.sendall(b"x" * 32)                               # a wrong HMAC answer
    stranger.settimeout(10)
    received = b""
    while chunk := stranger.recv(64):
        received += chunk
    assert len(received) == 32                                # the challenge, never "ok"; then closed
    worker = connect(server.getsockname(), KEY)               # a real worker still gets in

    key, channel = accepted.get(timeout=10)
    assert key == KEY
    worker.send("hello")
    assert channel.recv() == "hello"
    assert accepted.empty()

    stopping.set()
    server.shutdown(socket.SHUT_RDWR)
    server.close()
    acceptor.join(timeout=10)
    assert not acceptor.is_alive()
    for s in (stranger, worker, channel):
        s.close()
