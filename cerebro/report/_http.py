"""The HTTP server of ``cerebro dashboard`` and of ``fit(metrics_port=...)`` (its observer:
:mod:`cerebro.observe._metrics`): a standard library ``ThreadingHTTPServer`` answering GET on
three fixed routes (see :mod:`._dashboard`), one thread per request, nothing written, nothing
else read.

A port is untrusted ground (DESIGN, invariant 10): no client may end or stall the run it
serves. So the server holds at most :func:`connection_cap` connections at once (a small
share of the process's descriptors: the run's own files never starve for them); one more
is answered 503 and closed by the accepting thread, with no thread of its own. A request
has :data:`DEADLINE` seconds from its connection to its answer, whatever its client sends
(each read waits only for the time left), and a request whose run cannot be read is
answered 503 with one line saying why, never a traceback or a hung thread. And it takes at
most ``cpu_share`` of a core from its process, whatever its clients do (:mod:`._budget`):
past it, no connection is accepted until the time is made up.
"""
from __future__ import annotations

import errno
import io
import ipaddress
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from ._budget import CpuBudget
from ._prometheus import MetricsText

LOOPBACK = "127.0.0.1"
MAX_CONNECTIONS = 32    # served at once; more are refused at once
DEADLINE = 10.0         # seconds from a connection to its answer
FD_SHARE = 16           # the connections may take at most 1/16th of the process's descriptors
CPU_SHARE = 0.2         # of a core, on average, for a server in a process of its own (cerebro dashboard) ...
CPU_BURST = 1.0         # ... which may take this many CPU seconds at once (the page's first read of a long run)
PAUSE_STEP = 0.25       # seconds the accepting thread waits at a time for its budget (shutdown() waits as long)
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
         b"too many connections; try again\n")
_Answer = tuple[int, str, bytes]


def connection_cap(most: int = MAX_CONNECTIONS) -> int:
    """How many connections a server may hold at once in this process: ``most``, or fewer
    where the open-file limit (``ulimit -n``) is low, so the run keeps nearly all of it."""
    try:
        import resource
    except ImportError:         # no such limit to share (Windows)
        return most
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return most
    cap = min(most, soft // FD_SHARE)
    if cap < 2:
        raise ValueError(f"the open-file limit (ulimit -n) is {soft}, too low to serve HTTP beside the run, whose "
                         f"files need it; raise it to {2 * FD_SHARE} or more")
    return cap


class RunServer(ThreadingHTTPServer):
    """Serves the run in ``run_dir`` on ``host:port`` (0: a free port): the dashboard and
    ``/metrics``, or ``/metrics`` alone. Binds at once, so a port in use fails here.
    ``max_connections`` (capped by :func:`connection_cap`) and ``deadline`` (seconds a
    request may take, from its connection to its answer) bound what clients can hold, and
    ``cpu_share`` (of a core, on average; ``cpu_burst`` CPU seconds at once) the CPU time they
    can take from this process."""

    daemon_threads = True
    request_queue_size = 128   # connections the kernel queues before refusing; they hold no descriptor of ours

    def __init__(self, run_dir: str | os.PathLike, host: str = LOOPBACK, port: int = 8265,
                 dashboard: bool = True, *, max_connections: int = MAX_CONNECTIONS,
                 deadline: float = DEADLINE, cpu_share: float = CPU_SHARE, cpu_burst: float = CPU_BURST) -> None:
        from ._dashboard import RunView

        self.cap, self.deadline = connection_cap(max_connections), deadline
        self._slots = threading.BoundedSemaphore(self.cap)
        self.budget = CpuBudget(cpu_share, cpu_burst)
        self._accepting = 0.0           # the accepting thread's CPU time as it began taking the connection
        self.view = RunView(run_dir) if dashboard else None
        self.metrics = MetricsText(run_dir)
        if dashboard:       # the journal folded now, as the view was made: the first scrape answers at once
            self.metrics.get()
        self._page: bytes | None = None
        self.address_family = family(host)
        try:
            super().__init__((host, port), _Handler)
        except OSError as error:
            raise OSError(error.errno, f"cannot serve on {host}:{port}: {error.strerror or error}") from None

    @property
    def bound(self) -> tuple[str, int]:
        """The address and port it listens on (asked for port 0: the one the system chose)."""
        host, port = self.server_address[:2]
        return str(host), port        # an IP server's host is a str already

    @property
    def url(self) -> str:
        host, port = self.bound
        return f"http://{shown_host(host)}:{port}/"

    def page(self) -> bytes:
        from ._dashboard import page

        if self._page is None:
            self._page = page()
        return self._page

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="cerebro-http", daemon=True)
        thread.start()
        return thread

    def get_request(self) -> tuple[socket.socket, Any]:
        owed = self.budget.owed()
        if owed > 0:     # the connection waits in the kernel's queue; the loop comes back (and sees a shutdown)
            time.sleep(min(owed, PAUSE_STEP))
            raise BlockingIOError(errno.EAGAIN, "the server's CPU budget is spent for now")
        self._accepting = time.thread_time()
        try:
            return super().get_request()
        except OSError as error:
            if error.errno in (errno.EMFILE, errno.ENFILE):
                # The process is out of descriptors (the run's: ours are capped). The connection
                # stays queued; pausing keeps the accepting loop from spinning on it meanwhile.
                time.sleep(0.1)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            if not self._slots.acquire(blocking=False):
                refuse(request)      # no thread, and its descriptor closed at once
                self.shutdown_request(request)
                return
            try:
                super().process_request(request, client_address)
            except BaseException:     # no thread took the slot: nothing else would give it back
                self._slots.release()
                raise
        finally:                      # the accept, the refusal or the thread's start
            self.budget.charge(time.thread_time() - self._accepting)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        started = time.thread_time()
        try:
            super().process_request_thread(request, client_address)    # closes the connection
        finally:
            self._slots.release()
            self.budget.charge(time.thread_time() - started)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up or misbehaves is no news worth a traceback on the run's stderr.
        logging.getLogger("cerebro").debug("HTTP client %s: %r", client_address, sys.exc_info()[1])


def refuse(request: socket.socket) -> None:
    """Say 503 to a connection beyond the cap, without waiting on it: a client that does not
    read gets nothing, and the connection is closed all the same."""
    try:
        request.setblocking(False)
        request.send(_BUSY)
        request.recv(65536)     # what the client sent already: closed unread, it would reset the answer away
    except OSError:
        pass


class _Deadline:
    """The time left to a request: each read or write on its socket may wait that long only."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.sock, self.end = sock, time.monotonic() + seconds

    def arm(self) -> socket.socket:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self.sock.settimeout(left)
        return self.sock


class _Reader(io.RawIOBase):
    def __init__(self, deadline: _Deadline) -> None:
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.deadline.arm().recv_into(buffer)


class _Writer(io.BufferedIOBase):     # as socketserver's own writer: each write sends it all
    def __init__(self, deadline: _Deadline) -> None:
        self.deadline = deadline

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.deadline.arm().sendall(data)
        return len(data)


class _Handler(BaseHTTPRequestHandler):
    server: RunServer

    def setup(self) -> None:
        # One deadline for the whole request, not StreamRequestHandler's timeout per read: a
        # client sending a byte a second would keep a timeout per read from ever firing.
        deadline = _Deadline(self.request, self.server.deadline)
        self.connection = self.request
        self.rfile = io.BufferedReader(_Reader(deadline))
        self.wfile = _Writer(deadline)

    def do_GET(self) -> None:   # noqa: N802 (http.server's name)
        path = urlsplit(self.path).path
        if not self._host_allowed():
            self._send(403, "text/plain", self._refusal())
        elif path == "/metrics":
            self._send(*answered(lambda: (200, CONTENT_TYPE_LATEST, self.server.metrics.get())))
        elif self.server.view is None:
            self._send(404, "text/plain", b"only /metrics is served here\n")
        elif path == "/":
            self._send(200, "text/html; charset=utf-8", self.server.page())
        elif path == "/state":
            self._send(*answered(self._state))
        else:
            self._send(404, "text/plain", b"not found: / (the page), /state, /metrics\n")

    def _state(self) -> _Answer:
        import json
        assert self.server.view is not None
        asked = parse_qs(urlsplit(self.path).query)
        state = self.server.view.state(asked.get("figures", [""])[0])
        if asked.get("since", [""])[0] == state["version"]:
            return 204, "text/plain", b""
        return 200, "application/json", json.dumps(state).encode()

    def _host_allowed(self) -> bool:
        """A web page whose own name resolves to this machine (DNS rebinding) must not read the
        run: a request must name one host, exactly ``host[:port]``; a server on the loopback
        interface answers those addressed to it, one on any other address (0.0.0.0 listens on
        the loopback too) those addressed to an IP address or to this machine's own names."""
        named = self.headers.get_all("Host") or []
        found = _HOST.fullmatch(named[0].strip()) if len(named) == 1 else None
        if found is None or (found["port"] is not None and int(found["port"]) > 65535):
            return False
        host = (found["v6"] or found["name"]).rstrip(".").lower()
        if is_loopback(self.server.bound[0]):
            return is_loopback(host)
        return _is_address(host) or host in _own_names()

    def _refusal(self) -> bytes:
        """What a request :meth:`_host_allowed` refuses is told: what this server answers."""
        bound = self.server.bound[0]
        if is_loopback(bound):      # its own address: a server on [::1] is not reached at 127.0.0.1
            return f"this server answers requests addressed to {shown_host(bound)} or localhost only\n".encode()
        return (b"this server answers requests addressed to one of this machine's IP addresses or names only "
                b"(one Host header: host[:port])\n")

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:   # noqa: A002 (http.server's name)
        pass     # a request a second is no news


def answered(make: Callable[[], _Answer]) -> _Answer:
    """What ``make`` answers, or 503 and one line naming why the run could not be read."""
    try:
        return make()
    except Exception as error:      # noqa: BLE001 (a run directory may hold anything: the server answers all the same)
        why = " ".join(f"{type(error).__name__}: {error}".split())[:500]
        return 503, "text/plain; charset=utf-8", f"the run cannot be read now: {why}\n".encode()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine's loopback interface."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.rstrip(".").lower() == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)       # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))(?::(?P<port>[0-9]{1,5}))?")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _own_names() -> set[str]:
    """The names this machine calls itself, which a scraper on another machine may use."""
    return {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}


def family(host: str) -> socket.AddressFamily:
    """The address family a server on ``host`` listens with."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def shown_host(host: str) -> str:
    """``host`` as a URL names it."""
    return f"[{host}]" if ":" in host else host
