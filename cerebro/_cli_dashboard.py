"""``cerebro dashboard RUN_DIR``: the live page and ``/metrics`` of a run (see
:mod:`cerebro.report._dashboard`)."""
from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

import click


def metrics_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--metrics-port`` and ``--metrics-host``, as ``cerebro run`` and ``cerebro resume`` take them."""
    port = click.option("--metrics-port", default=None, type=click.IntRange(0, 65535),
                        help="serve the run's Prometheus /metrics from here on this port while it runs")
    host = click.option("--metrics-host", default="127.0.0.1", show_default=True,
                        help="the address --metrics-port listens on; the default serves this machine alone, "
                             "0.0.0.0 every interface (the run's metrics to anyone who reaches the port)")
    return port(host(command))


@click.command()
@click.argument("run_dir")
@click.option("--port", default=8265, show_default=True, type=click.IntRange(0, 65535),
              help="the port to serve on (0: any free one)")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="the address to serve on; the default serves this machine alone")
def dashboard(run_dir: str, port: int, host: str) -> None:
    """Serve a live page about a run, running or finished, and its Prometheus metrics at
    /metrics: ranked trials, learning curves, the workers' sub-epochs over time and now,
    failures, settings. Read-only. RUN_DIR may be a local path or an fsspec URL.

    Example: cerebro dashboard cerebro_runs/demo-20261122-101500-ab12
    """
    from .report._http import RunServer, is_loopback

    try:
        server = RunServer(run_dir, host, port)
    except (OSError, ValueError) as error:     # no run there, or the port is taken
        message = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
            message += (f"; another program (an earlier dashboard?) serves there: choose another port with "
                        f"--port, e.g. --port {port + 1 if 0 < port < 65535 else 8266}, or --port 0 for any free one")
        raise click.ClickException(message) from None
    click.echo(f"The dashboard of {run_dir} is at {server.url} (metrics at {server.url}metrics); Ctrl-C stops it.")
    if not is_loopback(host):
        click.echo(f"It is served to anyone who can reach {host}:{server.server_address[1]}, without a password: "
                   f"it shows the run's configs and errors. Prefer the default host and an SSH tunnel: "
                   f"ssh -L {server.server_address[1]}:127.0.0.1:{server.server_address[1]} <this machine>.",
                   err=True)
    else:
        click.echo(f"From another machine: ssh -L {server.server_address[1]}:127.0.0.1:{server.server_address[1]} "
                   f"<this machine>, then open http://127.0.0.1:{server.server_address[1]}/ there.")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

