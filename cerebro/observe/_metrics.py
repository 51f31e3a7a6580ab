"""``fit(metrics_port=P)``: the driver serves its run's Prometheus metrics (``/metrics``,
:mod:`cerebro.report._prometheus`) from the dashboard's hardened server while the run goes,
as one more observer of the run."""
from __future__ import annotations

import logging
import socket
import sys

from .._checks import quoted
from ..report._http import LOOPBACK, RunServer, connection_cap, family, shown_host
from ._progress import Progress

# Of one core, on average: what the clients of /metrics may take from the driver, under the GIL
# its scheduling needs, whatever they do (a scrape costs far less: see report/_prometheus);
# and the CPU seconds they may take at once, before the share holds them back.
CPU_SHARE, CPU_BURST = 0.02, 0.1


def check_port(port: int | None, host: str = LOOPBACK) -> None:
    """Fail now, before any work, where ``fit(metrics_port=port, metrics_host=host)`` could
    not listen: ``host`` no address of this machine, ``port`` taken, or too few descriptors."""
    if not isinstance(host, str) or not host:
        raise ValueError(f"metrics_host={quoted(host)} must be an address of this machine: '127.0.0.1' (this machine "
                         f"alone) or '0.0.0.0' (every interface)")
    if port is None:
        return
    _probe(host, 0, f"metrics_host={quoted(host)}", "give an address of this machine: '127.0.0.1' (this machine alone) "
                                              "or '0.0.0.0' (every interface)")
    connection_cap()
    if port:
        _probe(host, port, f"metrics_port={port}", "give a free port, or 0 for any")


def _probe(host: str, port: int, what: str, hint: str) -> None:
    with socket.socket(family(host)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as the server will
        try:
            probe.bind((host, port))
        except (OSError, OverflowError) as error:
            raise ValueError(f"{what} cannot be listened on: {getattr(error, 'strerror', None) or error}; "
                             f"{hint}") from None


class MetricsEndpoint(Progress):
    """``fit(metrics_port=P)``: the driver serves the run's ``/metrics`` on ``host`` (this
    machine alone by default; ``"0.0.0.0"``: every interface), port ``P``, while the run
    goes (for scrapers that cannot reach the run directory). :func:`check_port` fails a port
    in use before the run; the server binds as the run starts, so a run that fails before
    leaves no socket open. ``announce``: say where, on stderr (a run with progress shown does)."""

    def __init__(self, run_dir: str, port: int, announce: bool = False, host: str = LOOPBACK) -> None:
        self.run_dir, self.port, self.announce, self.host = run_dir, port, announce, host
        self.server: RunServer | None = None

    def start(self, run_dir: str, workers: int) -> None:
        try:
            self.server = RunServer(self.run_dir, self.host, self.port, dashboard=False, cpu_share=CPU_SHARE,
                                    cpu_burst=CPU_BURST)
        except OSError as error:      # taken since fit checked it
            raise ValueError(f"metrics_port={self.port} cannot be listened on: {error.strerror}; it was free when "
                             f"the run was checked, and another process took it since") from None
        self.server.serve_in_thread()
        everywhere = self.host in ("0.0.0.0", "::")      # noqa: S104 (the name of every interface)
        url = (f"http://{socket.gethostname() if everywhere else shown_host(self.host)}:"
               f"{self.server.server_address[1]}/metrics")
        if self.announce:       # port 0 took a free port: this line is where to find it
            print(f"The run's Prometheus metrics are at {url}", file=sys.stderr)
        logging.getLogger("cerebro").info("the run's Prometheus metrics are at %s", url)

    def finish(self, outcome: str) -> None:
        if self.server is not None:      # shutdown() waits for serve_forever, which has begun
            self.server.shutdown()
            self.server.server_close()
            self.server = None
