"""The HTTP server of ``cerebro dashboard`` and of ``fit(metrics_port=...)``: a standard
library ``ThreadingHTTPServer`` answering GET on three fixed routes (see
:mod:`._dashboard`), one thread per request, nothing written, nothing else read."""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ._progress import Progress
from ._prometheus import RunCollector


class RunServer(ThreadingHTTPServer):
    """Serves the run in ``run_dir`` on ``host:port`` (0: a free port): the dashboard and
    ``/metrics``, or ``/metrics`` alone. Binds at once, so a port in use fails here."""

    daemon_threads = True

    def __init__(self, run_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 8265,
                 dashboard: bool = True) -> None:
        from ._dashboard import RunView

        self.view = RunView(run_dir) if dashboard else None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RunCollector(run_dir))
        self._page: bytes | None = None
        try:
            super().__init__((host, port), _Handler)
        except OSError as error:
            raise OSError(error.errno, f"cannot serve on {host}:{port}: {error.strerror or error}") from None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    def page(self) -> bytes:
        from ._dashboard import page

        if self._page is None:
            self._page = page()
        return self._page

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="cerebro-http", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: RunServer
    timeout = 10     # seconds a connection may stay silent: idle ones do not pile up threads

    def do_GET(self) -> None:   # noqa: N802 (http.server's name)
        path = urlsplit(self.path).path
        if not self._host_allowed():
            self._send(403, "text/plain", b"this server answers requests for 127.0.0.1 or localhost only\n")
        elif path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))
        elif self.server.view is None:
            self._send(404, "text/plain", b"only /metrics is served here\n")
        elif path == "/":
            self._send(200, "text/html; charset=utf-8", self.server.page())
        elif path == "/state":
            import json
            asked = parse_qs(urlsplit(self.path).query)
            state = self.server.view.state(asked.get("figures", [""])[0])
            if asked.get("since", [""])[0] == state["version"]:
                self._send(204, "text/plain", b"")
            else:
                self._send(200, "application/json", json.dumps(state).encode())
        else:
            self._send(404, "text/plain", b"not found: / (the page), /state, /metrics\n")

    def _host_allowed(self) -> bool:
        """A server on the loopback interface answers only requests addressed to it: a web
        page whose own name resolves to 127.0.0.1 (DNS rebinding) must not read the run."""
        if not is_loopback(self.server.server_address[0]):
            return True
        try:
            host = urlsplit(f"//{self.headers.get('Host', '')}").hostname or ""
        except ValueError:      # not a host name at all
            return False
        return is_loopback(host)

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


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine's loopback interface."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_port(port: int | None) -> None:
    """Fail now, before any work, where ``fit(metrics_port=port)`` could not listen."""
    if not port:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as the server will
        try:
            probe.bind(("0.0.0.0", port))      # noqa: S104 (where the endpoint will listen)
        except OSError as error:
            raise ValueError(f"metrics_port={port} cannot be listened on: {error.strerror}; give a free port, or "
                             f"0 for any") from None


class MetricsEndpoint(Progress):
    """``fit(metrics_port=P)``: the driver serves the run's ``/metrics`` on every interface
    of this machine, port ``P``, while the run goes (for scrapers that cannot reach the run
    directory). :func:`check_port` fails a port in use before the run; the server binds as
    the run starts, so a run that fails before leaves no socket open. ``announce``: say
    where, on stderr (a run with progress shown does)."""

    def __init__(self, run_dir: str, port: int, announce: bool = False) -> None:
        self.run_dir, self.port, self.announce = run_dir, port, announce
        self.server: RunServer | None = None

    def start(self, run_dir: str, workers: int) -> None:
        try:
            self.server = RunServer(self.run_dir, "0.0.0.0", self.port, dashboard=False)  # noqa: S104 (scrapers)
        except OSError as error:      # taken since fit checked it
            raise ValueError(f"metrics_port={self.port} cannot be listened on: {error.strerror}; it was free when "
                             f"the run was checked, and another process took it since") from None
        self.server.serve_in_thread()
        url = f"http://{socket.gethostname()}:{self.server.server_address[1]}/metrics"
        if self.announce:       # port 0 took a free port: this line is where to find it
            print(f"The run's Prometheus metrics are at {url}", file=sys.stderr)
        logging.getLogger("cerebro").info("the run's Prometheus metrics are at %s", url)

    def finish(self, outcome: str) -> None:
        if self.server is not None:      # shutdown() waits for serve_forever, which has begun
            self.server.shutdown()
            self.server.server_close()
            self.server = None
